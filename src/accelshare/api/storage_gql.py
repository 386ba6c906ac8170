"""Backend.AI's storage volume queries (``backend.ai admin storage list`` / ``info``).

* ``storage_volume_list(limit, offset, filter, order) { items { ... } total_count }``;
* ``storage_volume(id: "<proxy>:<volume>")``.

Superadmin only, as in Backend.AI.  The volumes come from the storage proxies the
configuration store names (:meth:`StorageProxies.volume_list
<accelshare.manager.storage_client.StorageProxies.volume_list>`).  Fields
accelshare's proxies do not report are null: ``fsprefix``, ``hardware_metadata``,
``performance_metric``; ``filter`` and ``order`` are refused (the list is ordered by
id); ``usage`` is ``{"capacity_bytes", "used_bytes"}`` when the
proxy reports the volume's file system size, else null.
"""

from __future__ import annotations

import json

import strawberry
from strawberry.types import Info

from accelshare.manager.runtime import Manager
from accelshare.manager.storage_client import StorageVolume

from .auth import Identity
from .gql_admin.common import check_page

__all__ = ["StorageQuery", "StorageVolumeList", "StorageVolumeNode"]


@strawberry.type(name="StorageVolume")
class StorageVolumeNode:
    id: str  # "<proxy>:<volume>"
    proxy: str
    name: str
    backend: str
    path: str
    capabilities: list[str]
    usage: str | None
    fsprefix: str | None = None
    hardware_metadata: str | None = None
    performance_metric: str | None = None

    @classmethod
    def of(cls, volume: StorageVolume) -> StorageVolumeNode:
        info = volume.info
        usage = None
        if info.total_bytes is not None and info.used_bytes is not None:
            usage = json.dumps({"capacity_bytes": info.total_bytes, "used_bytes": info.used_bytes})
        return cls(
            id=volume.id,
            proxy=volume.proxy,
            name=info.name,
            backend=info.backend,
            path=info.path,
            capabilities=list(info.capabilities),
            usage=usage,
        )


@strawberry.type(name="StorageVolumeList")
class StorageVolumeList:
    items: list[StorageVolumeNode]
    total_count: int


def _superadmin(info: Info) -> Manager:
    manager: Manager = info.context["manager"]
    identity: Identity = info.context["identity"]
    if not identity.is_superadmin:
        raise PermissionError(
            f"Storage volumes need the superadmin role; {identity.email} has {identity.role}"
        )
    return manager


@strawberry.type
class StorageQuery:
    @strawberry.field
    async def storage_volume_list(
        self,
        info: Info,
        limit: int,
        offset: int,
        filter: str | None = None,
        order: str | None = None,
    ) -> StorageVolumeList:
        manager = _superadmin(info)
        check_page("storage_volume_list", limit, offset)
        for name, value in (("filter", filter), ("order", order)):
            if value:
                raise ValueError(
                    f"storage_volume_list({name}): the volume list takes no {name}"
                    f" expression, received {value!r}; leave {name} out (there are few"
                    " volumes: the whole list is one page)"
                )
        volumes = await manager.storage.volume_list()
        return StorageVolumeList(
            items=[StorageVolumeNode.of(v) for v in volumes[offset : offset + limit]],
            total_count=len(volumes),
        )

    @strawberry.field
    async def storage_volume(self, info: Info, id: str) -> StorageVolumeNode:
        manager = _superadmin(info)
        return StorageVolumeNode.of(await manager.storage.find_volume(id))
