"""A user folder given to another user (a superadmin's act, Backend.AI's
``/folders/_/change-ownership``).

Only the manager's record changes: a storage proxy knows a folder by its volume and id
(``FolderRef``), never by its owner, so its files stay where they are and the new owner
reaches them at once.  The folder takes the new owner's domain; its quota stays as it
was set.  The new owner must be able to own one more folder: their name must be free
among their folders (the trash included) and ``max_vfolder_count`` of their keypairs'
resource policies (the most generous of their active keypairs) must allow one more.  A
share or invitation the new owner had to the folder is dropped (it is theirs now); the
old owner keeps nothing.  Sessions that mount it keep running.
"""

from __future__ import annotations

import uuid
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from ...enums import UserRole, UserStatus, VFolderOwnershipType
from ...errors import Conflict, InvalidRequest, NotFound, PermissionDenied
from ...models import (
    Keypair,
    KeypairResourcePolicy,
    User,
    VFolder,
    VFolderInvitation,
    VFolderPermissionGrant,
    email_matches,
)
from ..actor import Actor
from .access import LIVE, TRASH
from .crud import FolderCrud

__all__ = ["FolderOwnership"]


class FolderOwnership(FolderCrud):
    """Changing a user folder's owner."""

    async def _folder_limit(self, db: AsyncSession, user_id: uuid.UUID) -> tuple[int, str]:
        """The most folders ``user_id`` may own (0 = unlimited): the most generous
        ``max_vfolder_count`` among the policies of their active keypairs, and its
        policy's name."""
        rows = await db.execute(
            sa.select(KeypairResourcePolicy.name, KeypairResourcePolicy.max_vfolder_count)
            .join(Keypair, Keypair.resource_policy == KeypairResourcePolicy.name)
            .where(Keypair.user_id == user_id, Keypair.is_active.is_(True))
            .order_by(KeypairResourcePolicy.name)
        )
        best: tuple[int, str] | None = None
        for name, limit in rows.all():
            if limit <= 0:
                return 0, name
            if best is None or limit > best[0]:
                best = (limit, name)
        return best if best is not None else (0, "")

    async def change_owner(
        self, actor: Actor, vfolder_id: uuid.UUID, user_email: str
    ) -> dict[str, Any]:
        if actor.role is not UserRole.SUPERADMIN:
            raise PermissionDenied(
                "Only a superadmin may change a folder's owner",
                field="vfolder",
                received=str(vfolder_id),
            )
        try:
            async with self.db.begin(write=True) as db:
                folder = await db.get(VFolder, vfolder_id)
                if folder is None:
                    raise NotFound(
                        f"No folder {str(vfolder_id)!r}", field="vfolder", received=str(vfolder_id)
                    )
                if folder.ownership_type is not VFolderOwnershipType.USER:
                    raise InvalidRequest(
                        f"The folder {folder.name!r} belongs to a project: only a user"
                        " folder changes owner",
                        field="vfolder",
                        expected="the id of a user folder",
                        received=str(vfolder_id),
                    )
                if folder.status not in (*LIVE, TRASH):
                    raise Conflict(
                        f"The folder {folder.name!r} is {folder.status.value}: its owner"
                        " changes when it is ready, mounted or in the trash",
                        field="vfolder",
                        received=str(vfolder_id),
                        folder_status=folder.status.value,
                    )
                user = (
                    await db.execute(sa.select(User).where(email_matches(user_email)))
                ).scalar_one_or_none()
                if user is None or user.status is not UserStatus.ACTIVE:
                    raise NotFound(
                        f"No active user {user_email!r}", field="user_email", received=user_email
                    )
                answer = {
                    "id": folder.id.hex,
                    "name": folder.name,
                    "user": str(user.id),
                    "user_email": user.email,
                }
                if folder.user_id == user.id:
                    return answer
                clash = (
                    await db.execute(
                        sa.select(VFolder.id).where(
                            VFolder.user_id == user.id, VFolder.name == folder.name
                        )
                    )
                ).first()
                if clash is not None:
                    raise Conflict(
                        f"{user.email} has a folder named {folder.name!r} already (the trash"
                        " included): rename one of them first",
                        field="vfolder",
                        received=str(vfolder_id),
                    )
                limit, policy = await self._folder_limit(db, user.id)
                await self._check_count_of(
                    db,
                    user.id,
                    limit,
                    lambda count: (
                        f"{user.email} has {count} folders, the most the resource"
                        f" policy {policy!r} allows"
                    ),
                )
                folder.user_id = user.id
                folder.domain_name = user.domain_name
                await db.execute(
                    sa.delete(VFolderPermissionGrant).where(
                        VFolderPermissionGrant.vfolder_id == folder.id,
                        VFolderPermissionGrant.user_id == user.id,
                    )
                )
                await db.execute(
                    sa.delete(VFolderInvitation).where(
                        VFolderInvitation.vfolder_id == folder.id,
                        sa.func.lower(VFolderInvitation.invitee) == user.email.lower(),
                    )
                )
        except IntegrityError:  # the name taken meanwhile
            raise Conflict(
                f"{user_email} has a folder with this name already (the trash included):"
                " rename one of them first",
                field="vfolder",
                received=str(vfolder_id),
            ) from None
        return answer
