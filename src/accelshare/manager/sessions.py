"""Sessions: enqueue, look up, list, destroy, logs, why-pending, status events.

Visibility (spec 07): a user sees and touches only its own sessions, an admin those of
its domain, a superadmin all; anything else is "not found" (404), so ids of other
users' sessions do not leak.  A session is named by its id or by its owner's session
name (the caller's own, or ``owner_access_key``'s for admins).

Enqueue is one write transaction (with a per-access-key advisory lock on
PostgreSQL), so the keypair's pending-queue limits cannot be overrun by concurrent
requests; the new session is PENDING with a status-history row, and a scheduling
pass is triggered.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence, Set
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from accelshare.common import ResourceSlot, SlotTypes, canonical_decimal
from accelshare.protocol import CreateKernelRequest, KernelReport, KernelStatus
from accelshare.sched.explain import explain
from accelshare.sched.fit import (
    DeviceLedger,
    MapLayouts,
    fits_capacity,
    format_slot_amount,
    largest_placements,
    totals_shortfall,
)
from accelshare.sched.images import (
    ImageRequirement,
    ImageRuleError,
    apply_minimum,
    check_accelerators,
    image_refusal,
)
from accelshare.sched.lifecycle import FINAL_STATUSES, SessionResult, SessionStatus
from accelshare.sched.model import KeypairLimits, SessionType
from accelshare.sched.predicates import check_enqueue_limits

from .agent_client import AgentClient, AgentRPCError
from .clock import Clock
from .db import Database
from .errors import (
    Conflict,
    InvalidRequest,
    LimitExceeded,
    NotFound,
    PermissionDenied,
    Unavailable,
)
from .hub import ChangeHub
from .images import check_known_name, lookup, requirement_of
from .list_specs import SESSIONS
from .maintenance import Maintenance
from .models import (
    Agent,
    AgentStatus,
    Group,
    GroupMember,
    Kernel,
    Keypair,
    KeypairResourcePolicy,
    ScalingGroup,
    Session,
    SessionDependency,
    SessionStatusHistory,
    SessionVFolderMount,
    User,
    UserRole,
)
from .querylang.compile_sql import filter_clause, order_clauses
from .scheduler.apply import BindJob
from .scheduler.binding import BINDABLE, allocations_json, kernel_request
from .scheduler.snapshot import reported_map_states
from .services.actor import Actor
from .services.sessions.spec import (
    MAX_PRIORITY,
    SESSION_NAME_RULE,
    SessionRequest,
    app_services,
    resolve_resources,
    session_name_problem,
)
from .slots import KnownSlots
from .status_watch import StatusWatch
from .transitions import agent_addresses, change_status, lock_session, session_kernels

__all__ = ["ProxyTarget", "SessionService", "session_json"]

log = logging.getLogger(__name__)

_WAIT_POLL_S = 0.5


def _visible(caller: Actor, row: Session) -> bool:
    if caller.role is UserRole.SUPERADMIN:
        return True
    if caller.role is UserRole.ADMIN:
        return row.domain_name == caller.domain_name
    return row.user_id == caller.user_id


def _visibility_filter(caller: Actor) -> sa.ColumnElement[bool]:
    if caller.role is UserRole.SUPERADMIN:
        return sa.true()
    if caller.role is UserRole.ADMIN:
        return Session.domain_name == caller.domain_name
    return Session.user_id == caller.user_id


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def _reported_ports(kernels: Sequence[Kernel]) -> list[Any] | None:
    """The app ports of the first kernel its agent reported them for (the one
    ``GET /session/{id}/apps`` and the proxy use), ``None`` if none did."""
    return next((k.service_ports for k in kernels if k.service_ports), None)


async def _reported_ports_of(
    db: AsyncSession, session_ids: Sequence[uuid.UUID]
) -> dict[uuid.UUID, list[Any]]:
    """:func:`_reported_ports` of many sessions in one query (session lists)."""
    if not session_ids:
        return {}
    found: dict[uuid.UUID, list[Any]] = {}
    result = await db.execute(
        sa.select(Kernel.session_id, Kernel.service_ports)
        .where(Kernel.session_id.in_(session_ids))
        .order_by(Kernel.session_id, Kernel.cluster_idx)
    )
    for session_id, service_ports in result:
        if service_ports and session_id not in found:
            found[session_id] = service_ports
    return found


async def _owner_emails(db: AsyncSession, rows: Sequence[Session]) -> dict[uuid.UUID, str]:
    """The owners' e-mails of a page of sessions, in one query (the console's Owner
    column shows them rather than access keys)."""
    user_ids = {r.user_id for r in rows}
    if not user_ids:
        return {}
    result = await db.execute(sa.select(User.id, User.email).where(User.id.in_(user_ids)))
    return {row.id: row.email for row in result}


def session_json(
    row: Session,
    kernels: Sequence[Kernel] = (),
    history: Sequence[SessionStatusHistory] = (),
    dependencies: Sequence[uuid.UUID] = (),
    *,
    reported_ports: Sequence[Any] | None = None,
) -> dict[str, Any]:
    """The REST shape of a session (Backend.AI's names where it has them).

    ``servicePorts`` carry each app's ``hostPort`` from the kernels (or, for lists,
    ``reported_ports``: the kernels' ports fetched in one query)."""
    occupied = row.occupied_slots.to_json()
    body: dict[str, Any] = {
        "sessionId": str(row.id),
        "sessionName": row.name,
        "type": row.session_type.value,
        "status": row.status.value,
        "statusInfo": row.status_info,
        "statusData": row.status_data or {},
        "statusChangedAt": _iso(row.status_changed_at),
        "result": row.result.value,
        "exitCode": row.exit_code,
        "image": row.image,
        "architecture": row.architecture,
        "requestedSlots": row.requested_slots.nonzero().to_json(),
        "occupiedSlots": occupied,
        "occupyingSlots": occupied,
        "resourceOpts": row.resource_opts or {},
        "environ": row.environ or {},
        "startupCommand": row.startup_command,
        "priority": row.priority,
        "startsAt": _iso(row.starts_at),
        "tag": row.tag,
        "scalingGroup": row.scaling_group,
        "agentId": row.agent_id,
        "accessKey": row.access_key,
        "userId": str(row.user_id),
        "groupId": str(row.group_id),
        "domainName": row.domain_name,
        "creationTime": _iso(row.created_at),
        "scheduledAt": _iso(row.scheduled_at),
        "startedAt": _iso(row.started_at),
        "terminationTime": _iso(row.terminated_at),
        "dependencies": [str(d) for d in dependencies],
        # the storage folders its kernels mount: {name, host_path, kernel_path, read_only}
        "mounts": list(row.vfolder_mounts or []),
        "servicePorts": app_services(
            row.environ, reported_ports if reported_ports is not None else _reported_ports(kernels)
        ),
    }
    if kernels:
        body["kernels"] = [
            {
                "kernelId": str(k.id),
                "agentId": k.agent_id,
                "status": k.status.value,
                "containerId": k.container_id,
                "deviceAllocs": k.device_allocs or {},
                "occupiedSlots": k.occupied_slots.to_json(),
            }
            for k in kernels
        ]
    if history:
        body["statusHistory"] = [
            {
                "from": h.from_status.value if h.from_status else None,
                "to": h.to_status.value,
                "reason": h.reason,
                "at": _iso(h.changed_at),
            }
            for h in history
        ]
    return body


def _lock_key(name: str) -> int:
    digest = hashlib.sha256(f"accelshare.enqueue:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def _generated_name() -> str:
    return "s-" + uuid.uuid4().hex[:12]


@dataclass(frozen=True, slots=True)
class CreateResult:
    body: dict[str, Any]
    created: bool


async def _agent_reach(
    db: AsyncSession, kernels: Sequence[Kernel]
) -> tuple[dict[str, str], set[str]]:
    """The kernels' agents: ``{id: current RPC address}`` (as :func:`agent_addresses`)
    and which of those are not ALIVE (LOST or gone), in one query (a destroy's)."""
    ids = {k.agent_id for k in kernels if k.agent_id is not None}
    if not ids:
        return {}, set()
    rows = await db.execute(_AGENT_REACH, {"ids": sorted(ids)})
    addresses: dict[str, str] = {}
    lost: set[str] = set()
    for agent_id, address, status in rows:
        if address:
            addresses[agent_id] = address
            if status is not AgentStatus.ALIVE:
                lost.add(agent_id)
    return addresses, lost


class SessionService:
    maintenance: Maintenance | None = None
    """Set by the manager: a frozen manager refuses new sessions."""

    def __init__(
        self,
        *,
        db: Database,
        client: AgentClient,
        hub: ChangeHub,
        clock: Clock,
        trigger: Callable[[], None],
        passes: Callable[[], int],  # a mark for wait_for_pass (Scheduler.next_pass_mark)
        wait_for_pass: Callable[[int, float, str], Any],
        known_slots: KnownSlots,
        default_scaling_group: str = "default",
    ) -> None:
        self.db = db
        self.known_slots = known_slots
        self.client = client
        self.hub = hub
        self.clock = clock
        self.trigger = trigger
        self.passes = passes
        self.wait_for_pass = wait_for_pass
        self.default_scaling_group = default_scaling_group
        # one status query per change for every create waiting for RUNNING
        self.status_watch = StatusWatch(db, hub, poll_s=_WAIT_POLL_S)
        # agents' reported maps as ledgers, for "could an empty agent hold this?"
        self.empty_ledgers = EmptyLedgers()

    # -- look-ups ---------------------------------------------------------------------------
    async def _find(
        self, db: AsyncSession, caller: Actor, ref: str, owner_access_key: str | None
    ) -> Session:
        try:
            session_id = uuid.UUID(ref)
        except ValueError:
            session_id = None
        row: Session | None = None
        if session_id is not None:
            row = (await db.execute(_SESSION_BY_ID, {"id": session_id})).scalar_one_or_none()
        else:
            owner = owner_access_key or caller.access_key
            query = (
                sa.select(Session)
                .where(Session.name == ref, Session.access_key == owner)
                .order_by(Session.created_at.desc())
            )
            rows = list((await db.execute(query)).scalars())
            live = [r for r in rows if r.status not in FINAL_STATUSES]
            candidates = live or rows
            row = candidates[0] if candidates else None
        if row is None or not _visible(caller, row):
            raise NotFound(
                f"No session {ref!r} that you can see",
                field="session",
                expected="the id or name of one of your sessions",
                received=ref,
            )
        return row

    async def resolve(
        self, caller: Actor, ref: str, owner_access_key: str | None = None
    ) -> uuid.UUID:
        async with self.db.begin() as db:
            return (await self._find(db, caller, ref, owner_access_key)).id

    async def get(
        self, caller: Actor, ref: str, owner_access_key: str | None = None
    ) -> dict[str, Any]:
        async with self.db.begin() as db:
            row = await self._find(db, caller, ref, owner_access_key)
            return await self._full_json(db, row)

    async def _full_json(self, db: AsyncSession, row: Session) -> dict[str, Any]:
        kernels = await session_kernels(db, row.id)
        history = list((await db.execute(_HISTORY, {"session_id": row.id})).scalars())
        deps = list((await db.execute(_DEPENDENCIES, {"session_id": row.id})).scalars())
        return session_json(row, kernels, history, deps)

    async def list_sessions(
        self,
        caller: Actor,
        *,
        statuses: Iterable[SessionStatus] | None = None,
        access_key: str | None = None,
        limit: int = 100,
        offset: int = 0,
        newest_first: bool = False,
        filter: str | None = None,
        order: str | None = None,
    ) -> dict[str, Any]:
        """A page of the sessions the caller may see (a user: their own; an admin: the
        domain's; a superadmin: all), oldest first, or with ``newest_first`` the most
        recently changed first (the console's history of ended sessions).

        ``filter`` / ``order`` are Backend.AI's expressions over
        :data:`~.list_specs.SESSIONS` (:class:`~.querylang.QueryError` when bad); a
        given ``order`` replaces the default one."""
        wanted = (
            sorted(statuses)
            if statuses is not None
            else sorted(set(SessionStatus) - FINAL_STATUSES)
        )
        where = [_visibility_filter(caller), Session.status.in_(wanted)]
        if access_key:
            where.append(Session.access_key == access_key)
        matching = filter_clause(filter, SESSIONS)
        if matching is not None:
            where.append(matching)
        if order is not None and order.strip():
            ordering = order_clauses(order, SESSIONS)
        else:
            ordering = list(_NEWEST_FIRST if newest_first else _OLDEST_FIRST)
        async with self.db.begin() as db:
            total = (
                await db.execute(sa.select(sa.func.count()).select_from(Session).where(*where))
            ).scalar_one()
            rows = (
                await db.scalars(
                    sa.select(Session).where(*where).order_by(*ordering).limit(limit).offset(offset)
                )
            ).all()
            ports = await _reported_ports_of(db, [r.id for r in rows])
            emails = await _owner_emails(db, rows)
            items = [
                session_json(r, reported_ports=ports.get(r.id))
                | {"ownerEmail": emails.get(r.user_id)}
                for r in rows
            ]
        return {"items": items, "total": total, "limit": limit, "offset": offset}

    # -- enqueue ----------------------------------------------------------------------------
    async def create(
        self,
        caller: Actor,
        body: SessionRequest,
        *,
        known: Mapping[str, SlotTypes] | None = None,
    ) -> CreateResult:
        """Enqueue (PENDING), trigger a pass, wait as the body asks; the answer's body.

        The resources are parsed against ``known``, the known slot types (read once, now,
        when not given), so a heartbeat adding a slot meanwhile does not change what this
        request sees."""
        if self.maintenance is not None:
            await self.maintenance.refuse_if_frozen()
        if known is None:
            known = await self.known_slots.load()
        enqueued = await self._enqueue(caller, body, known)
        if isinstance(enqueued, CreateResult):  # reuseIfExists found a live session
            return enqueued
        row = enqueued
        log.info("session %s (%s) enqueued by %s", row.id, row.name, caller.email)
        passes_before = self.passes()
        self.trigger()
        self.hub.publish()
        if not body.enqueue_only:
            await self._wait_after_create(row.id, passes_before, body.max_wait_seconds)
        async with self.db.begin() as db:
            fresh = (await db.execute(_SESSION_BY_ID, {"id": row.id})).scalar_one()
            result = await self._full_json(db, fresh)
        return CreateResult(_create_answer(result, created=True), True)

    async def _enqueue(
        self, caller: Actor, body: SessionRequest, known: Mapping[str, SlotTypes]
    ) -> _Enqueued | CreateResult:
        """The enqueue transaction: the new PENDING session, or the live session of that
        name when ``reuseIfExists`` finds one."""
        async with self.db.begin(write=True) as db:
            owner = await self._owner(db, caller, body.owner_access_key)
            if self.db.dialect == "postgresql":
                await db.execute(
                    sa.select(sa.func.pg_advisory_xact_lock(_lock_key(owner.access_key)))
                )
            name = body.name or _generated_name()
            existing = await self._live_by_name(db, owner.access_key, name)
            if existing is not None:
                if body.reuse_if_exists:
                    result = await self._full_json(db, existing)
                    return CreateResult(_create_answer(result, created=False), False)
                raise Conflict(
                    f"A session named {name!r} already exists ({existing.status.value});"
                    " choose another name or destroy it first",
                    field="name",
                    expected="a name not used by your live sessions",
                    received=name,
                    sessionId=str(existing.id),
                )
            sgroup = await self._scaling_group(db, body)
            group_id = await self._group(db, owner.user_id, owner.domain_name, body.group)
            agents = await _group_agents(db, sgroup.name)
            resources = self._resources(agents, sgroup, body, known)
            image_ref, resources = await self._image(db, body, resources, sgroup.name, agents)
            opts = dict(body.config.resource_opts)
            opts.setdefault(
                "allow_fractional_resource_fragmentation",
                bool(
                    (sgroup.scheduler_opts or {}).get(
                        "allow_fractional_resource_fragmentation", True
                    )
                ),
            )
            if not body.wait_for_agents:
                await _check_some_agent_could_hold(
                    db,
                    self.empty_ledgers,
                    agents,
                    sgroup.name,
                    resources,
                    known,
                    allow_fragmentation=bool(opts["allow_fractional_resource_fragmentation"]),
                )
            await self._check_limits(db, owner, resources)
            deps = await self._dependencies(db, caller, owner.access_key, body.dependencies)
            designated = await self._designated(db, caller, body, sgroup.name)
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
                    **{sp.env_name: str(sp.port) for sp in body.config.service_ports},
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
                "scaling_group": sgroup.name,
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
        return _Enqueued(values["id"], name)

    async def _wait_after_create(
        self, session_id: uuid.UUID, passes_before: int, max_wait_s: int
    ) -> None:
        """Without ``maxWaitSeconds``: until the first pass gave its verdict (a few
        seconds at most), so the answer carries the PENDING reason.  With it: until the
        session is RUNNING or ended, at most that long."""
        if max_wait_s <= 0:
            await self.wait_for_pass(passes_before, 5.0, str(session_id))
            return
        await self.status_watch.wait_for(session_id, _is_up_or_ended, max_wait_s)

    async def _owner(self, db: AsyncSession, caller: Actor, owner_key: str | None) -> _Owner:
        key = owner_key or caller.access_key
        if owner_key and owner_key != caller.access_key and caller.role is UserRole.USER:
            raise NotFound(
                f"No keypair {owner_key!r} that you can act for",
                field="owner_access_key",
                expected="your own access key (only admins act for others)",
                received=owner_key,
            )
        # one query: the keypair, its user and its resource policy's enqueue limits
        row = (await db.execute(_OWNER, {"access_key": key})).first()
        if row is None:
            raise NotFound(f"Unknown access key {key!r}", field="owner_access_key", received=key)
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
        return _Owner(key, user_id, domain_name, policy_name, limits)

    async def _live_by_name(self, db: AsyncSession, access_key: str, name: str) -> Session | None:
        params = {"access_key": access_key, "name": name}
        return (await db.execute(_LIVE_BY_NAME, params)).scalar_one_or_none()

    async def _scaling_group(self, db: AsyncSession, body: SessionRequest) -> ScalingGroup:
        name = body.config.scaling_group or self.default_scaling_group
        sgroup = (await db.execute(_SCALING_GROUP, {"name": name})).scalar_one_or_none()
        if sgroup is None or not sgroup.is_active:
            names = list(
                (
                    await db.execute(
                        sa.select(ScalingGroup.name).where(ScalingGroup.is_active.is_(True))
                    )
                ).scalars()
            )
            raise InvalidRequest(
                f"Unknown scaling group {name!r} (available: {', '.join(names) or 'none'})",
                field="config.scalingGroup",
                expected="one of " + ", ".join(names),
                received=name,
            )
        allowed = (sgroup.scheduler_opts or {}).get("allowed_session_types") or [
            "interactive",
            "batch",
        ]
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
        return sgroup

    async def _group(
        self, db: AsyncSession, user_id: uuid.UUID, domain: str, name: str | None
    ) -> uuid.UUID:
        rows = list(await db.execute(_MEMBER_GROUPS, {"user_id": user_id, "domain": domain}))
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
        agents: Sequence[_GroupAgent],
        sgroup: ScalingGroup,
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
            defaults=sgroup.default_session_slots,
            quanta=quanta,
            discrete=(discrete - fractional) - {"mem"},
        )

    async def _image(
        self,
        db: AsyncSession,
        body: SessionRequest,
        resources: ResourceSlot,
        sgroup_name: str,
        agents: Sequence[_GroupAgent],
    ) -> tuple[str, ResourceSlot]:
        """The catalogue reference the body's image stands for (an alias resolved) and
        the resources after the image's rules (accelerator labels, minimum resources;
        :mod:`accelshare.sched.images`).  A name outside the catalogue is kept as is when
        an agent of the group reports it (or nothing can judge it); otherwise refused."""
        image = await lookup(db, body.image)
        if image is None:
            await check_known_name(
                db,
                body.image,
                sgroup=sgroup_name,
                reported={name for agent in agents for name in agent.images or ()},
                pulls=any(agent.runtime == "docker" for agent in agents),
            )
            return body.image, resources
        rules = requirement_of(image)
        try:
            check_accelerators(rules, resources)
            resources = apply_minimum(rules, resources, explicit=set(body.config.resources))
        except ImageRuleError as e:
            raise InvalidRequest(
                str(e), field=f"config.{e.field}", expected=e.expected, received=e.received
            ) from None
        _check_some_agent_has(agents, rules, sgroup_name)
        return image.ref, resources

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
                row = await self._find(db, caller, ref, access_key)
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
        self, db: AsyncSession, caller: Actor, body: SessionRequest, sgroup: str
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
        if agent is None or agent.scaling_group != sgroup:
            raise InvalidRequest(
                f"No agent {agents[0]!r} in scaling group {sgroup}",
                field="config.agentList",
                received=agents,
            )
        return agents[0]

    # -- destroy ----------------------------------------------------------------------------
    async def destroy(
        self, caller: Actor, ref: str, *, forced: bool = False, owner_access_key: str | None = None
    ) -> dict[str, Any]:
        now = self.clock()
        who = f"destroyed by {caller.email}"
        targets: list[tuple[str, str]] = []  # (agent url, kernel id) to destroy on the agent
        unreachable: list[str] = []  # LOST agents: not called (reconciled when they return)
        confirm = False
        released = False
        async with self.db.begin(write=True) as db:
            row = await self._find(db, caller, ref, owner_access_key)
            if self.db.dialect == "postgresql":  # SQLite: BEGIN IMMEDIATE serialises writers
                locked = await lock_session(db, row.id)
                assert locked is not None
                row = locked
            kernels = await session_kernels(db, row.id)
            addresses, lost = await _agent_reach(db, kernels)
            targets = [
                (addresses[k.agent_id], str(k.id))
                for k in kernels
                if k.agent_id in addresses and k.agent_id not in lost
            ]
            unreachable = sorted(lost)
            if row.status in FINAL_STATUSES:
                targets, unreachable = [], []
            elif row.status is SessionStatus.PENDING:
                await change_status(
                    db, row, SessionStatus.CANCELLED, reason=who, now=now, kernels=kernels
                )
                targets = []
            elif row.status in BINDABLE:
                await change_status(
                    db, row, SessionStatus.CANCELLED, reason=who, now=now, kernels=kernels
                )
                released = True
            else:  # RUNNING, ERROR, TERMINATING
                if row.status is not SessionStatus.TERMINATING:
                    await change_status(
                        db, row, SessionStatus.TERMINATING, reason=who, now=now, kernels=kernels
                    )
                confirm = True
            session_id = row.id
        self.hub.publish()
        # a LOST agent is not waited for (its RPC would time out): the session ends here
        # and the agent destroys the kernel when it comes back (its heartbeat's ack)
        errors: list[str] = [f"agent {agent_id} is LOST" for agent_id in unreachable]
        for url, kernel_id in targets:
            try:
                await self.client.destroy_kernel(url, kernel_id)
            except AgentRPCError as e:
                if e.status_code != 404:  # "no such kernel": it is gone, which is the goal
                    errors.append(str(e))
        if confirm:
            released = await self._confirm_destroyed(session_id, who, errors, forced)
        if released:
            self.trigger()
        self.hub.publish()
        async with self.db.connect() as conn:  # four columns, not the ORM row
            answer = (await conn.execute(_DESTROY_ANSWER, {"id": session_id})).one()
        return {
            "sessionId": str(answer.id),
            "sessionName": answer.name,
            "status": answer.status.value,
            "statusInfo": answer.status_info,
        }

    async def _confirm_destroyed(
        self, session_id: uuid.UUID, who: str, errors: list[str], forced: bool
    ) -> bool:
        async with self.db.begin(write=True) as db:
            row = await lock_session(db, session_id)
            if row is None or row.status is not SessionStatus.TERMINATING:
                return row is not None and row.status in FINAL_STATUSES
            kernels = await session_kernels(db, row.id)
            agent_status = (
                await db.scalar(_AGENT_STATUS, {"id": row.agent_id}) if row.agent_id else None
            )
            lost = agent_status is not AgentStatus.ALIVE
            if errors and not forced and not lost:
                row.status_info = (
                    f"{who}; the agent did not confirm yet ({errors[0]}); it is asked again at"
                    " its next heartbeat"
                )
                return False
            reason = who
            if errors:
                reason += (
                    f" (agent {row.agent_id} is LOST)"
                    if lost
                    else " (forced; the agent did not confirm)"
                )
            await change_status(
                db, row, SessionStatus.TERMINATED, reason=reason, now=self.clock(), kernels=kernels
            )
            return True

    # -- status history, rename, priority ------------------------------------------------
    async def status_history(
        self, caller: Actor, ref: str, owner_access_key: str | None = None
    ) -> dict[str, str]:
        """``{STATUS: when the session last entered it}`` (Backend.AI's ``status_history``
        shape: upper-case status names, ISO times) from the recorded status changes."""
        async with self.db.begin() as db:
            row = await self._find(db, caller, ref, owner_access_key)
            rows = (await db.execute(_HISTORY_TIMES, {"session_id": row.id})).all()
        return {status.value: _iso(at) or "" for status, at in rows}

    async def rename(
        self, caller: Actor, ref: str, new_name: str, owner_access_key: str | None = None
    ) -> dict[str, Any]:
        """Give a live session another name (the rule of ``POST /session``'s ``name``;
        not one of the owner's other live sessions').  Its id, kernels and allocation
        are unchanged.  Answers ``{sessionId, sessionName, status}``."""
        async with self.db.begin(write=True) as db:
            row = await self._find(db, caller, ref, owner_access_key)
            row = await self._lock_for_change(db, row)
            await self._rename_row(db, row, new_name)
            answer = {"sessionId": str(row.id), "sessionName": row.name, "status": row.status.value}
        self.hub.publish()
        log.info("session %s renamed to %s by %s", answer["sessionId"], new_name, caller.email)
        return answer

    async def modify(
        self,
        caller: Actor,
        ref: str,
        *,
        name: str | None = None,
        priority: int | None = None,
    ) -> dict[str, Any]:
        """Backend.AI's ``modify_compute_session``: a new name (as :meth:`rename`) and/or
        a new scheduling priority (0..MAX_PRIORITY, only while the session is PENDING:
        afterwards there is no queue to reorder).  Both or neither change.  The session's
        full JSON afterwards."""
        if priority is not None and not 0 <= priority <= MAX_PRIORITY:
            raise InvalidRequest(
                f"priority must be from 0 to {MAX_PRIORITY} (received {priority})",
                field="priority",
                expected=f"an integer from 0 to {MAX_PRIORITY}",
                received=priority,
            )
        async with self.db.begin(write=True) as db:
            row = await self._find(db, caller, ref, None)
            row = await self._lock_for_change(db, row)
            if priority is not None and priority != row.priority:
                if row.status is not SessionStatus.PENDING:
                    raise Conflict(
                        f"The priority of session {row.name!r} can change only while it is"
                        f" PENDING; it is {row.status.value}",
                        field="status",
                        expected="PENDING",
                        received=row.status.value,
                    )
                row.priority = priority
            if name is not None:
                await self._rename_row(db, row, name)
            session_id = row.id
        if priority is not None:
            self.trigger()  # the queue's order may have changed
        self.hub.publish()
        async with self.db.begin() as db:
            fresh = (await db.execute(_SESSION_BY_ID, {"id": session_id})).scalar_one()
            return await self._full_json(db, fresh)

    async def _lock_for_change(self, db: AsyncSession, row: Session) -> Session:
        """``row`` locked (PostgreSQL: with the owner's enqueue lock, so no create of the
        same name interleaves; SQLite's ``BEGIN IMMEDIATE`` serialises writers)."""
        if self.db.dialect != "postgresql":
            return row
        await db.execute(sa.select(sa.func.pg_advisory_xact_lock(_lock_key(row.access_key))))
        locked = await lock_session(db, row.id)
        assert locked is not None
        return locked

    async def _rename_row(self, db: AsyncSession, row: Session, new_name: str) -> None:
        problem = session_name_problem(new_name)
        if problem is not None:
            raise InvalidRequest(
                f"Invalid session name {new_name!r}: {problem}",
                field="name",
                expected=SESSION_NAME_RULE,
                received=new_name,
            )
        if row.status in FINAL_STATUSES or row.status is SessionStatus.TERMINATING:
            raise Conflict(
                f"Session {row.name!r} has ended ({row.status.value}): only a live session"
                " can be renamed",
                field="status",
                expected="a live session (not TERMINATING or ended)",
                received=row.status.value,
            )
        if new_name == row.name:
            return
        existing = await self._live_by_name(db, row.access_key, new_name)
        if existing is not None and existing.id != row.id:
            raise Conflict(
                f"A session named {new_name!r} already exists ({existing.status.value});"
                " choose another name",
                field="name",
                expected="a name not used by the owner's live sessions",
                received=new_name,
                sessionId=str(existing.id),
            )
        row.name = new_name

    # -- restart ----------------------------------------------------------------------------
    async def restart(
        self, caller: Actor, ref: str, owner_access_key: str | None = None
    ) -> dict[str, Any]:
        """Backend.AI's ``session restart``: each kernel of a RUNNING session destroyed on
        its agent and created again with the same allocation (the same devices and
        amounts: the kernel row's ``device_allocs`` sent as the create's plan).  The
        session keeps its id, name, status (RUNNING) and resources; each kernel gets a new
        id (a new kernel row, the old one removed first, so the old kernel's exit event
        and heartbeats refer to no kernel of the session and cannot end it).  The history
        records a RUNNING -> RUNNING change, "restarted by ...".  A batch session's
        startup command runs again; the kernel's scratch directory is new.

        Not RUNNING (a batch session that has ended included): ``Conflict`` naming the
        status; its agent not ALIVE: ``Unavailable``.  A kernel that cannot be created
        again ends the session (ERROR -> TERMINATED, FAILURE, with the agent's reason)."""
        who = caller.email
        now = self.clock()
        async with self.db.begin(write=True) as db:
            row = await self._find(db, caller, ref, owner_access_key)
            row = await self._lock_for_change(db, row)
            if row.status is not SessionStatus.RUNNING:
                raise Conflict(
                    f"Session {row.name!r} is {row.status.value}: only a RUNNING session can"
                    " be restarted",
                    field="status",
                    expected="RUNNING",
                    received=row.status.value,
                )
            began = (row.status_data or {}).get("restarting")
            if isinstance(began, str) and datetime.fromisoformat(began) > now - _RESTART_GUARD:
                raise Conflict(
                    f"Session {row.name!r} is being restarted already (since {began})",
                    field="status",
                    expected="RUNNING, not restarting",
                    received="restarting",
                )
            kernels = await session_kernels(db, row.id)
            addresses, lost = await _agent_reach(db, kernels)
            missing = [k for k in kernels if k.agent_id not in addresses or k.agent_id in lost]
            if not kernels or missing:
                agent = missing[0].agent_id if missing else row.agent_id
                raise Unavailable(
                    f"Session {row.name!r} cannot be restarted: its agent {agent} is not"
                    " reachable (LOST or unknown)",
                    field="agent",
                    received=agent,
                )
            swaps: list[_KernelSwap] = []
            for old in kernels:
                assert old.agent_id is not None
                swap = _KernelSwap(
                    old=_kernel_values(old),
                    new_id=uuid.uuid4(),
                    agent_url=addresses[old.agent_id],
                )
                job = BindJob(row.id, swap.new_id, old.agent_id, plan=old.device_allocs or None)
                swap.request = kernel_request(job, row)
                swaps.append(swap)
                await db.delete(old)
            await db.flush()
            for swap in swaps:
                db.add(Kernel(**swap.new_values(now)))
            row.status_data = {**(row.status_data or {}), "restarting": now.isoformat()}
            row.status_info = f"restarting (by {who})"
            session_id = row.id
        self.hub.publish()
        log.info("session %s: restarting %d kernel(s) for %s", session_id, len(swaps), who)
        return await self._restart_kernels(session_id, swaps, who)

    async def _restart_kernels(
        self, session_id: uuid.UUID, swaps: list[_KernelSwap], who: str
    ) -> dict[str, Any]:
        failure: str | None = None
        reports: dict[uuid.UUID, KernelReport] = {}
        for swap in swaps:
            old_id = str(swap.old["id"])
            try:
                await self.client.destroy_kernel(swap.agent_url, old_id)
            except AgentRPCError as e:
                if e.status_code != 404:
                    failure = f"the kernel {old_id} could not be destroyed: {e}"
                    break
            assert swap.request is not None
            try:
                report = await self.client.create_kernel(swap.agent_url, swap.request)
            except AgentRPCError as e:
                failure = f"the kernel could not be created again: {e}"
                break
            if report.status is KernelStatus.FAILED:
                failure = f"the kernel could not be created again: {report.reason or 'no reason'}"
                break
            reports[swap.new_id] = report
        stale: list[tuple[str, str]] = []  # kernels created for a session ended meanwhile
        released = False
        async with self.db.begin(write=True) as db:
            row = await lock_session(db, session_id)
            if row is None or row.status is not SessionStatus.RUNNING:
                stale = [(s.agent_url, str(s.new_id)) for s in swaps if s.new_id in reports]
            else:
                kernels = await session_kernels(db, row.id)
                for kernel in kernels:
                    got = reports.get(kernel.id)
                    if got is None:
                        continue
                    if got.allocations:
                        kernel.device_allocs = allocations_json(got)
                    kernel.container_id = got.container_id
                    kernel.service_ports = [m.model_dump(mode="json") for m in got.service_ports]
                row.status_data = {
                    k: v for k, v in (row.status_data or {}).items() if k != "restarting"
                }
                now = self.clock()
                if failure is None:
                    reason = f"restarted by {who}"
                    db.add(
                        SessionStatusHistory(
                            session_id=row.id,
                            from_status=SessionStatus.RUNNING,
                            to_status=SessionStatus.RUNNING,
                            reason=reason,
                            changed_at=now,
                        )
                    )
                    row.status_info = reason
                    row.status_changed_at = now
                else:
                    why = f"restart by {who} failed: {failure}"
                    await change_status(
                        db, row, SessionStatus.ERROR, reason=why, now=now, kernels=kernels
                    )
                    row.result = SessionResult.FAILURE
                    await change_status(
                        db, row, SessionStatus.TERMINATED, reason=why, now=now, kernels=kernels
                    )
                    released = True
                    stale = [(s.agent_url, str(s.new_id)) for s in swaps if s.new_id in reports]
        for url, kernel_id in stale:
            try:
                await self.client.destroy_kernel(url, kernel_id)
            except AgentRPCError as e:  # the agent's next heartbeat is told to destroy it
                log.info("session %s: kernel %s not destroyed yet: %s", session_id, kernel_id, e)
        if released:
            self.trigger()
        self.hub.publish()
        if failure is not None:
            log.warning("session %s: restart failed: %s", session_id, failure)
        async with self.db.connect() as conn:
            answer = (await conn.execute(_DESTROY_ANSWER, {"id": session_id})).one()
        return {
            "sessionId": str(answer.id),
            "sessionName": answer.name,
            "status": answer.status.value,
            "statusInfo": answer.status_info,
        }

    # -- proxy (web terminal, app services) ------------------------------------------------
    async def proxy_target(self, caller: Actor, ref: str) -> ProxyTarget:
        """Where the session's terminal and apps live, for its owner or a superadmin.

        Not visible, or ended: ``NotFound`` (a closed session's routes disappear); a
        domain admin's look at a user's session: ``PermissionDenied`` (a terminal is the
        user's own shell: admins manage sessions, they do not enter them); not RUNNING
        yet: ``Conflict``."""
        async with self.db.begin() as db:
            row = await self._find(db, caller, ref, None)
            if row.status in FINAL_STATUSES or row.status is SessionStatus.TERMINATING:
                raise NotFound(
                    f"Session {ref!r} has ended ({row.status.value})",
                    field="session",
                    expected="a running session",
                    received=row.status.value,
                )
            if row.user_id != caller.user_id and caller.role is not UserRole.SUPERADMIN:
                raise PermissionDenied(
                    f"Only the owner of session {ref!r} (or a superadmin) may open its "
                    "terminal or apps",
                    field="session",
                    received=ref,
                )
            if row.status is not SessionStatus.RUNNING:
                raise Conflict(
                    f"Session {ref!r} is {row.status.value}, not RUNNING yet",
                    field="session",
                    expected="RUNNING",
                    received=row.status.value,
                )
            kernels = await session_kernels(db, row.id)
            addresses = await agent_addresses(db, kernels)
        target = next((k for k in kernels if k.agent_id in addresses), None)
        if target is None or target.agent_id is None:
            raise Unavailable(
                f"The agent of session {ref!r} has no known address",
                field="agent",
                received=row.agent_id,
            )
        return ProxyTarget(
            session_id=row.id,
            kernel_id=str(target.id),
            agent_url=addresses[target.agent_id],
            service_ports=tuple(app_services(row.environ, target.service_ports)),
        )

    # -- logs, why, events ------------------------------------------------------------------
    async def logs(self, caller: Actor, ref: str, owner_access_key: str | None = None) -> str:
        async with self.db.begin() as db:
            row = await self._find(db, caller, ref, owner_access_key)
            kernels = await session_kernels(db, row.id)
            addresses = await agent_addresses(db, kernels)
        target = next((k for k in kernels if k.agent_id in addresses), None)
        if target is None or target.agent_id is None:
            return ""
        try:
            return await self.client.kernel_logs(addresses[target.agent_id], str(target.id))
        except AgentRPCError as e:
            if e.status_code == 404:
                return ""
            raise Unavailable(
                f"Cannot read the logs from agent {target.agent_id}: {e}",
                field="agent",
                received=target.agent_id,
            ) from e

    async def why(
        self, caller: Actor, ref: str, owner_access_key: str | None = None
    ) -> dict[str, Any]:
        async with self.db.begin() as db:
            row = await self._find(db, caller, ref, owner_access_key)
        data = (row.status_data or {}).get("scheduler") or {}
        return {
            "sessionId": str(row.id),
            "sessionName": row.name,
            "status": row.status.value,
            "statusInfo": row.status_info,
            "scheduler": data,
            "agents": list(data.get("agents") or []),
            "explanation": explain(row.status.value, row.status_info, data),
        }

    async def events(
        self,
        caller: Actor,
        ref: str,
        owner_access_key: str | None = None,
        *,
        keepalive_s: float = 15.0,
    ) -> AsyncIterator[dict[str, Any]]:
        """Every status change of the session (history first), until it is final."""
        session_id = await self.resolve(caller, ref, owner_access_key)
        return self._event_stream(session_id, keepalive_s)

    async def _event_stream(
        self, session_id: uuid.UUID, keepalive_s: float
    ) -> AsyncIterator[dict[str, Any]]:
        last_id = 0
        idle = 0.0
        while True:
            async with self.db.begin() as db:
                rows = list(
                    (
                        await db.execute(
                            sa.select(SessionStatusHistory)
                            .where(
                                SessionStatusHistory.session_id == session_id,
                                SessionStatusHistory.id > last_id,
                            )
                            .order_by(SessionStatusHistory.id)
                        )
                    ).scalars()
                )
            for h in rows:
                last_id = h.id
                yield {
                    "event": "status",
                    "sessionId": str(session_id),
                    "from": h.from_status.value if h.from_status else None,
                    "status": h.to_status.value,
                    "reason": h.reason,
                    "at": _iso(h.changed_at),
                }
                if h.to_status in FINAL_STATUSES:
                    return
            if rows:
                idle = 0.0
            woke = await self.hub.wait(_WAIT_POLL_S)
            if not woke:
                idle += _WAIT_POLL_S
                if idle >= keepalive_s:
                    idle = 0.0
                    yield {"event": "keepalive"}
            await asyncio.sleep(0)


@dataclass(frozen=True, slots=True)
class ProxyTarget:
    """A running session's kernel as the app proxy reaches it."""

    session_id: uuid.UUID
    kernel_id: str
    agent_url: str
    service_ports: tuple[dict[str, Any], ...]

    def service(self, name: str) -> dict[str, Any] | None:
        return next((s for s in self.service_ports if s.get("name") == name), None)

    def host_port(self, name: str) -> int | None:
        """The port on the agent's host that serves ``name`` (None: no such service)."""
        service = self.service(name)
        return None if service is None else int(service.get("hostPort") or service["port"])


_RESTART_GUARD = timedelta(minutes=5)  # a restart older than this has died with its manager


@dataclass(slots=True)
class _KernelSwap:
    """A kernel being restarted: its row's values, the new kernel's id and request."""

    old: dict[str, Any]
    new_id: uuid.UUID
    agent_url: str
    request: CreateKernelRequest | None = None

    def new_values(self, now: datetime) -> dict[str, Any]:
        return {
            **self.old,
            "id": self.new_id,
            "container_id": None,
            "service_ports": [],
            "exit_code": None,
            "status_changed_at": now,
            "created_at": now,
            "started_at": now,
            "terminated_at": None,
        }


_KERNEL_COLUMNS = tuple(c.key for c in cast(sa.Table, Kernel.__table__).columns)


def _kernel_values(kernel: Kernel) -> dict[str, Any]:
    return {name: getattr(kernel, name) for name in _KERNEL_COLUMNS}


@dataclass(frozen=True, slots=True)
class _Owner:
    access_key: str
    user_id: uuid.UUID
    domain_name: str
    resource_policy: str
    limits: KeypairLimits | None  # None: the keypair's policy does not exist


@dataclass(frozen=True, slots=True)
class _Enqueued:
    id: uuid.UUID
    name: str


@dataclass(frozen=True, slots=True)
class _GroupAgent:
    """What the enqueue needs of an agent of the session's scaling group."""

    id: str
    runtime: str | None
    architecture: str
    images: list[str] | None
    quanta: dict[str, Any] | None
    compute_plugins: dict[str, Any] | None
    status: AgentStatus
    available_slots: ResourceSlot
    views_revision: int


async def _group_agents(db: AsyncSession, sgroup_name: str) -> list[_GroupAgent]:
    """The scaling group's agents (LOST ones included, not TERMINATED), by id: one query
    for the resource quanta and the image check."""
    rows = await db.execute(_GROUP_AGENTS, {"sgroup": sgroup_name})
    return [_GroupAgent(*row) for row in rows]


def _check_some_agent_has(
    agents: Sequence[_GroupAgent], rules: ImageRequirement, sgroup_name: str
) -> None:
    """Refuse an image that no agent of the scaling group can run (by their last
    heartbeats, LOST agents included): waiting would never end.  A group without
    agents yet is not judged (they may be starting); an agent that has the image
    but is busy leaves the session PENDING as usual."""
    reasons = []
    for agent in agents:
        refusal = image_refusal(
            rules,
            agent_runtime=agent.runtime or "process",
            agent_architecture=agent.architecture,
            agent_images=frozenset(agent.images or ()),
        )
        if refusal is None:
            return
        reasons.append(f"{agent.id} {refusal}")
    if reasons:
        shown = "; ".join(reasons[:3]) + (
            f"; and {len(reasons) - 3} more" if len(reasons) > 3 else ""
        )
        raise InvalidRequest(
            f"No agent in scaling group {sgroup_name} can run image {rules.ref}: {shown}",
            field="image",
            expected="an image some agent of the scaling group has",
            received=rules.ref,
        )


_VIEWS_CHUNK = 8  # agents whose reported maps are read at a time (13 kB each at 8 GPUs)


async def _check_some_agent_could_hold(
    db: AsyncSession,
    empty_ledgers: EmptyLedgers,
    agents: Sequence[_GroupAgent],
    sgroup_name: str,
    requested: ResourceSlot,
    known: Mapping[str, SlotTypes],
    *,
    allow_fragmentation: bool,
) -> None:
    """Refuse a session that no agent of the scaling group could hold even if that agent
    were empty: the scheduler's verdict (:func:`~accelshare.sched.fit.fits_capacity`, its
    ``could_fit``) on each agent's totals and last reported maps, LOST agents included.

    Judged only while at least one agent of the group is ALIVE: a group whose agents
    are all starting, restarting or lost keeps the session queued (its why-pending says
    what it waits for).  The agents whose totals cover the request are dry-run one,
    then a few at a time until one could hold it (usually the first); every agent's
    maps are read only to word a refusal."""
    if not any(a.status is AgentStatus.ALIVE for a in agents):
        return
    empty = ResourceSlot()
    candidates = [a for a in agents if not totals_shortfall(a.available_slots, empty, requested)]
    start = 0
    while start < len(candidates):
        # the first candidate alone (it usually fits), then a few at a time
        chunk = candidates[start : start + (1 if start == 0 else _VIEWS_CHUNK)]
        start += len(chunk)
        ledgers = await empty_ledgers.of(db, chunk)
        for agent in chunk:
            if fits_capacity(
                agent.available_slots,
                ledgers[agent.id],
                requested,
                allow_fragmentation=allow_fragmentation,
            ):
                return
    ledgers = await empty_ledgers.of(db, agents)
    largest = largest_placements(
        [(a.available_slots, ledgers[a.id]) for a in agents],
        requested,
        allow_fragmentation=allow_fragmentation,
    )
    if largest is None:  # pragma: no cover - the loop above found none that fits
        return
    most = ", ".join(f"{s} {format_slot_amount(s, v, known.get(s))}" for s, v in largest.items())
    asked = ", ".join(
        f"{s} {format_slot_amount(s, v, known.get(s))}" for s, v in requested.items() if v > 0
    )
    alive = sum(a.status is AgentStatus.ALIVE for a in agents)
    raise InvalidRequest(
        f"No agent of scaling group {sgroup_name} could hold this session, even with"
        f" nothing else running (judged by its {alive} alive and {len(agents) - alive}"
        f" lost agent(s)): the most one agent can give one kernel is {most}"
        f" (requested: {asked}). Ask for less, or set waitForAgents"
        " (CLI: --wait-for-agents) to keep it queued for agents yet to join.",
        field="config.resources",
        expected=f"at most what one agent of scaling group {sgroup_name} can hold: {most}",
        received=requested.to_json(),
        error="NoAgentCouldHold",
        largest={s: canonical_decimal(v) for s, v in largest.items()},
    )


def _maps_key(agent: _GroupAgent) -> tuple[Any, ...]:
    plugins = {
        key: {k: v for k, v in summary.items() if k != "status"}
        for key, summary in (agent.compute_plugins or {}).items()
        if isinstance(summary, Mapping)
    }
    return (
        agent.views_revision,
        tuple(sorted((s, canonical_decimal(v)) for s, v in agent.available_slots.items())),
        json.dumps(plugins, sort_keys=True, default=str),
    )


class EmptyLedgers:
    """Agents' last reported maps as :class:`DeviceLedger`\\ s, for "could an empty agent
    hold this?" at enqueue (their empty layout is what :func:`fits_capacity` judges).
    Parsing them costs milliseconds (an agent of 512 cores: ~7 ms of manager CPU per
    create), and they change only with the agent's heartbeats: kept per agent with its
    ``views_revision`` (bumped whenever its stored maps change) and its totals and
    plugin summary, so a ledger is reused only for the very maps it was read from.  The
    ledgers share one :class:`MapLayouts`.  Owned by the session service."""

    def __init__(self, max_agents: int = 4096) -> None:
        self.max_agents = max_agents
        self.layouts = MapLayouts()
        self._ledgers: dict[str, tuple[tuple[Any, ...], DeviceLedger]] = {}

    async def of(self, db: AsyncSession, agents: Sequence[_GroupAgent]) -> dict[str, DeviceLedger]:
        """Each agent's ledger, read from the database only for agents whose maps
        changed since they were last read here."""
        found: dict[str, DeviceLedger] = {}
        stale: list[tuple[_GroupAgent, tuple[Any, ...]]] = []
        for agent in agents:
            key = _maps_key(agent)
            entry = self._ledgers.get(agent.id)
            if entry is not None and entry[0] == key:
                found[agent.id] = entry[1]
            else:
                stale.append((agent, key))
        if stale:
            views = await _agent_views(db, [a.id for a, _ in stale])
            if len(self._ledgers) + len(stale) > self.max_agents:
                self._ledgers.clear()
            for agent, key in stale:
                states = reported_map_states(views.get(agent.id))
                ledger = DeviceLedger(agent.id, states, self.layouts)
                self._ledgers[agent.id] = (key, ledger)
                found[agent.id] = ledger
        return found


async def _agent_views(db: AsyncSession, ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    rows = await db.execute(_AGENT_VIEWS, {"ids": list(ids)})
    return {row.id: row.device_allocs for row in rows}


_OLDEST_FIRST = (Session.created_at, Session.id)
# an ended session's last change is its end (terminated, cancelled, failed)
_NEWEST_FIRST = (Session.status_changed_at.desc(), Session.created_at.desc(), Session.id.desc())

# The create path's statements, prebuilt: a statement built per call (and its cache key,
# computed per call) cost about as much on SQLite as running it.
_SESSION_BY_ID = sa.select(Session).where(Session.id == sa.bindparam("id"))
_HISTORY = (
    sa.select(SessionStatusHistory)
    .where(SessionStatusHistory.session_id == sa.bindparam("session_id"))
    .order_by(SessionStatusHistory.id)
)
_HISTORY_TIMES = (
    sa.select(SessionStatusHistory.to_status, SessionStatusHistory.changed_at)
    .where(SessionStatusHistory.session_id == sa.bindparam("session_id"))
    .order_by(SessionStatusHistory.id)
)
_DEPENDENCIES = sa.select(SessionDependency.depends_on).where(
    SessionDependency.session_id == sa.bindparam("session_id")
)
# the keypair, its user and its resource policy's enqueue limits (columns only: the ORM
# entities decoded every column, the users' quotas too)
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
    )
    .join(User, User.id == Keypair.user_id)
    .outerjoin(KeypairResourcePolicy, KeypairResourcePolicy.name == Keypair.resource_policy)
    .where(Keypair.access_key == sa.bindparam("access_key"))
)
_LIVE_BY_NAME = (
    sa.select(Session)
    .where(
        Session.access_key == sa.bindparam("access_key"),
        Session.name == sa.bindparam("name"),
        Session.status.not_in(sorted(FINAL_STATUSES)),
    )
    .limit(1)
)
_SCALING_GROUP = sa.select(ScalingGroup).where(ScalingGroup.name == sa.bindparam("name"))
_MEMBER_GROUPS = (
    sa.select(Group.id, Group.name)
    .join(GroupMember, GroupMember.group_id == Group.id)
    .where(
        GroupMember.user_id == sa.bindparam("user_id"), Group.domain_name == sa.bindparam("domain")
    )
    .order_by(Group.created_at, Group.name)
)
_GROUP_AGENTS = (
    sa.select(
        Agent.id,
        Agent.runtime,
        Agent.architecture,
        Agent.images,
        Agent.quanta,
        Agent.compute_plugins,
        Agent.status,
        Agent.available_slots,
        Agent.views_revision,
    )
    .where(Agent.scaling_group == sa.bindparam("sgroup"), Agent.status != AgentStatus.TERMINATED)
    .order_by(Agent.id)
)
# the destroy's
_AGENT_REACH = sa.select(Agent.id, Agent.address, Agent.status).where(
    Agent.id.in_(sa.bindparam("ids", expanding=True))
)
_AGENT_VIEWS = sa.select(Agent.id, Agent.device_allocs).where(
    Agent.id.in_(sa.bindparam("ids", expanding=True))
)
_AGENT_STATUS = sa.select(Agent.status).where(Agent.id == sa.bindparam("id"))
_DESTROY_ANSWER = sa.select(Session.id, Session.name, Session.status, Session.status_info).where(
    Session.id == sa.bindparam("id")
)
_INSERT_SESSION = sa.insert(cast(sa.Table, Session.__table__))
_INSERT_HISTORY = sa.insert(cast(sa.Table, SessionStatusHistory.__table__))
_INSERT_DEPENDENCY = sa.insert(cast(sa.Table, SessionDependency.__table__))
_INSERT_MOUNT = sa.insert(cast(sa.Table, SessionVFolderMount.__table__))


def _is_up_or_ended(status: SessionStatus) -> bool:
    return status is SessionStatus.RUNNING or status in FINAL_STATUSES


def _create_answer(session: Mapping[str, Any], *, created: bool) -> dict[str, Any]:
    """Backend.AI's create answer plus the whole session under ``session``."""
    return {
        "sessionId": session["sessionId"],
        "sessionName": session["sessionName"],
        "status": session["status"],
        "statusInfo": session["statusInfo"],
        "created": created,
        "servicePorts": session.get("servicePorts", []),
        "session": dict(session),
    }
