"""Who may use a folder, how a request names one, and the state every part of
:class:`~accelshare.manager.services.folders.FolderService` shares.

Who may use a folder (:meth:`FolderCore._access`):

* its owner (a user folder's user): everything (``wd``);
* a user it is shared with (an accepted invitation, or a project folder's per-user
  share): that share's permission (``ro`` / ``rw`` / ``wd``);
* a member of a project folder's project: the folder's own ``permission``;
* a superadmin, and an admin of the folder's domain: everything;
* anyone else: 404, as if the folder did not exist (ids and names do not leak).

A folder is named by its id (32 hex digits, Backend.AI's ``request_key``, or a UUID with
dashes) or by its name among the folders the caller may use (own first).  ``ro`` access
cannot upload, make directories, move or delete files; renaming, deleting, inviting and
sharing belong to the owner (a project folder: an admin, or a ``wd`` share).
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from accelshare.protocol.storage import FolderRef

from ...clock import Clock, utcnow
from ...db import Database
from ...enums import UserRole, VFolderOwnershipType, VFolderPermission, VFolderStatus
from ...errors import Conflict, NotFound, PermissionDenied
from ...models import GroupMember, VFolder, VFolderPermissionGrant
from ...storage_client import StorageProxies, split_host
from ..actor import Actor

__all__ = ["LIVE", "TRASH", "Access", "FolderCore", "iso"]

_HEX_ID = re.compile(r"^[0-9a-fA-F]{32}$")
TRASH = VFolderStatus.DELETE_PENDING
LIVE = (VFolderStatus.READY, VFolderStatus.MOUNTED)


@dataclass(frozen=True)
class Access:
    folder: VFolder
    permission: VFolderPermission
    is_owner: bool
    can_manage: bool  # rename, delete, invite, share


def iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


class FolderCore:
    """The store, the storage proxies and the clock; the access rules (module doc)."""

    def __init__(
        self,
        *,
        db: Database,
        proxies: StorageProxies,
        clock: Clock = utcnow,
        trash_max_age: timedelta | None = None,
    ) -> None:
        self.db = db
        self.proxies = proxies
        self.clock = clock
        self.trash_max_age = trash_max_age

    # -- look-ups ------------------------------------------------------------------------

    @staticmethod
    def _is_admin_of(actor: Actor, domain: str) -> bool:
        if actor.role is UserRole.SUPERADMIN:
            return True
        return actor.role is UserRole.ADMIN and actor.domain_name == domain

    async def _member_groups(self, db: AsyncSession, user_id: uuid.UUID) -> set[uuid.UUID]:
        rows = await db.execute(
            sa.select(GroupMember.group_id).where(GroupMember.user_id == user_id)
        )
        return set(rows.scalars())

    async def _grants(
        self, db: AsyncSession, user_id: uuid.UUID
    ) -> dict[uuid.UUID, VFolderPermission]:
        rows = await db.execute(
            sa.select(VFolderPermissionGrant.vfolder_id, VFolderPermissionGrant.permission).where(
                VFolderPermissionGrant.user_id == user_id
            )
        )
        return {row[0]: row[1] for row in rows}

    def _access_to(
        self,
        actor: Actor,
        folder: VFolder,
        groups: set[uuid.UUID],
        grants: dict[uuid.UUID, VFolderPermission],
    ) -> Access | None:
        admin = self._is_admin_of(actor, folder.domain_name)
        if folder.user_id == actor.user_id:
            return Access(folder, VFolderPermission.RW_DELETE, True, True)
        grant = grants.get(folder.id)
        if folder.ownership_type is VFolderOwnershipType.GROUP:
            if grant is not None and folder.group_id in groups:
                return Access(folder, grant, False, grant is VFolderPermission.RW_DELETE or admin)
            if admin:
                return Access(folder, VFolderPermission.RW_DELETE, False, True)
            if folder.group_id in groups:
                return Access(folder, folder.permission, False, False)
            return None
        if grant is not None:
            return Access(folder, grant, False, False)
        if admin:
            return Access(folder, VFolderPermission.RW_DELETE, False, True)
        return None

    async def _access(
        self, db: AsyncSession, actor: Actor, ref: str, *, field: str = "name"
    ) -> Access:
        groups = await self._member_groups(db, actor.user_id)
        grants = await self._grants(db, actor.user_id)
        candidates: list[VFolder] = []
        folder_id = self._as_id(ref)
        if folder_id is not None:
            found = await db.get(VFolder, folder_id)
            if found is not None:
                candidates.append(found)
        if not candidates:
            rows = await db.execute(
                sa.select(VFolder)
                .where(VFolder.name == ref)
                .where(
                    sa.or_(
                        VFolder.user_id == actor.user_id,
                        VFolder.group_id.in_(list(groups)),
                        VFolder.id.in_(list(grants)),
                        sa.true() if actor.role is UserRole.SUPERADMIN else sa.false(),
                        VFolder.domain_name == actor.domain_name
                        if actor.role is UserRole.ADMIN
                        else sa.false(),
                    )
                )
            )
            # own folders first, then project folders, then shared ones
            candidates = sorted(
                rows.scalars(),
                key=lambda f: (f.user_id != actor.user_id, f.group_id is None, str(f.id)),
            )
        for folder in candidates:
            access = self._access_to(actor, folder, groups, grants)
            if access is not None:
                return access
        raise NotFound(f"No folder {ref!r}", field=field, received=ref)

    @staticmethod
    def _as_id(ref: str) -> uuid.UUID | None:
        if _HEX_ID.match(ref) or (len(ref) == 36 and ref.count("-") == 4):
            try:
                return uuid.UUID(ref)
            except ValueError:
                return None
        return None

    async def _usable(self, actor: Actor, ref: str, *, write: bool = False) -> Access:
        async with self.db.begin() as db:
            access = await self._access(db, actor, ref)
        folder = access.folder
        if folder.status not in LIVE:
            raise Conflict(
                f"The folder {folder.name!r} is {folder.status.value}: restore it first",
                field="name",
                received=ref,
                folder_status=folder.status.value,
            )
        if write and not access.permission.can_write:
            raise PermissionDenied(
                f"The folder {folder.name!r} is shared with you read-only",
                field="name",
                received=ref,
                permission=access.permission.value,
            )
        return access

    @staticmethod
    def _ref(folder: VFolder) -> tuple[str, FolderRef]:
        _, volume = split_host(folder.host)
        return volume, FolderRef(volume=volume, folder_id=folder.id.hex)

    def _manage(self, access: Access, what: str) -> None:
        if not access.can_manage:
            raise PermissionDenied(
                f"Only the folder's owner may {what} {access.folder.name!r}",
                field="name",
                received=access.folder.name,
            )
