"""Storage hosts, and folders created, listed, described, renamed and their options
changed.

Limits come from the caller's keypair resource policy: ``max_vfolder_count`` folders
per user (its own user folders, the trash included; 0 = unlimited) and
``max_vfolder_size`` bytes per folder, given to the storage proxy as the folder's
quota (0 = unlimited); usage is the proxy's.
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from accelshare.protocol.storage import FolderClone, FolderCreate, FolderRef

from ...enums import (
    UserRole,
    VFolderOwnershipType,
    VFolderPermission,
    VFolderStatus,
    VFolderUsageMode,
)
from ...errors import Conflict, InvalidRequest, LimitExceeded, PermissionDenied
from ...list_specs import VFOLDERS
from ...models import Group, GroupMember, KeypairResourcePolicy, User, VFolder
from ...querylang.compile_sql import filter_clause, order_clauses
from ..actor import Actor
from .access import LIVE, Access, FolderCore, iso
from .names import check_folder_name

__all__ = ["FolderCrud", "FolderScope", "NewFolder"]


class FolderScope(enum.Enum):
    """Which of the folders a caller may use a list holds (Backend.AI's ``vfolder_list``,
    ``vfolder_own_list``, ``vfolder_invited_list``, ``vfolder_project_list``)."""

    VISIBLE = "visible"  # own, its projects', shared with it
    OWN = "own"  # the user folders it owns
    INVITED = "invited"  # others' user folders shared with it (an accepted invitation)
    PROJECT = "project"  # the project folders of the projects it is a member of


@dataclass(frozen=True)
class NewFolder:
    name: str
    host: str | None = None
    group: str | None = None  # a project's id or name: a project folder
    usage_mode: VFolderUsageMode = VFolderUsageMode.GENERAL
    permission: VFolderPermission = VFolderPermission.READ_WRITE
    cloneable: bool = False
    unmanaged_path: str | None = None


class FolderCrud(FolderCore):
    """Storage hosts; creating, listing, describing and renaming folders; their options."""

    # -- hosts ---------------------------------------------------------------------------

    async def list_hosts(self, actor: Actor) -> dict[str, Any]:
        hosts = await self.proxies.all_hosts()
        default = await self.proxies.default_host()
        return {
            "default": default,
            "allowed": sorted(hosts),
            "volume_info": {
                host: {
                    "backend": info.backend,
                    "capabilities": info.capabilities,
                    "usage": {"total_bytes": info.total_bytes, "used_bytes": info.used_bytes},
                    "sftp_scaling_groups": [],
                }
                for host, info in hosts.items()
            },
        }

    async def _check_host(self, host: str, *, field: str) -> str:
        proxy, volume = await self.proxies.for_host(host, field=field)
        names = {v.name for v in await proxy.volumes()}
        if volume not in names:
            raise InvalidRequest(
                f"The storage proxy {proxy.name!r} has no volume {volume!r}",
                field=field,
                expected="one of " + ", ".join(f"{proxy.name}:{n}" for n in sorted(names)),
                received=host,
            )
        return host

    async def _default_host(self, field: str) -> str:
        host = await self.proxies.default_host()
        if not host:
            raise InvalidRequest(
                "No folder host given and no default host is configured (volumes/default_host)",
                field=field,
                expected="<proxy>:<volume>",
                received=None,
            )
        return host

    # -- folders -------------------------------------------------------------------------

    def _item(
        self, access: Access, *, owner_email: str | None = None, group_name: str | None = None
    ) -> dict[str, Any]:
        f = access.folder
        return {
            "id": f.id.hex,
            "name": f.name,
            "quota_scope_id": (
                f"user:{f.user_id}" if f.user_id is not None else f"project:{f.group_id}"
            ),
            "host": f.host,
            "usage_mode": f.usage_mode.value,
            "created_at": iso(f.created_at),
            "permission": access.permission.value,
            "max_size": f.quota_bytes or 0,
            "creator": f.creator,
            "ownership_type": f.ownership_type.value,
            "user": str(f.user_id) if f.user_id is not None else None,
            "group": str(f.group_id) if f.group_id is not None else None,
            "user_email": owner_email or "",
            "group_name": group_name or "",
            "cloneable": f.cloneable,
            "status": f.status.value,
            "is_owner": access.is_owner,
            "type": f.ownership_type.value,
            "unmanaged_path": None,
            "max_files": 0,
            "cur_size": 0,
        }

    async def _policy(self, db: AsyncSession, actor: Actor) -> KeypairResourcePolicy | None:
        return await db.get(KeypairResourcePolicy, actor.resource_policy)

    async def _group(self, db: AsyncSession, actor: Actor, ref: str) -> Group:
        query = sa.select(Group)
        group_id = self._as_id(ref)
        if group_id is not None:
            query = query.where(Group.id == group_id)
        else:
            query = query.where(Group.name == ref, Group.domain_name == actor.domain_name)
        group = (await db.execute(query)).scalar_one_or_none()
        if group is None:
            raise InvalidRequest(f"No project {ref!r}", field="group", received=ref)
        if group.domain_name != actor.domain_name and actor.role is not UserRole.SUPERADMIN:
            raise InvalidRequest(f"No project {ref!r}", field="group", received=ref)
        if not self._is_admin_of(actor, group.domain_name):
            member = await db.get(GroupMember, (group.id, actor.user_id))
            if member is None:
                raise PermissionDenied(
                    f"You are not a member of the project {group.name!r}",
                    field="group",
                    received=ref,
                )
        return group

    async def _check_new_name(
        self,
        db: AsyncSession,
        name: str,
        *,
        user_id: uuid.UUID | None,
        group_id: uuid.UUID | None,
        field: str,
    ) -> None:
        owner = VFolder.user_id == user_id if user_id is not None else VFolder.group_id == group_id
        taken = (await db.execute(sa.select(VFolder.id).where(owner, VFolder.name == name))).first()
        if taken is not None:
            raise Conflict(
                f"A folder named {name!r} already exists (the trash included)",
                field=field,
                received=name,
            )

    async def _check_count(self, db: AsyncSession, actor: Actor) -> None:
        policy = await self._policy(db, actor)
        limit = policy.max_vfolder_count if policy is not None else 0
        await self._check_count_of(
            db,
            actor.user_id,
            limit,
            lambda count: (
                f"You have {count} folders, the most your resource policy"
                f" {actor.resource_policy!r} allows"
            ),
        )

    async def _check_count_of(
        self, db: AsyncSession, user_id: uuid.UUID, limit: int, says: Callable[[int], str]
    ) -> None:
        """``user_id`` may own one more folder under ``limit`` (0 = unlimited); ``says``
        words the refusal from the number of folders the user owns."""
        if limit <= 0:
            return
        count = (
            await db.execute(
                sa.select(sa.func.count()).select_from(VFolder).where(VFolder.user_id == user_id)
            )
        ).scalar_one()
        if count >= limit:
            raise LimitExceeded(
                says(count) + f" (max_vfolder_count {limit});"
                " purge some from the trash or ask an administrator",
                field="max_vfolder_count",
                expected=f"fewer than {limit} folders",
                received=count,
            )

    async def _quota(self, db: AsyncSession, actor: Actor) -> int | None:
        policy = await self._policy(db, actor)
        if policy is None or policy.max_vfolder_size <= 0:
            return None
        return int(policy.max_vfolder_size)

    async def create(self, actor: Actor, spec: NewFolder) -> dict[str, Any]:
        name = check_folder_name(spec.name)
        if spec.unmanaged_path:
            raise InvalidRequest(
                "Unmanaged folders (a host path mapped as a folder) are not supported:"
                " create a folder on a storage volume",
                field="unmanaged_path",
                expected="null",
                received=spec.unmanaged_path,
            )
        host = await self._check_host(spec.host or await self._default_host("host"), field="host")
        async with self.db.begin() as db:
            group = await self._group(db, actor, spec.group) if spec.group else None
            await self._check_new_name(
                db,
                name,
                user_id=None if group else actor.user_id,
                group_id=group.id if group else None,
                field="name",
            )
            if group is None:
                await self._check_count(db, actor)
            quota = await self._quota(db, actor)
        folder = VFolder(
            id=uuid.uuid4(),
            name=name,
            host=host,
            domain_name=group.domain_name if group else actor.domain_name,
            ownership_type=VFolderOwnershipType.GROUP if group else VFolderOwnershipType.USER,
            user_id=None if group else actor.user_id,
            group_id=group.id if group else None,
            creator=actor.email,
            permission=spec.permission,
            usage_mode=spec.usage_mode,
            cloneable=spec.cloneable,
            status=VFolderStatus.READY,
            quota_bytes=quota,
            created_at=self.clock(),
            status_changed_at=self.clock(),
        )
        await self._insert_with_storage(
            folder,
            FolderCreate(volume=self._ref(folder)[0], folder_id=folder.id.hex, quota_bytes=quota),
        )
        access = Access(folder, VFolderPermission.RW_DELETE, group is None, True)
        return self._item(
            access,
            owner_email=actor.email if group is None else None,
            group_name=group.name if group else None,
        )

    async def _insert_with_storage(
        self, folder: VFolder, create: FolderCreate | FolderClone
    ) -> None:
        """The proxy's folder first, then the row; a row that cannot be written (a name
        taken meanwhile) removes the proxy's folder again: nothing half-made stays."""
        proxy, _ = await self.proxies.for_host(folder.host)
        if isinstance(create, FolderCreate):
            await proxy.create_folder(create)
        else:
            await proxy.clone_folder(create)
        try:
            async with self.db.begin(write=True) as db:
                db.add(folder)
        except IntegrityError:
            await proxy.delete_folder(
                FolderRef(volume=self._ref(folder)[0], folder_id=folder.id.hex)
            )
            raise Conflict(
                f"A folder named {folder.name!r} already exists", field="name", received=folder.name
            ) from None

    async def list_folders(
        self,
        actor: Actor,
        *,
        all_: bool = False,
        group_id: uuid.UUID | None = None,
        filter: str | None = None,
        order: str | None = None,
        scope: FolderScope = FolderScope.VISIBLE,
    ) -> list[dict[str, Any]]:
        """Own, project and shared folders (``all_`` for a superadmin: every folder),
        oldest first; ``filter`` / ``order``: Backend.AI's expressions over
        :data:`~accelshare.manager.list_specs.VFOLDERS` (a
        :class:`~accelshare.manager.querylang.QueryError` when bad).

        ``scope`` narrows the list to one kind of the caller's folders (``all_`` then
        does not apply): its own user folders, others' user folders shared with it, or
        the folders of its projects (:class:`FolderScope`); each item carries the
        caller's permission as in the whole list."""
        async with self.db.begin() as db:
            groups = await self._member_groups(db, actor.user_id)
            grants = await self._grants(db, actor.user_id)
            if scope is FolderScope.OWN:
                visible = [VFolder.user_id == actor.user_id]
            elif scope is FolderScope.INVITED:
                visible = [
                    sa.and_(
                        VFolder.id.in_(list(grants)),
                        VFolder.ownership_type == VFolderOwnershipType.USER,
                        VFolder.user_id != actor.user_id,
                    )
                ]
            elif scope is FolderScope.PROJECT:
                visible = [
                    sa.and_(
                        VFolder.group_id.in_(list(groups)),
                        VFolder.ownership_type == VFolderOwnershipType.GROUP,
                    )
                ]
            else:
                visible = [
                    VFolder.user_id == actor.user_id,
                    VFolder.group_id.in_(list(groups)),
                    VFolder.id.in_(list(grants)),
                ]
            everything = scope is FolderScope.VISIBLE and all_
            if everything and actor.role is UserRole.SUPERADMIN:
                visible.append(sa.true())
            query = (
                sa.select(VFolder, User.email, Group.name)
                .outerjoin(User, User.id == VFolder.user_id)
                .outerjoin(Group, Group.id == VFolder.group_id)
                .where(sa.or_(*visible))
            )
            if group_id is not None:
                query = query.where(VFolder.group_id == group_id)
            where = filter_clause(filter, VFOLDERS)
            if where is not None:
                query = query.where(where)
            query = query.order_by(*order_clauses(order, VFOLDERS))
            rows = (await db.execute(query)).all()
        items = []
        for folder, email, group_name in rows:
            access = self._access_to(actor, folder, groups, grants)
            if access is None:
                if not (everything and actor.role is UserRole.SUPERADMIN):
                    continue
                access = Access(folder, VFolderPermission.RW_DELETE, False, True)
            items.append(self._item(access, owner_email=email, group_name=group_name))
        return items

    async def get_id(self, actor: Actor, name: str) -> dict[str, Any]:
        async with self.db.begin() as db:
            access = await self._access(db, actor, name)
        return {"id": access.folder.id.hex, "name": access.folder.name}

    async def info(self, actor: Actor, ref: str) -> dict[str, Any]:
        async with self.db.begin() as db:
            access = await self._access(db, actor, ref)
        folder = access.folder
        num_files = used = 0
        if folder.status in LIVE:
            proxy, _ = await self.proxies.for_host(folder.host)
            usage = await proxy.usage(self._ref(folder)[1])
            num_files, used = usage.file_count, usage.used_bytes
        return {
            "name": folder.name,
            "id": folder.id.hex,
            "quota_scope_id": self._item(access)["quota_scope_id"],
            "host": folder.host,
            "status": folder.status.value,
            "numFiles": num_files,
            "num_files": num_files,
            "used_bytes": used,
            "max_size": folder.quota_bytes or 0,
            "created_at": iso(folder.created_at),
            "last_used": iso(folder.last_used),
            "user": str(folder.user_id) if folder.user_id else None,
            "group": str(folder.group_id) if folder.group_id else None,
            "type": folder.ownership_type.value,
            "is_owner": access.is_owner,
            "permission": access.permission.value,
            "usage_mode": folder.usage_mode.value,
            "cloneable": folder.cloneable,
        }

    async def rename(self, actor: Actor, ref: str, new_name: str) -> None:
        name = check_folder_name(new_name, field="new_name")
        access = await self._usable(actor, ref)
        self._manage(access, "rename")
        folder = access.folder
        try:
            async with self.db.begin(write=True) as db:
                await self._check_new_name(
                    db, name, user_id=folder.user_id, group_id=folder.group_id, field="new_name"
                )
                await db.execute(
                    sa.update(VFolder).where(VFolder.id == folder.id).values(name=name)
                )
        except IntegrityError:
            raise Conflict(
                f"A folder named {name!r} already exists", field="new_name", received=name
            ) from None

    async def update_options(
        self,
        actor: Actor,
        ref: str,
        *,
        permission: VFolderPermission | None = None,
        cloneable: bool | None = None,
    ) -> dict[str, Any]:
        """The folder's own permission (what a project folder's members get) and whether
        others may clone it; ``None`` leaves that option as it is.  The owner's (a project
        folder's: an admin's, or a member's with a ``wd`` share), as renaming is."""
        access = await self._usable(actor, ref)
        self._manage(access, "change the options of")
        folder = access.folder
        changes: dict[str, Any] = {}
        if permission is not None and permission is not folder.permission:
            changes["permission"] = permission
        if cloneable is not None and cloneable != folder.cloneable:
            changes["cloneable"] = cloneable
        if changes:
            async with self.db.begin(write=True) as db:
                await db.execute(
                    sa.update(VFolder).where(VFolder.id == folder.id).values(**changes)
                )
        return {
            "id": folder.id.hex,
            "name": folder.name,
            "permission": changes.get("permission", folder.permission).value,
            "cloneable": changes.get("cloneable", folder.cloneable),
        }
