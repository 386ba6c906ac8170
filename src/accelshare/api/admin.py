"""Admin routes: users, keypairs (admin: own domain; superadmin: all), resource policies
and scaling groups (superadmin).

| route | body | answer |
|---|---|---|
| ``GET /admin/users[?domain=]`` | | ``{"items": [user]}`` |
| ``POST /admin/users`` | ``{email, password, username?, full_name?, role?, domain_name?, group?, resource_policy?, with_keypair?}`` | 201 ``{"user": user, "keypair": {access_key, secret_key, ...} or null}`` |
| ``PATCH /admin/users/{email}`` | ``{password?, role?, status?, full_name?, total_resource_slots?}`` | ``{"user": user}`` |
| ``DELETE /admin/users/{email}`` | | status ``deleted``, keypairs deactivated |
| ``GET /admin/keypairs[?user_email=]`` | | ``{"items": [keypair]}`` (no secrets) |
| ``POST /admin/keypairs`` | ``{user_email, resource_policy?, is_active?, is_admin?}`` | 201 keypair with ``secret_key`` (shown once) |
| ``PATCH /admin/keypairs/{access_key}`` | ``{is_active?, is_admin?, resource_policy?}`` | keypair |
| ``DELETE /admin/keypairs/{access_key}`` | | 409 if sessions reference it (deactivate instead) |
| ``GET/POST /admin/resource-policies``, ``PATCH/DELETE /admin/resource-policies/{name}`` | ``{name, default_for_unspecified, total_resource_slots, max_concurrent_sessions, max_pending_session_count, max_pending_session_resource_slots, idle_timeout}`` | policy |
| ``GET/POST /admin/scaling-groups``, ``PATCH/DELETE /admin/scaling-groups/{name}`` | ``{name, description, is_active, is_public, scheduler, scheduler_opts, default_session_slots}`` | scaling group |

Slot amounts are user input (``{"cpu": "4", "mem": "8g", "cuda.shares": "inf"}``),
parsed against the known slot types; ``Infinity``/``inf`` means unlimited.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping
from decimal import Decimal
from typing import Any, Literal

import sqlalchemy as sa
from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from accelshare.common import (
    CommonValueError,
    DefaultForUnspecified,
    ResourceSlot,
    SlotTypes,
    normalize_amount,
)
from accelshare.common.text_input import check_text
from accelshare.manager.credentials import generate_access_key, generate_secret_key
from accelshare.manager.models import (
    DEFAULT_SCHEDULER_OPTS,
    DEFAULT_SESSION_SLOTS,
    Agent,
    Domain,
    Group,
    GroupMember,
    Keypair,
    KeypairResourcePolicy,
    ScalingGroup,
    Session,
    User,
    UserRole,
    UserStatus,
    email_matches,
)
from accelshare.manager.passwords import hash_password
from accelshare.sched.plan import SchedulerOptions

from .auth import AdminIdentity, Identity, SuperadminIdentity
from .deps import ManagerDep
from .problems import Conflict, Forbidden, InvalidAPIParameters, NotFound

__all__ = ["router"]

router = APIRouter(prefix="/admin", tags=["admin"])


def _iso(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


def parse_slots(
    raw: Mapping[str, Any] | None, known: Mapping[str, SlotTypes], field: str
) -> ResourceSlot:
    """Admin slot amounts: known slots only, zeros kept, ``inf`` allowed."""
    values: dict[str, Decimal] = {}
    for slot, value in (raw or {}).items():
        if slot not in known:
            raise InvalidAPIParameters(
                f"Unknown slot {slot!r} in {field}",
                field=f"{field}.{slot}",
                expected="one of " + ", ".join(known),
                received=value,
            )
        text = str(value).strip().lower() if isinstance(value, str) else value
        if text in ("inf", "infinity"):
            values[slot] = Decimal("Infinity")
            continue
        try:
            values[slot] = normalize_amount(slot, value, known[slot])
        except CommonValueError as e:
            raise InvalidAPIParameters(
                str(e), field=f"{field}.{slot}", expected=e.expected, received=value
            ) from None
    return ResourceSlot(values)


# -- users ----------------------------------------------------------------------------------


def user_json(user: User) -> dict[str, Any]:
    return {
        "id": str(user.id),
        "email": user.email,
        "username": user.username,
        "full_name": user.full_name,
        "role": user.role.value,
        "status": user.status.value,
        "domain_name": user.domain_name,
        "total_resource_slots": user.total_resource_slots.to_json(),
        "created_at": _iso(user.created_at),
    }


def keypair_json(keypair: Keypair, *, secret: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {
        "access_key": keypair.access_key,
        "user_id": str(keypair.user_id),
        "resource_policy": keypair.resource_policy,
        "is_active": keypair.is_active,
        "is_admin": keypair.is_admin,
        "created_at": _iso(keypair.created_at),
        "last_used_at": _iso(keypair.last_used_at),
    }
    if secret:
        body["secret_key"] = keypair.secret_key
    return body


def _check_domain(identity: Identity, domain: str) -> None:
    if not identity.is_superadmin and identity.domain_name != domain:
        raise NotFound(f"No such thing in your domain ({domain})")


def _single_line(value: str | None, info: ValidationInfo) -> str | None:
    """E-mail addresses and names: no NUL or control character (a ``ValueError`` naming
    the field, the character and its position)."""
    return None if value is None else check_text(value, field=str(info.field_name))


class CreateUserBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    email: str = Field(min_length=3, max_length=128, pattern=r"^[^@\s]+@[^@\s]+$")
    password: str = Field(min_length=8, max_length=1024)
    username: str | None = Field(default=None, max_length=64)
    full_name: str = Field(default="", max_length=128)
    role: UserRole = UserRole.USER
    domain_name: str | None = None
    group: str | None = None
    resource_policy: str = "default"
    with_keypair: bool = True

    @field_validator("email", "username", "full_name")
    @classmethod
    def _one_line(cls, value: str | None, info: ValidationInfo) -> str | None:
        return _single_line(value, info)


class PatchUserBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    password: str | None = Field(default=None, min_length=8, max_length=1024)
    role: UserRole | None = None
    status: UserStatus | None = None
    full_name: str | None = Field(default=None, max_length=128)
    total_resource_slots: dict[str, Any] | None = None

    @field_validator("full_name")
    @classmethod
    def _one_line(cls, value: str | None, info: ValidationInfo) -> str | None:
        return _single_line(value, info)


@router.get("/users")
async def list_users(
    identity: AdminIdentity, manager: ManagerDep, domain: str | None = None
) -> dict[str, Any]:
    query = sa.select(User).order_by(User.created_at, User.email)
    if not identity.is_superadmin:
        query = query.where(User.domain_name == identity.domain_name)
    elif domain:
        query = query.where(User.domain_name == domain)
    async with manager.db.begin() as db:
        return {"items": [user_json(u) for u in (await db.execute(query)).scalars()]}


@router.post("/users", status_code=201)
async def create_user(
    body: CreateUserBody, identity: AdminIdentity, manager: ManagerDep
) -> dict[str, Any]:
    domain = body.domain_name or identity.domain_name
    _check_domain(identity, domain)
    if body.role is UserRole.SUPERADMIN and not identity.is_superadmin:
        raise Forbidden("Only a superadmin may create a superadmin", reason="insufficient-role")
    password_hash = await asyncio.to_thread(hash_password, body.password)
    async with manager.db.begin(write=True) as db:
        if await db.get(Domain, domain) is None:
            raise InvalidAPIParameters(
                f"Unknown domain {domain!r}", field="domain_name", received=domain
            )
        taken = (await db.execute(sa.select(User.email).where(email_matches(body.email)))).scalar()
        if taken is not None:
            same = "" if taken == body.email else f" ({taken}: addresses differ only in case)"
            raise Conflict(
                f"A user with the email {body.email} exists{same}",
                field="email",
                received=body.email,
            )
        if await db.get(KeypairResourcePolicy, body.resource_policy) is None:
            raise InvalidAPIParameters(
                f"Unknown resource policy {body.resource_policy!r}",
                field="resource_policy",
                received=body.resource_policy,
            )
        user = User(
            id=uuid.uuid4(),
            email=body.email,
            username=body.username,
            full_name=body.full_name,
            password_hash=password_hash,
            role=body.role,
            status=UserStatus.ACTIVE,
            domain_name=domain,
            total_resource_slots=ResourceSlot(),
        )
        db.add(user)
        await db.flush()
        group_query = sa.select(Group).where(Group.domain_name == domain)
        if body.group:
            group_query = group_query.where(Group.name == body.group)
        group = (await db.execute(group_query.order_by(Group.created_at))).scalars().first()
        if group is None and body.group:
            raise InvalidAPIParameters(
                f"Unknown group {body.group!r} in domain {domain}",
                field="group",
                received=body.group,
            )
        if group is not None:
            db.add(GroupMember(group_id=group.id, user_id=user.id))
        keypair = None
        if body.with_keypair:
            keypair = Keypair(
                access_key=generate_access_key(),
                secret_key=generate_secret_key(),
                user_id=user.id,
                resource_policy=body.resource_policy,
                is_active=True,
                is_admin=body.role is not UserRole.USER,
            )
            db.add(keypair)
    return {
        "user": user_json(user),
        "keypair": keypair_json(keypair, secret=True) if keypair else None,
    }


async def _user_by_email(db: Any, identity: Identity, email: str) -> User:
    found = await db.execute(sa.select(User).where(email_matches(check_text(email, field="email"))))
    user = found.scalar_one_or_none()
    if user is None or (not identity.is_superadmin and user.domain_name != identity.domain_name):
        raise NotFound(f"No user {email!r}", field="email", received=email)
    return user  # type: ignore[no-any-return]


@router.patch("/users/{email}")
async def patch_user(
    email: str, body: PatchUserBody, identity: AdminIdentity, manager: ManagerDep
) -> dict[str, Any]:
    async with manager.known_slots.hold() as known, manager.db.begin(write=True) as db:
        user = await _user_by_email(db, identity, email)
        if body.role is UserRole.SUPERADMIN and not identity.is_superadmin:
            raise Forbidden("Only a superadmin may grant superadmin", reason="insufficient-role")
        if user.role is UserRole.SUPERADMIN and not identity.is_superadmin:
            raise Forbidden("Only a superadmin may change a superadmin", reason="insufficient-role")
        if body.password is not None:
            user.password_hash = await asyncio.to_thread(hash_password, body.password)
        if body.role is not None:
            user.role = body.role
        if body.status is not None:
            user.status = body.status
        if body.password is not None or (
            body.status is not None and body.status is not UserStatus.ACTIVE
        ):
            user.login_generation += 1  # ends the user's console logins
        if body.full_name is not None:
            user.full_name = body.full_name
        if body.total_resource_slots is not None:
            user.total_resource_slots = parse_slots(
                body.total_resource_slots, known, "total_resource_slots"
            )
    return {"user": user_json(user)}


@router.delete("/users/{email}")
async def delete_user(email: str, identity: AdminIdentity, manager: ManagerDep) -> dict[str, Any]:
    async with manager.db.begin(write=True) as db:
        user = await _user_by_email(db, identity, email)
        if user.id == identity.user_id:
            raise Conflict("You cannot delete yourself", field="email", received=email)
        _guard_superadmin(identity, user.role)
        user.status = UserStatus.DELETED
        user.login_generation += 1
        await db.execute(
            sa.update(Keypair).where(Keypair.user_id == user.id).values(is_active=False)
        )
    return {"user": user_json(user)}


# -- keypairs -------------------------------------------------------------------------------


class CreateKeypairBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    user_email: str
    resource_policy: str = "default"
    is_active: bool = True
    is_admin: bool = False

    @field_validator("user_email")
    @classmethod
    def _one_line(cls, value: str, info: ValidationInfo) -> str | None:
        return _single_line(value, info)


class PatchKeypairBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    is_active: bool | None = None
    is_admin: bool | None = None
    resource_policy: str | None = None


@router.get("/keypairs")
async def list_keypairs(
    identity: AdminIdentity, manager: ManagerDep, user_email: str | None = None
) -> dict[str, Any]:
    query = (
        sa.select(Keypair, User.email)
        .join(User, User.id == Keypair.user_id)
        .order_by(Keypair.created_at, Keypair.access_key)
    )
    if not identity.is_superadmin:
        query = query.where(User.domain_name == identity.domain_name)
    if user_email:
        query = query.where(email_matches(check_text(user_email, field="user_email")))
    async with manager.db.begin() as db:
        rows = await db.execute(query)
        return {"items": [{**keypair_json(k), "user_email": e} for k, e in rows]}


async def _keypair(db: Any, identity: Identity, access_key: str) -> Keypair:
    row = (
        await db.execute(
            sa.select(Keypair, User.domain_name, User.role)
            .join(User, User.id == Keypair.user_id)
            .where(Keypair.access_key == access_key)
        )
    ).first()
    if row is None or (not identity.is_superadmin and row[1] != identity.domain_name):
        raise NotFound(f"No keypair {access_key!r}", field="access_key", received=access_key)
    _guard_superadmin(identity, row[2])
    return row[0]  # type: ignore[no-any-return]


def _guard_superadmin(identity: Identity, owner_role: UserRole) -> None:
    """A domain admin must not act on a superadmin's account or keys: a keypair minted
    for a superadmin signs as the superadmin (docs/reliability.md, bug 1)."""
    if owner_role is UserRole.SUPERADMIN and not identity.is_superadmin:
        raise Forbidden("Only a superadmin may change a superadmin", reason="insufficient-role")


@router.post("/keypairs", status_code=201)
async def create_keypair(
    body: CreateKeypairBody, identity: AdminIdentity, manager: ManagerDep
) -> dict[str, Any]:
    async with manager.db.begin(write=True) as db:
        user = await _user_by_email(db, identity, body.user_email)
        _guard_superadmin(identity, user.role)
        if await db.get(KeypairResourcePolicy, body.resource_policy) is None:
            raise InvalidAPIParameters(
                f"Unknown resource policy {body.resource_policy!r}",
                field="resource_policy",
                received=body.resource_policy,
            )
        keypair = Keypair(
            access_key=generate_access_key(),
            secret_key=generate_secret_key(),
            user_id=user.id,
            resource_policy=body.resource_policy,
            is_active=body.is_active,
            is_admin=body.is_admin,
        )
        db.add(keypair)
    return {**keypair_json(keypair, secret=True), "user_email": user.email}


async def _end_logins(db: Any, user_id: uuid.UUID) -> None:
    """End the user's console logins (a cookie may act with this keypair)."""
    await db.execute(
        sa.update(User).where(User.id == user_id).values(login_generation=User.login_generation + 1)
    )


@router.patch("/keypairs/{access_key}")
async def patch_keypair(
    access_key: str, body: PatchKeypairBody, identity: AdminIdentity, manager: ManagerDep
) -> dict[str, Any]:
    async with manager.db.begin(write=True) as db:
        keypair = await _keypair(db, identity, access_key)
        if body.resource_policy is not None:
            if await db.get(KeypairResourcePolicy, body.resource_policy) is None:
                raise InvalidAPIParameters(
                    f"Unknown resource policy {body.resource_policy!r}",
                    field="resource_policy",
                    received=body.resource_policy,
                )
            keypair.resource_policy = body.resource_policy
        if body.is_active is not None:
            if keypair.is_active and not body.is_active:
                await _end_logins(db, keypair.user_id)
            keypair.is_active = body.is_active
        if body.is_admin is not None:
            keypair.is_admin = body.is_admin
    return keypair_json(keypair)


@router.delete("/keypairs/{access_key}")
async def delete_keypair(
    access_key: str, identity: AdminIdentity, manager: ManagerDep
) -> dict[str, str]:
    async with manager.db.begin(write=True) as db:
        keypair = await _keypair(db, identity, access_key)
        used = (
            await db.execute(sa.select(Session.id).where(Session.access_key == access_key).limit(1))
        ).first()
        if used is not None:
            raise Conflict(
                f"Sessions reference the keypair {access_key}; deactivate it instead"
                " (PATCH is_active=false)",
                field="access_key",
                received=access_key,
            )
        await _end_logins(db, keypair.user_id)
        await db.delete(keypair)
    return {"result": "deleted"}


# -- resource policies ----------------------------------------------------------------------


INT32_MAX = 2**31 - 1


class PolicyBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(default=None, min_length=1, max_length=64)
    default_for_unspecified: DefaultForUnspecified | None = None
    total_resource_slots: dict[str, Any] | None = None
    # le: the columns are 32-bit INTEGERs (a larger value was a 500; docs/reliability.md)
    max_concurrent_sessions: int | None = Field(default=None, ge=0, le=INT32_MAX)
    max_pending_session_count: int | None = Field(default=None, ge=0, le=INT32_MAX)
    max_pending_session_resource_slots: dict[str, Any] | None = None
    clear_max_pending_session_resource_slots: bool = False
    idle_timeout: int | None = Field(default=None, ge=0, le=INT32_MAX)


def policy_json(p: KeypairResourcePolicy) -> dict[str, Any]:
    pending = p.max_pending_session_resource_slots
    return {
        "name": p.name,
        "default_for_unspecified": p.default_for_unspecified.value,
        "total_resource_slots": p.total_resource_slots.to_json(),
        "max_concurrent_sessions": p.max_concurrent_sessions,
        "max_pending_session_count": p.max_pending_session_count,
        "max_pending_session_resource_slots": pending.to_json() if pending is not None else None,
        "idle_timeout": p.idle_timeout,
        "created_at": _iso(p.created_at),
    }


def _apply_policy(
    policy: KeypairResourcePolicy, body: PolicyBody, known: Mapping[str, SlotTypes]
) -> None:
    if body.default_for_unspecified is not None:
        policy.default_for_unspecified = body.default_for_unspecified
    if body.total_resource_slots is not None:
        policy.total_resource_slots = parse_slots(
            body.total_resource_slots, known, "total_resource_slots"
        )
    if body.max_concurrent_sessions is not None:
        policy.max_concurrent_sessions = body.max_concurrent_sessions
    if body.max_pending_session_count is not None:
        policy.max_pending_session_count = body.max_pending_session_count
    if body.max_pending_session_resource_slots is not None:
        policy.max_pending_session_resource_slots = parse_slots(
            body.max_pending_session_resource_slots, known, "max_pending_session_resource_slots"
        )
    if body.clear_max_pending_session_resource_slots:
        policy.max_pending_session_resource_slots = None
    if body.idle_timeout is not None:
        policy.idle_timeout = body.idle_timeout


@router.get("/resource-policies")
async def list_policies(_identity: SuperadminIdentity, manager: ManagerDep) -> dict[str, Any]:
    async with manager.db.begin() as db:
        rows = (
            await db.execute(sa.select(KeypairResourcePolicy).order_by(KeypairResourcePolicy.name))
        ).scalars()
        return {"items": [policy_json(p) for p in rows]}


@router.post("/resource-policies", status_code=201)
async def create_policy(
    body: PolicyBody, _identity: SuperadminIdentity, manager: ManagerDep
) -> dict[str, Any]:
    if not body.name:
        raise InvalidAPIParameters("A name is needed", field="name", received=body.name)
    async with manager.known_slots.hold() as known, manager.db.begin(write=True) as db:
        if await db.get(KeypairResourcePolicy, body.name) is not None:
            raise Conflict(f"The policy {body.name!r} exists", field="name", received=body.name)
        policy = KeypairResourcePolicy(
            name=body.name,
            default_for_unspecified=DefaultForUnspecified.LIMITED,
            total_resource_slots=ResourceSlot(),
            max_concurrent_sessions=0,
            max_pending_session_count=0,
            idle_timeout=0,
        )
        _apply_policy(policy, body, known)
        db.add(policy)
    return policy_json(policy)


async def _policy(db: Any, name: str) -> KeypairResourcePolicy:
    policy = await db.get(KeypairResourcePolicy, name)
    if policy is None:
        raise NotFound(f"No resource policy {name!r}", field="name", received=name)
    return policy  # type: ignore[no-any-return]


@router.patch("/resource-policies/{name}")
async def patch_policy(
    name: str, body: PolicyBody, _identity: SuperadminIdentity, manager: ManagerDep
) -> dict[str, Any]:
    async with manager.known_slots.hold() as known, manager.db.begin(write=True) as db:
        policy = await _policy(db, name)
        _apply_policy(policy, body, known)
    return policy_json(policy)


@router.delete("/resource-policies/{name}")
async def delete_policy(
    name: str, _identity: SuperadminIdentity, manager: ManagerDep
) -> dict[str, str]:
    async with manager.db.begin(write=True) as db:
        policy = await _policy(db, name)
        used = (
            await db.execute(sa.select(Keypair.access_key).where(Keypair.resource_policy == name))
        ).first()
        if used is not None:
            raise Conflict(
                f"Keypairs use the policy {name!r} (e.g. {used[0]})", field="name", received=name
            )
        await db.delete(policy)
    return {"result": "deleted"}


# -- scaling groups -------------------------------------------------------------------------


class ScalingGroupBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(
        default=None, min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
    )
    description: str | None = Field(default=None, max_length=512)
    is_active: bool | None = None
    is_public: bool | None = None
    scheduler: Literal["fifo", "lifo", "drf"] | None = None
    scheduler_opts: dict[str, Any] | None = None
    default_session_slots: dict[str, Any] | None = None


def sgroup_json(sg: ScalingGroup) -> dict[str, Any]:
    return {
        "name": sg.name,
        "description": sg.description,
        "is_active": sg.is_active,
        "is_public": sg.is_public,
        "scheduler": sg.scheduler,
        "scheduler_opts": sg.scheduler_opts or {},
        "default_session_slots": sg.default_session_slots.to_json(),
        "created_at": _iso(sg.created_at),
    }


def _check_opts(scheduler: str, opts: Mapping[str, Any]) -> None:
    try:
        SchedulerOptions.from_scaling_group(scheduler, opts)
    except ValueError as e:
        raise InvalidAPIParameters(
            str(e), field="scheduler_opts", expected="valid scheduler options", received=dict(opts)
        ) from None
    timeout = opts.get("pending_timeout", 0)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout < 0:
        raise InvalidAPIParameters(
            f"pending_timeout must be a number of seconds >= 0 (0 = never), got {timeout!r}",
            field="scheduler_opts.pending_timeout",
            expected="seconds >= 0",
            received=timeout,
        )
    frag = opts.get("allow_fractional_resource_fragmentation", True)
    if not isinstance(frag, bool):
        raise InvalidAPIParameters(
            "allow_fractional_resource_fragmentation must be true or false",
            field="scheduler_opts.allow_fractional_resource_fragmentation",
            expected="a boolean",
            received=frag,
        )


def _apply_sgroup(sg: ScalingGroup, body: ScalingGroupBody, known: Mapping[str, SlotTypes]) -> None:
    if body.description is not None:
        sg.description = body.description
    if body.is_active is not None:
        sg.is_active = body.is_active
    if body.is_public is not None:
        sg.is_public = body.is_public
    if body.scheduler is not None:
        sg.scheduler = body.scheduler
    if body.scheduler_opts is not None:
        sg.scheduler_opts = {**(sg.scheduler_opts or {}), **body.scheduler_opts}
    _check_opts(sg.scheduler, sg.scheduler_opts or {})
    if body.default_session_slots is not None:
        slots = parse_slots(body.default_session_slots, known, "default_session_slots")
        for slot in ("cpu", "mem"):
            if slots.get_amount(slot) <= 0 and slot in body.default_session_slots:
                raise InvalidAPIParameters(
                    f"default_session_slots.{slot} must be positive",
                    field=f"default_session_slots.{slot}",
                    received=body.default_session_slots[slot],
                )
        sg.default_session_slots = ResourceSlot(
            {**dict(sg.default_session_slots.items()), **dict(slots.items())}
        )


@router.get("/scaling-groups")
async def list_sgroups(_identity: SuperadminIdentity, manager: ManagerDep) -> dict[str, Any]:
    async with manager.db.begin() as db:
        rows = (await db.execute(sa.select(ScalingGroup).order_by(ScalingGroup.name))).scalars()
        return {"items": [sgroup_json(s) for s in rows]}


@router.post("/scaling-groups", status_code=201)
async def create_sgroup(
    body: ScalingGroupBody, _identity: SuperadminIdentity, manager: ManagerDep
) -> dict[str, Any]:
    if not body.name:
        raise InvalidAPIParameters("A name is needed", field="name", received=body.name)
    async with manager.known_slots.hold() as known, manager.db.begin(write=True) as db:
        if await db.get(ScalingGroup, body.name) is not None:
            raise Conflict(
                f"The scaling group {body.name!r} exists", field="name", received=body.name
            )
        sg = ScalingGroup(
            name=body.name,
            description="",
            is_active=True,
            is_public=True,
            scheduler="fifo",
            scheduler_opts={**DEFAULT_SCHEDULER_OPTS, "config": {}},
            default_session_slots=DEFAULT_SESSION_SLOTS,
        )
        _apply_sgroup(sg, body, known)
        db.add(sg)
    return sgroup_json(sg)


@router.patch("/scaling-groups/{name}")
async def patch_sgroup(
    name: str, body: ScalingGroupBody, _identity: SuperadminIdentity, manager: ManagerDep
) -> dict[str, Any]:
    async with manager.known_slots.hold() as known, manager.db.begin(write=True) as db:
        sg = await db.get(ScalingGroup, name)
        if sg is None:
            raise NotFound(f"No scaling group {name!r}", field="name", received=name)
        _apply_sgroup(sg, body, known)
    manager.trigger()
    return sgroup_json(sg)


@router.delete("/scaling-groups/{name}")
async def delete_sgroup(
    name: str, _identity: SuperadminIdentity, manager: ManagerDep
) -> dict[str, str]:
    async with manager.db.begin(write=True) as db:
        sg = await db.get(ScalingGroup, name)
        if sg is None:
            raise NotFound(f"No scaling group {name!r}", field="name", received=name)
        agent = (await db.execute(sa.select(Agent.id).where(Agent.scaling_group == name))).first()
        session = (
            await db.execute(sa.select(Session.id).where(Session.scaling_group == name))
        ).first()
        if agent is not None or session is not None:
            raise Conflict(
                f"Agents or sessions reference the scaling group {name!r}; deactivate it instead",
                field="name",
                received=name,
            )
        await db.delete(sg)
    return {"result": "deleted"}
