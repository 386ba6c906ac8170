"""Backend.AI's admin GraphQL surface (issue #30), as the official client 25.5.2 asks it.

Queries (the caller's visibility: superadmin everything, a domain admin its domain, a
user itself — :mod:`accelshare.manager.services.admin_views`):

* ``user(email)``, ``user_from_uuid(user_id)``, ``users(domain_name, group_id, is_active,
  status)``, ``user_list(limit, offset, filter, order, domain_name, group_id, is_active,
  status) { items total_count }``;
* ``keypairs(domain_name, email, is_active)``, ``keypair_list(limit, offset, filter,
  order, domain_name, email, is_active)`` (``keypair(access_key)`` is in :mod:`.gql`);
* ``domain(name)``, ``domains(is_active)``; ``group(id)``, ``groups(domain_name,
  is_active)``, ``groups_by_name(name, domain_name)``;
* ``scaling_group(name)``, ``scaling_groups(name, is_active)`` — admins;
* ``keypair_resource_policy(name)``, ``keypair_resource_policies`` — admins all, a user
  the policies of its keypairs.

Mutations (``{ ok msg <object> }``): ``create_user`` / ``modify_user`` / ``delete_user``
(admins, in their domain), ``create_keypair`` / ``modify_keypair`` / ``delete_keypair``
(admins, in their domain), ``create_group`` / ``modify_group`` / ``delete_group`` /
``purge_group`` (admins, in their domain), ``create_domain`` / ``modify_domain`` /
``delete_domain`` / ``purge_domain``, ``create_scaling_group`` / ``modify_scaling_group``
/ ``delete_scaling_group`` and ``create_keypair_resource_policy`` /
``modify_keypair_resource_policy`` / ``delete_keypair_resource_policy`` (superadmin).

What accelshare does not keep (``need_password_change``, ``allowed_client_ip``, a
scaling group's ``driver``, a policy's ``max_session_lifetime``...) reads as ``null``; an
input that asks for a value of such a setting other than its "off" value is refused
with an error naming the field, so nothing is silently dropped; the exceptions are the
limits accelshare does not apply (``allowed_vfolder_hosts``: every user may use every
configured storage host; ``max_concurrent_sftp_sessions``: no SFTP sessions) and a keypair's
``rate_limit`` (the client always sends one), which are accepted without being kept.
``user_list`` and ``keypair_list`` take Backend.AI's ``filter`` / ``order`` expressions
(:mod:`accelshare.manager.querylang`; fields in :mod:`accelshare.manager.list_specs`).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import strawberry
from strawberry.types import Info

from accelshare.common import DefaultForUnspecified
from accelshare.manager.enums import UserRole, UserStatus
from accelshare.manager.runtime import Manager
from accelshare.manager.services.admin import (
    KeypairChanges,
    NewKeypair,
    NewUser,
    PolicyChanges,
    ScalingGroupChanges,
    UserChanges,
)
from accelshare.manager.services.admin_views import DomainChanges, GroupChanges

from .auth import Identity
from .compat_gql import KeyPairNode, keypair_from_row
from .gql_limits import MAX_PAGE_SIZE

__all__ = ["AdminMutation", "AdminQuery", "check_page"]

_MAX_OFFSET = 2**31 - 1  # past SQL's range


def check_page(query: str, limit: int, offset: int) -> None:
    """Page sizes are capped like REST's (``GET /sessions?limit=``)."""
    if not 1 <= limit <= MAX_PAGE_SIZE:
        raise ValueError(
            f"{query}(limit): expected an integer from 1 to {MAX_PAGE_SIZE}, received {limit}"
        )
    if not 0 <= offset <= _MAX_OFFSET:
        raise ValueError(
            f"{query}(offset): expected an integer from 0 to {_MAX_OFFSET}, received {offset}"
        )


def _context(info: Info) -> tuple[Manager, Identity]:
    ctx = info.context
    return ctx["manager"], ctx["identity"]


def _require_admin(identity: Identity) -> None:
    if not identity.is_admin:
        raise PermissionError(f"This needs the admin role; {identity.email} has {identity.role}")


def _require_superadmin(identity: Identity) -> None:
    if not identity.is_superadmin:
        raise PermissionError(
            f"This needs the superadmin role; {identity.email} has {identity.role}"
        )


def _json(value: Any) -> str:
    return json.dumps(value)


def _json_input(raw: str | None, field: str) -> dict[str, Any] | None:
    """A JSON-object input (Backend.AI's ``JSONString``)."""
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        raise ValueError(f"{field}: expected a JSON object (a string), received {raw!r}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{field}: expected a JSON object, received {raw!r}")
    return value


def _vacuous(field: str, raw: str | None) -> None:
    """``allowed_vfolder_hosts``: accelshare does not restrict storage hosts per domain,
    project or policy (every configured host is usable, docs/folders.md), so a
    permission on them is accepted (a JSON object) without being kept."""
    _json_input(raw, field)


def _not_kept(field: str, value: Any, *off: Any) -> None:
    """Refuse a setting accelshare does not keep unless it is null or its "off" value."""
    if value is None or any(value == o for o in off):
        return
    allowed = " or ".join(repr(o) for o in (None, *off))
    raise ValueError(
        f"{field}: accelshare does not keep this setting; expected {allowed},"
        f" received {value!r} (see docs/compatibility.md)"
    )


# Backend.AI's user statuses accelshare never uses: they match nothing.
_BACKENDAI_ONLY_USER_STATUSES = frozenset({"before-verification"})


def _user_status(status: str | None, field: str = "status") -> UserStatus | bool | None:
    """A status filter: the status, None (no filter) or False (matches nothing)."""
    if not status:
        return None
    name = status.strip().lower()
    if name in _BACKENDAI_ONLY_USER_STATUSES:
        return False
    try:
        return UserStatus(name)
    except ValueError:
        raise ValueError(
            f"{field}: expected one of {', '.join(UserStatus)}, received {status!r}"
        ) from None


def _role(role: str | None) -> UserRole | None:
    if role is None:
        return None
    try:
        return UserRole(role.strip().lower())
    except ValueError:
        raise ValueError(
            f"role: expected one of {', '.join(UserRole)}, received {role!r}"
        ) from None


# -- types ----------------------------------------------------------------------------------
@strawberry.type(name="UserGroup")
class UserGroupNode:
    id: str
    name: str


@strawberry.type(name="User")
class UserNode:
    id: str
    uuid: str
    username: str | None
    email: str
    full_name: str
    role: str
    status: str
    is_active: bool
    domain_name: str
    created_at: str | None
    modified_at: str | None
    groups: list[UserGroupNode]
    total_resource_slots: str
    # Backend.AI's settings accelshare does not keep: null.
    need_password_change: bool | None = None
    description: str | None = None
    status_info: str | None = None
    resource_policy: str | None = None
    allowed_client_ip: list[str] | None = None
    totp_activated: bool | None = None
    sudo_session_enabled: bool | None = None
    main_access_key: str | None = None
    container_uid: int | None = None
    container_main_gid: int | None = None
    container_gids: list[int] | None = None

    @classmethod
    def from_json(cls, u: dict[str, Any]) -> UserNode:
        return cls(
            id=u["id"],
            uuid=u["id"],
            username=u["username"],
            email=u["email"],
            full_name=u["full_name"],
            role=u["role"],
            status=u["status"],
            is_active=u["is_active"],
            domain_name=u["domain_name"],
            created_at=u["created_at"],
            modified_at=u["modified_at"],
            groups=[UserGroupNode(id=g["id"], name=g["name"]) for g in u["groups"]],
            total_resource_slots=_json(u["total_resource_slots"]),
        )


@strawberry.type(name="UserList")
class UserList:
    items: list[UserNode]
    total_count: int


@strawberry.type(name="KeyPairList")
class KeyPairList:
    items: list[KeyPairNode]
    total_count: int


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
            total_resource_slots=_json(d["total_resource_slots"]),
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
            total_resource_slots=_json(g["total_resource_slots"]),
        )


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
            scheduler_opts=_json(s["scheduler_opts"]),
            default_session_slots=_json(s["default_session_slots"]),
        )


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
            total_resource_slots=_json(p["total_resource_slots"]),
            max_concurrent_sessions=p["max_concurrent_sessions"],
            idle_timeout=p["idle_timeout"],
            max_pending_session_count=p["max_pending_session_count"],
            max_pending_session_resource_slots=_json(pending) if pending is not None else None,
        )


# -- queries --------------------------------------------------------------------------------
async def _users(
    info: Info,
    *,
    domain_name: str | None,
    group_id: uuid.UUID | None,
    is_active: bool | None,
    status: str | None,
    limit: int | None = None,
    offset: int = 0,
    filter: str | None = None,
    order: str | None = None,
) -> tuple[list[UserNode], int]:
    manager, identity = _context(info)
    wanted = _user_status(status)
    if wanted is False:
        return [], 0
    page = await manager.admin_views.users(
        identity,
        domain_name=domain_name,
        group_id=group_id,
        is_active=is_active,
        status=wanted if isinstance(wanted, UserStatus) else None,
        limit=limit,
        offset=offset,
        filter=filter,
        order=order,
    )
    return [UserNode.from_json(u) for u in page.items], page.total


@strawberry.type
class AdminQuery:
    @strawberry.field
    async def user(
        self, info: Info, email: str | None = None, domain_name: str | None = None
    ) -> UserNode | None:
        """A user the caller may see (itself without ``email``)."""
        manager, identity = _context(info)
        found = await manager.admin_views.user(identity, email=email)
        if found is None or (domain_name and found["domain_name"] != domain_name):
            return None
        return UserNode.from_json(found)

    @strawberry.field
    async def user_from_uuid(
        self, info: Info, user_id: strawberry.ID | None = None, domain_name: str | None = None
    ) -> UserNode | None:
        manager, identity = _context(info)
        uid = None
        if user_id is not None:
            try:
                uid = uuid.UUID(str(user_id))
            except ValueError:
                raise ValueError(
                    f"user_from_uuid(user_id): expected a user UUID, received {user_id!r}"
                ) from None
        found = await manager.admin_views.user(identity, user_id=uid)
        if found is None or (domain_name and found["domain_name"] != domain_name):
            return None
        return UserNode.from_json(found)

    @strawberry.field
    async def users(
        self,
        info: Info,
        domain_name: str | None = None,
        group_id: uuid.UUID | None = None,
        is_active: bool | None = None,
        status: str | None = None,
    ) -> list[UserNode]:
        items, _ = await _users(
            info, domain_name=domain_name, group_id=group_id, is_active=is_active, status=status
        )
        return items

    @strawberry.field
    async def user_list(
        self,
        info: Info,
        limit: int = 20,
        offset: int = 0,
        filter: str | None = None,
        order: str | None = None,
        domain_name: str | None = None,
        group_id: uuid.UUID | None = None,
        is_active: bool | None = None,
        status: str | None = None,
    ) -> UserList:
        check_page("user_list", limit, offset)
        items, total = await _users(
            info,
            domain_name=domain_name,
            group_id=group_id,
            is_active=is_active,
            status=status,
            limit=limit,
            offset=offset,
            filter=filter,
            order=order,
        )
        return UserList(items=items, total_count=total)

    @strawberry.field
    async def keypairs(
        self,
        info: Info,
        domain_name: str | None = None,
        email: str | None = None,
        is_active: bool | None = None,
    ) -> list[KeyPairNode]:
        manager, identity = _context(info)
        page = await manager.admin_views.keypairs(
            identity, domain_name=domain_name, email=email, is_active=is_active
        )
        return [keypair_from_row(k) for k in page.items]

    @strawberry.field
    async def keypair_list(
        self,
        info: Info,
        limit: int = 20,
        offset: int = 0,
        filter: str | None = None,
        order: str | None = None,
        domain_name: str | None = None,
        email: str | None = None,
        is_active: bool | None = None,
    ) -> KeyPairList:
        check_page("keypair_list", limit, offset)
        manager, identity = _context(info)
        page = await manager.admin_views.keypairs(
            identity,
            domain_name=domain_name,
            email=email,
            is_active=is_active,
            limit=limit,
            offset=offset,
            filter=filter,
            order=order,
        )
        return KeyPairList(items=[keypair_from_row(k) for k in page.items], total_count=page.total)

    @strawberry.field
    async def domain(self, info: Info, name: str | None = None) -> DomainNode | None:
        """A domain (the caller's own without ``name``; others' for a superadmin)."""
        manager, identity = _context(info)
        found = await manager.admin_views.domain(identity, name)
        return DomainNode.from_json(found) if found is not None else None

    @strawberry.field
    async def domains(self, info: Info, is_active: bool | None = None) -> list[DomainNode]:
        manager, identity = _context(info)
        return [
            DomainNode.from_json(d)
            for d in await manager.admin_views.domains(identity, is_active=is_active)
        ]

    @strawberry.field
    async def group(
        self, info: Info, id: uuid.UUID, domain_name: str | None = None
    ) -> GroupNode | None:
        manager, identity = _context(info)
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
        manager, identity = _context(info)
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
        manager, identity = _context(info)
        return [
            GroupNode.from_json(g)
            for g in await manager.admin_views.groups(identity, name=name, domain_name=domain_name)
        ]

    @strawberry.field
    async def scaling_group(self, info: Info, name: str | None = None) -> ScalingGroupNode | None:
        manager, identity = _context(info)
        _require_admin(identity)
        for sg in await manager.admin.list_sgroups():
            if sg["name"] == name:
                return ScalingGroupNode.from_json(sg)
        return None

    @strawberry.field
    async def scaling_groups(
        self, info: Info, name: str | None = None, is_active: bool | None = None
    ) -> list[ScalingGroupNode]:
        manager, identity = _context(info)
        _require_admin(identity)
        return [
            ScalingGroupNode.from_json(sg)
            for sg in await manager.admin.list_sgroups()
            if (name is None or sg["name"] == name)
            and (is_active is None or sg["is_active"] == is_active)
        ]

    @strawberry.field
    async def keypair_resource_policy(
        self, info: Info, name: str | None = None
    ) -> KeyPairResourcePolicyNode | None:
        """The policy named, or (without a name) the caller's keypair's."""
        manager, identity = _context(info)
        found = await manager.admin_views.policies(identity, name or identity.resource_policy)
        return KeyPairResourcePolicyNode.from_json(found[0]) if found else None

    @strawberry.field
    async def keypair_resource_policies(self, info: Info) -> list[KeyPairResourcePolicyNode]:
        manager, identity = _context(info)
        return [
            KeyPairResourcePolicyNode.from_json(p)
            for p in await manager.admin_views.policies(identity)
        ]


# -- mutation inputs (Backend.AI's names) ---------------------------------------------------
@strawberry.input(name="UserInput")
class UserInput:
    password: str
    domain_name: str
    username: str | None = None
    full_name: str | None = None
    role: str | None = None
    status: str | None = None
    need_password_change: bool | None = None
    description: str | None = None
    allowed_client_ip: list[str] | None = None
    totp_activated: bool | None = None
    resource_policy: str | None = None
    sudo_session_enabled: bool | None = None
    group_ids: list[str] | None = None
    container_uid: int | None = None
    container_main_gid: int | None = None
    container_gids: list[int] | None = None


@strawberry.input(name="ModifyUserInput")
class ModifyUserInput:
    password: str | None = None
    username: str | None = None
    full_name: str | None = None
    domain_name: str | None = None
    role: str | None = None
    status: str | None = None
    need_password_change: bool | None = None
    description: str | None = None
    allowed_client_ip: list[str] | None = None
    totp_activated: bool | None = None
    resource_policy: str | None = None
    sudo_session_enabled: bool | None = None
    main_access_key: str | None = None
    group_ids: list[str] | None = None
    container_uid: int | None = None
    container_main_gid: int | None = None
    container_gids: list[int] | None = None


@strawberry.input(name="PurgeUserInput")
class PurgeUserInput:
    purge_shared_vfolders: bool | None = None
    delegate_endpoint_ownership: bool | None = None


@strawberry.input(name="KeyPairInput")
class KeyPairInput:
    is_active: bool | None = True
    is_admin: bool | None = False
    resource_policy: str | None = None
    concurrency_limit: int | None = None
    # Accepted and not kept: accelshare has no per-key rate limit (the client's
    # `keypair add` always sends one, 5000 by default); it reads as null.
    rate_limit: int | None = None


@strawberry.input(name="ModifyKeyPairInput")
class ModifyKeyPairInput:
    is_active: bool | None = None
    is_admin: bool | None = None
    resource_policy: str | None = None
    concurrency_limit: int | None = None
    # Accepted and not kept: accelshare has no per-key rate limit (the client's
    # `keypair add` always sends one, 5000 by default); it reads as null.
    rate_limit: int | None = None


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


# -- mutation payloads ----------------------------------------------------------------------
@strawberry.type
class CreateUser:
    ok: bool
    msg: str
    user: UserNode | None


@strawberry.type
class ModifyUser:
    ok: bool
    msg: str
    user: UserNode | None


@strawberry.type
class CreateKeyPair:
    ok: bool
    msg: str
    keypair: KeyPairNode | None


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


@strawberry.type
class CreateScalingGroup:
    ok: bool
    msg: str
    scaling_group: ScalingGroupNode | None


@strawberry.type
class CreateKeyPairResourcePolicy:
    ok: bool
    msg: str
    resource_policy: KeyPairResourcePolicyNode | None


@strawberry.type(name="SimpleMutationResult")
class Done:
    """``{ ok msg }`` of the mutations that answer nothing else."""

    ok: bool
    msg: str


def _done(what: str) -> Done:
    return Done(ok=True, msg=f"{what}: done")


def _check_user_extras(props: UserInput | ModifyUserInput) -> None:
    _not_kept("need_password_change", props.need_password_change, False)
    _not_kept("description", props.description, "")
    _not_kept("allowed_client_ip", props.allowed_client_ip, [])
    _not_kept("totp_activated", props.totp_activated, False)
    _not_kept("sudo_session_enabled", props.sudo_session_enabled, False)
    _not_kept("container_uid", props.container_uid)
    _not_kept("container_main_gid", props.container_main_gid)
    _not_kept("container_gids", props.container_gids, [])


def _uuids(raw: list[str] | None, field: str) -> list[uuid.UUID]:
    found = []
    for value in raw or []:
        try:
            found.append(uuid.UUID(value))
        except ValueError:
            raise ValueError(f"{field}: expected UUIDs, received {value!r}") from None
    return found


def _sgroup_changes(
    props: CreateScalingGroupInput | ModifyScalingGroupInput, name: str | None
) -> ScalingGroupChanges:
    _not_kept("driver", props.driver, "static")
    _not_kept("driver_opts", _json_input(props.driver_opts, "driver_opts"), {})
    _not_kept("wsproxy_addr", props.wsproxy_addr, "")
    _not_kept("wsproxy_api_token", props.wsproxy_api_token, "")
    _not_kept("use_host_network", props.use_host_network, False)
    return ScalingGroupChanges(
        name=name,
        description=props.description,
        is_active=props.is_active,
        is_public=props.is_public,
        scheduler=props.scheduler,
        scheduler_opts=_json_input(props.scheduler_opts, "scheduler_opts"),
    )


def _policy_changes(
    props: CreateKeyPairResourcePolicyInput | ModifyKeyPairResourcePolicyInput,
    name: str | None,
) -> PolicyChanges:
    _not_kept("max_session_lifetime", props.max_session_lifetime, 0)
    sftp = props.max_concurrent_sftp_sessions
    if sftp is not None and sftp < 0:  # no SFTP sessions exist: any limit holds
        raise ValueError(f"max_concurrent_sftp_sessions: expected >= 0, received {sftp}")
    _not_kept("max_containers_per_session", props.max_containers_per_session, 1)
    _vacuous("allowed_vfolder_hosts", props.allowed_vfolder_hosts)
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
    pending = _json_input(pending_raw, "max_pending_session_resource_slots")
    return PolicyChanges(
        name=name,
        default_for_unspecified=default,
        total_resource_slots=_json_input(props.total_resource_slots, "total_resource_slots"),
        max_concurrent_sessions=props.max_concurrent_sessions,
        max_pending_session_count=props.max_pending_session_count,
        max_pending_session_resource_slots=pending or None,
        clear_max_pending_session_resource_slots=pending == {},
        idle_timeout=props.idle_timeout,
    )


@strawberry.type
class AdminMutation:
    # -- users ------------------------------------------------------------------------------
    @strawberry.mutation
    async def create_user(self, info: Info, email: str, props: UserInput) -> CreateUser:
        manager, identity = _context(info)
        _require_admin(identity)
        _check_user_extras(props)
        _not_kept("resource_policy", props.resource_policy, "default")
        role = _role(props.role) or UserRole.USER
        status = _user_status(props.status, "props.status")
        if status is False or status is UserStatus.DELETED:
            raise ValueError(
                f"props.status: expected active or inactive, received {props.status!r}"
            )
        groups = _uuids(props.group_ids, "props.group_ids")
        made = await manager.admin.create_user(
            identity,
            NewUser(
                email=email,
                password=props.password,
                username=props.username,
                full_name=props.full_name or "",
                role=role,
                domain_name=props.domain_name,
            ),
        )
        if status is UserStatus.INACTIVE:
            await manager.admin.patch_user(identity, email, UserChanges(status=status))
        if groups:
            await manager.admin_views.set_user_groups(identity, email, groups)
        user = await manager.admin_views.user(identity, email=email)
        assert user is not None, made  # just created, in the caller's scope
        return CreateUser(ok=True, msg="created", user=UserNode.from_json(user))

    @strawberry.mutation
    async def modify_user(self, info: Info, email: str, props: ModifyUserInput) -> ModifyUser:
        manager, identity = _context(info)
        _require_admin(identity)
        _check_user_extras(props)
        _not_kept("main_access_key", props.main_access_key)
        _not_kept("resource_policy", props.resource_policy, "default")
        current = await manager.admin_views.user(identity, email=email)
        if current is None:
            raise ValueError(f"modify_user(email): no user {email!r} in your scope")
        _not_kept("username", props.username, current["username"])
        _not_kept("domain_name", props.domain_name, current["domain_name"])
        status = _user_status(props.status, "props.status")
        if status is False:
            raise ValueError(
                f"props.status: expected one of {', '.join(UserStatus)}, received {props.status!r}"
            )
        await manager.admin.patch_user(
            identity,
            email,
            UserChanges(
                password=props.password,
                role=_role(props.role),
                status=status if isinstance(status, UserStatus) else None,
                full_name=props.full_name,
            ),
        )
        if props.group_ids is not None:
            await manager.admin_views.set_user_groups(
                identity, email, _uuids(props.group_ids, "props.group_ids")
            )
        user = await manager.admin_views.user(identity, email=email)
        return ModifyUser(ok=True, msg="modified", user=UserNode.from_json(user) if user else None)

    @strawberry.mutation
    async def delete_user(self, info: Info, email: str) -> Done:
        """Marks the user deleted and deactivates its keypairs (kept for its sessions)."""
        manager, identity = _context(info)
        _require_admin(identity)
        await manager.admin.delete_user(identity, email)
        return _done(f"delete_user {email}")

    @strawberry.mutation
    async def purge_user(self, info: Info, email: str, props: PurgeUserInput) -> Done:
        """Refused: accelshare keeps users for the sessions that reference them."""
        _, identity = _context(info)
        _require_admin(identity)
        raise ValueError(
            f"purge_user({email}): accelshare keeps users for the sessions that reference"
            " them; use delete_user (status deleted, keypairs deactivated)"
        )

    # -- keypairs ---------------------------------------------------------------------------
    @strawberry.mutation
    async def create_keypair(self, info: Info, user_id: str, props: KeyPairInput) -> CreateKeyPair:
        """``user_id`` is the owner's email (Backend.AI's argument name)."""
        manager, identity = _context(info)
        _require_admin(identity)
        _not_kept("concurrency_limit", props.concurrency_limit)
        made = await manager.admin.create_keypair(
            identity,
            NewKeypair(
                user_email=user_id,
                resource_policy=props.resource_policy or "default",
                is_active=True if props.is_active is None else props.is_active,
                is_admin=bool(props.is_admin),
            ),
        )
        row = await manager.admin_views.keypair(identity, made["access_key"])
        assert row is not None  # just created, in the caller's scope
        node = keypair_from_row(row)
        node.secret_key = made["secret_key"]  # shown once, now
        return CreateKeyPair(ok=True, msg="created", keypair=node)

    @strawberry.mutation
    async def modify_keypair(self, info: Info, access_key: str, props: ModifyKeyPairInput) -> Done:
        manager, identity = _context(info)
        _require_admin(identity)
        _not_kept("concurrency_limit", props.concurrency_limit)
        await manager.admin.patch_keypair(
            identity,
            access_key,
            KeypairChanges(
                is_active=props.is_active,
                is_admin=props.is_admin,
                resource_policy=props.resource_policy,
            ),
        )
        return _done(f"modify_keypair {access_key}")

    @strawberry.mutation
    async def delete_keypair(self, info: Info, access_key: str) -> Done:
        manager, identity = _context(info)
        _require_admin(identity)
        await manager.admin.delete_keypair(identity, access_key)
        return _done(f"delete_keypair {access_key}")

    # -- domains ----------------------------------------------------------------------------
    @strawberry.mutation
    async def create_domain(self, info: Info, name: str, props: DomainInput) -> CreateDomain:
        manager, identity = _context(info)
        _require_superadmin(identity)
        _vacuous("allowed_vfolder_hosts", props.allowed_vfolder_hosts)
        _not_kept("allowed_docker_registries", props.allowed_docker_registries, [])
        _not_kept("integration_id", props.integration_id, "")
        made = await manager.admin_views.create_domain(
            identity,
            name,
            DomainChanges(
                description=props.description,
                is_active=props.is_active,
                total_resource_slots=_json_input(
                    props.total_resource_slots, "total_resource_slots"
                ),
            ),
        )
        return CreateDomain(ok=True, msg="created", domain=DomainNode.from_json(made))

    @strawberry.mutation
    async def modify_domain(self, info: Info, name: str, props: ModifyDomainInput) -> Done:
        manager, identity = _context(info)
        _require_superadmin(identity)
        _not_kept("name", props.name, name)
        _vacuous("allowed_vfolder_hosts", props.allowed_vfolder_hosts)
        _not_kept("allowed_docker_registries", props.allowed_docker_registries, [])
        _not_kept("integration_id", props.integration_id, "")
        await manager.admin_views.modify_domain(
            identity,
            name,
            DomainChanges(
                description=props.description,
                is_active=props.is_active,
                total_resource_slots=_json_input(
                    props.total_resource_slots, "total_resource_slots"
                ),
            ),
        )
        return _done(f"modify_domain {name}")

    @strawberry.mutation
    async def delete_domain(self, info: Info, name: str) -> Done:
        """Deactivates the domain (Backend.AI's soft delete)."""
        manager, identity = _context(info)
        _require_superadmin(identity)
        await manager.admin_views.modify_domain(identity, name, DomainChanges(is_active=False))
        return _done(f"delete_domain {name}")

    @strawberry.mutation
    async def purge_domain(self, info: Info, name: str) -> Done:
        manager, identity = _context(info)
        _require_superadmin(identity)
        await manager.admin_views.purge_domain(identity, name)
        return _done(f"purge_domain {name}")

    # -- groups -----------------------------------------------------------------------------
    @strawberry.mutation
    async def create_group(self, info: Info, name: str, props: GroupInput) -> CreateGroup:
        manager, identity = _context(info)
        _require_admin(identity)
        _not_kept("type", props.type and props.type.upper(), "GENERAL")
        _vacuous("allowed_vfolder_hosts", props.allowed_vfolder_hosts)
        _not_kept("integration_id", props.integration_id, "")
        _not_kept("resource_policy", props.resource_policy)
        _not_kept("container_registry", props.container_registry)
        made = await manager.admin_views.create_group(
            identity,
            name,
            props.domain_name,
            GroupChanges(
                description=props.description,
                is_active=props.is_active,
                total_resource_slots=_json_input(
                    props.total_resource_slots, "total_resource_slots"
                ),
            ),
        )
        return CreateGroup(ok=True, msg="created", group=GroupNode.from_json(made))

    @strawberry.mutation
    async def modify_group(self, info: Info, gid: uuid.UUID, props: ModifyGroupInput) -> Done:
        manager, identity = _context(info)
        _require_admin(identity)
        _vacuous("allowed_vfolder_hosts", props.allowed_vfolder_hosts)
        _not_kept("integration_id", props.integration_id, "")
        _not_kept("resource_policy", props.resource_policy)
        _not_kept("container_registry", props.container_registry)
        users = _uuids(props.user_uuids, "props.user_uuids")
        mode = (props.user_update_mode or "").lower()
        if users and mode not in ("add", "remove"):
            raise ValueError(
                "props.user_update_mode: expected 'add' or 'remove' with user_uuids,"
                f" received {props.user_update_mode!r}"
            )
        found = await manager.admin_views.groups(identity, group_id=gid)
        if found and props.domain_name is not None:
            _not_kept("domain_name", props.domain_name, found[0]["domain_name"])
        await manager.admin_views.modify_group(
            identity,
            gid,
            GroupChanges(
                name=props.name,
                description=props.description,
                is_active=props.is_active,
                total_resource_slots=_json_input(
                    props.total_resource_slots, "total_resource_slots"
                ),
                add_users=users if mode == "add" else (),
                remove_users=users if mode == "remove" else (),
            ),
        )
        return _done(f"modify_group {gid}")

    @strawberry.mutation
    async def delete_group(self, info: Info, gid: uuid.UUID) -> Done:
        """Deactivates the group (Backend.AI's soft delete)."""
        manager, identity = _context(info)
        _require_admin(identity)
        await manager.admin_views.modify_group(identity, gid, GroupChanges(is_active=False))
        return _done(f"delete_group {gid}")

    @strawberry.mutation
    async def purge_group(self, info: Info, gid: uuid.UUID) -> Done:
        manager, identity = _context(info)
        _require_admin(identity)
        await manager.admin_views.purge_group(identity, gid)
        return _done(f"purge_group {gid}")

    # -- scaling groups ---------------------------------------------------------------------
    @strawberry.mutation
    async def create_scaling_group(
        self, info: Info, name: str, props: CreateScalingGroupInput
    ) -> CreateScalingGroup:
        manager, identity = _context(info)
        _require_superadmin(identity)
        made = await manager.admin.create_sgroup(_sgroup_changes(props, name))
        return CreateScalingGroup(
            ok=True, msg="created", scaling_group=ScalingGroupNode.from_json(made)
        )

    @strawberry.mutation
    async def modify_scaling_group(
        self, info: Info, name: str, props: ModifyScalingGroupInput
    ) -> Done:
        manager, identity = _context(info)
        _require_superadmin(identity)
        await manager.admin.patch_sgroup(name, _sgroup_changes(props, None))
        return _done(f"modify_scaling_group {name}")

    @strawberry.mutation
    async def delete_scaling_group(self, info: Info, name: str) -> Done:
        manager, identity = _context(info)
        _require_superadmin(identity)
        await manager.admin.delete_sgroup(name)
        return _done(f"delete_scaling_group {name}")

    # -- keypair resource policies ----------------------------------------------------------
    @strawberry.mutation
    async def create_keypair_resource_policy(
        self, info: Info, name: str, props: CreateKeyPairResourcePolicyInput
    ) -> CreateKeyPairResourcePolicy:
        manager, identity = _context(info)
        _require_superadmin(identity)
        made = await manager.admin.create_policy(_policy_changes(props, name))
        return CreateKeyPairResourcePolicy(
            ok=True, msg="created", resource_policy=KeyPairResourcePolicyNode.from_json(made)
        )

    @strawberry.mutation
    async def modify_keypair_resource_policy(
        self, info: Info, name: str, props: ModifyKeyPairResourcePolicyInput
    ) -> Done:
        manager, identity = _context(info)
        _require_superadmin(identity)
        await manager.admin.patch_policy(name, _policy_changes(props, None))
        return _done(f"modify_keypair_resource_policy {name}")

    @strawberry.mutation
    async def delete_keypair_resource_policy(self, info: Info, name: str) -> Done:
        manager, identity = _context(info)
        _require_superadmin(identity)
        await manager.admin.delete_policy(name)
        return _done(f"delete_keypair_resource_policy {name}")
