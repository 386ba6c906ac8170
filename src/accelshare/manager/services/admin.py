"""Administration: users, keypairs (admin: own domain; superadmin: all), resource
policies and scaling groups (superadmin), for the ``/admin`` routes.

Every method runs one transaction and answers plain JSON-ready dicts.  Errors are
:mod:`accelshare.manager.errors` (the API turns them into problems): an unknown domain,
policy, group or slot is :class:`~accelshare.manager.errors.InvalidRequest`, a name in
use or a row still referenced :class:`~accelshare.manager.errors.Conflict`, something
outside the caller's domain :class:`~accelshare.manager.errors.NotFound`, acting on a
superadmin without being one :class:`~accelshare.manager.errors.PermissionDenied`.

Slot amounts are user input (``{"cpu": "4", "mem": "8g", "cuda.shares": "inf"}``),
parsed against the known slot types (:func:`parse_slots`); ``Infinity``/``inf`` means
unlimited.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Protocol

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from accelshare.common import (
    CommonValueError,
    DefaultForUnspecified,
    ResourceSlot,
    SlotTypes,
    normalize_amount,
)
from accelshare.common.text_input import check_text
from accelshare.sched.snapshot import SchedulerOptions

from ..credentials import generate_access_key, generate_secret_key
from ..db import Database
from ..enums import UserRole, UserStatus
from ..errors import Conflict, InvalidRequest, NotFound, PermissionDenied
from ..models import (
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
    email_matches,
)
from ..passwords import hash_password
from ..slots import KnownSlots

__all__ = [
    "AdminService",
    "Administrator",
    "KeypairChanges",
    "NewKeypair",
    "NewUser",
    "PolicyChanges",
    "ScalingGroupChanges",
    "UserChanges",
    "parse_slots",
]


class Administrator(Protocol):
    """Who acts (``accelshare.api.auth.Identity`` satisfies it)."""

    @property
    def user_id(self) -> uuid.UUID: ...

    @property
    def domain_name(self) -> str: ...

    @property
    def is_superadmin(self) -> bool: ...


@dataclass(frozen=True)
class NewUser:
    email: str
    password: str
    username: str | None = None
    full_name: str = ""
    role: UserRole = UserRole.USER
    domain_name: str | None = None
    group: str | None = None
    resource_policy: str = "default"
    with_keypair: bool = True


@dataclass(frozen=True)
class UserChanges:
    password: str | None = None
    role: UserRole | None = None
    status: UserStatus | None = None
    full_name: str | None = None
    total_resource_slots: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class NewKeypair:
    user_email: str
    resource_policy: str = "default"
    is_active: bool = True
    is_admin: bool = False


@dataclass(frozen=True)
class KeypairChanges:
    is_active: bool | None = None
    is_admin: bool | None = None
    resource_policy: str | None = None


@dataclass(frozen=True)
class PolicyChanges:
    """A new policy (``name`` needed) or the changes to one (``None``: unchanged)."""

    name: str | None = None
    default_for_unspecified: DefaultForUnspecified | None = None
    total_resource_slots: Mapping[str, Any] | None = None
    max_concurrent_sessions: int | None = None
    max_pending_session_count: int | None = None
    max_pending_session_resource_slots: Mapping[str, Any] | None = None
    clear_max_pending_session_resource_slots: bool = False
    idle_timeout: int | None = None
    max_vfolder_count: int | None = None  # storage folders per user; 0 = unlimited
    max_vfolder_size: int | None = None  # bytes per folder (its quota); 0 = unlimited


@dataclass(frozen=True)
class ScalingGroupChanges:
    """A new scaling group (``name`` needed) or the changes to one."""

    name: str | None = None
    description: str | None = None
    is_active: bool | None = None
    is_public: bool | None = None
    scheduler: str | None = None
    scheduler_opts: Mapping[str, Any] | None = None
    default_session_slots: Mapping[str, Any] | None = None


def parse_slots(
    raw: Mapping[str, Any] | None, known: Mapping[str, SlotTypes], field: str
) -> ResourceSlot:
    """Admin slot amounts: known slots only, zeros kept, ``inf`` allowed."""
    values: dict[str, Decimal] = {}
    for slot, value in (raw or {}).items():
        if slot not in known:
            raise InvalidRequest(
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
            raise InvalidRequest(
                str(e), field=f"{field}.{slot}", expected=e.expected, received=value
            ) from None
    return ResourceSlot(values)


def _iso(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


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
        "max_vfolder_count": p.max_vfolder_count,
        "max_vfolder_size": p.max_vfolder_size,
        "created_at": _iso(p.created_at),
    }


def scaling_group_json(sg: ScalingGroup) -> dict[str, Any]:
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


def _check_domain(actor: Administrator, domain: str) -> None:
    if not actor.is_superadmin and actor.domain_name != domain:
        raise NotFound(f"No such thing in your domain ({domain})")


def _guard_superadmin(actor: Administrator, owner_role: UserRole) -> None:
    """A domain admin must not act on a superadmin's account or keys: a keypair minted
    for a superadmin signs as the superadmin (docs/reliability.md, bug 1)."""
    if owner_role is UserRole.SUPERADMIN and not actor.is_superadmin:
        raise PermissionDenied(
            "Only a superadmin may change a superadmin", reason="insufficient-role"
        )


async def _check_policy_exists(db: AsyncSession, name: str) -> None:
    if await db.get(KeypairResourcePolicy, name) is None:
        raise InvalidRequest(
            f"Unknown resource policy {name!r}", field="resource_policy", received=name
        )


async def _user_by_email(db: AsyncSession, actor: Administrator, email: str) -> User:
    found = await db.execute(sa.select(User).where(email_matches(check_text(email, field="email"))))
    user = found.scalar_one_or_none()
    if user is None or (not actor.is_superadmin and user.domain_name != actor.domain_name):
        raise NotFound(f"No user {email!r}", field="email", received=email)
    return user


async def _keypair(db: AsyncSession, actor: Administrator, access_key: str) -> Keypair:
    row = (
        await db.execute(
            sa.select(Keypair, User.domain_name, User.role)
            .join(User, User.id == Keypair.user_id)
            .where(Keypair.access_key == access_key)
        )
    ).first()
    if row is None or (not actor.is_superadmin and row[1] != actor.domain_name):
        raise NotFound(f"No keypair {access_key!r}", field="access_key", received=access_key)
    _guard_superadmin(actor, row[2])
    return row[0]


async def _end_logins(db: AsyncSession, user_id: uuid.UUID) -> None:
    """End the user's console logins (a cookie may act with this keypair)."""
    await db.execute(
        sa.update(User).where(User.id == user_id).values(login_generation=User.login_generation + 1)
    )


async def _policy(db: AsyncSession, name: str) -> KeypairResourcePolicy:
    policy = await db.get(KeypairResourcePolicy, name)
    if policy is None:
        raise NotFound(f"No resource policy {name!r}", field="name", received=name)
    return policy


def _apply_policy(
    policy: KeypairResourcePolicy, changes: PolicyChanges, known: Mapping[str, SlotTypes]
) -> None:
    if changes.default_for_unspecified is not None:
        policy.default_for_unspecified = changes.default_for_unspecified
    if changes.total_resource_slots is not None:
        policy.total_resource_slots = parse_slots(
            changes.total_resource_slots, known, "total_resource_slots"
        )
    if changes.max_concurrent_sessions is not None:
        policy.max_concurrent_sessions = changes.max_concurrent_sessions
    if changes.max_pending_session_count is not None:
        policy.max_pending_session_count = changes.max_pending_session_count
    if changes.max_pending_session_resource_slots is not None:
        policy.max_pending_session_resource_slots = parse_slots(
            changes.max_pending_session_resource_slots,
            known,
            "max_pending_session_resource_slots",
        )
    if changes.clear_max_pending_session_resource_slots:
        policy.max_pending_session_resource_slots = None
    if changes.idle_timeout is not None:
        policy.idle_timeout = changes.idle_timeout
    if changes.max_vfolder_count is not None:
        policy.max_vfolder_count = changes.max_vfolder_count
    if changes.max_vfolder_size is not None:
        policy.max_vfolder_size = changes.max_vfolder_size


def check_scheduler_opts(scheduler: str, opts: Mapping[str, Any]) -> None:
    try:
        SchedulerOptions.from_scaling_group(scheduler, opts)
    except ValueError as e:
        raise InvalidRequest(
            str(e), field="scheduler_opts", expected="valid scheduler options", received=dict(opts)
        ) from None
    timeout = opts.get("pending_timeout", 0)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout < 0:
        raise InvalidRequest(
            f"pending_timeout must be a number of seconds >= 0 (0 = never), got {timeout!r}",
            field="scheduler_opts.pending_timeout",
            expected="seconds >= 0",
            received=timeout,
        )
    frag = opts.get("allow_fractional_resource_fragmentation", True)
    if not isinstance(frag, bool):
        raise InvalidRequest(
            "allow_fractional_resource_fragmentation must be true or false",
            field="scheduler_opts.allow_fractional_resource_fragmentation",
            expected="a boolean",
            received=frag,
        )


def _apply_scaling_group(
    sg: ScalingGroup, changes: ScalingGroupChanges, known: Mapping[str, SlotTypes]
) -> None:
    if changes.description is not None:
        sg.description = changes.description
    if changes.is_active is not None:
        sg.is_active = changes.is_active
    if changes.is_public is not None:
        sg.is_public = changes.is_public
    if changes.scheduler is not None:
        sg.scheduler = changes.scheduler
    if changes.scheduler_opts is not None:
        sg.scheduler_opts = {**(sg.scheduler_opts or {}), **changes.scheduler_opts}
    check_scheduler_opts(sg.scheduler, sg.scheduler_opts or {})
    if changes.default_session_slots is not None:
        slots = parse_slots(changes.default_session_slots, known, "default_session_slots")
        for slot in ("cpu", "mem"):
            if slots.get_amount(slot) <= 0 and slot in changes.default_session_slots:
                raise InvalidRequest(
                    f"default_session_slots.{slot} must be positive",
                    field=f"default_session_slots.{slot}",
                    received=changes.default_session_slots[slot],
                )
        sg.default_session_slots = ResourceSlot(
            {**dict(sg.default_session_slots.items()), **dict(slots.items())}
        )


class AdminService:
    """Users, keypairs, resource policies and scaling groups (see the module doc)."""

    def __init__(
        self, *, db: Database, known_slots: KnownSlots, trigger: Callable[[], None]
    ) -> None:
        self.db = db
        self.known_slots = known_slots
        self.trigger = trigger

    # -- users ------------------------------------------------------------------------------
    async def list_users(self, actor: Administrator, domain: str | None) -> list[dict[str, Any]]:
        query = sa.select(User).order_by(User.created_at, User.email)
        if not actor.is_superadmin:
            query = query.where(User.domain_name == actor.domain_name)
        elif domain:
            query = query.where(User.domain_name == domain)
        async with self.db.begin() as db:
            return [user_json(u) for u in (await db.execute(query)).scalars()]

    async def create_user(self, actor: Administrator, new: NewUser) -> dict[str, Any]:
        """``{"user": ..., "keypair": ... (with its secret) or None}``."""
        domain = new.domain_name or actor.domain_name
        _check_domain(actor, domain)
        if new.role is UserRole.SUPERADMIN and not actor.is_superadmin:
            raise PermissionDenied(
                "Only a superadmin may create a superadmin", reason="insufficient-role"
            )
        password_hash = await asyncio.to_thread(hash_password, new.password)
        async with self.db.begin(write=True) as db:
            if await db.get(Domain, domain) is None:
                raise InvalidRequest(
                    f"Unknown domain {domain!r}", field="domain_name", received=domain
                )
            taken = (
                await db.execute(sa.select(User.email).where(email_matches(new.email)))
            ).scalar()
            if taken is not None:
                same = "" if taken == new.email else f" ({taken}: addresses differ only in case)"
                raise Conflict(
                    f"A user with the email {new.email} exists{same}",
                    field="email",
                    received=new.email,
                )
            await _check_policy_exists(db, new.resource_policy)
            user = User(
                id=uuid.uuid4(),
                email=new.email,
                username=new.username,
                full_name=new.full_name,
                password_hash=password_hash,
                role=new.role,
                status=UserStatus.ACTIVE,
                domain_name=domain,
                total_resource_slots=ResourceSlot(),
            )
            db.add(user)
            await db.flush()
            group_query = sa.select(Group).where(Group.domain_name == domain)
            if new.group:
                group_query = group_query.where(Group.name == new.group)
            group = (await db.execute(group_query.order_by(Group.created_at))).scalars().first()
            if group is None and new.group:
                raise InvalidRequest(
                    f"Unknown group {new.group!r} in domain {domain}",
                    field="group",
                    received=new.group,
                )
            if group is not None:
                db.add(GroupMember(group_id=group.id, user_id=user.id))
            keypair = None
            if new.with_keypair:
                keypair = Keypair(
                    access_key=generate_access_key(),
                    secret_key=generate_secret_key(),
                    user_id=user.id,
                    resource_policy=new.resource_policy,
                    is_active=True,
                    is_admin=new.role is not UserRole.USER,
                )
                db.add(keypair)
        return {
            "user": user_json(user),
            "keypair": keypair_json(keypair, secret=True) if keypair else None,
        }

    async def patch_user(
        self, actor: Administrator, email: str, changes: UserChanges
    ) -> dict[str, Any]:
        known = await self.known_slots.load()
        async with self.db.begin(write=True) as db:
            user = await _user_by_email(db, actor, email)
            if changes.role is UserRole.SUPERADMIN and not actor.is_superadmin:
                raise PermissionDenied(
                    "Only a superadmin may grant superadmin", reason="insufficient-role"
                )
            if user.role is UserRole.SUPERADMIN and not actor.is_superadmin:
                raise PermissionDenied(
                    "Only a superadmin may change a superadmin", reason="insufficient-role"
                )
            if changes.password is not None:
                user.password_hash = await asyncio.to_thread(hash_password, changes.password)
            if changes.role is not None:
                user.role = changes.role
            if changes.status is not None:
                user.status = changes.status
            if changes.password is not None or (
                changes.status is not None and changes.status is not UserStatus.ACTIVE
            ):
                user.login_generation += 1  # ends the user's console logins
            if changes.full_name is not None:
                user.full_name = changes.full_name
            if changes.total_resource_slots is not None:
                user.total_resource_slots = parse_slots(
                    changes.total_resource_slots, known, "total_resource_slots"
                )
        return user_json(user)

    async def delete_user(self, actor: Administrator, email: str) -> dict[str, Any]:
        """Marks the user deleted, deactivates its keypairs and ends its logins."""
        async with self.db.begin(write=True) as db:
            user = await _user_by_email(db, actor, email)
            if user.id == actor.user_id:
                raise Conflict("You cannot delete yourself", field="email", received=email)
            _guard_superadmin(actor, user.role)
            user.status = UserStatus.DELETED
            user.login_generation += 1
            await db.execute(
                sa.update(Keypair).where(Keypair.user_id == user.id).values(is_active=False)
            )
        return user_json(user)

    # -- keypairs ---------------------------------------------------------------------------
    async def list_keypairs(
        self, actor: Administrator, user_email: str | None
    ) -> list[dict[str, Any]]:
        """Without secrets; each with its ``user_email``."""
        query = (
            sa.select(Keypair, User.email)
            .join(User, User.id == Keypair.user_id)
            .order_by(Keypair.created_at, Keypair.access_key)
        )
        if not actor.is_superadmin:
            query = query.where(User.domain_name == actor.domain_name)
        if user_email:
            query = query.where(email_matches(check_text(user_email, field="user_email")))
        async with self.db.begin() as db:
            rows = await db.execute(query)
            return [{**keypair_json(k), "user_email": e} for k, e in rows]

    async def create_keypair(self, actor: Administrator, new: NewKeypair) -> dict[str, Any]:
        """The keypair with its secret key (shown once) and ``user_email``."""
        async with self.db.begin(write=True) as db:
            user = await _user_by_email(db, actor, new.user_email)
            _guard_superadmin(actor, user.role)
            await _check_policy_exists(db, new.resource_policy)
            keypair = Keypair(
                access_key=generate_access_key(),
                secret_key=generate_secret_key(),
                user_id=user.id,
                resource_policy=new.resource_policy,
                is_active=new.is_active,
                is_admin=new.is_admin,
            )
            db.add(keypair)
        return {**keypair_json(keypair, secret=True), "user_email": user.email}

    async def patch_keypair(
        self, actor: Administrator, access_key: str, changes: KeypairChanges
    ) -> dict[str, Any]:
        async with self.db.begin(write=True) as db:
            keypair = await _keypair(db, actor, access_key)
            if changes.resource_policy is not None:
                await _check_policy_exists(db, changes.resource_policy)
                keypair.resource_policy = changes.resource_policy
            if changes.is_active is not None:
                if keypair.is_active and not changes.is_active:
                    await _end_logins(db, keypair.user_id)
                keypair.is_active = changes.is_active
            if changes.is_admin is not None:
                keypair.is_admin = changes.is_admin
        return keypair_json(keypair)

    async def delete_keypair(self, actor: Administrator, access_key: str) -> None:
        """Conflict while sessions reference the keypair (deactivate it instead)."""
        async with self.db.begin(write=True) as db:
            keypair = await _keypair(db, actor, access_key)
            used = (
                await db.execute(
                    sa.select(Session.id).where(Session.access_key == access_key).limit(1)
                )
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

    # -- resource policies ------------------------------------------------------------------
    async def list_policies(self) -> list[dict[str, Any]]:
        async with self.db.begin() as db:
            rows = (
                await db.execute(
                    sa.select(KeypairResourcePolicy).order_by(KeypairResourcePolicy.name)
                )
            ).scalars()
            return [policy_json(p) for p in rows]

    async def create_policy(self, new: PolicyChanges) -> dict[str, Any]:
        if not new.name:
            raise InvalidRequest("A name is needed", field="name", received=new.name)
        known = await self.known_slots.load()
        async with self.db.begin(write=True) as db:
            if await db.get(KeypairResourcePolicy, new.name) is not None:
                raise Conflict(f"The policy {new.name!r} exists", field="name", received=new.name)
            policy = KeypairResourcePolicy(
                name=new.name,
                default_for_unspecified=DefaultForUnspecified.LIMITED,
                total_resource_slots=ResourceSlot(),
                max_concurrent_sessions=0,
                max_pending_session_count=0,
                idle_timeout=0,
            )
            _apply_policy(policy, new, known)
            db.add(policy)
        return policy_json(policy)

    async def patch_policy(self, name: str, changes: PolicyChanges) -> dict[str, Any]:
        known = await self.known_slots.load()
        async with self.db.begin(write=True) as db:
            policy = await _policy(db, name)
            _apply_policy(policy, changes, known)
        return policy_json(policy)

    async def delete_policy(self, name: str) -> None:
        """Conflict while keypairs use the policy."""
        async with self.db.begin(write=True) as db:
            policy = await _policy(db, name)
            used = (
                await db.execute(
                    sa.select(Keypair.access_key).where(Keypair.resource_policy == name)
                )
            ).first()
            if used is not None:
                raise Conflict(
                    f"Keypairs use the policy {name!r} (e.g. {used[0]})",
                    field="name",
                    received=name,
                )
            await db.delete(policy)

    # -- scaling groups ---------------------------------------------------------------------
    async def list_scaling_groups(self) -> list[dict[str, Any]]:
        async with self.db.begin() as db:
            rows = (await db.execute(sa.select(ScalingGroup).order_by(ScalingGroup.name))).scalars()
            return [scaling_group_json(s) for s in rows]

    async def create_scaling_group(self, new: ScalingGroupChanges) -> dict[str, Any]:
        if not new.name:
            raise InvalidRequest("A name is needed", field="name", received=new.name)
        known = await self.known_slots.load()
        async with self.db.begin(write=True) as db:
            if await db.get(ScalingGroup, new.name) is not None:
                raise Conflict(
                    f"The scaling group {new.name!r} exists", field="name", received=new.name
                )
            sg = ScalingGroup(
                name=new.name,
                description="",
                is_active=True,
                is_public=True,
                scheduler="fifo",
                scheduler_opts={**DEFAULT_SCHEDULER_OPTS, "config": {}},
                default_session_slots=DEFAULT_SESSION_SLOTS,
            )
            _apply_scaling_group(sg, new, known)
            db.add(sg)
        return scaling_group_json(sg)

    async def patch_scaling_group(self, name: str, changes: ScalingGroupChanges) -> dict[str, Any]:
        """Changes the group, then asks for a scheduling pass."""
        known = await self.known_slots.load()
        async with self.db.begin(write=True) as db:
            sg = await db.get(ScalingGroup, name)
            if sg is None:
                raise NotFound(f"No scaling group {name!r}", field="name", received=name)
            _apply_scaling_group(sg, changes, known)
        self.trigger()
        return scaling_group_json(sg)

    async def delete_scaling_group(self, name: str) -> None:
        """Conflict while agents or sessions reference the group."""
        async with self.db.begin(write=True) as db:
            sg = await db.get(ScalingGroup, name)
            if sg is None:
                raise NotFound(f"No scaling group {name!r}", field="name", received=name)
            agent = (
                await db.execute(sa.select(Agent.id).where(Agent.scaling_group == name))
            ).first()
            session = (
                await db.execute(sa.select(Session.id).where(Session.scaling_group == name))
            ).first()
            if agent is not None or session is not None:
                raise Conflict(
                    f"Agents or sessions reference the scaling group {name!r};"
                    " deactivate it instead",
                    field="name",
                    received=name,
                )
            await db.delete(sg)
