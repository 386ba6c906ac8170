"""Users and keypairs in Backend.AI's admin GraphQL.

Queries (the caller's visibility: superadmin everything, a domain admin its domain, a
user itself — :mod:`accelshare.manager.services.admin_views`):

* ``user(email)``, ``user_from_uuid(user_id)``, ``users(domain_name, group_id, is_active,
  status)``, ``user_list(limit, offset, filter, order, domain_name, group_id, is_active,
  status) { items total_count }``;
* ``keypairs(domain_name, email, is_active)``, ``keypair_list(limit, offset, filter,
  order, domain_name, email, is_active)`` (``keypair(access_key)`` is in
  :mod:`accelshare.api.gql`).

``user_list`` and ``keypair_list`` take Backend.AI's ``filter`` / ``order`` expressions
(:mod:`accelshare.manager.querylang`; fields in :mod:`accelshare.manager.list_specs`).

Mutations (``{ ok msg <object> }``; admins, in their domain): ``create_user`` /
``modify_user`` / ``delete_user`` (``purge_user`` is refused: users are kept for their
sessions) and ``create_keypair`` / ``modify_keypair`` / ``delete_keypair``.
"""

from __future__ import annotations

import uuid
from typing import Any

import strawberry
from strawberry.types import Info

from accelshare.manager.enums import UserRole, UserStatus
from accelshare.manager.services.admin import KeypairChanges, NewKeypair, NewUser, UserChanges

from ..compat_gql import KeyPairNode, keypair_from_row
from .common import Done, check_page, context, done, json_text, not_kept, require_admin, uuids

__all__ = ["UserMutation", "UserNode", "UserQuery"]

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
            total_resource_slots=json_text(u["total_resource_slots"]),
        )


@strawberry.type(name="UserList")
class UserList:
    items: list[UserNode]
    total_count: int


@strawberry.type(name="KeyPairList")
class KeyPairList:
    items: list[KeyPairNode]
    total_count: int


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


def _check_user_extras(props: UserInput | ModifyUserInput) -> None:
    not_kept("need_password_change", props.need_password_change, False)
    not_kept("description", props.description, "")
    not_kept("allowed_client_ip", props.allowed_client_ip, [])
    not_kept("totp_activated", props.totp_activated, False)
    not_kept("sudo_session_enabled", props.sudo_session_enabled, False)
    not_kept("container_uid", props.container_uid)
    not_kept("container_main_gid", props.container_main_gid)
    not_kept("container_gids", props.container_gids, [])


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
    manager, identity = context(info)
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
class UserQuery:
    @strawberry.field
    async def user(
        self, info: Info, email: str | None = None, domain_name: str | None = None
    ) -> UserNode | None:
        """A user the caller may see (itself without ``email``)."""
        manager, identity = context(info)
        found = await manager.admin_views.user(identity, email=email)
        if found is None or (domain_name and found["domain_name"] != domain_name):
            return None
        return UserNode.from_json(found)

    @strawberry.field
    async def user_from_uuid(
        self, info: Info, user_id: strawberry.ID | None = None, domain_name: str | None = None
    ) -> UserNode | None:
        manager, identity = context(info)
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
        manager, identity = context(info)
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
        manager, identity = context(info)
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


@strawberry.type
class UserMutation:
    @strawberry.mutation
    async def create_user(self, info: Info, email: str, props: UserInput) -> CreateUser:
        manager, identity = context(info)
        require_admin(identity)
        _check_user_extras(props)
        not_kept("resource_policy", props.resource_policy, "default")
        role = _role(props.role) or UserRole.USER
        status = _user_status(props.status, "props.status")
        if status is False or status is UserStatus.DELETED:
            raise ValueError(
                f"props.status: expected active or inactive, received {props.status!r}"
            )
        groups = uuids(props.group_ids, "props.group_ids")
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
        manager, identity = context(info)
        require_admin(identity)
        _check_user_extras(props)
        not_kept("main_access_key", props.main_access_key)
        not_kept("resource_policy", props.resource_policy, "default")
        current = await manager.admin_views.user(identity, email=email)
        if current is None:
            raise ValueError(f"modify_user(email): no user {email!r} in your scope")
        not_kept("username", props.username, current["username"])
        not_kept("domain_name", props.domain_name, current["domain_name"])
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
                identity, email, uuids(props.group_ids, "props.group_ids")
            )
        user = await manager.admin_views.user(identity, email=email)
        return ModifyUser(ok=True, msg="modified", user=UserNode.from_json(user) if user else None)

    @strawberry.mutation
    async def delete_user(self, info: Info, email: str) -> Done:
        """Marks the user deleted and deactivates its keypairs (kept for its sessions)."""
        manager, identity = context(info)
        require_admin(identity)
        await manager.admin.delete_user(identity, email)
        return done(f"delete_user {email}")

    @strawberry.mutation
    async def purge_user(self, info: Info, email: str, props: PurgeUserInput) -> Done:
        """Refused: accelshare keeps users for the sessions that reference them."""
        _, identity = context(info)
        require_admin(identity)
        raise ValueError(
            f"purge_user({email}): accelshare keeps users for the sessions that reference"
            " them; use delete_user (status deleted, keypairs deactivated)"
        )

    @strawberry.mutation
    async def create_keypair(self, info: Info, user_id: str, props: KeyPairInput) -> CreateKeyPair:
        """``user_id`` is the owner's email (Backend.AI's argument name)."""
        manager, identity = context(info)
        require_admin(identity)
        not_kept("concurrency_limit", props.concurrency_limit)
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
        manager, identity = context(info)
        require_admin(identity)
        not_kept("concurrency_limit", props.concurrency_limit)
        await manager.admin.patch_keypair(
            identity,
            access_key,
            KeypairChanges(
                is_active=props.is_active,
                is_admin=props.is_admin,
                resource_policy=props.resource_policy,
            ),
        )
        return done(f"modify_keypair {access_key}")

    @strawberry.mutation
    async def delete_keypair(self, info: Info, access_key: str) -> Done:
        manager, identity = context(info)
        require_admin(identity)
        await manager.admin.delete_keypair(identity, access_key)
        return done(f"delete_keypair {access_key}")
