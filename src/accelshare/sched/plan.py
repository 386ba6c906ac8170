"""One scheduling pass over a frozen snapshot: sessions in, a plan out (pure, no I/O).

The manager loads a :class:`SchedulingSnapshot` of one scaling group inside one
transaction (ALIVE agents with their per-device state, PENDING sessions, counters
for the predicates), calls :func:`plan_pass`, and applies the returned
:class:`SchedulingPlan` with an optimistic check (spec 05, STYLE: Nomad).  The pass:

1. **Priority bands**, highest first.  Every band is tried, but a lower band may not
   take what a waiting higher-priority session needs (the no-starvation rule below).
2. Inside a band the scaling group's **picker** (fifo, lifo, drf) orders sessions;
   every one is tried: a session that does not fit never stops the pass (no
   head-of-line blocking).
3. **Predicates** (start time, dependencies, concurrency, quotas) run first; every
   result is kept for ``status_data.scheduler``.
4. **Fit**: agents whose remaining totals cover the request (missing slots are 0) are
   ranked by the **selector** (dispersed by default); the per-device dry run of
   :mod:`accelshare.sched.fit` runs in that order and the first agent whose devices
   hold the request gets it.  The placement is committed to that agent's in-pass
   ledger, totals and the predicate counters at once, so later sessions in the same
   pass see it (in-pass accounting: a plan never over-commits an agent or a device).
5. Sessions that were not placed get a :class:`Failure` with the reasons (failed
   predicates, and per agent why it did not fit — the first :data:`MAX_AGENT_REASONS`
   agents by id, then how many more) for ``why``.

**No starvation.**  A session *waits* when it passed every predicate and found no room
now, although some agent could hold it if that agent were empty (its *usable* agents).
When a band is done, each waiting session **protects** what it needs on each of its
usable agents from every lower band:

* its accelerator slots (``cuda.shares``...) entirely: a lower-band session that asks
  for any of them is not placed there (fractional devices fragment; any use competes);
* of every other slot it asks for (cpu, mem...), its amount: a lower-band session may
  take that slot there only if at least that much stays free after it.

A lower-band session that would break a protection on every agent that could hold it
is ``DEFERRED`` ("Waiting for priority-P sessions to be placed first", retries
unchanged); one that fits elsewhere, or only uses slack the waiting session does not
need, is placed.  Freed resources therefore reach the waiting session before any
lower band, however long it waits: it is never overtaken on the resources it waits
for.  Sessions that fail only predicates resources cannot cure (a future start time,
unfinished dependencies, the owner's own quota or concurrency limit), or that no agent
could ever hold, protect nothing.  Deferred sessions that could fit when empty wait
too and protect what they need from the bands below them.

Example: agent ``gpu`` with 8 cores (2 used) and two GPUs holding 0.5 and 1.0 (0.5
free); pending H (priority 50: 4 cores, 2 fGPU), L1 (10: 2 cores), L2 (10: 3 cores),
L3 (10: 1 core, 0.5 fGPU).  H waits (it fits the empty agent).  L1 is placed (6 free
cores − 2 = 4 still cover H's 4), then L2 is deferred (4 − 3 < 4), and L3 is deferred
(it asks for cuda.shares, which H waits for).
"""

from __future__ import annotations

import enum
import functools
import operator
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from decimal import Decimal
from typing import Any

from accelshare.alloc import KernelAllocation
from accelshare.common import ResourceSlot, SlotName, canonical_decimal

from .capacity import Capacity, RankSignature
from .fit import (
    DeviceLedger,
    FitFailure,
    MapLayouts,
    MapState,
    device_allocation,
    totals_shortfall,
)
from .images import ImageRequirement, image_refusal
from .model import AgentState, PendingSession, PredicateResult
from .pickers import PickerName, pick
from .predicates import (
    DEFAULT_PREDICATES,
    Predicate,
    PredicateContext,
    passed_without_limits,
    predicate_results,
)
from .selectors import DEFAULT_RESOURCE_PRIORITY, SelectorName, iter_ranked

__all__ = [
    "MAX_AGENT_REASONS",
    "MAX_SHORTAGE_AGENTS",
    "NEVER_FITS",
    "AgentSnapshot",
    "Assignment",
    "DeviceShortage",
    "Failure",
    "FailureKind",
    "PlacedPass",
    "PlanMemo",
    "SchedulerOptions",
    "SchedulingPlan",
    "SchedulingSnapshot",
    "place_pass",
    "plan_pass",
]

_EMPTY = ResourceSlot()
_ZERO = Decimal(0)
_MAX_REASONS_IN_MSG = 3
NEVER_FITS = (
    "No agent could hold the request even if it were empty; waiting for an agent that can to join: "
)
"""The why-pending of a session no agent of its pool could ever hold (kept by
``waitForAgents``, or enqueued before any agent of its scaling group was alive)."""
MAX_AGENT_REASONS = 10
#: A session refusing fragmentation is dry-run on up to this many fitting agents, in the
#: selector's order, and placed where it costs the least hole score (docs/scheduler.md,
#: *Packing with the anti-fragmentation guard*).
PACK_CANDIDATES = 32
"""A failure lists the per-agent reasons of the first 10 agents (by id) and one
``"... and N more agent(s)"`` line: a 1,000-agent cluster would otherwise compute (a
per-device dry run each) and store 1,000 lines for every pending session on every pass."""

_ShapeKey = tuple[tuple[tuple[str, Decimal], ...], bool, str | None, ImageRequirement | None]


_Order = tuple[tuple["PickerName", int], list[PendingSession], list[PendingSession]]


def _memo_number(memo: PlanMemo, session: PendingSession) -> int | None:
    """The shape number the memo kept for this very session object (None: not kept)."""
    known = memo.shape_ids.get(id(session))
    return known[1] if known is not None and known[0] is session else None


def _shape(session: PendingSession) -> _ShapeKey:
    """What a session's fit depends on besides the cluster: its request, its
    fragmentation option, its designated agent and its catalogue image (sessions of one
    shape fit alike)."""
    return (
        tuple(sorted(session.requested_slots.items())),
        session.allow_fragmentation,
        session.designated_agent,
        session.image,
    )


@dataclass(slots=True)
class PlanMemo:
    """What one pass keeps for the next (owned by the caller, one per scaling group;
    only :func:`plan_pass` reads and writes it): shown agents' reasons and pending
    sessions' shape keys.  The plan is the same with or without it.

    *Reasons.* A shown agent's reason for a shape is a function of the agent's snapshot and the
    shape alone when the pass placed nothing on it and no waiting session protects
    anything there; on a full cluster most shown agents stay so pass after pass (a
    release changes one agent), and working their reasons out again was most of a
    release pass.  An entry is used only for the *same* :class:`AgentSnapshot` object
    (the manager's snapshot cache hands an unchanged agent's object again; an equal
    but new one is explained anew): the entry holds the object, so its id cannot be
    reused.  Entries a pass did not use are dropped.

    *Shape keys.* Working out a session's shape key (its sorted request, options and
    image) and hashing it was a third of a pass over 10,000 pending sessions; the
    snapshot cache hands an unchanged session's object again, so the key is kept per
    session object (by identity, holding the object) as a small int, interned while
    some session uses it.

    *Orders.* A fifo or lifo band of the very same session objects, in the same order,
    as the previous pass's is ordered as it was (the sort's keys, 10,000 tuples, were
    ~8 % of a release pass).

    *Layouts.* The device layouts' empty maps and empty-map verdicts
    (:class:`~accelshare.sched.fit.MapLayouts`); the caller may give every scaling
    group's memo the same one."""

    entries: dict[tuple[_ShapeKey, str], tuple[AgentSnapshot, str]] = field(default_factory=dict)
    hits: int = 0
    shape_ids: dict[int, tuple[PendingSession, int]] = field(default_factory=dict)
    shape_keys: dict[_ShapeKey, int] = field(default_factory=dict)
    next_shape: int = 0
    # per priority: ((picker, num_retries_to_skip), the band as given, its order)
    orders: dict[int, _Order] = field(default_factory=dict)
    layouts: MapLayouts = field(default_factory=MapLayouts)


@dataclass(frozen=True, slots=True)
class AgentSnapshot:
    """An ALIVE, schedulable agent: totals (``state``) and per-device maps."""

    state: AgentState
    maps: tuple[MapState, ...] = ()


@dataclass(frozen=True, slots=True)
class SchedulerOptions:
    """What a scaling group configures (its profile): picker, selector, predicates."""

    picker: PickerName = PickerName.FIFO
    selector: SelectorName = SelectorName.DISPERSED
    num_retries_to_skip: int = 0
    resource_priority: tuple[str, ...] = DEFAULT_RESOURCE_PRIORITY
    predicates: tuple[Predicate, ...] = DEFAULT_PREDICATES

    @classmethod
    def from_scaling_group(
        cls,
        scheduler: str,
        opts: Mapping[str, Any] | None = None,
        store_config: Mapping[str, Any] | None = None,
    ) -> SchedulerOptions:
        """From ``scaling_groups.scheduler`` and ``scheduler_opts`` (Backend.AI's keys).

        ``store_config`` is the picker's options from the config store
        (``config/plugins/scheduler/<picker>/``, already merged over the sgroup and
        global scopes by the caller): the defaults of ``scheduler_opts["config"]``,
        whose own keys win when both are set.

        Raises ``ValueError`` naming the option (or the store key) and the accepted values.
        """
        opts = opts or {}
        try:
            picker = PickerName(scheduler or "fifo")
        except ValueError:
            raise ValueError(
                f"scheduler {scheduler!r}: expected one of {', '.join(PickerName)}"
            ) from None
        db_config = opts.get("config") or {}
        if not isinstance(db_config, Mapping):
            db_config = {}
        from_store = {k: v for k, v in (store_config or {}).items() if k not in db_config}
        config = {**from_store, **db_config}
        raw_selector = opts.get("agent_selection_strategy") or "dispersed"
        try:
            selector = SelectorName(str(raw_selector))
        except ValueError:
            raise ValueError(
                f"agent_selection_strategy {raw_selector!r}: expected one of"
                f" {', '.join(SelectorName)}"
            ) from None
        skip = config.get("num_retries_to_skip", 0)
        if isinstance(skip, bool) or not isinstance(skip, int | str) or not str(skip).isdigit():
            where = (
                f"config/plugins/scheduler/{picker}/num_retries_to_skip"
                if "num_retries_to_skip" in from_store
                else "config.num_retries_to_skip"
            )
            raise ValueError(f"{where} {skip!r}: expected an integer >= 0")
        priority = opts.get("agent_selection_resource_priority") or DEFAULT_RESOURCE_PRIORITY
        return cls(
            picker=picker,
            selector=selector,
            num_retries_to_skip=int(skip),
            resource_priority=tuple(str(p) for p in priority),
        )


@dataclass(frozen=True, slots=True)
class SchedulingSnapshot:
    """Everything one pass reads, loaded by the manager in one transaction."""

    scaling_group: str
    now: datetime
    agents: tuple[AgentSnapshot, ...]
    pending: tuple[PendingSession, ...]
    options: SchedulerOptions = SchedulerOptions()
    predicate_context: PredicateContext | None = None  # None: no limits, nothing running
    occupancy_by_access_key: Mapping[str, ResourceSlot] = field(default_factory=dict)
    last_roundrobin_agent: str | None = None


@dataclass(frozen=True, slots=True)
class Assignment:
    """Session -> agent, with the placement the dry run made on the agent's devices."""

    session_id: str
    agent_id: str
    requested_slots: ResourceSlot
    allocation: KernelAllocation  # plugin key -> slot -> device -> amount
    passed_predicates: tuple[PredicateResult, ...] = ()

    @property
    def device_allocs(self) -> dict[str, dict[str, Decimal]]:
        """``{slot: {device: amount}}`` (the kernel row's form)."""
        return device_allocation(self.allocation)


class FailureKind(enum.StrEnum):
    PREDICATE = "predicate"  # a predicate failed; agents were not looked at
    NO_AGENT = "no-agent"  # predicates passed, no agent can hold it now
    DEFERRED = "deferred"  # not tried: a higher-priority band is waiting for resources


@dataclass(frozen=True, slots=True)
class DeviceShortage:
    """An accelerator slot a shown agent could not give a session, with that agent's
    devices of the slot as the pass ended: what the console words as "GPU 0 and GPU 1
    are full (0 of 1 fGPU free each)".  ``devices`` are ``(device, free, capacity)`` in
    the map's declaration order (a device's position there is its number)."""

    agent_id: str
    slot: str
    needs: Decimal
    devices: tuple[tuple[str, Decimal, Decimal], ...]

    def as_json(self) -> dict[str, Any]:
        return {
            "agent": self.agent_id,
            "slot": self.slot,
            "needs": canonical_decimal(self.needs),
            "devices": [
                {"id": d, "free": canonical_decimal(f), "capacity": canonical_decimal(c)}
                for d, f, c in self.devices
            ],
        }


MAX_SHORTAGE_AGENTS = 3
"""A failure carries the device shortages of at most this many of its shown agents."""


@dataclass(frozen=True, slots=True)
class Failure:
    """A session left PENDING by this pass, and why."""

    session_id: str
    kind: FailureKind
    msg: str
    retries: int  # status_data.scheduler.retries after this pass
    failed_predicates: tuple[PredicateResult, ...] = ()
    passed_predicates: tuple[PredicateResult, ...] = ()
    # "i-node01: cuda.shares needs 1.2, ..."; the first MAX_AGENT_REASONS agents by id,
    # then "... and N more agent(s)"
    agent_reasons: tuple[str, ...] = ()
    blocks_lower_priorities: bool = False
    # the accelerator slots the first shown agents could not give, device by device
    shortages: tuple[DeviceShortage, ...] = ()

    @property
    def adds_retry(self) -> bool:
        """Whether this failure counts as a failed attempt (``retries`` + 1): a deferred
        session was not tried (its ``retries`` stays, see :func:`plan_pass`)."""
        return self.kind is not FailureKind.DEFERRED

    def scheduler_data(self, now: datetime) -> dict[str, Any]:
        """``status_data["scheduler"]`` (Backend.AI's keys, plus ``agents`` and ``kind``)."""
        return {
            "retries": self.retries,
            "last_try": now.isoformat(),
            "failed_predicates": [
                {"name": r.name, "msg": r.message} for r in self.failed_predicates
            ],
            "passed_predicates": [{"name": r.name} for r in self.passed_predicates],
            "msg": self.msg,
            "agents": list(self.agent_reasons),
            "kind": self.kind.value,
            "devices": [shortage.as_json() for shortage in self.shortages],
        }


@dataclass(frozen=True, slots=True)
class SchedulingPlan:
    scaling_group: str
    assignments: tuple[Assignment, ...]
    failures: tuple[Failure, ...]
    last_roundrobin_agent: str | None = None

    def by_agent(self) -> dict[str, list[Assignment]]:
        grouped: dict[str, list[Assignment]] = {}
        for a in self.assignments:
            grouped.setdefault(a.agent_id, []).append(a)
        return grouped


def _copy_context(ctx: PredicateContext | None, now: datetime) -> PredicateContext:
    if ctx is None:
        return PredicateContext(now=now)
    return PredicateContext(
        now=ctx.now,
        limits=ctx.limits,
        dependencies=ctx.dependencies,
        concurrent_sessions=dict(ctx.concurrent_sessions),
        occupancy=dict(ctx.occupancy),
        quotas=ctx.quotas,
    )


def _age_key(session: PendingSession) -> tuple[datetime, str]:
    return (session.created_at, session.id)


@dataclass(frozen=True, slots=True)
class _Blocker:
    """A session that waits for resources and holds lower priorities back (see
    :func:`plan_pass`): what it asks for, and its shape (where it could fit when empty)."""

    priority: int
    requested: ResourceSlot
    shape: _Shape


@dataclass(slots=True)
class _Protection:
    """Per agent, what the waiting higher-priority sessions that could use it need:
    the largest amount of each slot, and the accelerator slots (never shared)."""

    priority: int
    needs: dict[str, Decimal] = field(default_factory=dict)
    accelerators: set[str] = field(default_factory=set)


@functools.lru_cache(maxsize=1024)
def _is_accelerator(slot: str) -> bool:
    return SlotName(slot).is_accelerator


@dataclass(slots=True)
class _Shape:
    """What a pass knows about one shape (:func:`_shape`): sessions of one shape fit alike.

    Within a pass capacities only shrink, and whether an agent can hold a shape only
    gets less likely as they do (totals, the held-for rule and the per-device dry run
    are all monotone, see :meth:`~accelshare.sched.fit.DeviceLedger.refusal`), so an
    agent that refused a shape (``dead``) refuses it for the rest of the pass, and a
    shape that found no agent (``failed``) finds none for the rest of the pass: later
    sessions of that shape fail in O(1) (like Kubernetes' equivalence cache, but exact).
    """

    key: _ShapeKey
    request: tuple[tuple[str, Decimal], ...]  # positive amounts, in the request's order
    items: tuple[tuple[str, Decimal], ...]  # every amount (what a commit adds)
    signature: RankSignature
    pool: tuple[int, ...] | None  # None: every agent (no designated agent, no image)
    dead: set[int] = field(default_factory=set)
    failed: _Fit | None = None
    could_fit: bool | None = None  # some agent of the pool could hold it when empty
    usable: frozenset[str] | None = None  # the agents of the pool that could
    # refusing fragmentation: the accelerator slots it asks for (the agent choice packs)
    packs: tuple[str, ...] = ()


@dataclass(slots=True)
class _Fit:
    """A shape's failed fit: whether a waiting higher-priority session held it back and
    whether some agent could hold it when empty; the per-agent reasons are worked out
    when the pass ends (:meth:`_Pass.explain_failures`)."""

    reasons: list[str]
    # None: the shape's (:meth:`_Pass.fit_could_fit`), worked out only when read: a band
    # that protects nothing reads it in the explanations, after the binds went out
    could_fit: bool | None
    deferred_by: int | None
    refused: int = 1  # how many agents refused (the reasons list at most MAX_AGENT_REASONS)
    shape: _Shape | None = None
    deferral_key: tuple[int, int] = (0, 0)  # (blockers, commits on protected agents)


@dataclass(slots=True)
class _Pass:
    """The mutable state of one pass (never escapes :func:`plan_pass`).

    Remaining totals live in :class:`~accelshare.sched.capacity.Capacity` (plain dicts
    and the selectors' orders kept sorted), per-device state in one
    :class:`~accelshare.sched.fit.DeviceLedger` per agent, and per shape a
    :class:`_Shape` (which agents refused it, whether it failed).
    """

    snapshot: SchedulingSnapshot
    ctx: PredicateContext
    states: dict[str, AgentState]
    ledgers: dict[str, DeviceLedger]
    drf_occupancy: dict[str, ResourceSlot]
    total_capacity: ResourceSlot
    last_roundrobin: str | None
    capacity: Capacity
    assignments: list[Assignment] = field(default_factory=list)
    failures: list[Failure | None] = field(default_factory=list)
    blockers: list[_Blocker] = field(default_factory=list)
    # per agent; replaced (never changed in place) when a band adds blockers, so a
    # failure can be explained with the protections its band saw
    protections: dict[str, _Protection] = field(default_factory=dict)
    protected_commits: int = 0  # placements on protected agents (deferred_by may change)
    _shapes: dict[_ShapeKey, _Shape] = field(default_factory=dict)
    _unexplained: list[
        tuple[int, PendingSession, tuple[PredicateResult, ...], _Fit, dict[str, _Protection]]
    ] = field(default_factory=list)
    _signatures: dict[str, int] | None = None  # agents built alike: same int
    memo: PlanMemo | None = None
    touched: set[str] = field(default_factory=set)  # agents this pass placed on
    _agents: dict[str, AgentSnapshot] = field(default_factory=dict)
    _memo_used: dict[tuple[_ShapeKey, str], tuple[AgentSnapshot, str]] = field(default_factory=dict)
    _numbered: dict[int, _Shape] = field(default_factory=dict)  # memo's shape number -> shape
    _session_shapes: dict[int, tuple[PendingSession, int]] = field(default_factory=dict)
    _placed: dict[str, list[ResourceSlot]] = field(default_factory=dict)  # not in states yet
    counts_occupancy: bool = True  # False: no predicate reads the counters occupy() keeps
    # predicates.passed_without_limits: what every session without a start time and
    # dependencies passes, when no limit or quota exists (None: run them per session)
    trivially_passed: tuple[PredicateResult, ...] | None = None
    _orders: dict[int, _Order] = field(default_factory=dict)  # the memo's, for the next pass

    def pick_sequence(self, band: list[PendingSession]) -> Iterator[PendingSession]:
        """The picker's order for a band, one session at a time.

        fifo/lifo orders do not change while the pass runs, so they are sorted once
        (the same order repeated :func:`~accelshare.sched.pickers.pick` calls give);
        drf re-picks after every placement because the shares move.
        """
        options = self.snapshot.options
        if options.picker is PickerName.DRF:
            remaining = list(band)
            while remaining:
                chosen = pick(
                    PickerName.DRF,
                    remaining,
                    occupancy_by_access_key=self.drf_occupancy,
                    total_capacity=self.total_capacity,
                )
                assert chosen is not None
                remaining.remove(chosen)
                yield chosen
            return
        how = (options.picker, options.num_retries_to_skip)
        memo = self.memo
        if memo is not None and band:
            known = memo.orders.get(band[0].priority)
            if (
                known is not None
                and known[0] == how
                and len(known[1]) == len(band)
                and all(map(operator.is_, known[1], band))
            ):
                self._orders[band[0].priority] = known
                yield from known[2]
                return
        ordered = sorted(band, key=_age_key, reverse=options.picker is PickerName.LIFO)
        skip = options.num_retries_to_skip
        if options.picker is PickerName.FIFO and skip > 0:
            fresh = [s for s in ordered if s.retries < skip]
            stale = [s for s in ordered if s.retries >= skip]
            ordered = fresh + stale
        if memo is not None and band:
            self._orders[band[0].priority] = (how, band, ordered)
        yield from ordered

    def try_session(self, session: PendingSession, blocking: bool) -> _Blocker | None:
        """Try one session; returns a blocker when it waits for resources (see plan_pass)
        and ``blocking`` (a band follows)."""
        trivial = self.trivially_passed
        memo = self.memo
        if (
            trivial is not None
            and memo is not None
            and not self.protections
            and session.starts_at is None
            and not session.dependencies
            and session.designated_agent is None
        ):
            # The common case on a full cluster, in O(1): every predicate passes, and
            # the session's shape (its memo entry) already failed in this pass with
            # nothing deferring it: it fails the same, as the general path below would
            # find, without its calls.
            number = _memo_number(memo, session)
            if number is not None:
                shape = self._numbered.get(number)
                fit = None if shape is None else shape.failed
                if shape is not None and fit is not None and fit.deferred_by is None:
                    self._session_shapes[id(session)] = (session, number)
                    self._unexplained.append(
                        (len(self.failures), session, trivial, fit, self.protections)
                    )
                    self.failures.append(None)
                    # no blocker: it would repeat the one of the shape's first session
                    # in this band (add_blockers keeps one per request and shape), or
                    # the shape failed in a band above with none (no protections here)
                    return None
        passed, failed = predicate_results(session, self.ctx, self.snapshot.options.predicates)
        if failed:
            self.failures.append(
                Failure(
                    session.id,
                    FailureKind.PREDICATE,
                    "; ".join(r.message for r in failed),
                    session.retries + 1,
                    failed,
                    passed,
                )
            )
            return None
        result = self.place(session)
        if isinstance(result, Assignment):
            self.assignments.append(replace(result, passed_predicates=passed))
            return None
        entry = (len(self.failures), session, passed, result, self.protections)
        self._unexplained.append(entry)
        self.failures.append(None)  # filled in by explain_failures
        if not blocking or result.shape is None or not self.fit_could_fit(result):
            return None
        return _Blocker(session.priority, session.requested_slots, result.shape)

    def failure_for(
        self,
        session: PendingSession,
        passed: tuple[PredicateResult, ...],
        result: _Fit,
        shortages: tuple[DeviceShortage, ...] = (),
    ) -> Failure:
        reasons = result.reasons
        if result.deferred_by is not None:
            kind = FailureKind.DEFERRED
            msg = (
                f"Waiting for priority-{result.deferred_by} sessions to be placed first"
                f" (this session has priority {session.priority})"
            )
            retries = session.retries
        else:
            kind = FailureKind.NO_AGENT
            shown = reasons[: min(_MAX_REASONS_IN_MSG, result.refused)]
            more = result.refused - len(shown)
            msg = (
                NEVER_FITS
                if not self.fit_could_fit(result)
                else "No agent can hold the request now: "
            ) + "; ".join(shown)
            if more:
                msg += f"; and {more} more agent(s)"
            retries = session.retries + 1
        return Failure(
            session.id,
            kind,
            msg,
            retries,
            (),
            passed,
            tuple(reasons),
            blocks_lower_priorities=self.fit_could_fit(result),
            shortages=shortages if kind is FailureKind.NO_AGENT else (),
        )

    def explain_failures(self) -> None:
        """Fill in the failures of the sessions left pending, with their reasons as of the
        end of the pass: ``<agent>: <why>`` for the first :data:`MAX_AGENT_REASONS` agents
        by id, then how many more agents refused.  Worked out once per shape, agent and
        band (the protections a band saw), for the shown agents only; sessions of one
        shape and priority share the message."""
        explained: dict[tuple[_ShapeKey, int, int], str] = {}
        twins: dict[str, int] = {}  # agent -> the same int for agents that explain alike
        interned: dict[object, int] = {}
        lists: dict[tuple[_ShapeKey, int], tuple[list[str], tuple[DeviceShortage, ...]]] = {}
        made: dict[tuple[int, int, int], Failure] = {}  # (fit, band, priority) -> a failure
        first_ids = sorted(self.states)[:MAX_AGENT_REASONS]
        for index, session, passed, fit, protections in self._unexplained:
            shape = fit.shape
            if shape is None or fit.reasons:
                self.failures[index] = self.failure_for(session, passed, fit)
                continue
            like = made.get((id(fit), id(protections), session.priority))
            if like is not None:
                self.failures[index] = Failure(
                    session.id,
                    like.kind,
                    like.msg,
                    session.retries + (like.kind is FailureKind.NO_AGENT),
                    (),
                    passed,
                    like.agent_reasons,
                    like.blocks_lower_priorities,
                    like.shortages,
                )
                continue
            known = lists.get((shape.key, id(protections)))
            if known is not None:
                listed, shortages = known
            else:
                designated = session.designated_agent
                shown = first_ids if designated is None else [designated]
                listed = []
                short: list[DeviceShortage] = []
                for agent_id in shown:
                    alike = twins.get(agent_id)
                    if alike is None:
                        alike = twins[agent_id] = self.twin(agent_id, interned)
                    key = (shape.key, alike, id(protections.get(agent_id)))
                    reason = explained.get(key)
                    if reason is None:
                        reason = explained[key] = self.remembered_reason(
                            session, shape, agent_id, protections
                        )
                    listed.append(f"{agent_id}: {reason}")
                    if len(short) < MAX_SHORTAGE_AGENTS:
                        short.extend(self.shortages(session, agent_id, reason))
                if fit.refused > len(shown):
                    listed.append(f"... and {fit.refused - len(shown)} more agent(s)")
                shortages = tuple(short)
                lists[(shape.key, id(protections))] = (listed, shortages)
            failure = self.failure_for(session, passed, replace(fit, reasons=listed), shortages)
            made[(id(fit), id(protections), session.priority)] = failure
            self.failures[index] = failure

    def shortages(
        self, session: PendingSession, agent_id: str, reason: str
    ) -> list[DeviceShortage]:
        """The accelerator slots (a plugin's, ``vendor.kind``) that ``reason`` says the
        agent could not give, with the agent's devices of each as the pass ends."""
        found: list[DeviceShortage] = []
        ledger = self.ledgers[agent_id]
        for slot, amount in session.requested_slots.items():
            if "." not in slot or amount <= 0 or not reason.startswith(f"{slot} needs"):
                continue
            devices = ledger.devices_of(slot)
            if devices:
                found.append(DeviceShortage(agent_id, slot, amount, devices))
        return found

    def remembered_reason(
        self,
        session: PendingSession,
        shape: _Shape,
        agent_id: str,
        protections: dict[str, _Protection],
    ) -> str:
        """:meth:`reason`, from the previous pass's :class:`PlanMemo` where that is
        exact (see its docstring); what is worked out goes into this pass's memo."""
        memo = self.memo
        if memo is None or agent_id in protections or agent_id in self.touched:
            return self.reason(session, shape, agent_id, protections)
        if not self._agents:
            self._agents = {a.state.id: a for a in self.snapshot.agents}
        agent = self._agents[agent_id]
        key = (shape.key, agent_id)
        entry = memo.entries.get(key)
        if entry is not None and entry[0] is agent:
            memo.hits += 1
            reason = entry[1]
        else:
            reason = self.reason(session, shape, agent_id, protections)
        self._memo_used[key] = (agent, reason)
        return reason

    def twin(self, agent_id: str, interned: dict[object, int]) -> int:
        """Agents whose reasons read the same (same totals, image facts and reported
        maps, nothing placed on them in the pass) get the same int: on a full cluster
        the shown agents are often built and filled alike, and are explained once."""
        agent = self.current(agent_id)
        state = (
            agent.available_slots,
            agent.occupied_slots,
            agent.runtime,
            agent.architecture,
            agent.images,
            self.ledgers[agent_id].fingerprint,
        )
        return interned.setdefault(state, len(interned))

    def reason(
        self,
        session: PendingSession,
        shape: _Shape,
        agent_id: str,
        protections: dict[str, _Protection],
    ) -> str:
        """Why ``agent_id`` refuses ``shape`` as the pass ends: the image, its totals (per
        device where that says more), a waiting higher-priority session, its devices."""
        agent = self.current(agent_id)
        if session.image is not None:
            refusal = image_refusal(
                session.image,
                agent_runtime=agent.runtime,
                agent_architecture=agent.architecture,
                agent_images=agent.images,
            )
            if refusal is not None:
                return refusal
        index = self.capacity.index[agent_id]
        if not self.capacity.fits(index, shape.request):
            return self.shortfall_reason(agent, session, shape)
        held = self.held_for(index, shape.request, protections)
        if held is not None:
            priority, slot = held
            return f"held for a waiting priority-{priority} session ({slot} it needs here)"
        refusal = self.ledgers[agent_id].refusal(
            shape.request, allow_fragmentation=session.allow_fragmentation
        )
        # An agent that refused the shape refuses it at the end of the pass (monotone).
        return refusal or "no room when it was tried"

    def place(self, session: PendingSession) -> Assignment | _Fit:
        if session.designated_agent is not None and session.designated_agent not in self.states:
            why = (
                f"{session.designated_agent}: the designated agent is not ALIVE and"
                f" schedulable in scaling group {self.snapshot.scaling_group}"
            )
            return _Fit([why], False, None)
        if not self.states:
            why = f"no ALIVE agent in scaling group {self.snapshot.scaling_group}"
            return _Fit([why], False, None)
        shape = self.shape_of(session)
        if shape.failed is not None:  # it failed earlier in the pass: it fails again
            return self.refresh(shape.failed)
        capacity, request, dead = self.capacity, shape.request, shape.dead
        protections = self.protections
        ids = capacity.ids
        packing: list[tuple[Decimal, int, int]] = []  # (hole loss, rank, agent index)
        for index in self.candidates(session, shape):
            if index in dead:
                continue
            if not capacity.fits(index, request):
                dead.add(index)
                continue
            if protections and self.held_for(index, request, protections) is not None:
                dead.add(index)
                continue
            agent_id = ids[index]
            if shape.packs:  # the first fitting agent and a few more: the least hole loss
                ledger = self.ledgers[agent_id]
                if ledger.refusal(request, allow_fragmentation=False) is not None:
                    dead.add(index)
                    continue
                loss = ledger.hole_loss(request, shape.packs)
                packing.append((loss, len(packing), index))
                if len(packing) < PACK_CANDIDATES:
                    continue
                break
            placed = self.ledgers[agent_id].place(
                session.requested_slots, allow_fragmentation=session.allow_fragmentation
            )
            if isinstance(placed, FitFailure):
                dead.add(index)
                continue
            self.commit(session, shape, index)
            return Assignment(session.id, agent_id, session.requested_slots, placed)
        if packing:
            index = min(packing)[2]
            agent_id = ids[index]
            placed = self.ledgers[agent_id].place(
                session.requested_slots, allow_fragmentation=False
            )
            assert not isinstance(placed, FitFailure)  # its dry run just succeeded
            self.commit(session, shape, index)
            return Assignment(session.id, agent_id, session.requested_slots, placed)
        refused = len(ids) if session.designated_agent is None else 1
        fit = _Fit([], None, None, refused, shape=shape, deferral_key=(-1, -1))
        shape.failed = fit
        return self.refresh(fit)

    def candidates(self, session: PendingSession, shape: _Shape) -> Iterator[int]:
        """The pool's agents in the selector's order (those that surely cannot hold the
        shape's first slot may be left out)."""
        capacity = self.capacity
        options = self.snapshot.options
        if shape.pool is None:
            yield from capacity.walk(shape.signature, shape.request, self.last_roundrobin)
            return
        fitting = [
            self.current(capacity.ids[i])
            for i in shape.pool
            if i not in shape.dead and capacity.fits(i, shape.request)
        ]
        for agent in iter_ranked(
            options.selector,
            session,
            fitting,
            resource_priority=options.resource_priority,
            last_roundrobin_agent=self.last_roundrobin,
        ):
            yield capacity.index[agent.id]

    def shape_of(self, session: PendingSession) -> _Shape:
        memo = self.memo
        if memo is None:
            key = _shape(session)
            shape = self._shapes.get(key)
            if shape is not None:
                return shape
            return self._new_shape(session, key)
        number = _memo_number(memo, session)
        if number is None:
            key = _shape(session)
            found = memo.shape_keys.get(key)
            if found is None:
                found = memo.shape_keys[key] = memo.next_shape
                memo.next_shape += 1
            number = found
        self._session_shapes[id(session)] = (session, number)
        shape = self._numbered.get(number)
        if shape is None:
            shape = self._numbered[number] = self._new_shape(session, _shape(session))
        return shape

    def _new_shape(self, session: PendingSession, key: _ShapeKey) -> _Shape:
        items = tuple(session.requested_slots.items())
        request = tuple((s, v) for s, v in items if v > 0)
        signature = self.capacity.signature([s for s, _ in request])
        pool: tuple[int, ...] | None = None  # every agent
        if session.designated_agent is not None:
            pool = (self.capacity.index[session.designated_agent],)
        if session.image is not None:  # only agents that can run the image (sched.images)
            image = session.image
            pool = tuple(
                i
                for i in (range(len(self.capacity.ids)) if pool is None else pool)
                if self.can_run(image, self.capacity.ids[i])
            )
        shape = self._shapes[key] = _Shape(key, request, items, signature, pool)
        if not session.allow_fragmentation and session.designated_agent is None:
            shape.packs = tuple(s for s, _ in request if _is_accelerator(s))
        return shape

    def keep_shapes(self) -> None:
        """After the pass: the memo keeps the shape keys of this pass's sessions only."""
        memo = self.memo
        if memo is None:
            return
        memo.shape_ids = self._session_shapes
        used = {number for _, number in self._session_shapes.values()}
        memo.shape_keys = {key: n for key, n in memo.shape_keys.items() if n in used}

    def can_run(self, image: ImageRequirement, agent_id: str) -> bool:
        agent = self.states[agent_id]
        refusal = image_refusal(
            image,
            agent_runtime=agent.runtime,
            agent_architecture=agent.architecture,
            agent_images=agent.images,
        )
        return refusal is None

    def refresh(self, fit: _Fit) -> _Fit:
        """``fit`` with ``deferred_by`` as of now: only protected agents can defer a
        session, so it changes only with the blockers or a placement on one of them."""
        if not self.protections:
            if fit.deferred_by is None:
                return fit
            return replace(fit, deferred_by=None, deferral_key=(0, 0))
        key = (len(self.blockers), self.protected_commits)
        if fit.deferral_key == key:
            return fit
        shape = fit.shape
        assert shape is not None
        deferred_by: int | None = None
        pool = None if shape.pool is None else set(shape.pool)
        for agent_id in self.protections:
            index = self.capacity.index.get(agent_id)
            if index is None or (pool is not None and index not in pool):
                continue
            if not self.capacity.fits(index, shape.request):
                continue
            held = self.held_for(index, shape.request, self.protections)
            if held is not None:
                deferred_by = max(deferred_by or held[0], held[0])
        fitted = replace(fit, deferred_by=deferred_by, deferral_key=key)
        shape.failed = fitted
        return fitted

    def fit_could_fit(self, fit: _Fit) -> bool:
        if fit.could_fit is not None:
            return fit.could_fit
        assert fit.shape is not None
        return self.could_fit(fit.shape)

    def could_fit(self, shape: _Shape) -> bool:
        """Could some agent of the shape's pool hold it if that agent were empty?"""
        if shape.could_fit is None:
            pool = range(len(self.capacity.ids)) if shape.pool is None else shape.pool
            shape.could_fit = any(self.fits_when_empty(shape, i) for i in pool)
        return shape.could_fit

    def fits_when_empty(self, shape: _Shape, index: int) -> bool:
        agent_id = self.capacity.ids[index]
        available = self.states[agent_id].available_slots
        for slot, amount in shape.request:
            if slot not in available or available[slot] < amount or available[slot] <= 0:
                return False
        return self.ledgers[agent_id].fits_when_empty(
            dict(shape.request), allow_fragmentation=shape.key[1]
        )

    def usable_agents(self, shape: _Shape) -> frozenset[str]:
        """The agents of the shape's pool that could hold it if they were empty (agents
        built alike — same totals, same devices — are dry-run once)."""
        if shape.usable is None:
            if self._signatures is None:
                self._signatures = _signature_ids(self.snapshot.agents)
            verdicts: dict[int, bool] = {}
            ids = self.capacity.ids
            pool = range(len(ids)) if shape.pool is None else shape.pool
            usable = []
            for i in pool:
                signature = self._signatures[ids[i]]
                fits = verdicts.get(signature)
                if fits is None:
                    fits = verdicts[signature] = self.fits_when_empty(shape, i)
                if fits:
                    usable.append(ids[i])
            shape.usable = frozenset(usable)
        return shape.usable

    def held_for(
        self,
        index: int,
        request: Sequence[tuple[str, Decimal]],
        protections: Mapping[str, _Protection],
    ) -> tuple[int, str] | None:
        """``(priority, slot)`` when placing ``request`` (positive amounts) on the agent
        would take what a waiting higher-priority session needs there (the rule of
        :func:`plan_pass`); the agent's remaining totals cover the request."""
        protection = protections.get(self.capacity.ids[index])
        if protection is None:
            return None
        free = self.capacity.free[index]
        for slot, amount in request:
            if slot in protection.accelerators:
                return protection.priority, slot
            need = protection.needs.get(slot)
            if need is None:
                continue
            if free.get(slot, _ZERO) - amount < need:
                return protection.priority, slot
        return None

    def add_blockers(self, blockers: Sequence[_Blocker]) -> None:
        """Sessions of a finished band that wait for resources protect what they need
        on every agent they could use, from every lower band."""
        if not blockers:
            return
        protections = {
            agent_id: _Protection(p.priority, dict(p.needs), set(p.accelerators))
            for agent_id, p in self.protections.items()
        }
        seen: set[tuple[ResourceSlot, _ShapeKey]] = set()
        for blocker in blockers:
            key = (blocker.requested, blocker.shape.key)
            if key in seen:
                continue
            seen.add(key)
            self.blockers.append(blocker)
            for agent_id in self.usable_agents(blocker.shape):
                protection = protections.get(agent_id)
                if protection is None:
                    protection = protections[agent_id] = _Protection(blocker.priority)
                protection.priority = max(protection.priority, blocker.priority)
                for slot, amount in blocker.requested.items():
                    if amount <= 0:
                        continue
                    if _is_accelerator(slot):
                        protection.accelerators.add(slot)
                    else:
                        protection.needs[slot] = max(protection.needs.get(slot, amount), amount)
        self.protections = protections

    def shortfall_reason(self, agent: AgentState, session: PendingSession, shape: _Shape) -> str:
        """The totals' reason, or the devices' one when it says more (per-device free)."""
        ledger = self.ledgers[agent.id]
        free = self.capacity.free[self.capacity.index[agent.id]]
        short_slots = {slot for slot, amount in shape.request if free.get(slot, _ZERO) < amount}
        if short_slots and short_slots <= ledger.slots:
            refusal = ledger.refusal(shape.request, allow_fragmentation=session.allow_fragmentation)
            if refusal is not None:
                return refusal
        short = totals_shortfall(
            agent.available_slots, agent.occupied_slots, session.requested_slots
        )
        return "; ".join(short)

    def current(self, agent_id: str) -> AgentState:
        """The agent with what this pass placed on it so far in its occupied totals."""
        placed = self._placed.pop(agent_id, None)
        agent = self.states[agent_id]
        if placed:
            occupied = agent.occupied_slots
            for requested in placed:
                occupied = occupied + requested
            agent = self.states[agent_id] = replace(agent, occupied_slots=occupied)
        return agent

    def commit(self, session: PendingSession, shape: _Shape, index: int) -> None:
        """Account a placement: the agent's remaining totals (its ``AgentState`` is
        brought up to date when read, :meth:`current`), the predicates' counters (only
        when a predicate can read them) and the DRF shares (only for drf)."""
        requested = session.requested_slots
        agent_id = self.capacity.ids[index]
        self.touched.add(agent_id)
        self._placed.setdefault(agent_id, []).append(requested)
        self.capacity.commit(index, shape.items)
        if agent_id in self.protections:
            self.protected_commits += 1
        if self.counts_occupancy:
            self.ctx.occupy(session)
        if self.snapshot.options.picker is PickerName.DRF:
            key = session.access_key
            self.drf_occupancy[key] = self.drf_occupancy.get(key, _EMPTY) + requested
        self.last_roundrobin = agent_id


def _capacity_signature(agent: AgentSnapshot) -> object:
    """What "could it hold this when empty?" depends on: the totals and every map's
    devices (slot, capacity, NUMA node, in the map's order), kind, strategy, quantum."""
    return (
        agent.state.available_slots,
        tuple(
            (
                m.key,
                m.kind,
                m.strategy,
                m.quantum,
                m.exclusive_slot_types,
                tuple((d.slot_name, d.slot_type, d.capacity, d.numa_node) for d in m.devices),
            )
            for m in agent.maps
        ),
    )


def _signature_ids(agents: Sequence[AgentSnapshot]) -> dict[str, int]:
    interned: dict[object, int] = {}
    return {a.state.id: interned.setdefault(_capacity_signature(a), len(interned)) for a in agents}


def plan_pass(
    snapshot: SchedulingSnapshot,
    memo: PlanMemo | None = None,
    *,
    layouts: MapLayouts | None = None,
) -> SchedulingPlan:
    """Run one pass (see the module docstring) and return the plan; the snapshot is
    untouched.  ``memo`` (the scaling group's, kept by the caller between passes) saves
    working out again the reasons of agents that did not change; ``layouts`` (or the
    memo's) keeps the device layouts' empty maps and verdicts.  The plan is the same
    with or without either.  The same as ``place_pass(snapshot, memo).explain()``."""
    return place_pass(snapshot, memo, layouts=layouts).explain()


class PlacedPass:
    """A pass whose placements are decided (:func:`place_pass`): :attr:`placements` is
    the plan without its failures; :meth:`explain` works out why every other session
    stays pending and returns the whole plan (the same as :func:`plan_pass`'s).

    On a full cluster the explanations are most of a pass (a :class:`Failure` for each
    of 10,000 pending sessions), and nothing of the placements depends on them: the
    manager applies and binds the placements first, then explains (the reasons are
    those as of the end of the placements either way).  Until :meth:`explain` runs, the
    memo holds the previous pass's reasons and orders, which stay exact."""

    __slots__ = ("_plan", "_run", "placements")

    def __init__(self, run: _Pass) -> None:
        self._run = run
        self._plan: SchedulingPlan | None = None
        self.placements = SchedulingPlan(
            run.snapshot.scaling_group, tuple(run.assignments), (), run.last_roundrobin
        )

    def explain(self) -> SchedulingPlan:
        """The whole plan (worked out once; later calls return it again)."""
        if self._plan is not None:
            return self._plan
        run = self._run
        run.explain_failures()
        memo = run.memo
        if memo is not None:
            memo.entries = run._memo_used
            memo.orders = run._orders
            run.keep_shapes()
        failures = tuple(f for f in run.failures if f is not None)
        assert len(failures) == len(run.failures)
        self._plan = replace(self.placements, failures=failures)
        return self._plan


def place_pass(
    snapshot: SchedulingSnapshot,
    memo: PlanMemo | None = None,
    *,
    layouts: MapLayouts | None = None,
) -> PlacedPass:
    """The placements of one pass (see :func:`plan_pass` and :class:`PlacedPass`).
    ``layouts``: kept across passes by a caller without a memo (else the memo's)."""
    states = {a.state.id: a.state for a in snapshot.agents}
    if layouts is None:
        layouts = memo.layouts if memo is not None else MapLayouts()
    options = snapshot.options
    total = _EMPTY  # only drf reads it
    if options.picker is PickerName.DRF:
        for a in snapshot.agents:
            total = total + a.state.available_slots
    ctx = _copy_context(snapshot.predicate_context, snapshot.now)
    trivially_passed = passed_without_limits(ctx, options.predicates)
    run = _Pass(
        snapshot=snapshot,
        ctx=ctx,
        states=states,
        ledgers={a.state.id: DeviceLedger(a.state.id, a.maps, layouts) for a in snapshot.agents},
        drf_occupancy=dict(snapshot.occupancy_by_access_key),
        total_capacity=total,
        last_roundrobin=snapshot.last_roundrobin_agent,
        capacity=Capacity(
            [a.state for a in snapshot.agents], options.selector, options.resource_priority
        ),
        memo=memo,
        trivially_passed=trivially_passed,
        # the default predicates read the counters only through a keypair limit on running
        # sessions or a quota: exactly when there is no pass-wide "every one passes"
        counts_occupancy=trivially_passed is None,
    )
    bands: dict[int, list[PendingSession]] = {}
    for session in snapshot.pending:
        bands.setdefault(session.priority, []).append(session)
    priorities = sorted(bands, reverse=True)
    for n, priority in enumerate(priorities):
        blocking = n + 1 < len(priorities)  # the last band protects nothing: none follows
        waiting = [
            blocker
            for session in run.pick_sequence(bands[priority])
            if (blocker := run.try_session(session, blocking)) is not None
        ]
        if blocking:
            run.add_blockers(waiting)
    return PlacedPass(run)
