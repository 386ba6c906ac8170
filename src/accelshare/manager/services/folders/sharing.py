"""Sharing: invitations to a user folder (accepted, rejected or canceled), a project
folder shared with members of its project, leaving a share, and the shares of the
folders one manages, listed and changed (Backend.AI's ``/folders/_/shared``)."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from ...enums import InvitationState, UserRole, VFolderOwnershipType, VFolderPermission
from ...errors import Conflict, InvalidRequest, NotFound, PermissionDenied
from ...models import (
    GroupMember,
    User,
    VFolder,
    VFolderInvitation,
    VFolderPermissionGrant,
    email_matches,
)
from ..actor import Actor
from .access import FolderCore, iso

__all__ = ["FolderSharing"]


class FolderSharing(FolderCore):
    """Invitations, project shares, leaving them; the shares of managed folders."""

    async def _users_by_email(
        self, db: AsyncSession, emails: Iterable[str], field: str
    ) -> dict[str, User]:
        found: dict[str, User] = {}
        for index, email in enumerate(emails):
            if not isinstance(email, str) or not email:
                raise InvalidRequest(
                    "An e-mail address is needed", field=f"{field}[{index}]", received=email
                )
            user = (
                await db.execute(sa.select(User).where(email_matches(email)))
            ).scalar_one_or_none()
            if user is not None:
                found[email] = user
        return found

    async def invite(
        self, actor: Actor, ref: str, permission: VFolderPermission, emails: Sequence[str]
    ) -> dict[str, Any]:
        access = await self._usable(actor, ref)
        folder = access.folder
        if folder.ownership_type is VFolderOwnershipType.GROUP:
            raise InvalidRequest(
                f"The folder {folder.name!r} belongs to a project: share it with its members instead",
                field="name",
                received=ref,
            )
        self._manage(access, "invite users to")
        invited: list[str] = []
        async with self.db.begin(write=True) as db:
            users = await self._users_by_email(db, emails, "emails")
            for email, user in users.items():
                if user.id == folder.user_id:
                    continue
                if await db.get(VFolderPermissionGrant, (folder.id, user.id)) is not None:
                    continue
                pending = (
                    await db.execute(
                        sa.select(VFolderInvitation.id).where(
                            VFolderInvitation.vfolder_id == folder.id,
                            sa.func.lower(VFolderInvitation.invitee) == user.email.lower(),
                            VFolderInvitation.state == InvitationState.PENDING,
                        )
                    )
                ).first()
                if pending is not None:
                    continue
                db.add(
                    VFolderInvitation(
                        id=uuid.uuid4(),
                        vfolder_id=folder.id,
                        inviter=actor.email,
                        invitee=user.email,
                        permission=permission,
                        state=InvitationState.PENDING,
                        created_at=self.clock(),
                        modified_at=self.clock(),
                    )
                )
                invited.append(email)
        return {"invited_ids": invited}

    @staticmethod
    def _invitation_json(inv: VFolderInvitation, folder_name: str) -> dict[str, Any]:
        return {
            "id": inv.id.hex,
            "inviter": inv.inviter,
            "invitee": inv.invitee,
            "perm": inv.permission.value,
            "state": inv.state.value,
            "created_at": iso(inv.created_at),
            "modified_at": iso(inv.modified_at),
            "vfolder_id": inv.vfolder_id.hex,
            "vfolder_name": folder_name,
        }

    async def invitations(self, actor: Actor) -> dict[str, Any]:
        async with self.db.begin() as db:
            rows = await db.execute(
                sa.select(VFolderInvitation, VFolder.name)
                .join(VFolder, VFolder.id == VFolderInvitation.vfolder_id)
                .where(sa.func.lower(VFolderInvitation.invitee) == actor.email.lower())
                .where(VFolderInvitation.state == InvitationState.PENDING)
                .order_by(VFolderInvitation.created_at)
            )
            return {"invitations": [self._invitation_json(inv, name) for inv, name in rows.all()]}

    async def _invitation(self, db: AsyncSession, inv_id: str) -> VFolderInvitation:
        parsed = self._as_id(inv_id) if isinstance(inv_id, str) else None
        inv = await db.get(VFolderInvitation, parsed) if parsed is not None else None
        if inv is None or inv.state is not InvitationState.PENDING:
            raise NotFound(f"No pending invitation {inv_id!r}", field="inv_id", received=inv_id)
        return inv

    async def accept_invitation(self, actor: Actor, inv_id: str) -> dict[str, Any]:
        async with self.db.begin(write=True) as db:
            inv = await self._invitation(db, inv_id)
            if inv.invitee.lower() != actor.email.lower():
                raise NotFound(f"No pending invitation {inv_id!r}", field="inv_id", received=inv_id)
            folder = await db.get(VFolder, inv.vfolder_id)
            assert folder is not None  # a foreign key with ON DELETE CASCADE
            clash = (
                await db.execute(
                    sa.select(VFolder.id).where(
                        VFolder.user_id == actor.user_id, VFolder.name == folder.name
                    )
                )
            ).first()
            if clash is not None:
                raise Conflict(
                    f"You have a folder named {folder.name!r} already: rename it first",
                    field="inv_id",
                    received=inv_id,
                )
            await db.merge(
                VFolderPermissionGrant(
                    vfolder_id=folder.id, user_id=actor.user_id, permission=inv.permission
                )
            )
            inv.state = InvitationState.ACCEPTED
            inv.modified_at = self.clock()
        return {"msg": f"Accepted the invitation to {folder.name!r}"}

    async def delete_invitation(self, actor: Actor, inv_id: str) -> dict[str, Any]:
        """The invitee rejects, or the inviter cancels."""
        async with self.db.begin(write=True) as db:
            inv = await self._invitation(db, inv_id)
            if inv.invitee.lower() == actor.email.lower():
                inv.state = InvitationState.REJECTED
            elif inv.inviter.lower() == actor.email.lower():
                inv.state = InvitationState.CANCELED
            else:
                raise NotFound(f"No pending invitation {inv_id!r}", field="inv_id", received=inv_id)
            inv.modified_at = self.clock()
            return {"msg": f"Invitation {inv.state.value}"}

    async def share(
        self, actor: Actor, ref: str, permission: VFolderPermission, emails: Sequence[str]
    ) -> dict[str, Any]:
        """A project folder, shared with members of its project with their own permission."""
        access = await self._usable(actor, ref)
        folder = access.folder
        if folder.ownership_type is not VFolderOwnershipType.GROUP:
            raise InvalidRequest(
                f"Only project folders are shared; invite users to {folder.name!r} instead",
                field="name",
                received=ref,
            )
        self._manage(access, "share")
        shared: list[str] = []
        async with self.db.begin(write=True) as db:
            users = await self._users_by_email(db, emails, "emails")
            missing = [e for e in emails if e not in users]
            outsiders = [
                e
                for e, u in users.items()
                if await db.get(GroupMember, (folder.group_id, u.id)) is None
            ]
            if missing or outsiders:
                raise InvalidRequest(
                    "A project folder is shared only with members of its project:"
                    f" {', '.join(missing + outsiders)}",
                    field="emails",
                    expected="e-mail addresses of the project's members",
                    received=missing + outsiders,
                )
            for email, user in users.items():
                await db.merge(
                    VFolderPermissionGrant(
                        vfolder_id=folder.id, user_id=user.id, permission=permission
                    )
                )
                shared.append(email)
        return {"shared_emails": shared}

    async def unshare(self, actor: Actor, ref: str, emails: Sequence[str]) -> dict[str, Any]:
        async with self.db.begin() as db:
            access = await self._access(db, actor, ref)
        self._manage(access, "unshare")
        unshared: list[str] = []
        async with self.db.begin(write=True) as db:
            users = await self._users_by_email(db, emails, "emails")
            for email, user in users.items():
                result = await db.execute(
                    sa.delete(VFolderPermissionGrant).where(
                        VFolderPermissionGrant.vfolder_id == access.folder.id,
                        VFolderPermissionGrant.user_id == user.id,
                    )
                )
                if getattr(result, "rowcount", 0):
                    unshared.append(email)
        return {"unshared_emails": unshared}

    async def leave(
        self, actor: Actor, ref: str, shared_user_uuid: str | None = None
    ) -> dict[str, Any]:
        async with self.db.begin() as db:
            access = await self._access(db, actor, ref)
        user_id = actor.user_id
        if shared_user_uuid:
            if not access.can_manage:
                raise PermissionDenied(
                    "Only the folder's owner may remove another user",
                    field="shared_user_uuid",
                    received=shared_user_uuid,
                )
            try:
                user_id = uuid.UUID(shared_user_uuid)
            except ValueError:
                raise InvalidRequest(
                    "A user id is a UUID", field="shared_user_uuid", received=shared_user_uuid
                ) from None
        elif access.is_owner:
            raise InvalidRequest(
                "You own this folder: delete it instead of leaving it", field="name", received=ref
            )
        async with self.db.begin(write=True) as db:
            result = await db.execute(
                sa.delete(VFolderPermissionGrant).where(
                    VFolderPermissionGrant.vfolder_id == access.folder.id,
                    VFolderPermissionGrant.user_id == user_id,
                )
            )
            if not getattr(result, "rowcount", 0):
                raise InvalidRequest(
                    f"The folder {access.folder.name!r} is not shared with that user",
                    field="name",
                    received=ref,
                )
        return {"msg": "left"}

    # -- the shares of the folders one manages ----------------------------------------------

    @staticmethod
    def _share_json(grant: VFolderPermissionGrant, folder: VFolder, email: str) -> dict[str, Any]:
        """Backend.AI's item of ``GET /folders/_/shared``."""
        project = folder.ownership_type is VFolderOwnershipType.GROUP
        return {
            "vfolder_id": str(folder.id),
            "vfolder_name": folder.name,
            "status": folder.status.value,
            "owner": str(folder.group_id if project else folder.user_id),
            "type": "project" if project else "user",
            "shared_to": {"uuid": str(grant.user_id), "email": email},
            "perm": grant.permission.value,
        }

    async def list_shares(self, actor: Actor, vfolder_id: str | None = None) -> dict[str, Any]:
        """The shares (accepted invitations, project folders' shares) of the folders the
        caller manages (a superadmin: every folder), by folder name then e-mail;
        ``vfolder_id``: one folder's (404 when the caller cannot see it, 403 when it may
        not manage it)."""
        async with self.db.begin() as db:
            groups = await self._member_groups(db, actor.user_id)
            grants = await self._grants(db, actor.user_id)
            query = (
                sa.select(VFolderPermissionGrant, VFolder, User.email)
                .join(VFolder, VFolder.id == VFolderPermissionGrant.vfolder_id)
                .join(User, User.id == VFolderPermissionGrant.user_id)
                .order_by(VFolder.name, User.email)
            )
            if vfolder_id is not None:
                if self._as_id(vfolder_id) is None:
                    raise InvalidRequest(
                        f"vfolder_id is a folder's id (received {vfolder_id!r})",
                        field="vfolder_id",
                        expected="a UUID (32 hexadecimal digits, dashes optional)",
                        received=vfolder_id,
                    )
                access = await self._access(db, actor, vfolder_id, field="vfolder_id")
                if not access.can_manage:
                    raise PermissionDenied(
                        f"Only the folder's owner may list the shares of {access.folder.name!r}",
                        field="vfolder_id",
                        received=vfolder_id,
                    )
                query = query.where(VFolder.id == access.folder.id)
            elif actor.role is not UserRole.SUPERADMIN:
                query = query.where(
                    sa.or_(
                        VFolder.user_id == actor.user_id,
                        VFolder.group_id.in_(list(groups)),
                        VFolder.domain_name == actor.domain_name
                        if actor.role is UserRole.ADMIN
                        else sa.false(),
                    )
                )
            rows = (await db.execute(query)).all()
        shared = []
        for grant, folder, email in rows:
            managed = self._access_to(actor, folder, groups, grants)
            if managed is not None and managed.can_manage:
                shared.append(self._share_json(grant, folder, email))
        return {"shared": shared}

    async def update_share(
        self,
        actor: Actor,
        vfolder_id: uuid.UUID,
        user_id: uuid.UUID,
        permission: VFolderPermission | None,
    ) -> dict[str, Any]:
        """A share's permission changed, or (``None``) the share removed; the folder's
        owner's (a project folder's: an admin's, or a member's with a ``wd`` share)."""
        async with self.db.begin(write=True) as db:
            access = await self._access(db, actor, vfolder_id.hex, field="vfolder")
            folder = access.folder
            if not access.can_manage:
                raise PermissionDenied(
                    f"Only the folder's owner may change the shares of {folder.name!r}",
                    field="vfolder",
                    received=str(vfolder_id),
                )
            user = await db.get(User, user_id)
            if user is None:
                raise NotFound(f"No user {str(user_id)!r}", field="user", received=str(user_id))
            grant = await db.get(VFolderPermissionGrant, (folder.id, user_id))
            if grant is None:
                raise NotFound(
                    f"The folder {folder.name!r} is not shared with {user.email}",
                    field="user",
                    received=str(user_id),
                )
            if permission is None:
                await db.delete(grant)
                return {"msg": f"The share of {folder.name!r} with {user.email} is removed"}
            grant.permission = permission
            return {
                "msg": f"{user.email} has {permission.value} on {folder.name!r}",
                "perm": permission.value,
            }
