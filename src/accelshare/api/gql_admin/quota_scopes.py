"""Storage quota scopes and folder host permissions in Backend.AI's admin GraphQL:
refused, each with an error that says what to use instead (docs/compatibility.md).

* ``quota_scope``, ``set_quota_scope``, ``unset_quota_scope``: no per-user or
  per-project storage quota scopes;
* ``vfolder_host_permissions``: no per-host folder permissions.
"""

from __future__ import annotations

import strawberry
from strawberry.types import Info

from .common import refuse, superadmin_manager

__all__ = ["HOST_PERMISSIONS", "QuotaScopeMutation", "QuotaScopeQuery"]

_QUOTA_SCOPE = (
    "quota scopes",
    "accelshare has no per-user or per-project storage quota scopes",
)

# the feature and what to use instead (also the root field ``vfolder_host_permission_list``
# of :mod:`accelshare.api.gql_refused`)
HOST_PERMISSIONS = (
    "folder host permissions",
    "accelshare keeps no per-host folder permissions",
)


@strawberry.type(name="QuotaDetails")
class QuotaDetails:
    usage_bytes: int | None
    usage_count: int | None
    hard_limit_bytes: int | None


@strawberry.type(name="QuotaScope")
class QuotaScope:
    quota_scope_id: str
    storage_host_name: str
    details: QuotaDetails


@strawberry.type(name="SetQuotaScope")
class SetQuotaScope:
    quota_scope: QuotaScope | None


@strawberry.input(name="QuotaScopeInput")
class QuotaScopeInput:
    hard_limit_bytes: int | None = None


@strawberry.type(name="PredefinedAtomicPermission")
class VFolderHostPermissions:
    vfolder_host_permission_list: list[str]


@strawberry.type
class QuotaScopeQuery:
    @strawberry.field
    async def quota_scope(
        self, info: Info, storage_host_name: str, quota_scope_id: str
    ) -> QuotaScope | None:
        superadmin_manager(info)
        raise refuse(*_QUOTA_SCOPE)

    @strawberry.field
    async def vfolder_host_permissions(self, info: Info) -> VFolderHostPermissions | None:
        raise refuse(*HOST_PERMISSIONS)


@strawberry.type
class QuotaScopeMutation:
    @strawberry.mutation
    async def set_quota_scope(
        self, info: Info, storage_host_name: str, quota_scope_id: str, props: QuotaScopeInput
    ) -> SetQuotaScope:
        superadmin_manager(info)
        raise refuse(*_QUOTA_SCOPE)

    @strawberry.mutation
    async def unset_quota_scope(
        self, info: Info, storage_host_name: str, quota_scope_id: str
    ) -> SetQuotaScope:
        superadmin_manager(info)
        raise refuse(*_QUOTA_SCOPE)
