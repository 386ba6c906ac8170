"""Load one scaling group's :class:`~accelshare.sched.plan.SchedulingSnapshot` (one transaction).

Everything the pure pass reads comes from the database in the scheduler's
transaction, so counters cannot drift (spec 05):

* ALIVE, schedulable agents of the group; their *occupied* totals recomputed from
  their resource-occupying kernels, and their per-device maps rebuilt from the last
  heartbeat's ``PluginMapView``\\ s with :func:`~accelshare.sched.fit.merge_device_ledger`:
  a device counts what the manager's own kernels hold there (planned placements of
  kernels the agent has not created yet included) plus what the agent reports for
  kernels the manager has no row for (and legacy holdings);
* PENDING sessions in FIFO order, with retries and fragmentation option;
* the predicates' counters: concurrent sessions per access key, occupancy per
  keypair / user / group / domain (over every scaling group), the keypairs' policy
  limits and the user / group / domain quotas, and the dependencies' states.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any, cast

import sqlalchemy as sa
from pydantic import ValidationError
from sqlalchemy.ext.asyncio import AsyncSession

from accelshare.agent.wire import PluginMapView
from accelshare.common import DefaultForUnspecified, ResourceSlot, SlotTypes
from accelshare.sched.fit import DeviceState, MapKind, MapState, merge_device_ledger
from accelshare.sched.images import ImageRequirement
from accelshare.sched.lifecycle import SessionResult, SessionStatus
from accelshare.sched.model import AgentState, KeypairLimits, PendingSession
from accelshare.sched.plan import AgentSnapshot, SchedulerOptions, SchedulingSnapshot
from accelshare.sched.predicates import DependencyState, PredicateContext

from ..images import requirement_of
from ..models import (
    Agent,
    AgentStatus,
    Domain,
    Group,
    Image,
    Kernel,
    Keypair,
    KeypairResourcePolicy,
    ScalingGroup,
    Session,
    SessionDependency,
    User,
)
from ..transitions import OCCUPYING

__all__ = ["LoadedSnapshot", "load_snapshot", "map_states_from_views", "parse_views"]

_ZERO = Decimal(0)
_INFINITY = Decimal("Infinity")


@dataclass(frozen=True, slots=True)
class LoadedSnapshot:
    snapshot: SchedulingSnapshot
    agent_revisions: Mapping[str, int]
    agent_urls: Mapping[str, str]


def parse_views(device_allocs: Mapping[str, Any] | None) -> dict[str, PluginMapView]:
    """The stored heartbeat views (``agents.device_allocs``); broken entries are skipped."""
    views: dict[str, PluginMapView] = {}
    for key, raw in (device_allocs or {}).items():
        try:
            views[key] = PluginMapView.model_validate(raw)
        except ValidationError:
            continue
    return views


def map_states_from_views(
    views: Mapping[str, PluginMapView],
    manager_allocs: Mapping[str, Mapping[str, Decimal]],
    known_kernels: frozenset[str],
) -> tuple[MapState, ...]:
    """Per-device state for the dry run (see the module docstring)."""
    states: list[MapState] = []
    for key, view in views.items():
        legacy = {
            device
            for per_device in view.legacy_allocations.values()
            for device, amount in per_device.items()
            if Decimal(amount) > 0
        }
        devices = []
        for d in view.devices:
            capacity = Decimal(d.capacity)
            allocated = merge_device_ledger(
                Decimal(d.allocated),
                {k: Decimal(v) for k, v in d.kernels.items()},
                manager_allocs.get(d.slot_name, {}).get(d.device_id, _ZERO),
                known_kernels,
            )
            if d.device_id in legacy:  # held under a renamed slot: not usable until freed
                allocated = capacity
            devices.append(
                DeviceState(
                    d.device_id,
                    d.slot_name,
                    SlotTypes(d.slot_type),
                    capacity,
                    min(allocated, capacity),
                    d.numa_node,
                )
            )
        try:
            kind = MapKind(view.kind)
        except ValueError:
            continue
        states.append(
            MapState(
                key,
                kind,
                tuple(devices),
                strategy=view.strategy,
                quantum=Decimal(view.quantum) if view.quantum else None,
                exclusive_slot_types=tuple(view.exclusive_slot_types),
            )
        )
    return tuple(states)


def _add_alloc(
    total: dict[str, dict[str, Decimal]], alloc: Mapping[str, Mapping[str, Any]]
) -> None:
    for slot, per_device in (alloc or {}).items():
        bucket = total.setdefault(slot, {})
        for device, amount in per_device.items():
            bucket[device] = bucket.get(device, _ZERO) + Decimal(str(amount))


def _reported_kernel_ids(views: Iterable[PluginMapView]) -> set[str]:
    return {k for view in views for d in view.devices for k in d.kernels}


def _as_uuid(value: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(value)
    except ValueError:
        return None


def _quota(total: ResourceSlot, known: Mapping[str, SlotTypes]) -> ResourceSlot | None:
    """User / group / domain quotas: listed slots limit, unlisted ones are unlimited."""
    listed = dict(total.items())
    if not listed:
        return None
    return ResourceSlot({**dict.fromkeys(known, _INFINITY), **listed})


def _keypair_quota(
    policy: KeypairResourcePolicy, known: Mapping[str, SlotTypes]
) -> ResourceSlot | None:
    if policy.default_for_unspecified is DefaultForUnspecified.UNLIMITED and not len(
        policy.total_resource_slots
    ):
        return None
    return ResourceSlot.from_policy(
        {
            "default_for_unspecified": policy.default_for_unspecified.value,
            "total_resource_slots": policy.total_resource_slots.to_json(),
        },
        known,
    )


async def _agents(
    db: AsyncSession, sgroup: str
) -> tuple[list[AgentSnapshot], dict[str, int], dict[str, str]]:
    # Core rows with only the columns the pass reads: no ORM identity map, no
    # attribute instrumentation (10x cheaper than ORM objects for large groups)
    agents = list(
        await db.execute(
            sa.select(
                Agent.id,
                Agent.available_slots,
                Agent.runtime,
                Agent.architecture,
                Agent.images,
                Agent.device_allocs,
                Agent.occupancy_revision,
                Agent.address,
            )
            .where(
                Agent.scaling_group == sgroup,
                Agent.status == AgentStatus.ALIVE,
                Agent.is_schedulable.is_(True),
            )
            .order_by(Agent.id)
        )
    )
    if not agents:
        return [], {}, {}
    occupied: dict[str, ResourceSlot] = {}
    allocs: dict[str, dict[str, dict[str, Decimal]]] = {}
    # the group's agents by a join, not an IN list of (up to thousands of) ids
    rows = await db.execute(
        sa.select(Kernel.agent_id, Kernel.occupied_slots, Kernel.device_allocs)
        .join(Agent, Agent.id == Kernel.agent_id)
        .where(
            Agent.scaling_group == sgroup,
            Agent.status == AgentStatus.ALIVE,
            Agent.is_schedulable.is_(True),
            Kernel.status.in_(OCCUPYING),
        )
    )
    for agent_id, slots, device_allocs in rows:
        assert agent_id is not None
        occupied[agent_id] = occupied.get(agent_id, ResourceSlot()) + slots
        _add_alloc(allocs.setdefault(agent_id, {}), device_allocs)
    views = {a.id: parse_views(a.device_allocs) for a in agents}
    reported = {k for v in views.values() for k in _reported_kernel_ids(v.values())}
    reported_uuids = [u for u in map(_as_uuid, reported) if u is not None]
    known: set[str] = set()
    for start in range(0, len(reported_uuids), 500):
        chunk = reported_uuids[start : start + 500]
        known.update(
            str(k) for (k,) in await db.execute(sa.select(Kernel.id).where(Kernel.id.in_(chunk)))
        )
    known_kernels = frozenset(known)
    snapshots = [
        AgentSnapshot(
            AgentState(
                a.id,
                a.available_slots,
                occupied.get(a.id, ResourceSlot()),
                sgroup,
                runtime=a.runtime or "process",
                architecture=a.architecture,
                images=frozenset(a.images or ()),
            ),
            map_states_from_views(views[a.id], allocs.get(a.id, {}), known_kernels),
        )
        for a in agents
    ]
    return (
        snapshots,
        {a.id: a.occupancy_revision for a in agents},
        {a.id: a.address for a in agents},
    )


async def _pending(db: AsyncSession, sgroup: ScalingGroup) -> list[PendingSession]:
    # Core on the session's connection (no ORM row processing); of ``status_data`` only
    # ``scheduler.retries`` is read, by the database: the failures' write replaces the
    # ``scheduler`` key in SQL, so the (large) documents are neither parsed nor re-encoded
    t = cast(sa.Table, Session.__table__)
    conn = await db.connection()
    rows = list(
        await conn.execute(
            sa.select(
                t.c.id,
                t.c.access_key,
                t.c.requested_slots,
                t.c.created_at,
                t.c.user_id,
                t.c.group_id,
                t.c.domain_name,
                t.c.name,
                t.c.priority,
                t.c.session_type,
                t.c.starts_at,
                t.c.status_data[("scheduler", "retries")].as_integer(),
                t.c.resource_opts,
                t.c.designated_agent_id,
                t.c.image,
            )
            .where(t.c.scaling_group == sgroup.name, t.c.status == SessionStatus.PENDING)
            .order_by(t.c.created_at, t.c.id)
        )
    )
    deps: dict[uuid.UUID, list[str]] = {}
    if rows:
        ids = [r[0] for r in rows]
        for start in range(0, len(ids), 500):
            dep_rows = await conn.execute(
                sa.select(SessionDependency.session_id, SessionDependency.depends_on).where(
                    SessionDependency.session_id.in_(ids[start : start + 500])
                )
            )
            for sid, dep in dep_rows:
                deps.setdefault(sid, []).append(str(dep))
    default_frag = bool(
        (sgroup.scheduler_opts or {}).get("allow_fractional_resource_fragmentation", True)
    )
    catalogue: dict[str, ImageRequirement] = {}
    wanted = {r[-1] for r in rows}
    if wanted:
        for image in (await db.execute(sa.select(Image).where(Image.ref.in_(wanted)))).scalars():
            catalogue[image.ref] = requirement_of(image)
    pending = []
    for (
        sid,
        access_key,
        requested,
        created_at,
        user_id,
        group_id,
        domain_name,
        name,
        priority,
        session_type,
        starts_at,
        retries,
        opts,
        designated,
        image_ref,
    ) in rows:
        frag = (opts or {}).get("allow_fractional_resource_fragmentation", default_frag)
        pending.append(
            PendingSession(
                id=str(sid),
                access_key=access_key,
                requested_slots=requested,
                created_at=created_at,
                user_id=str(user_id),
                group_id=str(group_id),
                domain_name=domain_name,
                name=name,
                priority=priority,
                session_type=session_type,
                starts_at=starts_at,
                dependencies=tuple(sorted(deps.get(sid, ()))),
                retries=int(retries or 0),
                allow_fragmentation=bool(frag),
                designated_agent=designated,
                image=catalogue.get(image_ref),
            )
        )
    return pending


async def _predicate_context(
    db: AsyncSession,
    pending: list[PendingSession],
    now: datetime,
    known: Mapping[str, SlotTypes],
) -> tuple[PredicateContext, dict[str, ResourceSlot]]:
    concurrent: dict[str, int] = {}
    occupancy: dict[tuple[str, str], ResourceSlot] = {}
    by_key: dict[str, ResourceSlot] = {}
    rows = await db.execute(
        sa.select(
            Session.access_key,
            Session.user_id,
            Session.group_id,
            Session.domain_name,
            Session.occupied_slots,
            Session.requested_slots,
        ).where(Session.status.in_(OCCUPYING))
    )
    for access_key, user_id, group_id, domain, occupied, requested in rows:
        slots = occupied if len(occupied.nonzero()) else requested
        concurrent[access_key] = concurrent.get(access_key, 0) + 1
        by_key[access_key] = by_key.get(access_key, ResourceSlot()) + slots
        for scope in (
            ("keypair", access_key),
            ("user", str(user_id)),
            ("group", str(group_id)),
            ("domain", domain),
        ):
            occupancy[scope] = occupancy.get(scope, ResourceSlot()) + slots
    limits: dict[str, KeypairLimits] = {}
    quotas: dict[tuple[str, str], ResourceSlot] = {}
    dependencies: dict[str, DependencyState] = {}
    if pending:
        keys = sorted({p.access_key for p in pending})
        policy_rows = await db.execute(
            sa.select(Keypair.access_key, KeypairResourcePolicy)
            .join(KeypairResourcePolicy, KeypairResourcePolicy.name == Keypair.resource_policy)
            .where(Keypair.access_key.in_(keys))
        )
        for access_key, policy in policy_rows:
            limits[access_key] = KeypairLimits(
                max_concurrent_sessions=policy.max_concurrent_sessions,
                max_pending_session_count=policy.max_pending_session_count,
                max_pending_session_resource_slots=policy.max_pending_session_resource_slots,
                total_resource_slots=_keypair_quota(policy, known),
            )
        user_ids = sorted(uuid.UUID(u) for u in {p.user_id for p in pending})
        for uid, total in await db.execute(
            sa.select(User.id, User.total_resource_slots).where(User.id.in_(user_ids))
        ):
            if (q := _quota(total, known)) is not None:
                quotas[("user", str(uid))] = q
        group_ids = sorted(uuid.UUID(g) for g in {p.group_id for p in pending})
        for gid, total in await db.execute(
            sa.select(Group.id, Group.total_resource_slots).where(Group.id.in_(group_ids))
        ):
            if (q := _quota(total, known)) is not None:
                quotas[("group", str(gid))] = q
        domains = sorted({p.domain_name for p in pending})
        for name, total in await db.execute(
            sa.select(Domain.name, Domain.total_resource_slots).where(Domain.name.in_(domains))
        ):
            if (q := _quota(total, known)) is not None:
                quotas[("domain", name)] = q
        dep_ids = sorted({uuid.UUID(d) for p in pending for d in p.dependencies})
        if dep_ids:
            for sid, status, result, exit_code in await db.execute(
                sa.select(Session.id, Session.status, Session.result, Session.exit_code).where(
                    Session.id.in_(dep_ids)
                )
            ):
                succeeded = status is SessionStatus.TERMINATED and (
                    result is SessionResult.SUCCESS
                    or (result is SessionResult.UNDEFINED and exit_code in (0, None))
                )
                dependencies[str(sid)] = DependencyState(str(status), succeeded)
    ctx = PredicateContext(
        now=now,
        limits=limits,
        dependencies=dependencies,
        concurrent_sessions=concurrent,
        occupancy=occupancy,
        quotas=quotas,
    )
    return ctx, by_key


async def load_snapshot(
    db: AsyncSession,
    sgroup: ScalingGroup,
    *,
    now: datetime,
    known: Mapping[str, SlotTypes],
    options: SchedulerOptions,
    last_roundrobin_agent: str | None = None,
) -> LoadedSnapshot:
    agents, revisions, urls = await _agents(db, sgroup.name)
    pending = await _pending(db, sgroup)
    ctx, by_key = await _predicate_context(db, pending, now, known)
    snapshot = SchedulingSnapshot(
        scaling_group=sgroup.name,
        now=now,
        agents=tuple(agents),
        pending=tuple(pending),
        options=options,
        predicate_context=ctx,
        occupancy_by_access_key=by_key,
        last_roundrobin_agent=last_roundrobin_agent,
    )
    return LoadedSnapshot(snapshot, revisions, urls)
