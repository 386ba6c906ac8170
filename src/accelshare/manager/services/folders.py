"""Storage folders (Backend.AI's vfolders) for the ``/folders`` routes and session mounts.

Who may use a folder (:meth:`FolderService._access`):

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

Names follow Backend.AI's rules: 1 to 64 characters, no ``/``, no NUL or control
character, not starting with ``.``, unique per owner (the trash included).

Limits come from the caller's keypair resource policy: ``max_vfolder_count`` folders
per user (its own user folders, the trash included; 0 = unlimited) and
``max_vfolder_size`` bytes per folder, given to the storage proxy as the folder's
quota (0 = unlimited); usage is the proxy's.

Deleting moves a folder to the trash (``delete-pending``), from where it is restored,
or purged (``delete-from-trash-bin``, ``purge``: the bytes go); :meth:`purge_old_trash`
purges what has been in the trash longer than the configured age.  A folder mounted by
a session that has not ended cannot be deleted: the error names the session.
"""

from __future__ import annotations

import json
import re
import stat
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from accelshare.common import CommonValueError
from accelshare.common.text_input import check_text
from accelshare.protocol.agent_rpc import KernelMount
from accelshare.protocol.storage import (
    DeleteRequest,
    DownloadRequest,
    FileListRequest,
    FolderClone,
    FolderCreate,
    FolderQuota,
    FolderRef,
    MkdirRequest,
    MoveRequest,
    TransferTicket,
    UploadRequest,
)
from accelshare.sched.lifecycle import FINAL_STATUSES

from ..clock import Clock, utcnow
from ..db import Database
from ..enums import (
    InvitationState,
    UserRole,
    VFolderOwnershipType,
    VFolderPermission,
    VFolderStatus,
    VFolderUsageMode,
)
from ..errors import Conflict, InvalidRequest, LimitExceeded, NotFound, PermissionDenied
from ..list_specs import VFOLDERS
from ..models import (
    Group,
    GroupMember,
    Keypair,
    KeypairResourcePolicy,
    Session,
    SessionVFolderMount,
    User,
    VFolder,
    VFolderInvitation,
    VFolderPermissionGrant,
    email_matches,
)
from ..querylang.compile_sql import filter_clause, order_clauses
from ..storage_client import StorageError, StorageProxies, split_host
from .actor import Actor
from .sessions.spec import ResolvedMount

__all__ = [
    "MAX_FOLDER_NAME",
    "Actor",
    "FolderService",
    "MountRequest",
    "NewFolder",
    "ResolvedMount",
    "check_folder_name",
    "parse_mount_specs",
]

MAX_FOLDER_NAME = 64
KERNEL_HOME = "/home/work"
_HEX_ID = re.compile(r"^[0-9a-fA-F]{32}$")
_TRASH = VFolderStatus.DELETE_PENDING
_LIVE = (VFolderStatus.READY, VFolderStatus.MOUNTED)


@dataclass(frozen=True)
class _Owner:
    """A session's owner when an admin creates it for another user (``owner_access_key``)."""

    user_id: uuid.UUID
    email: str
    role: UserRole
    domain_name: str
    resource_policy: str
    access_key: str

    @property
    def is_superadmin(self) -> bool:
        return self.role is UserRole.SUPERADMIN


@dataclass(frozen=True)
class NewFolder:
    name: str
    host: str | None = None
    group: str | None = None  # a project's id or name: a project folder
    usage_mode: VFolderUsageMode = VFolderUsageMode.GENERAL
    permission: VFolderPermission = VFolderPermission.READ_WRITE
    cloneable: bool = False
    unmanaged_path: str | None = None


@dataclass(frozen=True)
class MountRequest:
    """One folder a session asks for: ``name``, optionally where and read-only."""

    name: str
    kernel_path: str | None = None
    read_only: bool = False


@dataclass(frozen=True)
class _Access:
    folder: VFolder
    permission: VFolderPermission
    is_owner: bool
    can_manage: bool  # rename, delete, invite, share


def check_folder_name(name: Any, *, field: str = "name") -> str:
    """Backend.AI's folder name rules (see the module doc); a 400 naming ``field``."""
    expected = (
        f"1 to {MAX_FOLDER_NAME} characters, no '/', no control character, not starting with '.'"
    )
    if not isinstance(name, str) or not name or len(name) > MAX_FOLDER_NAME:
        raise InvalidRequest(
            f"A folder name has {expected} (received {name!r})",
            field=field,
            expected=expected,
            received=name,
        )
    try:
        check_text(name, field=field)
    except CommonValueError as e:
        raise InvalidRequest(str(e), field=field, expected=expected, received=name) from None
    if "/" in name or name.startswith(".") or name != name.strip():
        raise InvalidRequest(
            f"The folder name {name!r} is not allowed: {expected}, no surrounding spaces",
            field=field,
            expected=expected,
            received=name,
        )
    return name


def _check_rel_path(path: Any, *, field: str) -> str:
    """A path inside a folder as given by a client (the proxy checks it again)."""
    if not isinstance(path, str) or not path:
        raise InvalidRequest(
            f"{field} must be a path inside the folder",
            field=field,
            expected="a relative path",
            received=path,
        )
    try:
        check_text(path, field=field)
    except CommonValueError as e:
        raise InvalidRequest(
            str(e), field=field, expected="a relative path", received=path
        ) from None
    return path


def parse_mount_specs(
    mounts: Sequence[str] | None,
    mount_map: Mapping[str, str] | None,
    mount_options: Mapping[str, Any] | None = None,
) -> list[MountRequest]:
    """A create request's ``mounts`` (``name``, ``name:/path``, ``name:/path:ro``,
    ``name:ro``), ``mount_map`` (``name -> path``; a ``:ro`` suffix allowed) and
    ``mount_options`` (``name -> {"permission": "ro"}``, the official client's ``perm=ro``)
    as one list.

    >>> parse_mount_specs(["data", "models:/opt/models:ro"], {"data": "/data"})
    [MountRequest(name='data', kernel_path='/data', read_only=False), MountRequest(name='models', kernel_path='/opt/models', read_only=True)]
    """
    found: dict[str, MountRequest] = {}
    for index, spec in enumerate(mounts or []):
        field = f"mounts[{index}]"
        if not isinstance(spec, str) or not spec:
            raise InvalidRequest(
                f"A mount is name[:/path][:ro] (received {spec!r})",
                field=field,
                expected="name[:/path][:ro]",
                received=spec,
            )
        name, path, read_only = _split_mount(spec, field)
        found[name] = MountRequest(name, path, read_only)
    for name, target in (mount_map or {}).items():
        check_folder_name(name, field=f"mount_map.{name}")
        path, read_only = target, False
        if isinstance(target, str) and target.endswith(":ro"):
            path, read_only = target[: -len(":ro")], True
        previous = found.get(name)
        found[name] = MountRequest(
            name,
            _check_kernel_path(path, field=f"mount_map.{name}"),
            read_only or (previous.read_only if previous else False),
        )
    for name, options in (mount_options or {}).items():
        if name not in found or not isinstance(options, Mapping):
            continue
        permission = options.get("permission") or options.get("perm")
        if permission in ("ro", "read-only", "READ_ONLY") or options.get("readonly") in (
            True,
            "true",
            "1",
        ):
            found[name] = MountRequest(name, found[name].kernel_path, True)
    return list(found.values())


def _split_mount(spec: str, field: str) -> tuple[str, str | None, bool]:
    parts = spec.split(":")
    read_only = False
    if len(parts) > 1 and parts[-1] in ("ro", "rw"):
        read_only = parts.pop() == "ro"
    if len(parts) > 2:
        raise InvalidRequest(
            f"A mount is name[:/path][:ro] (received {spec!r})",
            field=field,
            expected="name[:/path][:ro]",
            received=spec,
        )
    name = check_folder_name(parts[0], field=field)
    path = _check_kernel_path(parts[1], field=field) if len(parts) == 2 else None
    return name, path, read_only


def _check_kernel_path(path: Any, *, field: str) -> str:
    expected = "an absolute path without '..' (or a name under /home/work)"
    if not isinstance(path, str) or not path or "\x00" in path:
        raise InvalidRequest(
            f"A mount path is {expected} (received {path!r})",
            field=field,
            expected=expected,
            received=path,
        )
    if not path.startswith("/"):
        path = f"{KERNEL_HOME}/{path}"
    if ".." in path.split("/") or path.rstrip("/") in ("", KERNEL_HOME):
        raise InvalidRequest(
            f"A mount path is {expected} (received {path!r})",
            field=field,
            expected=expected,
            received=path,
        )
    return str(path).rstrip("/")


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def _mode_text(mode: int, kind: str) -> str:
    prefix = {"dir": stat.S_IFDIR, "symlink": stat.S_IFLNK}.get(kind, stat.S_IFREG)
    return stat.filemode(prefix | mode)


class FolderService:
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
    ) -> _Access | None:
        admin = self._is_admin_of(actor, folder.domain_name)
        if folder.user_id == actor.user_id:
            return _Access(folder, VFolderPermission.RW_DELETE, True, True)
        grant = grants.get(folder.id)
        if folder.ownership_type is VFolderOwnershipType.GROUP:
            if grant is not None and folder.group_id in groups:
                return _Access(folder, grant, False, grant is VFolderPermission.RW_DELETE or admin)
            if admin:
                return _Access(folder, VFolderPermission.RW_DELETE, False, True)
            if folder.group_id in groups:
                return _Access(folder, folder.permission, False, False)
            return None
        if grant is not None:
            return _Access(folder, grant, False, False)
        if admin:
            return _Access(folder, VFolderPermission.RW_DELETE, False, True)
        return None

    async def _access(
        self, db: AsyncSession, actor: Actor, ref: str, *, field: str = "name"
    ) -> _Access:
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

    async def _usable(self, actor: Actor, ref: str, *, write: bool = False) -> _Access:
        async with self.db.begin() as db:
            access = await self._access(db, actor, ref)
        folder = access.folder
        if folder.status not in _LIVE:
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
        self, access: _Access, *, owner_email: str | None = None, group_name: str | None = None
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
            "created_at": _iso(f.created_at),
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
        if limit <= 0:
            return
        count = (
            await db.execute(
                sa.select(sa.func.count())
                .select_from(VFolder)
                .where(VFolder.user_id == actor.user_id)
            )
        ).scalar_one()
        if count >= limit:
            raise LimitExceeded(
                f"You have {count} folders, the most your resource policy"
                f" {actor.resource_policy!r} allows (max_vfolder_count {limit});"
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
        access = _Access(folder, VFolderPermission.RW_DELETE, group is None, True)
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
    ) -> list[dict[str, Any]]:
        """Own, project and shared folders (``all_`` for a superadmin: every folder),
        oldest first; ``filter`` / ``order``: Backend.AI's expressions over
        :data:`~accelshare.manager.list_specs.VFOLDERS` (a
        :class:`~accelshare.manager.querylang.QueryError` when bad)."""
        async with self.db.begin() as db:
            groups = await self._member_groups(db, actor.user_id)
            grants = await self._grants(db, actor.user_id)
            visible = [
                VFolder.user_id == actor.user_id,
                VFolder.group_id.in_(list(groups)),
                VFolder.id.in_(list(grants)),
            ]
            if all_ and actor.role is UserRole.SUPERADMIN:
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
                if not (all_ and actor.role is UserRole.SUPERADMIN):
                    continue
                access = _Access(folder, VFolderPermission.RW_DELETE, False, True)
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
        if folder.status in _LIVE:
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
            "created_at": _iso(folder.created_at),
            "last_used": _iso(folder.last_used),
            "user": str(folder.user_id) if folder.user_id else None,
            "group": str(folder.group_id) if folder.group_id else None,
            "type": folder.ownership_type.value,
            "is_owner": access.is_owner,
            "permission": access.permission.value,
            "usage_mode": folder.usage_mode.value,
            "cloneable": folder.cloneable,
        }

    def _manage(self, access: _Access, what: str) -> None:
        if not access.can_manage:
            raise PermissionDenied(
                f"Only the folder's owner may {what} {access.folder.name!r}",
                field="name",
                received=access.folder.name,
            )

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

    async def _mounting_sessions(self, db: AsyncSession, folder_id: uuid.UUID) -> list[str]:
        rows = await db.execute(
            sa.select(Session.name)
            .join(SessionVFolderMount, SessionVFolderMount.session_id == Session.id)
            .where(SessionVFolderMount.vfolder_id == folder_id)
            .where(Session.status.not_in(list(FINAL_STATUSES)))
            .order_by(Session.name)
        )
        return list(rows.scalars())

    async def delete(self, actor: Actor, ref: str) -> None:
        """Move to the trash (``delete-pending``)."""
        async with self.db.begin(write=True) as db:
            access = await self._access(db, actor, ref, field="id")
            self._manage(access, "delete")
            folder = access.folder
            if folder.status is _TRASH:
                raise Conflict(
                    f"The folder {folder.name!r} is already in the trash", field="id", received=ref
                )
            sessions = await self._mounting_sessions(db, folder.id)
            if sessions:
                raise Conflict(
                    f"The folder {folder.name!r} is mounted in the running session"
                    f"{'s' if len(sessions) > 1 else ''} {', '.join(repr(s) for s in sessions)}:"
                    " end the session first",
                    field="id",
                    received=ref,
                    sessions=sessions,
                )
            await db.execute(
                sa.update(VFolder)
                .where(VFolder.id == folder.id)
                .values(status=_TRASH, status_changed_at=self.clock())
            )

    async def restore(self, actor: Actor, ref: str) -> None:
        async with self.db.begin(write=True) as db:
            access = await self._access(db, actor, ref, field="id")
            self._manage(access, "restore")
            if access.folder.status is not _TRASH:
                raise Conflict(
                    f"The folder {access.folder.name!r} is not in the trash"
                    f" ({access.folder.status.value})",
                    field="id",
                    received=ref,
                )
            await db.execute(
                sa.update(VFolder)
                .where(VFolder.id == access.folder.id)
                .values(status=VFolderStatus.READY, status_changed_at=self.clock())
            )

    async def purge(self, actor: Actor, ref: str) -> None:
        """Delete a folder in the trash for good (its bytes on the proxy too)."""
        async with self.db.begin(write=True) as db:
            access = await self._access(db, actor, ref, field="id")
            self._manage(access, "purge")
            if access.folder.status not in (_TRASH, VFolderStatus.DELETE_ERROR):
                raise Conflict(
                    f"The folder {access.folder.name!r} is not in the trash: delete it first",
                    field="id",
                    received=ref,
                )
            await db.execute(
                sa.update(VFolder)
                .where(VFolder.id == access.folder.id)
                .values(status=VFolderStatus.DELETE_ONGOING, status_changed_at=self.clock())
            )
        await self._purge_one(access.folder)

    async def _purge_one(self, folder: VFolder) -> None:
        try:
            proxy, _ = await self.proxies.for_host(folder.host)
            await proxy.delete_folder(self._ref(folder)[1])
        except Exception:
            async with self.db.begin(write=True) as db:
                await db.execute(
                    sa.update(VFolder)
                    .where(VFolder.id == folder.id)
                    .values(status=VFolderStatus.DELETE_ERROR, status_changed_at=self.clock())
                )
            raise
        async with self.db.begin(write=True) as db:
            await db.execute(sa.delete(VFolder).where(VFolder.id == folder.id))

    async def purge_old_trash(self, max_age: timedelta | None = None) -> list[str]:
        """Purge every folder in the trash for longer than ``max_age`` (default: the
        service's ``trash_max_age``; ``None`` there: nothing).  Returns the purged ids;
        a proxy that fails leaves its folder ``delete-error`` for the next round."""
        age = max_age if max_age is not None else self.trash_max_age
        if age is None:
            return []
        cutoff = self.clock() - age
        async with self.db.begin(write=True) as db:
            rows = await db.execute(
                sa.select(VFolder).where(
                    VFolder.status == _TRASH, VFolder.status_changed_at <= cutoff
                )
            )
            old = list(rows.scalars())
            if old:
                await db.execute(
                    sa.update(VFolder)
                    .where(VFolder.id.in_([f.id for f in old]))
                    .values(status=VFolderStatus.DELETE_ONGOING)
                )
        purged = []
        for folder in old:
            try:
                await self._purge_one(folder)
            except Exception:
                continue
            purged.append(folder.id.hex)
        return purged

    async def clone(
        self,
        actor: Actor,
        ref: str,
        *,
        target_name: str,
        target_host: str | None = None,
        usage_mode: VFolderUsageMode = VFolderUsageMode.GENERAL,
        permission: VFolderPermission = VFolderPermission.READ_WRITE,
    ) -> dict[str, Any]:
        name = check_folder_name(target_name, field="target_name")
        access = await self._usable(actor, ref)
        source = access.folder
        if not source.cloneable and not access.is_owner and not access.can_manage:
            raise PermissionDenied(
                f"The folder {source.name!r} may not be cloned (it is not cloneable)",
                field="name",
                received=ref,
            )
        host = source.host
        if target_host and target_host != source.host:
            s_proxy, _ = split_host(source.host)
            t_proxy, _ = split_host(target_host, field="target_host")
            if s_proxy != t_proxy:
                raise InvalidRequest(
                    "A folder is cloned on its own storage proxy",
                    field="target_host",
                    expected=f"a volume of {s_proxy!r}",
                    received=target_host,
                )
            host = await self._check_host(target_host, field="target_host")
        async with self.db.begin() as db:
            await self._check_new_name(
                db, name, user_id=actor.user_id, group_id=None, field="target_name"
            )
            await self._check_count(db, actor)
            quota = await self._quota(db, actor)
        folder = VFolder(
            id=uuid.uuid4(),
            name=name,
            host=host,
            domain_name=actor.domain_name,
            ownership_type=VFolderOwnershipType.USER,
            user_id=actor.user_id,
            group_id=None,
            creator=actor.email,
            permission=permission,
            usage_mode=usage_mode,
            cloneable=False,
            status=VFolderStatus.READY,
            quota_bytes=quota,
            created_at=self.clock(),
            status_changed_at=self.clock(),
        )
        _, target_volume = split_host(host)
        await self._insert_with_storage(
            folder,
            FolderClone(
                source=self._ref(source)[1],
                target=FolderRef(volume=target_volume, folder_id=folder.id.hex),
            ),
        )
        if quota is not None:
            proxy, _ = await self.proxies.for_host(host)
            await proxy.set_quota(
                FolderQuota(volume=target_volume, folder_id=folder.id.hex, quota_bytes=quota)
            )
        item = self._item(
            _Access(folder, VFolderPermission.RW_DELETE, True, True), owner_email=actor.email
        )
        return {
            k: item[k]
            for k in (
                "id",
                "name",
                "host",
                "usage_mode",
                "permission",
                "creator",
                "ownership_type",
                "user",
                "group",
                "cloneable",
            )
        }

    # -- invitations and shares ----------------------------------------------------------

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
            "created_at": _iso(inv.created_at),
            "modified_at": _iso(inv.modified_at),
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

    # -- files ---------------------------------------------------------------------------

    async def request_upload(self, actor: Actor, ref: str, path: str, size: int) -> dict[str, Any]:
        _check_rel_path(path, field="path")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise InvalidRequest(
                "size is the file's length in bytes",
                field="size",
                expected="an integer >= 0",
                received=size,
            )
        access = await self._usable(actor, ref, write=True)
        proxy, volume = await self.proxies.for_host(access.folder.host)
        ticket = await proxy.upload(
            UploadRequest(volume=volume, folder_id=access.folder.id.hex, path=path, size=size)
        )
        return self._ticket(ticket)

    async def request_download(
        self, actor: Actor, ref: str, path: str, archive: bool = False
    ) -> dict[str, Any]:
        _check_rel_path(path, field="path")
        access = await self._usable(actor, ref)
        proxy, volume = await self.proxies.for_host(access.folder.host)
        ticket = await proxy.download(
            DownloadRequest(
                volume=volume, folder_id=access.folder.id.hex, path=path, archive=archive
            )
        )
        return self._ticket(ticket)

    @staticmethod
    def _ticket(ticket: TransferTicket) -> dict[str, Any]:
        return {"token": ticket.token, "url": ticket.url}

    async def list_files(self, actor: Actor, ref: str, path: str = ".") -> dict[str, Any]:
        _check_rel_path(path or ".", field="path")
        access = await self._usable(actor, ref)
        proxy, volume = await self.proxies.for_host(access.folder.host)
        entries: list[dict[str, Any]] = []
        cursor: str | None = None
        while True:
            page = await proxy.list_files(
                FileListRequest(
                    volume=volume, folder_id=access.folder.id.hex, path=path or ".", cursor=cursor
                )
            )
            for item in page.items:
                entries.append(
                    {
                        "name": item.name,
                        "filename": item.name,
                        "type": item.type.upper() if item.type != "symlink" else "SYMLINK",
                        "size": item.size,
                        "mode": _mode_text(item.mode, item.type),
                        "ctime": item.created,
                        "mtime": item.modified,
                        "atime": item.modified,
                    }
                )
            cursor = page.next_cursor
            if cursor is None:
                break
        # 25.5's client reads "files" (a JSON text); newer ones read "items"
        return {"items": entries, "files": json.dumps(entries)}

    async def mkdir(
        self,
        actor: Actor,
        ref: str,
        paths: str | Sequence[str],
        *,
        parents: bool = False,
        exist_ok: bool = False,
    ) -> dict[str, Any]:
        if isinstance(paths, str):
            listed = [paths]
        elif isinstance(paths, list | tuple) and all(isinstance(p, str) for p in paths):
            listed = list(paths)
        else:
            raise InvalidRequest(
                "path: expected a directory path or a list of them",
                field="path",
                expected="a string or a list of strings",
                received=paths,
            )
        if not listed:
            raise InvalidRequest("path names at least one directory", field="path", received=paths)
        for index, p in enumerate(listed):
            _check_rel_path(p, field=f"path[{index}]")
        access = await self._usable(actor, ref, write=True)
        proxy, volume = await self.proxies.for_host(access.folder.host)
        success: list[dict[str, Any]] = []
        failed: list[dict[str, Any]] = []
        for p in listed:
            try:
                await proxy.mkdir(
                    MkdirRequest(
                        volume=volume,
                        folder_id=access.folder.id.hex,
                        paths=[p],
                        parents=parents,
                        exist_ok=exist_ok,
                    )
                )
            except StorageError as e:
                failed.append({"item": p, "msg": e.detail})
            else:
                success.append({"item": p, "msg": None})
        return {"results": {"success": success, "failed": failed}}

    async def rename_file(self, actor: Actor, ref: str, target_path: str, new_name: str) -> None:
        _check_rel_path(target_path, field="target_path")
        _check_rel_path(new_name, field="new_name")
        if "/" in new_name:
            raise InvalidRequest(
                "new_name is a file name, without '/'",
                field="new_name",
                expected="a name without '/'",
                received=new_name,
            )
        parent = target_path.rstrip("/").rpartition("/")[0]
        await self.move_file(
            actor, ref, target_path, f"{parent}/{new_name}" if parent else new_name
        )

    async def move_file(self, actor: Actor, ref: str, src: str, dst: str) -> None:
        _check_rel_path(src, field="src")
        _check_rel_path(dst, field="dst")
        access = await self._usable(actor, ref, write=True)
        proxy, volume = await self.proxies.for_host(access.folder.host)
        await proxy.move(
            MoveRequest(volume=volume, folder_id=access.folder.id.hex, source=src, target=dst)
        )

    async def delete_files(
        self, actor: Actor, ref: str, files: Sequence[str], *, recursive: bool = False
    ) -> None:
        if isinstance(files, str) or not files:
            raise InvalidRequest(
                "files is a list of paths",
                field="files",
                expected="a non-empty list",
                received=files,
            )
        for index, f in enumerate(files):
            _check_rel_path(f, field=f"files[{index}]")
        access = await self._usable(actor, ref, write=True)
        proxy, volume = await self.proxies.for_host(access.folder.host)
        await proxy.delete_files(
            DeleteRequest(
                volume=volume,
                folder_id=access.folder.id.hex,
                paths=list(files),
                recursive=recursive,
            )
        )

    # -- session mounts ------------------------------------------------------------------

    async def actor_for(self, caller: Actor, owner_access_key: str | None) -> Actor:
        """Whose folders a session mounts: the caller's, or for an admin acting for
        another user (``owner_access_key``), that user's.  A user naming another key, or
        an unknown key, keeps the caller (the session's create refuses it with its own
        error, and no folder of another user is looked at)."""
        if not owner_access_key or caller.role is UserRole.USER:
            return caller
        async with self.db.begin() as db:
            row = (
                await db.execute(
                    sa.select(User, Keypair.resource_policy)
                    .join(Keypair, Keypair.user_id == User.id)
                    .where(Keypair.access_key == owner_access_key)
                )
            ).first()
        if row is None:
            return caller
        user, policy = row
        if caller.role is not UserRole.SUPERADMIN and user.domain_name != caller.domain_name:
            return caller
        return _Owner(user.id, user.email, user.role, user.domain_name, policy, owner_access_key)

    async def resolve_mounts(
        self, actor: Actor, requests: Sequence[MountRequest]
    ) -> list[ResolvedMount]:
        """Each requested folder as a :class:`KernelMount`: a folder the caller may use,
        ready; ``read_only`` for a ``ro`` share or a ``:ro`` request; a 400 naming the
        folder otherwise."""
        resolved: list[ResolvedMount] = []
        paths: dict[str, str] = {}
        for index, req in enumerate(requests):
            field = f"mounts[{index}]"
            try:
                async with self.db.begin() as db:
                    access = await self._access(db, actor, req.name, field=field)
            except NotFound:
                raise InvalidRequest(
                    f"No folder {req.name!r} to mount: create it first (`vfolder create`)",
                    field=field,
                    expected="a folder of yours, of your project, or shared with you",
                    received=req.name,
                ) from None
            folder = access.folder
            if any(r.folder_id == folder.id for r in resolved):
                raise InvalidRequest(
                    f"The folder {req.name!r} is asked for twice: mount it once",
                    field=field,
                    expected="each folder once",
                    received=req.name,
                )
            if folder.status not in _LIVE:
                raise InvalidRequest(
                    f"The folder {req.name!r} cannot be mounted: it is {folder.status.value}",
                    field=field,
                    received=req.name,
                )
            kernel_path = req.kernel_path or f"{KERNEL_HOME}/{folder.name}"
            if kernel_path in paths:
                raise InvalidRequest(
                    f"The folders {paths[kernel_path]!r} and {req.name!r} are both mounted at {kernel_path}",
                    field=field,
                    expected="one folder per path",
                    received=kernel_path,
                )
            paths[kernel_path] = req.name
            proxy, volume = await self.proxies.for_host(folder.host)
            mount = await proxy.mount(FolderRef(volume=volume, folder_id=folder.id.hex))
            resolved.append(
                ResolvedMount(
                    folder.id,
                    KernelMount(
                        name=folder.name,
                        host_path=mount.path,
                        kernel_path=kernel_path,
                        read_only=req.read_only or not access.permission.can_write,
                    ),
                )
            )
        return resolved
