"""Cloning: a copy of a folder, made by its storage proxy, as a new folder of the caller's
(the same limits as creating one)."""

from __future__ import annotations

import uuid
from typing import Any

from accelshare.protocol.storage import FolderClone, FolderQuota, FolderRef

from ...enums import VFolderOwnershipType, VFolderPermission, VFolderStatus, VFolderUsageMode
from ...errors import InvalidRequest, PermissionDenied
from ...models import VFolder
from ...storage_client import split_host
from ..actor import Actor
from .access import Access
from .crud import FolderCrud
from .names import check_folder_name

__all__ = ["FolderCloning"]


class FolderCloning(FolderCrud):
    """A copy of a folder as a new folder of the caller's."""

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
            Access(folder, VFolderPermission.RW_DELETE, True, True), owner_email=actor.email
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
