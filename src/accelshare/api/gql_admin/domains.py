"""Domains and groups (projects) in Backend.AI's admin GraphQL.

Queries (the caller's visibility): ``domain(name)``, ``domains(is_active)``;
``group(id)``, ``groups(domain_name, is_active)``, ``groups_by_name(name, domain_name)``.

Mutations (``{ ok msg <object> }``): ``create_domain`` / ``modify_domain`` /
``delete_domain`` / ``purge_domain`` (superadmin) and ``create_group`` / ``modify_group`` /
``delete_group`` / ``purge_group`` (admins, in their domain); a delete deactivates
(Backend.AI's soft delete), a purge removes.
"""

from __future__ import annotations

import uuid
from typing import Any

import strawberry
from strawberry.types import Info

from accelshare.manager.services.admin_views import DomainChanges, GroupChanges

from .common import (
    Done,
    context,
    done,
    json_input,
    json_text,
    not_kept,
    require_admin,
    require_superadmin,
    uuids,
    vacuous,
)

__all__ = ["DomainMutation", "DomainQuery"]


@strawberry.type(name="Domain")
class DomainNode:
    name: str
    description: str
    is_active: bool
    created_at: str | None
    modified_at: str | None
    total_resource_slots: str
    allowed_vfolder_hosts: str | None = None
    allowed_docker_registries: list[str] | None = None
    integration_id: str | None = None
    scaling_groups: list[str] | None = None

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> DomainNode:
        return cls(
            name=d["name"],
            description=d["description"],
            is_active=d["is_active"],
            created_at=d["created_at"],
            modified_at=d["modified_at"],
            total_resource_slots=json_text(d["total_resource_slots"]),
        )


@strawberry.type(name="Group")
class GroupNode:
    id: str
    name: str
    description: str
    is_active: bool
    created_at: str | None
    modified_at: str | None
    domain_name: str
    total_resource_slots: str
    type: str = "GENERAL"
    allowed_vfolder_hosts: str | None = None
    integration_id: str | None = None
    resource_policy: str | None = None
    scaling_groups: list[str] | None = None

    @classmethod
    def from_json(cls, g: dict[str, Any]) -> GroupNode:
        return cls(
            id=g["id"],
            name=g["name"],
            description=g["description"],
            is_active=g["is_active"],
            created_at=g["created_at"],
            modified_at=g["modified_at"],
            domain_name=g["domain_name"],
            total_resource_slots=json_text(g["total_resource_slots"]),
        )


@strawberry.type
class CreateDomain:
    ok: bool
    msg: str
    domain: DomainNode | None


@strawberry.type
class CreateGroup:
    ok: bool
    msg: str
    group: GroupNode | None


@strawberry.input(name="DomainInput")
class DomainInput:
    description: str | None = None
    is_active: bool | None = None
    total_resource_slots: str | None = None
    allowed_vfolder_hosts: str | None = None
    allowed_docker_registries: list[str] | None = None
    integration_id: str | None = None


@strawberry.input(name="ModifyDomainInput")
class ModifyDomainInput:
    name: str | None = None
    description: str | None = None
    is_active: bool | None = None
    total_resource_slots: str | None = None
    allowed_vfolder_hosts: str | None = None
    allowed_docker_registries: list[str] | None = None
    integration_id: str | None = None


@strawberry.input(name="GroupInput")
class GroupInput:
    domain_name: str
    type: str | None = None
    description: str | None = None
    is_active: bool | None = None
    total_resource_slots: str | None = None
    allowed_vfolder_hosts: str | None = None
    integration_id: str | None = None
    resource_policy: str | None = None
    container_registry: str | None = None


@strawberry.input(name="ModifyGroupInput")
class ModifyGroupInput:
    name: str | None = None
    description: str | None = None
    is_active: bool | None = None
    domain_name: str | None = None
    total_resource_slots: str | None = None
    user_update_mode: str | None = None
    user_uuids: list[str] | None = None
    allowed_vfolder_hosts: str | None = None
    integration_id: str | None = None
    resource_policy: str | None = None
    container_registry: str | None = None


@strawberry.type
class DomainQuery:
    @strawberry.field
    async def domain(self, info: Info, name: str | None = None) -> DomainNode | None:
        """A domain (the caller's own without ``name``; others' for a superadmin)."""
        manager, identity = context(info)
        found = await manager.admin_views.domain(identity, name)
        return DomainNode.from_json(found) if found is not None else None

    @strawberry.field
    async def domains(self, info: Info, is_active: bool | None = None) -> list[DomainNode]:
        manager, identity = context(info)
        return [
            DomainNode.from_json(d)
            for d in await manager.admin_views.domains(identity, is_active=is_active)
        ]

    @strawberry.field
    async def group(
        self, info: Info, id: uuid.UUID, domain_name: str | None = None
    ) -> GroupNode | None:
        manager, identity = context(info)
        found = await manager.admin_views.groups(identity, group_id=id, domain_name=domain_name)
        return GroupNode.from_json(found[0]) if found else None

    @strawberry.field
    async def groups(
        self,
        info: Info,
        domain_name: str | None = None,
        is_active: bool | None = None,
        type: list[str] | None = None,
    ) -> list[GroupNode]:
        """The groups the caller may see (``type``: only ``GENERAL`` groups exist)."""
        manager, identity = context(info)
        if type is not None and "GENERAL" not in [t.upper() for t in type]:
            return []
        return [
            GroupNode.from_json(g)
            for g in await manager.admin_views.groups(
                identity, domain_name=domain_name, is_active=is_active
            )
        ]

    @strawberry.field
    async def groups_by_name(
        self, info: Info, name: str, domain_name: str | None = None
    ) -> list[GroupNode]:
        manager, identity = context(info)
        return [
            GroupNode.from_json(g)
            for g in await manager.admin_views.groups(identity, name=name, domain_name=domain_name)
        ]


@strawberry.type
class DomainMutation:
    @strawberry.mutation
    async def create_domain(self, info: Info, name: str, props: DomainInput) -> CreateDomain:
        manager, identity = context(info)
        require_superadmin(identity)
        vacuous("allowed_vfolder_hosts", props.allowed_vfolder_hosts)
        not_kept("allowed_docker_registries", props.allowed_docker_registries, [])
        not_kept("integration_id", props.integration_id, "")
        made = await manager.admin_views.create_domain(
            identity,
            name,
            DomainChanges(
                description=props.description,
                is_active=props.is_active,
                total_resource_slots=json_input(props.total_resource_slots, "total_resource_slots"),
            ),
        )
        return CreateDomain(ok=True, msg="created", domain=DomainNode.from_json(made))

    @strawberry.mutation
    async def modify_domain(self, info: Info, name: str, props: ModifyDomainInput) -> Done:
        manager, identity = context(info)
        require_superadmin(identity)
        not_kept("name", props.name, name)
        vacuous("allowed_vfolder_hosts", props.allowed_vfolder_hosts)
        not_kept("allowed_docker_registries", props.allowed_docker_registries, [])
        not_kept("integration_id", props.integration_id, "")
        await manager.admin_views.modify_domain(
            identity,
            name,
            DomainChanges(
                description=props.description,
                is_active=props.is_active,
                total_resource_slots=json_input(props.total_resource_slots, "total_resource_slots"),
            ),
        )
        return done(f"modify_domain {name}")

    @strawberry.mutation
    async def delete_domain(self, info: Info, name: str) -> Done:
        """Deactivates the domain (Backend.AI's soft delete)."""
        manager, identity = context(info)
        require_superadmin(identity)
        await manager.admin_views.modify_domain(identity, name, DomainChanges(is_active=False))
        return done(f"delete_domain {name}")

    @strawberry.mutation
    async def purge_domain(self, info: Info, name: str) -> Done:
        manager, identity = context(info)
        require_superadmin(identity)
        await manager.admin_views.purge_domain(identity, name)
        return done(f"purge_domain {name}")

    @strawberry.mutation
    async def create_group(self, info: Info, name: str, props: GroupInput) -> CreateGroup:
        manager, identity = context(info)
        require_admin(identity)
        not_kept("type", props.type and props.type.upper(), "GENERAL")
        vacuous("allowed_vfolder_hosts", props.allowed_vfolder_hosts)
        not_kept("integration_id", props.integration_id, "")
        not_kept("resource_policy", props.resource_policy)
        not_kept("container_registry", props.container_registry)
        made = await manager.admin_views.create_group(
            identity,
            name,
            props.domain_name,
            GroupChanges(
                description=props.description,
                is_active=props.is_active,
                total_resource_slots=json_input(props.total_resource_slots, "total_resource_slots"),
            ),
        )
        return CreateGroup(ok=True, msg="created", group=GroupNode.from_json(made))

    @strawberry.mutation
    async def modify_group(self, info: Info, gid: uuid.UUID, props: ModifyGroupInput) -> Done:
        manager, identity = context(info)
        require_admin(identity)
        vacuous("allowed_vfolder_hosts", props.allowed_vfolder_hosts)
        not_kept("integration_id", props.integration_id, "")
        not_kept("resource_policy", props.resource_policy)
        not_kept("container_registry", props.container_registry)
        users = uuids(props.user_uuids, "props.user_uuids")
        mode = (props.user_update_mode or "").lower()
        if users and mode not in ("add", "remove"):
            raise ValueError(
                "props.user_update_mode: expected 'add' or 'remove' with user_uuids,"
                f" received {props.user_update_mode!r}"
            )
        found = await manager.admin_views.groups(identity, group_id=gid)
        if found and props.domain_name is not None:
            not_kept("domain_name", props.domain_name, found[0]["domain_name"])
        await manager.admin_views.modify_group(
            identity,
            gid,
            GroupChanges(
                name=props.name,
                description=props.description,
                is_active=props.is_active,
                total_resource_slots=json_input(props.total_resource_slots, "total_resource_slots"),
                add_users=users if mode == "add" else (),
                remove_users=users if mode == "remove" else (),
            ),
        )
        return done(f"modify_group {gid}")

    @strawberry.mutation
    async def delete_group(self, info: Info, gid: uuid.UUID) -> Done:
        """Deactivates the group (Backend.AI's soft delete)."""
        manager, identity = context(info)
        require_admin(identity)
        await manager.admin_views.modify_group(identity, gid, GroupChanges(is_active=False))
        return done(f"delete_group {gid}")

    @strawberry.mutation
    async def purge_group(self, info: Info, gid: uuid.UUID) -> Done:
        manager, identity = context(info)
        require_admin(identity)
        await manager.admin_views.purge_group(identity, gid)
        return done(f"purge_group {gid}")
