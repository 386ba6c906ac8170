"""The rest of Backend.AI's admin GraphQL that the client 25.5.2 sends: what maps onto
accelshare works, the rest is refused with an error that says what to use instead.

Works (superadmin):

* ``alias_image(alias, target, architecture) { ok msg }`` — the catalogue alias
  (``accelshare admin image alias``); re-pointing an existing alias is allowed;
* ``dealias_image(alias) { ok msg }``.

Refused, each with a GraphQL error naming the feature and what to use instead
(docs/compatibility.md):

* ``rescan_images``: accelshare does not scan registries; images are registered in
  its catalogue;
* ``associate_scaling_group_with_{domain,user_group,keypair}`` and their
  ``disassociate_*`` / ``disassociate_all_*``: accelshare's scaling groups are not tied
  to domains, groups or keypairs (a session names its scaling group);
* ``quota_scope``, ``set_quota_scope``, ``unset_quota_scope``: no per-user or
  per-project storage quota scopes;
* ``vfolder_host_permissions``: no per-host folder permissions.
"""

from __future__ import annotations

import uuid

import strawberry
from strawberry.types import Info

from accelshare.manager.runtime import Manager

from .auth import Identity

__all__ = ["AdminMoreMutation", "AdminMoreQuery", "NotSupportedByAccelshare"]


class NotSupportedByAccelshare(ValueError):
    """A Backend.AI feature accelshare does not have (a GraphQL error, not a bug)."""

    def __init__(self, feature: str, instead: str) -> None:
        super().__init__(
            f"Not supported by accelshare: {feature}. {instead} (see docs/compatibility.md)"
        )


_SGROUP_ASSOCIATION = (
    "scaling-group association",
    "accelshare's scaling groups are not tied to domains, groups or keypairs: every"
    " active scaling group is open to every user, and a session names its own"
    " (`--scaling-group`); restrict who may use what with keypair resource policies",
)
_QUOTA_SCOPE = (
    "quota scopes",
    "accelshare has no per-user or per-project storage quota scopes",
)


def _superadmin(info: Info) -> Manager:
    manager: Manager = info.context["manager"]
    identity: Identity = info.context["identity"]
    if not identity.is_superadmin:
        raise PermissionError(
            f"This needs the superadmin role; {identity.email} has {identity.role}"
        )
    return manager


def _refuse(feature: str, instead: str) -> NotSupportedByAccelshare:
    return NotSupportedByAccelshare(feature, instead)


@strawberry.type(name="AliasImage")
class ImageAliasResult:
    ok: bool
    msg: str


@strawberry.type(name="RescanImages")
class RescanImages:
    ok: bool
    msg: str
    task_id: str | None


@strawberry.type(name="ScalingGroupAssociation")
class ScalingGroupAssociation:
    ok: bool
    msg: str


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
class AdminMoreQuery:
    @strawberry.field
    async def quota_scope(
        self, info: Info, storage_host_name: str, quota_scope_id: str
    ) -> QuotaScope | None:
        _superadmin(info)
        raise _refuse(*_QUOTA_SCOPE)

    @strawberry.field
    async def vfolder_host_permissions(self, info: Info) -> VFolderHostPermissions | None:
        raise _refuse(
            "folder host permissions",
            "accelshare keeps no per-host folder permissions",
        )


@strawberry.type
class AdminMoreMutation:
    @strawberry.mutation
    async def alias_image(
        self, info: Info, alias: str, target: str, architecture: str | None = None
    ) -> ImageAliasResult:
        manager = _superadmin(info)
        if architecture is not None:
            image = await manager.images.info(target)
            if image["architecture"] != architecture:
                raise ValueError(
                    f"architecture: {target} is an image for {image['architecture']},"
                    f" received {architecture!r} (an alias names one image)"
                )
        image = await manager.images.alias(alias, target)
        return ImageAliasResult(ok=True, msg=f"{alias} names {image['ref']}")

    @strawberry.mutation
    async def dealias_image(self, info: Info, alias: str) -> ImageAliasResult:
        manager = _superadmin(info)
        await manager.images.unalias(alias)
        return ImageAliasResult(ok=True, msg=f"the alias {alias} is removed")

    @strawberry.mutation
    async def rescan_images(
        self, info: Info, registry: str | None = None, project: str | None = None
    ) -> RescanImages:
        _superadmin(info)
        raise _refuse(
            "image rescans",
            "accelshare does not scan container registries: images are registered in its"
            " catalogue with `accelshare admin image add REF` (docs/images.md)",
        )

    @strawberry.mutation
    async def associate_scaling_group_with_domain(
        self, info: Info, scaling_group: str, domain: str
    ) -> ScalingGroupAssociation:
        _superadmin(info)
        raise _refuse(*_SGROUP_ASSOCIATION)

    @strawberry.mutation
    async def disassociate_scaling_group_with_domain(
        self, info: Info, scaling_group: str, domain: str
    ) -> ScalingGroupAssociation:
        _superadmin(info)
        raise _refuse(*_SGROUP_ASSOCIATION)

    @strawberry.mutation
    async def disassociate_all_scaling_groups_with_domain(
        self, info: Info, domain: str
    ) -> ScalingGroupAssociation:
        _superadmin(info)
        raise _refuse(*_SGROUP_ASSOCIATION)

    @strawberry.mutation
    async def associate_scaling_group_with_user_group(
        self, info: Info, scaling_group: str, user_group: uuid.UUID
    ) -> ScalingGroupAssociation:
        _superadmin(info)
        raise _refuse(*_SGROUP_ASSOCIATION)

    @strawberry.mutation
    async def disassociate_scaling_group_with_user_group(
        self, info: Info, scaling_group: str, user_group: str
    ) -> ScalingGroupAssociation:
        _superadmin(info)
        raise _refuse(*_SGROUP_ASSOCIATION)

    @strawberry.mutation
    async def disassociate_all_scaling_groups_with_group(
        self, info: Info, user_group: uuid.UUID
    ) -> ScalingGroupAssociation:
        _superadmin(info)
        raise _refuse(*_SGROUP_ASSOCIATION)

    @strawberry.mutation
    async def associate_scaling_group_with_keypair(
        self, info: Info, scaling_group: str, access_key: str
    ) -> ScalingGroupAssociation:
        _superadmin(info)
        raise _refuse(*_SGROUP_ASSOCIATION)

    @strawberry.mutation
    async def disassociate_scaling_group_with_keypair(
        self, info: Info, scaling_group: str, access_key: str
    ) -> ScalingGroupAssociation:
        _superadmin(info)
        raise _refuse(*_SGROUP_ASSOCIATION)

    @strawberry.mutation
    async def set_quota_scope(
        self, info: Info, storage_host_name: str, quota_scope_id: str, props: QuotaScopeInput
    ) -> SetQuotaScope:
        _superadmin(info)
        raise _refuse(*_QUOTA_SCOPE)

    @strawberry.mutation
    async def unset_quota_scope(
        self, info: Info, storage_host_name: str, quota_scope_id: str
    ) -> SetQuotaScope:
        _superadmin(info)
        raise _refuse(*_QUOTA_SCOPE)
