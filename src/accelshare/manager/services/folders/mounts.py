"""The folders a new session mounts: whose folders (the caller's, or the owner's an admin
creates the session for) and each one resolved to a :class:`KernelMount`."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import sqlalchemy as sa

from accelshare.protocol.agent_rpc import KernelMount
from accelshare.protocol.storage import FolderRef

from ...enums import UserRole
from ...errors import InvalidRequest, NotFound
from ...models import Keypair, User
from ..actor import Actor
from ..sessions.spec import ResolvedMount
from .access import LIVE, FolderCore
from .names import KERNEL_HOME, MountRequest

__all__ = ["FolderMounts"]


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


class FolderMounts(FolderCore):
    """The folders a new session mounts."""

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
            if folder.status not in LIVE:
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
