"""Scaling groups in Backend.AI's admin GraphQL.

``scaling_group(name)``, ``scaling_groups(name, is_active)`` (admins);
``create_scaling_group`` / ``modify_scaling_group`` / ``delete_scaling_group``
(superadmin).

``associate_scaling_group_with_{domain,user_group,keypair}``, their
``disassociate_*`` and ``disassociate_all_scaling_groups_with_{domain,group}``
(superadmin): who may use a scaling group
(:mod:`accelshare.manager.services.scaling_group_access`).
"""

from __future__ import annotations

import uuid
from typing import Any

import strawberry
from strawberry.types import Info

from accelshare.manager.services.admin import ScalingGroupChanges
from accelshare.manager.services.scaling_group_access import AssociationKind

from .common import (
    Done,
    context,
    done,
    json_input,
    json_text,
    not_kept,
    require_admin,
    require_superadmin,
    superadmin_manager,
)

__all__ = ["ScalingGroupAssociationMutation", "ScalingGroupMutation", "ScalingGroupQuery"]


@strawberry.type(name="ScalingGroup")
class ScalingGroupNode:
    name: str
    description: str
    is_active: bool
    is_public: bool
    created_at: str | None
    scheduler: str
    scheduler_opts: str
    default_session_slots: str
    driver: str | None = None
    driver_opts: str | None = None
    use_host_network: bool | None = None
    wsproxy_addr: str | None = None
    wsproxy_api_token: str | None = None

    @classmethod
    def from_json(cls, s: dict[str, Any]) -> ScalingGroupNode:
        return cls(
            name=s["name"],
            description=s["description"],
            is_active=s["is_active"],
            is_public=s["is_public"],
            created_at=s["created_at"],
            scheduler=s["scheduler"],
            scheduler_opts=json_text(s["scheduler_opts"]),
            default_session_slots=json_text(s["default_session_slots"]),
        )


@strawberry.type
class CreateScalingGroup:
    ok: bool
    msg: str
    scaling_group: ScalingGroupNode | None


@strawberry.input(name="CreateScalingGroupInput")
class CreateScalingGroupInput:
    description: str | None = None
    is_active: bool | None = None
    is_public: bool | None = None
    wsproxy_addr: str | None = None
    wsproxy_api_token: str | None = None
    driver: str | None = None
    driver_opts: str | None = None
    scheduler: str | None = None
    scheduler_opts: str | None = None
    use_host_network: bool | None = None


@strawberry.input(name="ModifyScalingGroupInput")
class ModifyScalingGroupInput:
    description: str | None = None
    is_active: bool | None = None
    is_public: bool | None = None
    wsproxy_addr: str | None = None
    wsproxy_api_token: str | None = None
    driver: str | None = None
    driver_opts: str | None = None
    scheduler: str | None = None
    scheduler_opts: str | None = None
    use_host_network: bool | None = None


@strawberry.type(name="ScalingGroupAssociation")
class ScalingGroupAssociation:
    ok: bool
    msg: str


def _done(what: str) -> ScalingGroupAssociation:
    return ScalingGroupAssociation(ok=True, msg=f"{what}: done")


def _scaling_group_changes(
    props: CreateScalingGroupInput | ModifyScalingGroupInput, name: str | None
) -> ScalingGroupChanges:
    not_kept("driver", props.driver, "static")
    not_kept("driver_opts", json_input(props.driver_opts, "driver_opts"), {})
    not_kept("wsproxy_addr", props.wsproxy_addr, "")
    not_kept("wsproxy_api_token", props.wsproxy_api_token, "")
    not_kept("use_host_network", props.use_host_network, False)
    return ScalingGroupChanges(
        name=name,
        description=props.description,
        is_active=props.is_active,
        is_public=props.is_public,
        scheduler=props.scheduler,
        scheduler_opts=json_input(props.scheduler_opts, "scheduler_opts"),
    )


@strawberry.type
class ScalingGroupQuery:
    @strawberry.field
    async def scaling_group(self, info: Info, name: str | None = None) -> ScalingGroupNode | None:
        manager, identity = context(info)
        require_admin(identity)
        for sg in await manager.admin.list_scaling_groups():
            if sg["name"] == name:
                return ScalingGroupNode.from_json(sg)
        return None

    @strawberry.field
    async def scaling_groups(
        self, info: Info, name: str | None = None, is_active: bool | None = None
    ) -> list[ScalingGroupNode]:
        manager, identity = context(info)
        require_admin(identity)
        return [
            ScalingGroupNode.from_json(sg)
            for sg in await manager.admin.list_scaling_groups()
            if (name is None or sg["name"] == name)
            and (is_active is None or sg["is_active"] == is_active)
        ]


@strawberry.type
class ScalingGroupMutation:
    @strawberry.mutation
    async def create_scaling_group(
        self, info: Info, name: str, props: CreateScalingGroupInput
    ) -> CreateScalingGroup:
        manager, identity = context(info)
        require_superadmin(identity)
        made = await manager.admin.create_scaling_group(_scaling_group_changes(props, name))
        return CreateScalingGroup(
            ok=True, msg="created", scaling_group=ScalingGroupNode.from_json(made)
        )

    @strawberry.mutation
    async def modify_scaling_group(
        self, info: Info, name: str, props: ModifyScalingGroupInput
    ) -> Done:
        manager, identity = context(info)
        require_superadmin(identity)
        await manager.admin.patch_scaling_group(name, _scaling_group_changes(props, None))
        return done(f"modify_scaling_group {name}")

    @strawberry.mutation
    async def delete_scaling_group(self, info: Info, name: str) -> Done:
        manager, identity = context(info)
        require_superadmin(identity)
        await manager.admin.delete_scaling_group(name)
        return done(f"delete_scaling_group {name}")


@strawberry.type
class ScalingGroupAssociationMutation:
    """Superadmin only; ``{ ok msg }``.  Idempotent: associating what is associated, or
    dissociating what is not, succeeds.  An unknown scaling group, domain, group or
    keypair is an error naming it."""

    @strawberry.mutation
    async def associate_scaling_group_with_domain(
        self, info: Info, scaling_group: str, domain: str
    ) -> ScalingGroupAssociation:
        access = superadmin_manager(info).scaling_group_access
        await access.associate(AssociationKind.DOMAIN, scaling_group, domain)
        return _done(f"associate_scaling_group_with_domain {scaling_group} {domain}")

    @strawberry.mutation
    async def disassociate_scaling_group_with_domain(
        self, info: Info, scaling_group: str, domain: str
    ) -> ScalingGroupAssociation:
        access = superadmin_manager(info).scaling_group_access
        await access.dissociate(AssociationKind.DOMAIN, scaling_group, domain)
        return _done(f"disassociate_scaling_group_with_domain {scaling_group} {domain}")

    @strawberry.mutation
    async def disassociate_all_scaling_groups_with_domain(
        self, info: Info, domain: str
    ) -> ScalingGroupAssociation:
        access = superadmin_manager(info).scaling_group_access
        await access.dissociate_all(AssociationKind.DOMAIN, domain)
        return _done(f"disassociate_all_scaling_groups_with_domain {domain}")

    @strawberry.mutation
    async def associate_scaling_group_with_user_group(
        self, info: Info, scaling_group: str, user_group: uuid.UUID
    ) -> ScalingGroupAssociation:
        access = superadmin_manager(info).scaling_group_access
        await access.associate(AssociationKind.GROUP, scaling_group, user_group)
        return _done(f"associate_scaling_group_with_user_group {scaling_group} {user_group}")

    @strawberry.mutation
    async def disassociate_scaling_group_with_user_group(
        self, info: Info, scaling_group: str, user_group: str
    ) -> ScalingGroupAssociation:
        # a String (the client 25.5.2 declares its variable so); a group id all the same
        access = superadmin_manager(info).scaling_group_access
        await access.dissociate(AssociationKind.GROUP, scaling_group, user_group)
        return _done(f"disassociate_scaling_group_with_user_group {scaling_group} {user_group}")

    @strawberry.mutation
    async def disassociate_all_scaling_groups_with_group(
        self, info: Info, user_group: uuid.UUID
    ) -> ScalingGroupAssociation:
        access = superadmin_manager(info).scaling_group_access
        await access.dissociate_all(AssociationKind.GROUP, user_group)
        return _done(f"disassociate_all_scaling_groups_with_group {user_group}")

    @strawberry.mutation
    async def associate_scaling_group_with_keypair(
        self, info: Info, scaling_group: str, access_key: str
    ) -> ScalingGroupAssociation:
        access = superadmin_manager(info).scaling_group_access
        await access.associate(AssociationKind.KEYPAIR, scaling_group, access_key)
        return _done(f"associate_scaling_group_with_keypair {scaling_group} {access_key}")

    @strawberry.mutation
    async def disassociate_scaling_group_with_keypair(
        self, info: Info, scaling_group: str, access_key: str
    ) -> ScalingGroupAssociation:
        access = superadmin_manager(info).scaling_group_access
        await access.dissociate(AssociationKind.KEYPAIR, scaling_group, access_key)
        return _done(f"disassociate_scaling_group_with_keypair {scaling_group} {access_key}")
