"""One scheduling pass over a frozen snapshot: sessions in, a plan out (pure, no I/O).

The manager loads a :class:`SchedulingSnapshot` of one scaling group inside one
transaction (ALIVE agents with their per-device state, PENDING sessions, counters
for the predicates), calls :func:`plan_pass`, and applies the returned
:class:`SchedulingPlan` with an optimistic check (spec 05, STYLE: Nomad).  The pass:

1. **Priority bands**, highest first.  Only the highest band is tried, *unless* it
   cannot use the resources anyway (the no-starvation rule below), in which case the
   next band is tried in the same pass.
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
   predicates, and per agent why it did not fit) for ``why``.

**No starvation.**  A band *blocks* the lower bands when at least one of its sessions
passed every predicate and failed only because no agent has room *now* although some
agent could hold it when empty.  Then every lower-priority session is deferred
("waiting for priority-P sessions to be placed first") and the resources that free up
go to the high-priority session first: it is never overtaken forever.  A band does
*not* block when its unplaced sessions fail only predicates that resources cannot
cure (a future start time, unfinished dependencies, the owner's own quota or
concurrency limit) or ask for more than any agent has even when empty: such sessions
would otherwise freeze the whole cluster for nothing.

Example: agent with 2 fGPU, pending A (priority 20, 3 fGPU — never fits), B
(priority 20, 1 fGPU, starts tomorrow), C (priority 10, 1 fGPU).  The 20-band does
not block (A can never fit, B waits for its time), so C is placed in this pass.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from decimal import Decimal
from typing import Any

from accelshare.alloc import KernelAllocation
from accelshare.common import ResourceSlot

from .fit import (
    DeviceLedger,
    FitFailure,
    MapState,
    device_allocation,
    fits_capacity,
    totals_shortfall,
)
from .model import AgentState, PendingSession, PredicateResult
from .pickers import PickerName, pick
from .predicates import DEFAULT_PREDICATES, Predicate, PredicateContext, run_predicates
from .selectors import DEFAULT_RESOURCE_PRIORITY, SelectorName, rank_agents

__all__ = [
    "AgentSnapshot",
    "Assignment",
    "Failure",
    "FailureKind",
    "SchedulerOptions",
    "SchedulingPlan",
    "SchedulingSnapshot",
    "plan_pass",
]

_EMPTY = ResourceSlot()
_MAX_REASONS_IN_MSG = 3


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
class Failure:
    """A session left PENDING by this pass, and why."""

    session_id: str
    kind: FailureKind
    msg: str
    retries: int  # status_data.scheduler.retries after this pass
    failed_predicates: tuple[PredicateResult, ...] = ()
    passed_predicates: tuple[PredicateResult, ...] = ()
    agent_reasons: tuple[str, ...] = ()  # "i-node01: cuda.shares needs 1.2, ..."
    blocks_lower_priorities: bool = False

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


@dataclass(slots=True)
class _Pass:
    """The mutable state of one pass (never escapes :func:`plan_pass`)."""

    snapshot: SchedulingSnapshot
    ctx: PredicateContext
    states: dict[str, AgentState]
    ledgers: dict[str, DeviceLedger]
    drf_occupancy: dict[str, ResourceSlot]
    total_capacity: ResourceSlot
    last_roundrobin: str | None
    assignments: list[Assignment] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)

    def pick_sequence(self, band: Sequence[PendingSession]) -> Iterator[PendingSession]:
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
        ordered = sorted(band, key=_age_key, reverse=options.picker is PickerName.LIFO)
        skip = options.num_retries_to_skip
        if options.picker is PickerName.FIFO and skip > 0:
            fresh = [s for s in ordered if s.retries < skip]
            stale = [s for s in ordered if s.retries >= skip]
            ordered = fresh + stale
        yield from ordered

    def try_session(self, session: PendingSession) -> bool:
        """Try one session; returns True when it blocks lower priorities."""
        passed, failed = run_predicates(session, self.ctx, self.snapshot.options.predicates)
        if failed:
            self.failures.append(
                Failure(
                    session.id,
                    FailureKind.PREDICATE,
                    "; ".join(r.message for r in failed),
                    session.retries + 1,
                    tuple(failed),
                    tuple(passed),
                )
            )
            return False
        result = self.place(session)
        if isinstance(result, Assignment):
            self.assignments.append(replace(result, passed_predicates=tuple(passed)))
            return False
        reasons, could_fit = result
        shown = reasons[:_MAX_REASONS_IN_MSG]
        more = len(reasons) - len(shown)
        msg = "No agent can hold the request now: " + "; ".join(shown)
        if more:
            msg += f"; and {more} more agent(s)"
        self.failures.append(
            Failure(
                session.id,
                FailureKind.NO_AGENT,
                msg,
                session.retries + 1,
                (),
                tuple(passed),
                tuple(reasons),
                blocks_lower_priorities=could_fit,
            )
        )
        return could_fit

    def place(self, session: PendingSession) -> Assignment | tuple[list[str], bool]:
        requested = session.requested_slots
        if session.designated_agent is not None:
            designated = self.states.get(session.designated_agent)
            if designated is None:
                why = (
                    f"{session.designated_agent}: the designated agent is not ALIVE and"
                    f" schedulable in scaling group {self.snapshot.scaling_group}"
                )
                return [why], False
            pool = [designated]
        else:
            pool = list(self.states.values())
        if not pool:
            return [f"no ALIVE agent in scaling group {self.snapshot.scaling_group}"], False
        reasons: dict[str, str] = {}
        fitting: list[AgentState] = []
        for agent in pool:
            short = totals_shortfall(agent.available_slots, agent.occupied_slots, requested)
            if short:
                reasons[agent.id] = self.shortfall_reason(agent, session, short)
            else:
                fitting.append(agent)
        options = self.snapshot.options
        ranked = rank_agents(
            options.selector,
            session,
            fitting,
            resource_priority=options.resource_priority,
            last_roundrobin_agent=self.last_roundrobin,
        )
        for agent in ranked:
            placed = self.ledgers[agent.id].place(
                requested, allow_fragmentation=session.allow_fragmentation
            )
            if isinstance(placed, FitFailure):
                reasons[agent.id] = placed.reason
                continue
            self.commit(session, agent)
            return Assignment(session.id, agent.id, requested, placed)
        could_fit = any(
            fits_capacity(
                a.available_slots,
                self.ledgers[a.id],
                requested,
                allow_fragmentation=session.allow_fragmentation,
            )
            for a in pool
        )
        return [f"{aid}: {reasons[aid]}" for aid in sorted(reasons)], could_fit

    def shortfall_reason(self, agent: AgentState, session: PendingSession, short: list[str]) -> str:
        """The totals' reason, or the devices' one when it says more (per-device free)."""
        ledger = self.ledgers[agent.id]
        requested = session.requested_slots
        short_slots = {
            slot
            for slot, amount in requested.items()
            if amount
            > agent.available_slots.get_amount(slot) - agent.occupied_slots.get_amount(slot)
        }
        if short_slots and short_slots <= ledger.slots:
            checked = ledger.check(requested, allow_fragmentation=session.allow_fragmentation)
            if isinstance(checked, FitFailure):
                return checked.reason
        return "; ".join(short)

    def commit(self, session: PendingSession, agent: AgentState) -> None:
        requested = session.requested_slots
        self.states[agent.id] = replace(agent, occupied_slots=agent.occupied_slots + requested)
        self.ctx.occupy(session)
        key = session.access_key
        self.drf_occupancy[key] = self.drf_occupancy.get(key, _EMPTY) + requested
        self.last_roundrobin = agent.id


def plan_pass(snapshot: SchedulingSnapshot) -> SchedulingPlan:
    """Run one pass (see the module docstring) and return the plan; the snapshot is untouched."""
    states = {a.state.id: a.state for a in snapshot.agents}
    total = _EMPTY
    for a in snapshot.agents:
        total = total + a.state.available_slots
    run = _Pass(
        snapshot=snapshot,
        ctx=_copy_context(snapshot.predicate_context, snapshot.now),
        states=states,
        ledgers={a.state.id: DeviceLedger(a.state.id, a.maps) for a in snapshot.agents},
        drf_occupancy=dict(snapshot.occupancy_by_access_key),
        total_capacity=total,
        last_roundrobin=snapshot.last_roundrobin_agent,
    )
    bands: dict[int, list[PendingSession]] = {}
    for session in snapshot.pending:
        bands.setdefault(session.priority, []).append(session)
    blocked_by: int | None = None
    for priority in sorted(bands, reverse=True):
        band = bands[priority]
        if blocked_by is not None:
            msg = (
                f"Waiting for priority-{blocked_by} sessions to be placed first"
                f" (this session has priority {priority})"
            )
            run.failures.extend(
                Failure(s.id, FailureKind.DEFERRED, msg, s.retries)
                for s in sorted(band, key=_age_key)
            )
            continue
        blocks = False
        for session in run.pick_sequence(band):
            blocks = run.try_session(session) or blocks
        if blocks:
            blocked_by = priority
    return SchedulingPlan(
        snapshot.scaling_group,
        tuple(run.assignments),
        tuple(run.failures),
        run.last_roundrobin,
    )
