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

What is *derived* from rows is cached between passes (:class:`SnapshotCache`, one per
scaling group, in the scheduler's process) but never what is *read*: every pass still
reads every row it uses in its transaction, JSON columns as their stored text, and a
cached parse is reused only when that text (and every other input of the parse) is
exactly the one the entry was built from.  A changed row is a changed key: it is parsed
again, whoever wrote it and whether or not a revision was bumped.  Entries of rows no
longer read (agents gone, sessions no longer pending) are dropped at the end of the pass.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any, TypeVar, cast

import sqlalchemy as sa
from pydantic import ValidationError
from sqlalchemy.ext.asyncio import AsyncSession

from accelshare.agent.wire import PluginMapView
from accelshare.common import DefaultForUnspecified, ResourceSlot, SlotTypes
from accelshare.sched.fit import DeviceState, MapKind, MapState, merge_device_ledger
from accelshare.sched.images import ImageRequirement
from accelshare.sched.lifecycle import SessionResult, SessionStatus
from accelshare.sched.model import AgentState, KeypairLimits, PendingSession
from accelshare.sched.pickers import PickerName
from accelshare.sched.plan import AgentSnapshot, SchedulerOptions, SchedulingSnapshot
from accelshare.sched.predicates import DEFAULT_PREDICATES, DependencyState, PredicateContext

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

__all__ = [
    "LoadedSnapshot",
    "SnapshotCache",
    "load_snapshot",
    "map_states_from_views",
    "parse_views",
]

_ZERO = Decimal(0)
_INFINITY = Decimal("Infinity")
_T = TypeVar("_T")


@dataclass(slots=True)
class SnapshotCache:
    """What a scaling group's passes derived from rows, keyed by those rows' stored text.

    * ``agents``: agent id -> (key, :class:`AgentSnapshot`); the key is the agent's
      columns the snapshot reads (JSON as stored text), its resource-occupying kernels'
      ids / slots / per-device allocations (stored text) and which of the kernels its
      heartbeat reports the manager has rows for;
    * ``pending``: session id -> (key, :class:`PendingSession`); the key is the row's
      columns (JSON as stored text) but ``retries``, its dependencies and its image's
      requirement;
    * ``texts``: stored JSON text -> parsed value (``ResourceSlot``, allocations, views),
      rebuilt every pass from the texts that pass used.

    Never a source of truth: the rows are read every pass, a key that differs is parsed
    again, and entries of rows that were not read are dropped (memory bounded by the
    group's live rows).
    """

    agents: dict[str, tuple[tuple[Any, ...], AgentSnapshot]] = field(default_factory=dict)
    pending: dict[Any, tuple[tuple[Any, ...], PendingSession]] = field(default_factory=dict)
    texts: dict[tuple[str, str], Any] = field(default_factory=dict)
    hits: int = 0
    misses: int = 0

    def clear(self) -> None:
        self.agents.clear()
        self.pending.clear()
        self.texts.clear()


class _Texts:
    """Parses of stored JSON texts for one pass: reused from the previous pass's, kept
    for the next one only if this pass used them."""

    def __init__(self, previous: Mapping[tuple[str, str], Any]) -> None:
        self.previous = previous
        self.used: dict[tuple[str, str], Any] = {}

    def get(self, kind: str, text: str | None, parse: Callable[[Any], _T]) -> _T:
        key = (kind, text or "null")
        try:
            return cast(_T, self.used[key])
        except KeyError:
            pass
        value = self.previous[key] if key in self.previous else parse(json.loads(key[1]))
        self.used[key] = value
        return cast(_T, value)


def _text(column: Any) -> sa.ColumnElement[str]:
    """A JSON column as its stored text (PostgreSQL: ``jsonb::text``, canonical)."""
    return sa.cast(column, sa.Text())


def _slots(obj: Any) -> ResourceSlot:
    return ResourceSlot.from_json(obj or {})


def _alloc(obj: Any) -> dict[str, dict[str, Decimal]]:
    total: dict[str, dict[str, Decimal]] = {}
    _add_alloc(total, obj if isinstance(obj, Mapping) else {})
    return total


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
                # only the amounts it can attribute (a kernel it has a row for)
                {k: Decimal(v) for k, v in d.kernels.items() if k in known_kernels},
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
    total: dict[str, dict[str, Decimal]], alloc: Mapping[str, Mapping[str, Any]], count: int = 1
) -> None:
    """Adds ``alloc`` (per slot, per device) ``count`` times into ``total``."""
    for slot, per_device in (alloc or {}).items():
        bucket = total.setdefault(slot, {})
        for device, amount in per_device.items():
            bucket[device] = bucket.get(device, _ZERO) + Decimal(str(amount)) * count


@dataclass(frozen=True, slots=True)
class _ReportedViews:
    """An agent's stored heartbeat views, parsed, and the kernel ids they report."""

    views: dict[str, PluginMapView]
    kernels: frozenset[str]

    @classmethod
    def parse(cls, device_allocs: Mapping[str, Any] | None) -> _ReportedViews:
        views = parse_views(device_allocs)
        return cls(
            views,
            frozenset(k for view in views.values() for d in view.devices for k in d.kernels),
        )


def _uuid_text(raw: Any) -> str:
    """A kernel id as read with :func:`_raw` in the canonical ``str(uuid)`` form (SQLite
    stores 32 hex digits; PostgreSQL's driver returns a UUID object)."""
    if isinstance(raw, str) and len(raw) == 32:
        return f"{raw[:8]}-{raw[8:12]}-{raw[12:16]}-{raw[16:20]}-{raw[20:]}"
    return str(raw)


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
    db: AsyncSession, sgroup: str, cache: SnapshotCache, texts: _Texts
) -> tuple[list[AgentSnapshot], dict[str, int], dict[str, str]]:
    # Core rows with only the columns the pass reads, JSON as its stored text: the
    # text is the cache key, and parsed (views validated) only when it changed
    agents = list(
        await db.execute(
            sa.select(
                Agent.id,
                _text(Agent.available_slots),
                Agent.runtime,
                Agent.architecture,
                _text(Agent.images),
                _text(Agent.device_allocs),
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
        cache.agents.clear()
        return [], {}, {}
    # the group's resource-occupying kernels, by a join (not an IN list of thousands of
    # agent ids); ids as stored (no ``uuid.UUID`` built), amounts as their stored text
    held: dict[str, dict[tuple[str, str], int]] = {}
    held_ids: set[str] = set()
    rows = await db.execute(
        sa.select(
            Kernel.agent_id,
            _raw(Kernel.id),
            _text(Kernel.occupied_slots),
            _text(Kernel.device_allocs),
        )
        .join(Agent, Agent.id == Kernel.agent_id)
        .where(
            Agent.scaling_group == sgroup,
            Agent.status == AgentStatus.ALIVE,
            Agent.is_schedulable.is_(True),
            Kernel.status.in_(OCCUPYING),
        )
    )
    for agent_id, kernel_id, slots_text, allocs_text in rows:
        assert agent_id is not None
        shapes = held.setdefault(agent_id, {})
        shape = (slots_text or "null", allocs_text or "null")
        shapes[shape] = shapes.get(shape, 0) + 1
        held_ids.add(_uuid_text(kernel_id))
    views = {a.id: texts.get("views", a[5], _ReportedViews.parse) for a in agents}
    # which reported kernels the manager has a row for: those it holds (just read) and,
    # looked up, the others (ended ones, or strangers the agent runs on its own)
    reported = {k for v in views.values() for k in v.kernels}
    unheld = sorted(u for u in map(_as_uuid, reported - held_ids) if u is not None)
    known = reported & held_ids
    for start in range(0, len(unheld), 500):
        chunk = unheld[start : start + 500]
        known.update(
            str(k) for (k,) in await db.execute(sa.select(Kernel.id).where(Kernel.id.in_(chunk)))
        )
    known_kernels = frozenset(known)
    snapshots = []
    previous = cache.agents
    cache.agents = {}
    for agent_id, slots_text, runtime, architecture, images_text, views_text, _, _ in agents:
        shapes = held.get(agent_id, {})
        parsed = views[agent_id]
        key = (
            slots_text,
            runtime,
            architecture,
            images_text,
            views_text,
            frozenset(shapes.items()),
            parsed.kernels & known_kernels,
        )
        entry = previous.get(agent_id)
        if entry is not None and entry[0] == key:
            cache.hits += 1
            snapshot = entry[1]
        else:
            cache.misses += 1
            allocs: dict[str, dict[str, Decimal]] = {}
            for (_, k_allocs), count in shapes.items():
                _add_alloc(allocs, texts.get("alloc", k_allocs, _alloc), count)
            occupied = ResourceSlot.sum_of(
                (texts.get("slots", k_slots, _slots), count)
                for (k_slots, _), count in shapes.items()
            )
            snapshot = AgentSnapshot(
                AgentState(
                    agent_id,
                    texts.get("slots", slots_text, _slots),
                    occupied,
                    sgroup,
                    runtime=runtime or "process",
                    architecture=architecture,
                    images=frozenset(json.loads(images_text or "null") or ()),
                ),
                map_states_from_views(parsed.views, allocs, known_kernels),
            )
        cache.agents[agent_id] = (key, snapshot)
        snapshots.append(snapshot)
    return (
        snapshots,
        {a.id: a.occupancy_revision for a in agents},
        {a.id: a.address for a in agents},
    )


async def _pending(
    db: AsyncSession, sgroup: ScalingGroup, cache: SnapshotCache, texts: _Texts
) -> list[PendingSession]:
    # Core on the session's connection (no ORM row processing); of ``status_data`` only
    # ``scheduler.retries`` is read, by the database: the failures' write replaces the
    # ``scheduler`` key in SQL, so the (large) documents are neither parsed nor re-encoded.
    # JSON columns come as their stored text and ids as stored (SQLite: hex strings), the
    # cache key: parsed (``uuid.UUID``, ``ResourceSlot``) only for a row not seen as is.
    t = cast(sa.Table, Session.__table__)
    conn = await db.connection()
    rows = list(
        await conn.execute(
            sa.select(
                _raw(t.c.id),
                t.c.status_data[("scheduler", "retries")].as_integer(),
                t.c.access_key,
                _text(t.c.requested_slots),
                t.c.created_at,
                _raw(t.c.user_id),
                _raw(t.c.group_id),
                t.c.domain_name,
                t.c.name,
                t.c.priority,
                t.c.session_type,
                t.c.starts_at,
                _text(t.c.resource_opts),
                t.c.designated_agent_id,
                t.c.image,
            )
            .where(t.c.scaling_group == sgroup.name, t.c.status == SessionStatus.PENDING)
            .order_by(t.c.created_at, t.c.id)
        )
    )
    deps: dict[Any, list[str]] = {}
    if rows:  # the pending sessions' by a subquery, not IN lists of thousands of ids
        dep_rows = await conn.execute(
            sa.select(_raw(SessionDependency.session_id), SessionDependency.depends_on).where(
                SessionDependency.session_id.in_(
                    sa.select(t.c.id).where(
                        t.c.scaling_group == sgroup.name, t.c.status == SessionStatus.PENDING
                    )
                )
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
    previous = cache.pending
    cache.pending = {}
    for row in rows:
        sid, retries = row[0], int(row[1] or 0)
        requirement = catalogue.get(row[-1])
        dependencies = tuple(sorted(deps.get(sid, ())))
        key = (*row[2:], dependencies, requirement, default_frag)
        entry = previous.get(sid)
        if entry is not None and entry[0] == key:
            cache.hits += 1
            session = entry[1]
            if session.retries != retries:
                session = _with_retries(session, retries)
        else:
            cache.misses += 1
            session = _pending_session(row, retries, dependencies, requirement, default_frag, texts)
        cache.pending[sid] = (key, session)
        pending.append(session)
    return pending


def _raw(column: Any) -> sa.ColumnElement[Any]:
    """A UUID column as the driver returns it (SQLite: hex text; no ``uuid.UUID`` built)."""
    return sa.type_coerce(column, sa.String())


def _uuid(raw: Any) -> uuid.UUID:
    return raw if isinstance(raw, uuid.UUID) else uuid.UUID(str(raw))


def _with_retries(s: PendingSession, retries: int) -> PendingSession:
    # positional, not dataclasses.replace (which introspects the fields: 5x slower)
    return PendingSession(
        s.id,
        s.access_key,
        s.requested_slots,
        s.created_at,
        s.user_id,
        s.group_id,
        s.domain_name,
        s.name,
        s.priority,
        s.session_type,
        s.starts_at,
        s.dependencies,
        retries,
        s.allow_fragmentation,
        s.designated_agent,
        s.image,
    )


def _pending_session(
    row: Any,
    retries: int,
    dependencies: tuple[str, ...],
    image: ImageRequirement | None,
    default_frag: bool,
    texts: _Texts,
) -> PendingSession:
    (
        sid,
        _,
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
        opts,
        designated,
        _,
    ) = row
    opts_doc = json.loads(opts or "null")
    frag = (opts_doc if isinstance(opts_doc, dict) else {}).get(
        "allow_fractional_resource_fragmentation", default_frag
    )
    return PendingSession(
        id=str(_uuid(sid)),
        access_key=access_key,
        requested_slots=texts.get("slots", requested, _slots),
        created_at=created_at,
        user_id=str(_uuid(user_id)),
        group_id=str(_uuid(group_id)),
        domain_name=domain_name,
        name=name,
        priority=priority,
        session_type=session_type,
        starts_at=starts_at,
        dependencies=dependencies,
        retries=retries,
        allow_fragmentation=bool(frag),
        designated_agent=designated,
        image=image,
    )


async def _counters(
    db: AsyncSession, texts: _Texts
) -> tuple[dict[str, int], dict[tuple[str, str], ResourceSlot], dict[str, ResourceSlot]]:
    """Running sessions per access key and occupancy per keypair / user / group / domain
    (over every scaling group), and per access key for DRF.  Every pass that needs them,
    in its transaction (no drifting counters): grouped by owner and the amounts' stored
    text with a count, so hundreds of sessions of a few shapes are a few rows and
    multiplications (exact, the same sums as row by row); only the parse of the slots'
    stored text is shared between passes."""
    concurrent: dict[str, int] = {}
    terms: dict[tuple[str, str], list[tuple[ResourceSlot, int]]] = {}
    by_key_terms: dict[str, list[tuple[ResourceSlot, int]]] = {}
    columns = (
        Session.access_key,
        Session.user_id,
        Session.group_id,
        Session.domain_name,
        _text(Session.occupied_slots),
        _text(Session.requested_slots),
    )
    rows = await db.execute(
        sa.select(*columns, sa.func.count()).where(Session.status.in_(OCCUPYING)).group_by(*columns)
    )
    for access_key, user_id, group_id, domain, occupied_text, requested_text, n in rows:
        count = int(n)
        occupied = texts.get("slots", occupied_text, _slots)
        slots = occupied if len(occupied.nonzero()) else texts.get("slots", requested_text, _slots)
        concurrent[access_key] = concurrent.get(access_key, 0) + count
        by_key_terms.setdefault(access_key, []).append((slots, count))
        for scope in (
            ("keypair", access_key),
            ("user", str(user_id)),
            ("group", str(group_id)),
            ("domain", domain),
        ):
            terms.setdefault(scope, []).append((slots, count))
    occupancy = {scope: ResourceSlot.sum_of(t) for scope, t in terms.items()}
    by_key = {key: ResourceSlot.sum_of(t) for key, t in by_key_terms.items()}
    return concurrent, occupancy, by_key


async def _predicate_context(
    db: AsyncSession,
    pending: list[PendingSession],
    now: datetime,
    known: Mapping[str, SlotTypes],
    texts: _Texts,
    options: SchedulerOptions,
) -> tuple[PredicateContext, dict[str, ResourceSlot]]:
    """The predicates' inputs for ``pending``: the owners' policy limits and quotas, the
    dependencies' states and, when something reads them (a concurrency limit, a quota,
    the drf picker, a predicate set other than the default), the counters of
    :func:`_counters` — skipped otherwise: at thousands of running sessions they are
    the largest read of a pass, and the common cluster sets no limit."""
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
    concurrent: dict[str, int] = {}
    occupancy: dict[tuple[str, str], ResourceSlot] = {}
    by_key: dict[str, ResourceSlot] = {}
    if (
        options.picker is PickerName.DRF
        or options.predicates is not DEFAULT_PREDICATES
        or quotas
        or any(limit.limits_running for limit in limits.values())
    ):
        concurrent, occupancy, by_key = await _counters(db, texts)
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
    cache: SnapshotCache | None = None,
) -> LoadedSnapshot:
    """The group's snapshot; ``cache`` (the group's, kept by the caller between passes)
    saves re-parsing rows whose stored text did not change (see the module docstring)."""
    cache = cache if cache is not None else SnapshotCache()
    texts = _Texts(cache.texts)
    agents, revisions, urls = await _agents(db, sgroup.name, cache, texts)
    pending = await _pending(db, sgroup, cache, texts)
    ctx, by_key = await _predicate_context(db, pending, now, known, texts, options)
    cache.texts = texts.used
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
