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
reads every row it uses in its transaction, JSON columns as their stored text (an
agent's held kernels as one string the database joins), and a cached parse is reused
only when that text (and every other input of the parse) is exactly the one the entry
was built from.  A changed row is a changed key: it is parsed again, whoever wrote it.
Exceptions, as exact: an agent's own parsed columns (slots, runtime, architecture,
images, heartbeat views: 13 kB per agent of 8 GPUs and 64 cores) are read only when its
``views_revision`` moved, which a database trigger bumps on any change of them
(:mod:`accelshare.manager.models.triggers`), whoever writes; an agent's held kernels'
text only when their version moved (PostgreSQL: a digest of the kernels' row versions;
SQLite: ``agent_held_revisions``, bumped by triggers on the kernels); a pending
session's columns only when its ``sched_revision`` moved.  Entries of rows no longer
read (agents gone, sessions no longer pending) are dropped at the end of the pass.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any, TypeVar, cast

import sqlalchemy as sa
from pydantic import TypeAdapter, ValidationError
from sqlalchemy.dialects.postgresql import aggregate_order_by
from sqlalchemy.ext.asyncio import AsyncSession

from accelshare.common import DefaultForUnspecified, ResourceSlot, SlotTypes
from accelshare.protocol import PluginMapView
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
    AgentHeldRevision,
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
    "reported_map_states",
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
    inputs: dict[str, tuple[tuple[Any, Any], _AgentColumns]] = field(default_factory=dict)
    # agent id -> (version, its held kernels' text): PostgreSQL (digest of the kernels'
    # row versions, text), SQLite (held revision, text or None: no held kernels)
    held_versions: dict[str, tuple[Any, str | None]] = field(default_factory=dict)
    pending: dict[Any, tuple[tuple[Any, ...], PendingSession]] = field(default_factory=dict)
    rows: dict[Any, tuple[int, tuple[Any, ...]]] = field(default_factory=dict)
    catalogue: dict[str, ImageRequirement] = field(default_factory=dict)  # pending's images
    # what ``pending``'s entries depend on beyond each row's revision, as of the last
    # pass: (retries read, default fragmentation option, dependencies, image catalogue)
    pending_inputs: tuple[Any, ...] | None = None
    texts: dict[tuple[str, str], Any] = field(default_factory=dict)
    hits: int = 0
    misses: int = 0

    def clear(self) -> None:
        self.agents.clear()
        self.rows.clear()
        self.inputs.clear()
        self.held_versions.clear()
        self.pending.clear()
        self.pending_inputs = None
        self.texts.clear()
        self.catalogue.clear()


class _Texts:
    """Parses of stored JSON texts for one pass: reused from the previous pass's, kept
    for the next one only if this pass used them."""

    def __init__(self, previous: Mapping[tuple[str, str], Any]) -> None:
        self.previous = previous
        self.used: dict[tuple[str, str], Any] = {}

    def get_raw(self, kind: str, text: str, parse: Callable[[str], _T]) -> _T:
        """:meth:`get` for a text that is not JSON: ``parse`` gets the text itself."""
        key = (kind, text)
        try:
            return cast(_T, self.used[key])
        except KeyError:
            pass
        value = self.previous[key] if key in self.previous else parse(text)
        self.used[key] = value
        return cast(_T, value)

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


def reported_map_states(device_allocs: Mapping[str, Any] | None) -> tuple[MapState, ...]:
    """An agent's maps as its last heartbeat reported them (``agents.device_allocs``),
    as the scheduler's pass reads them: what the enqueue judges "could an empty agent
    hold this?" by (:func:`accelshare.sched.fit.largest_placements`)."""
    return tuple(m.alone for m in _reported_maps(parse_views(device_allocs)))


_VIEWS = TypeAdapter(dict[str, PluginMapView])


def parse_views_text(text: str | None) -> dict[str, PluginMapView]:
    """:func:`parse_views` of the stored JSON text: validated from the text in one go
    (~25 % less than decoding it first, for an agent of 8 GPUs and 64 cores); when that
    fails (a broken entry, or not an object at all), entry by entry as
    :func:`parse_views` does, so the same entries are skipped."""
    if not text or text == "null":
        return {}
    try:
        return _VIEWS.validate_json(text)
    except ValidationError:
        decoded = json.loads(text)
        return parse_views(decoded if isinstance(decoded, Mapping) else None)


def map_states_from_views(
    views: Mapping[str, PluginMapView],
    manager_allocs: Mapping[str, Mapping[str, Decimal]],
    known_kernels: frozenset[str],
) -> tuple[MapState, ...]:
    """Per-device state for the dry run (see the module docstring)."""
    return _map_states(_reported_maps(views), manager_allocs, known_kernels)


@dataclass(frozen=True, slots=True)
class _ReportedDevice:
    """One device of a stored heartbeat view, parsed once per ``views_revision``."""

    alone: DeviceState  # its state when the manager holds nothing there
    reported: Decimal  # allocated, as reported
    kernels: tuple[tuple[str, Decimal], ...]  # what the agent says each kernel holds
    legacy: bool  # held under a renamed slot: full until freed


@dataclass(frozen=True, slots=True)
class _ReportedMap:
    alone: MapState  # the map when the manager holds nothing on it
    devices: tuple[_ReportedDevice, ...]


def _reported_maps(views: Mapping[str, PluginMapView]) -> tuple[_ReportedMap, ...]:
    """The views' parts that depend on the report only (a view of an unknown kind is
    left out)."""
    maps: list[_ReportedMap] = []
    # the amounts' texts repeat ("1", "0", a GPU's capacity): each parsed once
    amounts: dict[str, Decimal] = {}

    def amount(text: str) -> Decimal:
        value = amounts.get(text)
        if value is None:
            value = amounts[text] = Decimal(text)
        return value

    for key, view in views.items():
        try:
            kind = MapKind(view.kind)
        except ValueError:
            continue
        legacy = {
            device
            for per_device in view.legacy_allocations.values()
            for device, held in per_device.items()
            if amount(held) > 0
        }
        devices = []
        for d in view.devices:
            capacity = amount(d.capacity)
            reported = amount(d.allocated)
            kernels = tuple((k, amount(v)) for k, v in d.kernels.items()) if d.kernels else ()
            is_legacy = d.device_id in legacy
            alone = capacity if is_legacy else min(max(_ZERO, reported), capacity)
            # d.slot_type is a SlotTypes already (validated)
            state = DeviceState(d.device_id, d.slot_name, d.slot_type, capacity, alone, d.numa_node)
            devices.append(_ReportedDevice(state, reported, kernels, is_legacy))
        map_state = MapState(
            key,
            kind,
            tuple(d.alone for d in devices),
            strategy=view.strategy,
            quantum=Decimal(view.quantum) if view.quantum else None,
            exclusive_slot_types=tuple(view.exclusive_slot_types),
        )
        maps.append(_ReportedMap(map_state, tuple(devices)))
    return tuple(maps)


def _map_states(
    maps: Sequence[_ReportedMap],
    manager_allocs: Mapping[str, Mapping[str, Decimal]],
    known_kernels: frozenset[str],
) -> tuple[MapState, ...]:
    """Each device: :func:`merge_device_ledger` of the report and the manager's kernels
    (capped at the capacity); a device without reported kernels and without the
    manager's keeps its parsed state, a map with no such device its parsed map."""
    states: list[MapState] = []
    for reported_map in maps:
        devices: list[DeviceState] | None = None
        for index, device in enumerate(reported_map.devices):
            state = device.alone
            manager = manager_allocs.get(state.slot_name, _NO_AMOUNTS).get(state.device_id)
            if not device.kernels and not manager:
                if devices is not None:
                    devices.append(state)
                continue
            if device.legacy:
                allocated = state.capacity
            else:
                allocated = merge_device_ledger(
                    device.reported,
                    # only the amounts it can attribute (a kernel it has a row for)
                    {k: v for k, v in device.kernels if k in known_kernels},
                    manager or _ZERO,
                    known_kernels,
                )
            if devices is None:
                devices = [d.alone for d in reported_map.devices[:index]]
            devices.append(
                state
                if allocated == state.allocated
                else DeviceState(
                    state.device_id,
                    state.slot_name,
                    state.slot_type,
                    state.capacity,
                    min(allocated, state.capacity),
                    state.numa_node,
                )
            )
        alone = reported_map.alone
        if devices is None:
            states.append(alone)
        else:
            states.append(
                MapState(
                    alone.key,
                    alone.kind,
                    tuple(devices),
                    strategy=alone.strategy,
                    quantum=alone.quantum,
                    exclusive_slot_types=alone.exclusive_slot_types,
                )
            )
    return tuple(states)


_NO_AMOUNTS: Mapping[str, Decimal] = {}


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
    maps: tuple[_ReportedMap, ...]

    @classmethod
    def parse(cls, text: str | None) -> _ReportedViews:
        """Of the stored text of ``agents.device_allocs``."""
        views = parse_views_text(text)
        return cls(
            views,
            frozenset(k for view in views.values() for d in view.devices for k in d.kernels),
            _reported_maps(views),
        )


_KERNEL_SEP = "\x1e"  # between kernels (never in JSON text: control characters are escaped)
_FIELD_SEP = "\x1f"  # between a kernel's id, occupied slots and device allocations


def _held_text(dialect: str) -> sa.ColumnElement[str]:
    """One agent's resource-occupying kernels as one string: ``id FS slots FS allocs``
    per kernel, joined by RS (in id order on PostgreSQL; SQLite's scan order, stable for
    unchanged rows — another order only costs a parse)."""
    row = (
        sa.cast(Kernel.id, sa.Text())
        + _FIELD_SEP
        + sa.func.coalesce(_text(Kernel.occupied_slots), "null")
        + _FIELD_SEP
        + sa.func.coalesce(_text(Kernel.device_allocs), "null")
    )
    if dialect == "postgresql":
        return sa.func.string_agg(row, aggregate_order_by(sa.literal(_KERNEL_SEP), Kernel.id))
    return sa.func.aggregate_strings(row, _KERNEL_SEP)


_K = TypeVar("_K")
_R = TypeVar("_R")
_V = TypeVar("_V")


def _keep_current(
    previous: Mapping[_K, tuple[_R, _V]], heads: Iterable[tuple[_K, _R]]
) -> tuple[dict[_K, tuple[_R, _V]], list[_K]]:
    """The entries of ``previous`` (key -> (revision, value)) whose revision is the one
    just read in ``heads``, and the keys to read again (in ``heads``' order).  Keys not
    in ``heads`` are dropped."""
    kept: dict[_K, tuple[_R, _V]] = {}
    stale: list[_K] = []
    for key, revision in heads:
        entry = previous.get(key)
        if entry is not None and entry[0] == revision:
            kept[key] = entry
        else:
            stale.append(key)
    return kept, stale


def _held_filter(sgroup: str) -> tuple[sa.ColumnElement[bool], ...]:
    return (
        Agent.scaling_group == sgroup,
        Agent.status == AgentStatus.ALIVE,
        Agent.is_schedulable.is_(True),
        Kernel.status.in_(OCCUPYING),
    )


async def _held_texts_by_version(
    db: AsyncSession, sgroup: str, cache: SnapshotCache
) -> dict[str, str]:
    """PostgreSQL: :func:`_held_text` per agent, read only for agents whose held kernels'
    row versions changed.  Every pass reads, per agent, an md5 of its held kernels'
    ``id:xmin`` pairs (``xmin``: the transaction that wrote the row version; any insert,
    update or change of status or agent makes a new one, and a kernel that stops
    holding leaves the set), which is cheap; the texts (``jsonb`` turned into text for
    every kernel, the expensive part) only where that digest moved."""
    version = sa.cast(Kernel.id, sa.Text()) + ":" + sa.literal_column("kernels.xmin::text")
    digests = {
        agent_id: digest
        for agent_id, digest in await db.execute(
            sa.select(
                Kernel.agent_id,
                sa.func.md5(
                    sa.func.string_agg(version, aggregate_order_by(sa.literal(","), Kernel.id))
                ),
            )
            .join(Agent, Agent.id == Kernel.agent_id)
            .where(*_held_filter(sgroup))
            .group_by(Kernel.agent_id)
        )
        if agent_id is not None
    }
    cache.held_versions, stale = _keep_current(cache.held_versions, digests.items())
    for start in range(0, len(stale), 500):
        chunk = stale[start : start + 500]
        for agent_id, digest, text in await db.execute(
            sa.select(
                Kernel.agent_id,
                sa.func.md5(
                    sa.func.string_agg(version, aggregate_order_by(sa.literal(","), Kernel.id))
                ),
                _held_text("postgresql"),
            )
            .join(Agent, Agent.id == Kernel.agent_id)
            .where(*_held_filter(sgroup), Kernel.agent_id.in_(chunk))
            .group_by(Kernel.agent_id)
        ):
            if agent_id is not None:
                cache.held_versions[agent_id] = (digest, text)
    return {
        agent_id: text for agent_id, (_, text) in cache.held_versions.items() if text is not None
    }


def _agent_heads(dialect: str, sgroup: str) -> sa.Select[Any]:
    """The group's ALIVE, schedulable agents: id, ``views_revision``,
    ``first_contact_at`` (a row deleted and made again differs), ``occupancy_revision``,
    address and, on SQLite, the revision of their held kernels (0: never written)."""
    columns: list[Any] = [
        Agent.id,
        Agent.views_revision,
        _raw(Agent.first_contact_at),
        Agent.occupancy_revision,
        Agent.address,
    ]
    if dialect == "sqlite":
        columns.append(sa.func.coalesce(AgentHeldRevision.revision, 0))
    query = sa.select(*columns)
    if dialect == "sqlite":
        query = query.outerjoin(AgentHeldRevision, AgentHeldRevision.agent_id == Agent.id)
    return query.where(
        Agent.scaling_group == sgroup,
        Agent.status == AgentStatus.ALIVE,
        Agent.is_schedulable.is_(True),
    ).order_by(Agent.id)


async def _held_texts_by_revision(
    db: AsyncSession, sgroup: str, agents: Sequence[Sequence[Any]], cache: SnapshotCache
) -> dict[str, str]:
    """SQLite: :func:`_held_text` per agent, read only for agents whose held revision
    (the last column of :func:`_agent_heads`; ``agent_held_revisions``, bumped by the
    kernels' triggers on every write of what the text is made of) moved.  An agent
    without held kernels is kept as ``None``, so it is not read again either."""
    cache.held_versions, stale = _keep_current(
        cache.held_versions, ((head[0], head[-1]) for head in agents)
    )
    if stale:
        revisions = {head[0]: head[-1] for head in agents}
        for start in range(0, len(stale), 500):
            chunk = stale[start : start + 500]
            texts: dict[str, str | None] = dict.fromkeys(chunk)
            for held_by, held_text in await db.execute(
                sa.select(Kernel.agent_id, _held_text("sqlite"))
                .join(Agent, Agent.id == Kernel.agent_id)
                .where(*_held_filter(sgroup), Kernel.agent_id.in_(chunk))
                .group_by(Kernel.agent_id)
            ):
                if held_by is not None:
                    texts[held_by] = held_text
            for agent_id, maybe in texts.items():
                cache.held_versions[agent_id] = (revisions[agent_id], maybe)
    return {
        agent_id: text for agent_id, (_, text) in cache.held_versions.items() if text is not None
    }


@dataclass(frozen=True, slots=True)
class _Held:
    """An agent's held kernels parsed from :func:`_held_text`: their ids (canonical
    ``str(uuid)``) and how many hold each (slots text, allocations text) pair."""

    ids: frozenset[str]
    shapes: dict[tuple[str, str], int]

    @classmethod
    def parse(cls, text: str) -> _Held:
        ids: set[str] = set()
        shapes: dict[tuple[str, str], int] = {}
        for kernel in text.split(_KERNEL_SEP):
            kernel_id, slots_text, allocs_text = kernel.split(_FIELD_SEP)
            ids.add(_uuid_text(kernel_id))
            shape = (slots_text, allocs_text)
            shapes[shape] = shapes.get(shape, 0) + 1
        return cls(frozenset(ids), shapes)


_NO_HELD = _Held(frozenset(), {})


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


@dataclass(frozen=True, slots=True, eq=False)
class _AgentColumns:
    """An agent's parsed columns as of one ``views_revision`` (compared by identity: a
    new revision is a new object)."""

    available_slots: ResourceSlot
    runtime: str
    architecture: str
    images: frozenset[str]
    views: _ReportedViews


async def _agent_inputs(
    db: AsyncSession, heads: Sequence[Sequence[Any]], cache: SnapshotCache
) -> dict[str, _AgentColumns]:
    """Each agent's :class:`_AgentColumns`: the previous pass's while its
    ``(views_revision, first_contact_at)`` is the one it was read at, else read and
    parsed (in chunks of 500 ids, in the snapshot's transaction)."""
    cache.inputs, stale = _keep_current(
        cache.inputs, ((head[0], (head[1], head[2])) for head in heads)
    )
    for start in range(0, len(stale), 500):
        rows = await db.execute(
            sa.select(
                Agent.id,
                Agent.views_revision,
                _raw(Agent.first_contact_at),
                _text(Agent.available_slots),
                Agent.runtime,
                Agent.architecture,
                _text(Agent.images),
                _text(Agent.device_allocs),
            ).where(Agent.id.in_(stale[start : start + 500]))
        )
        for agent_id, revision, first_contact, slots, runtime, arch, images, views in rows:
            cache.inputs[agent_id] = (
                (revision, first_contact),
                _AgentColumns(
                    _slots(json.loads(slots or "null")),
                    runtime or "process",
                    arch,
                    frozenset(json.loads(images or "null") or ()),
                    _ReportedViews.parse(views),
                ),
            )
    return {agent_id: entry[1] for agent_id, entry in cache.inputs.items()}


async def _agents(
    db: AsyncSession, sgroup: str, cache: SnapshotCache, texts: _Texts
) -> tuple[list[AgentSnapshot], dict[str, int], dict[str, str]]:
    # Every agent's revisions; its parsed columns (13 kB of heartbeat views per agent
    # of 8 GPUs and 64 cores) only when its views_revision moved: the database bumps it
    # whenever one of them changes (models.triggers), for any writer.
    agents = list(await db.execute(_agent_heads(db.get_bind().dialect.name, sgroup)))
    if not agents:
        cache.clear()
        return [], {}, {}
    inputs = await _agent_inputs(db, agents, cache)
    # the group's resource-occupying kernels, by a join (not an IN list of thousands of
    # agent ids), one row per agent: the database joins each kernel's id and stored
    # texts into one string (:func:`_held_text`), the cache key, parsed only when it
    # changed (a Python row per kernel was most of the snapshot at 1,000 agents)
    if db.get_bind().dialect.name == "postgresql":
        held_texts = await _held_texts_by_version(db, sgroup, cache)
    else:
        held_texts = await _held_texts_by_revision(db, sgroup, agents, cache)
    held = {a: texts.get_raw("held", t, _Held.parse) for a, t in held_texts.items()}
    views = {a.id: inputs[a.id].views for a in agents}
    # which reported kernels the manager has a row for: those the agent holds (just
    # read) and, looked up, the others (ended ones, moved ones, or strangers the agent
    # runs on its own)
    known: set[str] = set()
    unheld_ids: set[str] = set()
    for agent_id, parsed_views in views.items():
        holds = held.get(agent_id, _NO_HELD).ids
        known.update(parsed_views.kernels & holds)
        unheld_ids.update(parsed_views.kernels - holds)
    unheld = sorted(u for u in map(_as_uuid, unheld_ids) if u is not None)
    for start in range(0, len(unheld), 500):
        chunk = unheld[start : start + 500]
        known.update(
            str(k) for (k,) in await db.execute(sa.select(Kernel.id).where(Kernel.id.in_(chunk)))
        )
    known_kernels = frozenset(known)
    snapshots = []
    previous = cache.agents
    cache.agents = {}
    for agent_id, *_ in agents:
        shapes = held.get(agent_id, _NO_HELD).shapes
        parsed = views[agent_id]
        columns = inputs[agent_id]
        key = (columns, held_texts.get(agent_id), parsed.kernels & known_kernels)
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
                    columns.available_slots,
                    occupied,
                    sgroup,
                    runtime=columns.runtime,
                    architecture=columns.architecture,
                    images=columns.images,
                ),
                _map_states(parsed.maps, allocs, known_kernels),
            )
        cache.agents[agent_id] = (key, snapshot)
        snapshots.append(snapshot)
    return (
        snapshots,
        {a.id: a.occupancy_revision for a in agents},
        {a.id: a.address for a in agents},
    )


async def _pending(
    db: AsyncSession,
    sgroup: ScalingGroup,
    cache: SnapshotCache,
    texts: _Texts,
    unwritten: Callable[[str], int] | None = None,
    with_retries: bool = True,
) -> list[PendingSession]:
    # Core on the session's connection (no ORM row processing); of ``status_data`` only
    # ``scheduler.retries`` is read, by the database, and only ``with_retries`` (the
    # picker orders by it: fifo with num_retries_to_skip; otherwise no decision reads it
    # and the explanations add theirs in SQL), so the (large) documents are not parsed.
    # JSON columns, times and enums come as stored and ids as stored (SQLite: hex
    # strings), the cache key: parsed only for a row not seen as is.
    t = cast(sa.Table, Session.__table__)
    conn = await db.connection()
    retries_column = (
        t.c.status_data[("scheduler", "retries")].as_integer()
        if with_retries
        else sa.literal(0, sa.Integer())
    )
    # every pass: the pending sessions' ids and sched_revision, in FIFO order, from the
    # covering index alone (without retries); their other columns only for rows not
    # read before at that revision (bumped by the database on any change of them,
    # models.triggers), in chunks of 500 ids
    heads = (
        await conn.execute(
            sa.select(_raw(t.c.id), t.c.sched_revision, retries_column)
            .where(t.c.scaling_group == sgroup.name, t.c.status == SessionStatus.PENDING)
            .order_by(t.c.created_at, t.c.id)
        )
    ).all()  # fetched at once (iterating fetches row by row through the async adapter)
    cache.rows, stale = _keep_current(cache.rows, ((sid, revision) for sid, revision, _ in heads))
    for start in range(0, len(stale), 500):
        chunk = [_uuid(sid) for sid in stale[start : start + 500]]
        for fetched in await conn.execute(
            sa.select(
                _raw(t.c.id),
                t.c.sched_revision,
                t.c.access_key,
                _text(t.c.requested_slots),
                _raw(t.c.created_at),
                _raw(t.c.user_id),
                _raw(t.c.group_id),
                t.c.domain_name,
                t.c.name,
                t.c.priority,
                _raw(t.c.session_type),
                _raw(t.c.starts_at),
                _text(t.c.resource_opts),
                t.c.designated_agent_id,
                t.c.image,
            ).where(t.c.id.in_(chunk))
        ):
            cache.rows[fetched[0]] = (fetched[1], tuple(fetched))
    cached_rows = cache.rows
    deps: dict[Any, list[str]] = {}
    if heads:  # the pending sessions' by a join from the (small) dependencies table: not
        # IN lists of thousands of ids, nor an IN subquery (which read every pending id
        # again, ~6 ms at 10,000 pending, to find the few sessions with dependencies)
        dep_rows = await conn.execute(
            sa.select(_raw(SessionDependency.session_id), SessionDependency.depends_on)
            .join(t, t.c.id == SessionDependency.session_id)
            .where(t.c.scaling_group == sgroup.name, t.c.status == SessionStatus.PENDING)
        )
        for sid, dep in dep_rows:
            deps.setdefault(sid, []).append(str(dep))
    default_frag = bool(
        (sgroup.scheduler_opts or {}).get("allow_fractional_resource_fragmentation", True)
    )
    catalogue: dict[str, ImageRequirement] = {}
    wanted = {entry[1][-1] for entry in cached_rows.values()}
    if wanted:
        for image in (await db.execute(sa.select(Image).where(Image.ref.in_(wanted)))).scalars():
            fresh = requirement_of(image)
            known = cache.catalogue.get(image.ref)
            # the previous pass's object when equal: the rows' keys below then compare
            # by identity (a dataclass __eq__ per pending row otherwise)
            catalogue[image.ref] = known if known is not None and known == fresh else fresh
    cache.catalogue = catalogue
    parse = _RawColumns.of(t, conn.dialect)
    pending = []
    previous = cache.pending
    cache.pending = {}
    current = cache.pending
    hits = 0
    no_deps: tuple[str, ...] = ()
    # Fast path: with the inputs beyond the rows as in the last pass and no retries read,
    # an entry of the last pass at the revision just read has the key this pass would
    # build (its dependencies and image requirement come from those equal inputs, its
    # other columns are the revision's): taken as is, in ~0.2 us instead of ~0.7 a row
    # (10,000 pending: ~5 ms of every pass).
    inputs = (with_retries, default_frag, deps, catalogue)  # (retries: read or all 0)
    fast = not with_retries and cache.pending_inputs == inputs
    cache.pending_inputs = inputs
    for sid, head_revision, stored_retries in heads:
        if fast:
            entry = previous.get(sid)
            if entry is not None and entry[0][0] == head_revision:
                hits += 1
                current[sid] = entry
                pending.append(entry[1])
                continue
        found = cached_rows.get(sid)
        if found is None:  # (a row gone between the two reads)
            continue
        revision, row = found
        retries = int(stored_retries or 0)
        requirement = catalogue.get(row[-1])
        dependencies = tuple(sorted(deps[sid])) if sid in deps else no_deps
        entry = previous.get(sid)
        key = (revision, dependencies, requirement, default_frag)
        if entry is not None and entry[0] == key:
            hits += 1
            session = entry[1]
            if session.retries != retries:
                session = _with_retries(session, retries)
                entry = (key, session)
        else:
            cache.misses += 1
            session = _pending_session(
                row, retries, dependencies, requirement, default_frag, texts, parse
            )
            entry = (key, session)
        current[sid] = entry
        # (only when read: otherwise no decision reads retries, and the object the
        # cache hands stays the same, which the planner's memo keys by)
        if with_retries and unwritten is not None and (extra := unwritten(session.id)):
            session = _with_retries(session, session.retries + extra)
        pending.append(session)
    cache.hits += hits
    return pending


@dataclass(frozen=True, slots=True)
class _RawColumns:
    """The result processing of the columns :func:`_pending` reads as stored (applied
    on a cache miss only): the times' and the session type's."""

    created_at: Callable[[Any], Any]
    starts_at: Callable[[Any], Any]
    session_type: Callable[[Any], Any]

    @classmethod
    def of(cls, table: sa.Table, dialect: sa.Dialect) -> _RawColumns:
        def processor(column: str) -> Callable[[Any], Any]:
            process = table.c[column].type.dialect_impl(dialect).result_processor(dialect, None)
            return process if process is not None else (lambda value: value)

        return cls(processor("created_at"), processor("starts_at"), processor("session_type"))


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
    parse: _RawColumns,
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
        created_at=parse.created_at(created_at),
        user_id=str(_uuid(user_id)),
        group_id=str(_uuid(group_id)),
        domain_name=domain_name,
        name=name,
        priority=priority,
        session_type=parse.session_type(session_type),
        starts_at=parse.starts_at(starts_at),
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
    unwritten_retries: Callable[[str], int] | None = None,
) -> LoadedSnapshot:
    """The group's snapshot; ``cache`` (the group's, kept by the caller between passes)
    saves re-parsing rows whose stored text did not change (see the module docstring);
    ``unwritten_retries(session_id)``: failed attempts counted by passes whose
    explanations are not written yet (:mod:`.explanations`), added to the stored ones."""
    cache = cache if cache is not None else SnapshotCache()
    texts = _Texts(cache.texts)
    agents, revisions, urls = await _agents(db, sgroup.name, cache, texts)
    pending = await _pending(
        db,
        sgroup,
        cache,
        texts,
        unwritten_retries,
        with_retries=options.picker is PickerName.FIFO and options.num_retries_to_skip > 0,
    )
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
