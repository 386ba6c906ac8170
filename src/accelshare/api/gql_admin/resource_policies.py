"""Keypair resource policies in Backend.AI's admin GraphQL.

``keypair_resource_policy(name)``, ``keypair_resource_policies`` — admins all, a user
the policies of its keypairs; ``create_keypair_resource_policy`` /
``modify_keypair_resource_policy`` / ``delete_keypair_resource_policy`` (superadmin).
"""

from __future__ import annotations

from typing import Any

import strawberry
from strawberry.types import Info

from accelshare.common import DefaultForUnspecified
from accelshare.manager.services.admin import PolicyChanges

from .common import (
    Done,
    context,
    done,
    json_input,
    json_text,
    not_kept,
    require_superadmin,
    vacuous,
)

__all__ = ["ResourcePolicyMutation", "ResourcePolicyQuery"]


@strawberry.type(name="KeyPairResourcePolicy")
class KeyPairResourcePolicyNode:
    name: str
    created_at: str | None
    default_for_unspecified: str
    total_resource_slots: str
    max_concurrent_sessions: int
    idle_timeout: int
    max_pending_session_count: int
    max_pending_session_resource_slots: str | None
    # Sessions are single-container: one kernel each.
    max_containers_per_session: int = 1
    max_session_lifetime: int | None = None
    allowed_vfolder_hosts: str | None = None
    max_concurrent_sftp_sessions: int | None = None

    @classmethod
    def from_json(cls, p: dict[str, Any]) -> KeyPairResourcePolicyNode:
        pending = p["max_pending_session_resource_slots"]
        return cls(
            name=p["name"],
            created_at=p["created_at"],
            default_for_unspecified=p["default_for_unspecified"].upper(),
            total_resource_slots=json_text(p["total_resource_slots"]),
            max_concurrent_sessions=p["max_concurrent_sessions"],
            idle_timeout=p["idle_timeout"],
            max_pending_session_count=p["max_pending_session_count"],
            max_pending_session_resource_slots=json_text(pending) if pending is not None else None,
        )


@strawberry.type
class CreateKeyPairResourcePolicy:
    ok: bool
    msg: str
    resource_policy: KeyPairResourcePolicyNode | None


@strawberry.input(name="CreateKeyPairResourcePolicyInput")
class CreateKeyPairResourcePolicyInput:
    default_for_unspecified: str | None = None
    total_resource_slots: str | None = None
    max_session_lifetime: int | None = None
    max_concurrent_sessions: int | None = None
    max_concurrent_sftp_sessions: int | None = None
    max_containers_per_session: int | None = None
    idle_timeout: int | None = None
    allowed_vfolder_hosts: str | None = None
    max_pending_session_count: int | None = None
    max_pending_session_resource_slots: str | None = None


@strawberry.input(name="ModifyKeyPairResourcePolicyInput")
class ModifyKeyPairResourcePolicyInput:
    default_for_unspecified: str | None = None
    total_resource_slots: str | None = None
    max_session_lifetime: int | None = None
    max_concurrent_sessions: int | None = None
    max_concurrent_sftp_sessions: int | None = None
    max_containers_per_session: int | None = None
    idle_timeout: int | None = None
    allowed_vfolder_hosts: str | None = None
    max_pending_session_count: int | None = None
    max_pending_session_resource_slots: str | None = None


def _policy_changes(
    props: CreateKeyPairResourcePolicyInput | ModifyKeyPairResourcePolicyInput,
    name: str | None,
) -> PolicyChanges:
    not_kept("max_session_lifetime", props.max_session_lifetime, 0)
    sftp = props.max_concurrent_sftp_sessions
    if sftp is not None and sftp < 0:  # no SFTP sessions exist: any limit holds
        raise ValueError(f"max_concurrent_sftp_sessions: expected >= 0, received {sftp}")
    not_kept("max_containers_per_session", props.max_containers_per_session, 1)
    vacuous("allowed_vfolder_hosts", props.allowed_vfolder_hosts)
    default = None
    if props.default_for_unspecified is not None:
        try:
            default = DefaultForUnspecified(props.default_for_unspecified.strip().upper())
        except ValueError:
            raise ValueError(
                "default_for_unspecified: expected one of"
                f" {', '.join(d.value for d in DefaultForUnspecified)},"
                f" received {props.default_for_unspecified!r}"
            ) from None
    pending_raw = props.max_pending_session_resource_slots
    pending = json_input(pending_raw, "max_pending_session_resource_slots")
    return PolicyChanges(
        name=name,
        default_for_unspecified=default,
        total_resource_slots=json_input(props.total_resource_slots, "total_resource_slots"),
        max_concurrent_sessions=props.max_concurrent_sessions,
        max_pending_session_count=props.max_pending_session_count,
        max_pending_session_resource_slots=pending or None,
        clear_max_pending_session_resource_slots=pending == {},
        idle_timeout=props.idle_timeout,
    )


@strawberry.type
class ResourcePolicyQuery:
    @strawberry.field
    async def keypair_resource_policy(
        self, info: Info, name: str | None = None
    ) -> KeyPairResourcePolicyNode | None:
        """The policy named, or (without a name) the caller's keypair's."""
        manager, identity = context(info)
        found = await manager.admin_views.policies(identity, name or identity.resource_policy)
        return KeyPairResourcePolicyNode.from_json(found[0]) if found else None

    @strawberry.field
    async def keypair_resource_policies(self, info: Info) -> list[KeyPairResourcePolicyNode]:
        manager, identity = context(info)
        return [
            KeyPairResourcePolicyNode.from_json(p)
            for p in await manager.admin_views.policies(identity)
        ]


@strawberry.type
class ResourcePolicyMutation:
    @strawberry.mutation
    async def create_keypair_resource_policy(
        self, info: Info, name: str, props: CreateKeyPairResourcePolicyInput
    ) -> CreateKeyPairResourcePolicy:
        manager, identity = context(info)
        require_superadmin(identity)
        made = await manager.admin.create_policy(_policy_changes(props, name))
        return CreateKeyPairResourcePolicy(
            ok=True, msg="created", resource_policy=KeyPairResourcePolicyNode.from_json(made)
        )

    @strawberry.mutation
    async def modify_keypair_resource_policy(
        self, info: Info, name: str, props: ModifyKeyPairResourcePolicyInput
    ) -> Done:
        manager, identity = context(info)
        require_superadmin(identity)
        await manager.admin.patch_policy(name, _policy_changes(props, None))
        return done(f"modify_keypair_resource_policy {name}")

    @strawberry.mutation
    async def delete_keypair_resource_policy(self, info: Info, name: str) -> Done:
        manager, identity = context(info)
        require_superadmin(identity)
        await manager.admin.delete_policy(name)
        return done(f"delete_keypair_resource_policy {name}")
