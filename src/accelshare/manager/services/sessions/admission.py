"""Admission: a new session enqueued (PENDING), after every check of the request.

The checks, in order: the owner (the caller's keypair, or ``owner_access_key``'s for
admins), a live session of the same name (``reuseIfExists``), the group charged, the
scaling group (active and open to the session: associated with the owner's domain, the
group or the owner's keypair, :mod:`..scaling_group_access`) and the session type it
takes, the resources (:func:`.spec.resolve_resources`
with the group's agents' quanta), the image and its rules, whether some agent of the
group could ever hold it (:mod:`.group_agents`), the keypair's pending-queue limits,
the dependencies and a designated agent.

Enqueue is one write transaction (with a per-access-key advisory lock on
PostgreSQL), so the keypair's pending-queue limits cannot be overrun by concurrent
requests; the new session is PENDING with a status-history row, and a scheduling
pass is triggered.
"""

from __future__ import annotations

import hashlib
import logging
import uuid
from collections.abc import Callable, Mapping, Sequence, Set
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from accelshare.common import ResourceSlot, SlotTypes
from accelshare.sched.images import (
    ImageRuleError,
    apply_minimum,
    check_accelerators,
)
from accelshare.sched.lifecycle import FINAL_STATUSES, SessionStatus
from accelshare.sched.model import KeypairLimits, SessionType
from accelshare.sched.predicates import check_enqueue_limits

from ...clock import Clock
from ...db import Database
from ...errors import Conflict, InvalidRequest, LimitExceeded, NotFound
from ...hub import ChangeHub
from ...images import check_known_name, lookup, requirement_of
from ...maintenance import Maintenance
from ...models import (
    Agent,
    Group,
    GroupMember,
    Keypair,
    KeypairResourcePolicy,
    ScalingGroup,
    ScalingGroupForDomain,
    ScalingGroupForGroup,
    ScalingGroupForKeypair,
    Session,
    SessionDependency,
    SessionStatusHistory,
    SessionVFolderMount,
    User,
    UserRole,
)
from ...slots import KnownSlots
from ...status_watch import StatusWatch
from ..actor import Actor
from ..scaling_group_access import AllowedScalingGroup, allowed_scaling_groups
from .group_agents import (
    EmptyTrialMaps,
    GroupAgent,
    check_some_agent_could_hold,
    check_some_agent_has,
    group_agents,
)
from .reads import SessionReads, live_by_name
from .spec import (
    SERVICE_PORT_ENV_PREFIX,
    ServicePort,
    SessionRequest,
    declared_services,
    resolve_resources,
)
from .views import create_answer

__all__ = ["CreateResult", "SessionAdmission", "enqueue_lock_key", "lock_owner"]

log = logging.getLogger(__name__)


def enqueue_lock_key(access_key: str) -> int:
    """The PostgreSQL advisory lock of ``access_key``'s enqueues (and renames)."""
    digest = hashlib.sha256(f"accelshare.enqueue:{access_key}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


async def lock_owner(db: AsyncSession, access_key: str) -> None:
    """Take the owner's enqueue lock for this transaction (PostgreSQL only: callers
    check the dialect; SQLite's ``BEGIN IMMEDIATE`` serialises writers)."""
    await db.execute(sa.select(sa.func.pg_advisory_xact_lock(enqueue_lock_key(access_key))))


def _generated_name() -> str:
    return "s-" + uuid.uuid4().hex[:12]


@dataclass(frozen=True, slots=True)
class CreateResult:
    """A create's answer: its body, and whether a session was created (``False``: the
    live session of that name, found by ``reuseIfExists``)."""

    body: dict[str, Any]
    created: bool


@dataclass(frozen=True, slots=True)
class _Owner:
    access_key: str
    user_id: uuid.UUID
    domain_name: str
    resource_policy: str
    limits: KeypairLimits | None  # None: the keypair's policy does not exist
    groups: list[tuple[uuid.UUID, str]]
    """The user's groups in its domain (id, name), the oldest first."""
    scaling_group: _ScalingGroup | None
    """The scaling group asked for (read with the owner), ``None`` when there is none."""
    scaling_group_open: bool
    """It is associated with the owner's domain or keypair."""
    scaling_group_groups: frozenset[uuid.UUID]
    """The user's groups (of :attr:`groups`) it is associated with."""


@dataclass(frozen=True, slots=True)
class _ScalingGroup:
    """What the enqueue needs of the session's scaling group."""

    name: str
    is_active: bool
    scheduler_opts: dict[str, Any] | None
    default_session_slots: ResourceSlot


@dataclass(frozen=True, slots=True)
class _Enqueued:
    id: uuid.UUID
    name: str
    status_version: int
    """The hub's ``status_version`` before the PENDING row was committed."""
    dependencies: list[uuid.UUID]


# The enqueue's statements, prebuilt: a statement built per call (and its cache key,
# computed per call) cost about as much on SQLite as running it.
# In one query (columns only: the ORM entities decoded every column, the users' quotas
# too): the keypair, its user, its resource policy's enqueue limits, the user's groups in
# its domain (a row each, the oldest first; one row of NULLs without any) and the scaling
# group asked for (NULLs when there is none), with whether it is associated with the
# user's domain, the keypair and each group (EXISTS on the association tables' primary
# keys, no extra round trip).  Read per request: a keypair or user deactivated is
# refused at once.
_MEMBERSHIPS = sa.join(GroupMember, Group, Group.id == GroupMember.group_id)
_SG_FOR_DOMAIN = sa.exists().where(
    ScalingGroupForDomain.scaling_group == ScalingGroup.name,
    ScalingGroupForDomain.domain == User.domain_name,
)
_SG_FOR_KEYPAIR = sa.exists().where(
    ScalingGroupForKeypair.scaling_group == ScalingGroup.name,
    ScalingGroupForKeypair.access_key == Keypair.access_key,
)
_SG_FOR_GROUP = sa.exists().where(
    ScalingGroupForGroup.scaling_group == ScalingGroup.name,
    ScalingGroupForGroup.group == Group.id,
)
_OWNER = (
    sa.select(
        Keypair.is_active,
        Keypair.resource_policy,
        User.id,
        User.domain_name,
        KeypairResourcePolicy.name,
        KeypairResourcePolicy.max_concurrent_sessions,
        KeypairResourcePolicy.max_pending_session_count,
        KeypairResourcePolicy.max_pending_session_resource_slots,
        Group.id,
        Group.name,
        ScalingGroup.name,
        ScalingGroup.is_active,
        ScalingGroup.scheduler_opts,
        ScalingGroup.default_session_slots,
        sa.or_(_SG_FOR_DOMAIN, _SG_FOR_KEYPAIR),
        _SG_FOR_GROUP,
    )
    .join(User, User.id == Keypair.user_id)
    .outerjoin(KeypairResourcePolicy, KeypairResourcePolicy.name == Keypair.resource_policy)
    .outerjoin(
        _MEMBERSHIPS,
        sa.and_(GroupMember.user_id == User.id, Group.domain_name == User.domain_name),
    )
    .outerjoin(ScalingGroup, ScalingGroup.name == sa.bindparam("scaling_group"))
    .where(Keypair.access_key == sa.bindparam("access_key"))
    .order_by(Group.created_at, Group.name)
)
_INSERT_SESSION = sa.insert(cast(sa.Table, Session.__table__))
_INSERT_HISTORY = sa.insert(cast(sa.Table, SessionStatusHistory.__table__))
_INSERT_DEPENDENCY = sa.insert(cast(sa.Table, SessionDependency.__table__))
_INSERT_MOUNT = sa.insert(cast(sa.Table, SessionVFolderMount.__table__))


def _session_types(scheduler_opts: Mapping[str, Any] | None) -> list[str]:
    """The session types a scaling group takes."""
    types: list[str] = (scheduler_opts or {}).get("allowed_session_types") or [
        "interactive",
        "batch",
    ]
    return types


def _as_scaling_group(found: AllowedScalingGroup) -> _ScalingGroup:
    return _ScalingGroup(found.name, True, found.scheduler_opts, found.default_session_slots)


def _is_up_or_ended(status: SessionStatus) -> bool:
    return status is SessionStatus.RUNNING or status in FINAL_STATUSES


class SessionAdmission:
    """The session service's create: the checks, the enqueue, the wait after it."""

    maintenance: Maintenance | None = None
    """Set by the manager: a frozen manager refuses new sessions."""

    def __init__(
        self,
        *,
        reads: SessionReads,
        db: Database,
        hub: ChangeHub,
        clock: Clock,
        trigger: Callable[[], None],
        passes: Callable[[], int],
        wait_for_pass: Callable[[int, float, str], Any],
        known_slots: KnownSlots,
        status_watch: StatusWatch,
        empty_trial_maps: EmptyTrialMaps,
        default_scaling_group: str,
    ) -> None:
        self.reads = reads
        self.db = db
        self.hub = hub
        self.clock = clock
        self.trigger = trigger
        self.passes = passes
        self.wait_for_pass = wait_for_pass
        self.known_slots = known_slots
        self.status_watch = status_watch
        self.empty_trial_maps = empty_trial_maps
        self.default_scaling_group = default_scaling_group

    async def create(
        self,
        caller: Actor,
        body: SessionRequest,
        *,
        known: Mapping[str, SlotTypes] | None = None,
    ) -> CreateResult:
        """Enqueue (PENDING), trigger a pass, wait as the body asks; the answer's body.

        The resources are parsed against ``known``, the known slot types (when not given,
        :meth:`KnownSlots.cached <accelshare.manager.slots.KnownSlots.cached>`'s, read
        again when it lacks a slot the body names), so a heartbeat adding a slot meanwhile
        does not change what this request sees."""
        if self.maintenance is not None:
            await self.maintenance.refuse_if_frozen()
        if known is None:
            known = await self.known_slots.cached(body.config.resources)
        enqueued = await self._enqueue(caller, body, known)
        if isinstance(enqueued, CreateResult):  # reuseIfExists found a live session
            return enqueued
        row = enqueued
        log.info("session %s (%s) enqueued by %s", row.id, row.name, caller.email)
        passes_before = self.passes()
        self.trigger()
        self.hub.publish(statuses=False)  # a new session: no status changed
        if not body.enqueue_only:
            await self._wait_after_create(
                row.id, passes_before, body.max_wait_seconds, row.status_version
            )
        # no dependencies made: none to read (only the enqueue adds them)
        result = await self.reads.current_json(
            row.id, dependencies=None if row.dependencies else ()
        )
        return CreateResult(create_answer(result, created=True), True)

    async def _enqueue(
        self, caller: Actor, body: SessionRequest, known: Mapping[str, SlotTypes]
    ) -> _Enqueued | CreateResult:
        """The enqueue transaction: the new PENDING session, or the live session of that
        name when ``reuseIfExists`` finds one."""
        async with self.db.begin(write=True) as db:
            scaling_group_name = body.config.scaling_group or self.default_scaling_group
            owner = await self._owner(db, caller, body.owner_access_key, scaling_group_name)
            if self.db.dialect == "postgresql":
                await lock_owner(db, owner.access_key)
            name = body.name or _generated_name()
            existing = await live_by_name(db, owner.access_key, name)
            if existing is not None:
                if body.reuse_if_exists:
                    result = await self.reads.full_json(db, existing)
                    return CreateResult(create_answer(result, created=False), False)
                raise Conflict(
                    f"A session named {name!r} already exists ({existing.status.value});"
                    " choose another name or destroy it first",
                    field="name",
                    expected="a name not used by your live sessions",
                    received=name,
                    sessionId=str(existing.id),
                )
            group_id = await self._group(db, owner, body.group)
            scaling_group = await self._scaling_group(db, body, owner, group_id)
            agents = await group_agents(db, scaling_group.name)
            resources = self._resources(agents, scaling_group, body, known)
            image_ref, resources, services = await self._image(
                db, body, resources, scaling_group.name, agents
            )
            opts = dict(body.config.resource_opts)
            opts.setdefault(
                "allow_fractional_resource_fragmentation",
                bool(
                    (scaling_group.scheduler_opts or {}).get(
                        "allow_fractional_resource_fragmentation", True
                    )
                ),
            )
            if not body.wait_for_agents:
                await check_some_agent_could_hold(
                    db,
                    self.empty_trial_maps,
                    agents,
                    scaling_group.name,
                    resources,
                    known,
                    allow_fragmentation=bool(opts["allow_fractional_resource_fragmentation"]),
                )
            await self._check_limits(db, owner, resources)
            deps = await self._dependencies(db, caller, owner.access_key, body.dependencies)
            designated = await self._designated(db, caller, body, scaling_group.name)
            now = self.clock()
            values: dict[str, Any] = {
                "id": uuid.uuid4(),
                "name": name,
                "session_type": SessionType(body.type),
                "access_key": owner.access_key,
                "user_id": owner.user_id,
                "group_id": group_id,
                "domain_name": owner.domain_name,
                "image": image_ref,
                "requested_slots": resources,
                "resource_opts": opts,
                "environ": {
                    **body.config.environ,
                    **{sp.env_name: str(sp.port) for sp in services},
                },
                "startup_command": body.startup_command,
                "priority": body.priority,
                "starts_at": (
                    now + body.starts_at
                    if isinstance(body.starts_at, timedelta)
                    else body.starts_at
                ),
                "tag": body.tag,
                "vfolder_mounts": [m.mount.model_dump(mode="json") for m in body.mounts] or None,
                "scaling_group": scaling_group.name,
                "designated_agent_id": designated,
                "status": SessionStatus.PENDING,
                "status_info": "enqueued",
                "status_data": {},
                "status_changed_at": now,
                "created_at": now,
            }
            # Core inserts of prebuilt statements (the ORM's unit of work cost more than
            # the inserts); the caller needs the id and the name only
            await db.execute(_INSERT_SESSION, values)
            await db.execute(
                _INSERT_HISTORY,
                {
                    "session_id": values["id"],
                    "from_status": None,
                    "to_status": SessionStatus.PENDING,
                    "reason": "enqueued",
                    "changed_at": now,
                },
            )
            if body.mounts:
                await db.execute(
                    _INSERT_MOUNT,
                    [
                        {
                            "session_id": values["id"],
                            "vfolder_id": m.folder_id,
                            "kernel_path": m.mount.kernel_path,
                            "read_only": m.mount.read_only,
                        }
                        for m in body.mounts
                    ],
                )
            if deps:
                await db.execute(
                    _INSERT_DEPENDENCY,
                    [{"session_id": values["id"], "depends_on": dep} for dep in deps],
                )
            # read before the commit: whatever changes the new session afterwards
            # publishes after it, and moves the counter
            status_version = self.hub.status_version
        return _Enqueued(values["id"], name, status_version, deps)

    async def _wait_after_create(
        self, session_id: uuid.UUID, passes_before: int, max_wait_s: int, status_version: int
    ) -> None:
        """Without ``maxWaitSeconds``: until the first pass gave its verdict (a few
        seconds at most), so the answer carries the PENDING reason.  With it: until the
        session is RUNNING or ended, at most that long (PENDING as of ``status_version``:
        no query until a status changes)."""
        if max_wait_s <= 0:
            await self.wait_for_pass(passes_before, 5.0, str(session_id))
            return
        await self.status_watch.wait_for(
            session_id, _is_up_or_ended, max_wait_s, unchanged_since=status_version
        )

    async def _owner(
        self, db: AsyncSession, caller: Actor, owner_key: str | None, scaling_group: str
    ) -> _Owner:
        key = owner_key or caller.access_key
        if owner_key and owner_key != caller.access_key and caller.role is UserRole.USER:
            raise NotFound(
                f"No keypair {owner_key!r} that you can act for",
                field="owner_access_key",
                expected="your own access key (only admins act for others)",
                received=owner_key,
            )
        # one query: the keypair, its user, its resource policy's enqueue limits, the
        # user's groups and the scaling group
        rows = (await db.execute(_OWNER, {"access_key": key, "scaling_group": scaling_group})).all()
        if not rows:
            raise NotFound(f"Unknown access key {key!r}", field="owner_access_key", received=key)
        row = rows[0]
        is_active, policy_name, user_id, domain_name, found_policy = row[:5]
        if caller.role is UserRole.ADMIN and domain_name != caller.domain_name:
            raise NotFound(
                f"No keypair {key!r} in your domain", field="owner_access_key", received=key
            )
        if not is_active:
            raise InvalidRequest(
                f"The keypair {key} is inactive", field="owner_access_key", received=key
            )
        limits = (
            None
            if found_policy is None
            else KeypairLimits(
                max_concurrent_sessions=row[5],
                max_pending_session_count=row[6],
                max_pending_session_resource_slots=row[7],
            )
        )
        groups = [(r[8], r[9]) for r in rows if r[8] is not None]
        found_group = None if row[10] is None else _ScalingGroup(row[10], row[11], row[12], row[13])
        return _Owner(
            key,
            user_id,
            domain_name,
            policy_name,
            limits,
            groups,
            found_group,
            scaling_group_open=bool(row[14]),
            scaling_group_groups=frozenset(r[8] for r in rows if r[8] is not None and r[15]),
        )

    async def _scaling_group(
        self, db: AsyncSession, body: SessionRequest, owner: _Owner, group_id: uuid.UUID
    ) -> _ScalingGroup:
        """The session's scaling group: the one asked for, or without one the manager's
        default (``default``) when it is open to the session, else the first open one (by
        name) that takes the session's type.  Open: active, and associated with the
        owner's domain, the group charged or the owner's keypair."""
        found = owner.scaling_group
        if (
            found is not None
            and found.is_active
            and (owner.scaling_group_open or group_id in owner.scaling_group_groups)
        ):
            scaling_group = found  # read with the owner: no other query
        else:
            scaling_group = await self._open_scaling_group(db, body, owner, group_id)
        name = scaling_group.name
        allowed = _session_types(scaling_group.scheduler_opts)
        if body.type not in allowed:
            raise InvalidRequest(
                f"Scaling group {name} does not take {body.type} sessions"
                f" (allowed: {', '.join(allowed)})",
                field="type",
                expected="one of " + ", ".join(allowed),
                received=body.type,
            )
        if body.type == "batch" and not body.startup_command:
            raise InvalidRequest(
                "A batch session needs a startupCommand (what it runs)",
                field="startupCommand",
                expected="a command line",
                received=body.startup_command,
            )
        return scaling_group

    async def _open_scaling_group(
        self, db: AsyncSession, body: SessionRequest, owner: _Owner, group_id: uuid.UUID
    ) -> _ScalingGroup:
        """The scaling group when the one read with the owner is not open to the session
        (or the group charged is not one of the owner's memberships): the open ones read,
        then the one asked for among them, or the first open one that takes the session's
        type when none was asked for."""
        allowed = await allowed_scaling_groups(
            db, domain=owner.domain_name, group_id=group_id, access_key=owner.access_key
        )
        names = [a.name for a in allowed]
        requested = body.config.scaling_group or None
        wanted = requested or self.default_scaling_group
        for candidate in allowed:
            if candidate.name == wanted:
                return _as_scaling_group(candidate)
        if requested is None and allowed:
            for candidate in allowed:
                if body.type in _session_types(candidate.scheduler_opts):
                    return _as_scaling_group(candidate)
            return _as_scaling_group(allowed[0])  # refused for its session types next
        expected = (
            "one of " + ", ".join(names)
            if names
            else "a scaling group associated with your domain, project or keypair"
            " (none is: ask a superadmin to associate one)"
        )
        if requested is None:
            raise InvalidRequest(
                "No scaling group is open to your sessions (available: none): a superadmin"
                " associates scaling groups with domains, projects or keypairs",
                field="config.scalingGroup",
                expected=expected,
                received=None,
            )
        found = owner.scaling_group
        if found is None or not found.is_active:
            reason = f"Unknown scaling group {requested!r}"
        else:
            reason = (
                f"The scaling group {requested!r} is not open to your sessions (not"
                " associated with your domain, this project or your keypair)"
            )
        raise InvalidRequest(
            f"{reason} (available: {', '.join(names) or 'none'})",
            field="config.scalingGroup",
            expected=expected,
            received=requested,
        )

    async def _group(self, db: AsyncSession, owner: _Owner, name: str | None) -> uuid.UUID:
        rows, domain = owner.groups, owner.domain_name
        if name is not None:
            for gid, gname in rows:
                if gname == name or str(gid) == name:
                    return gid
            raise InvalidRequest(
                f"You are not a member of the group {name!r}",
                field="group",
                expected="one of " + ", ".join(g for _, g in rows),
                received=name,
            )
        if rows:
            return rows[0][0]
        fallback = (
            await db.execute(
                sa.select(Group.id).where(Group.domain_name == domain).order_by(Group.created_at)
            )
        ).scalar()
        if fallback is None:
            raise InvalidRequest(
                f"No group in domain {domain} to charge the session to",
                field="group",
                received=name,
            )
        return fallback

    def _resources(
        self,
        agents: Sequence[GroupAgent],
        scaling_group: _ScalingGroup,
        body: SessionRequest,
        known: Mapping[str, SlotTypes],
    ) -> ResourceSlot:
        quanta: dict[str, set[Decimal]] = {}
        discrete: set[str] = set()
        fractional: set[str] = set()
        for agent in agents:
            for slot, q in (agent.quanta or {}).items():
                quanta.setdefault(slot, set()).add(Decimal(str(q)))
            for summary in (agent.compute_plugins or {}).values():
                slots: Set[str] = set(summary.get("slots") or [])
                if summary.get("kind") == "discrete":
                    discrete |= slots
                else:
                    fractional |= slots
        return resolve_resources(
            body.config.resources,
            known=known,
            defaults=scaling_group.default_session_slots,
            quanta=quanta,
            discrete=(discrete - fractional) - {"mem"},
        )

    async def _image(
        self,
        db: AsyncSession,
        body: SessionRequest,
        resources: ResourceSlot,
        scaling_group_name: str,
        agents: Sequence[GroupAgent],
    ) -> tuple[str, ResourceSlot, tuple[ServicePort, ...]]:
        """The catalogue reference the body's image stands for (an alias resolved), the
        resources after the image's rules (accelerator labels, minimum resources;
        :mod:`accelshare.sched.images`) and the session's app services: the request's, or
        where it names none (no ``service_ports``, no ``BACKENDAI_SERVICE_PORT_*`` in its
        environment) the image's declared ones.  A name outside the catalogue is kept as
        is when an agent of the group reports it (or nothing can judge it); otherwise
        refused."""
        services = body.config.service_ports
        if services is None and any(
            k.startswith(SERVICE_PORT_ENV_PREFIX) for k in body.config.environ
        ):
            services = ()
        image = await lookup(db, body.image)
        if image is None:
            await check_known_name(
                db,
                body.image,
                scaling_group=scaling_group_name,
                reported={name for agent in agents for name in agent.images or ()},
                pulls=any(agent.runtime == "docker" for agent in agents),
            )
            return body.image, resources, services or ()
        rules = requirement_of(image)
        try:
            check_accelerators(rules, resources)
            resources = apply_minimum(rules, resources, explicit=set(body.config.resources))
        except ImageRuleError as e:
            raise InvalidRequest(
                str(e), field=f"config.{e.field}", expected=e.expected, received=e.received
            ) from None
        check_some_agent_has(agents, rules, scaling_group_name)
        if services is None:
            services = declared_services(image.labels)
        return image.ref, resources, services

    async def _check_limits(self, db: AsyncSession, owner: _Owner, requested: ResourceSlot) -> None:
        limits, access_key, policy_name = owner.limits, owner.access_key, owner.resource_policy
        if limits is None or (
            limits.max_pending_session_count <= 0
            and limits.max_pending_session_resource_slots is None
        ):  # no pending-queue limit: nothing to count
            return
        pending = list(
            (
                await db.execute(
                    sa.select(Session.requested_slots).where(
                        Session.access_key == access_key, Session.status == SessionStatus.PENDING
                    )
                )
            ).scalars()
        )
        pending_slots = ResourceSlot()
        for slots in pending:
            pending_slots = pending_slots + slots
        reason = check_enqueue_limits(
            limits, pending_count=len(pending), pending_slots=pending_slots, requested=requested
        )
        if reason is not None:
            field = (
                "max_pending_session_count"
                if reason.startswith("You cannot have")
                else "max_pending_session_resource_slots"
            )
            raise LimitExceeded(
                reason,
                field=f"keypair_resource_policy.{field}",
                expected=f"within the limits of the resource policy {policy_name!r}",
                received=len(pending) if field.endswith("count") else pending_slots.to_json(),
            )

    async def _dependencies(
        self, db: AsyncSession, caller: Actor, access_key: str, refs: Sequence[str]
    ) -> list[uuid.UUID]:
        deps: list[uuid.UUID] = []
        for ref in refs:
            try:
                row = await self.reads.find(db, caller, ref, access_key)
            except NotFound:
                raise InvalidRequest(
                    f"Unknown dependency session {ref!r}",
                    field="dependencies",
                    expected="ids or names of your sessions",
                    received=ref,
                ) from None
            deps.append(row.id)
        return sorted(set(deps))

    async def _designated(
        self, db: AsyncSession, caller: Actor, body: SessionRequest, scaling_group: str
    ) -> str | None:
        agents = body.config.agent_list
        if not agents:
            return None
        if caller.role is not UserRole.SUPERADMIN:
            raise InvalidRequest(
                "Only a superadmin may assign a session to an agent",
                field="config.agentList",
                received=agents,
            )
        if len(agents) != 1:
            raise InvalidRequest(
                "Give exactly one agent (single-kernel sessions)",
                field="config.agentList",
                received=agents,
            )
        agent = await db.get(Agent, agents[0])
        if agent is None or agent.scaling_group != scaling_group:
            raise InvalidRequest(
                f"No agent {agents[0]!r} in scaling group {scaling_group}",
                field="config.agentList",
                received=agents,
            )
        return agents[0]
