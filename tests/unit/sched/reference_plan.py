"""The planner as it was before the capacity index (commit db94d14), kept as a slow
reference for ``test_plan_equivalence.py``: it re-ranks every agent for every session
and re-evaluates a shape after every placement.  Test-only; only the pass itself is kept
(the data classes are the production ones)."""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from decimal import Decimal

from accelshare.alloc import ResourceError, allocate_kernel
from accelshare.common import ResourceSlot, SlotName
from accelshare.sched.fit import FitFailure, TrialMaps, totals_shortfall
from accelshare.sched.images import ImageRequirement, image_refusal
from accelshare.sched.model import AgentState, PendingSession, PredicateResult
from accelshare.sched.onepass import PACK_CANDIDATES
from accelshare.sched.outcome import NEVER_FITS, Assignment, Failure, FailureKind, SchedulingPlan
from accelshare.sched.pickers import PickerName, pick
from accelshare.sched.predicates import PredicateContext, run_predicates
from accelshare.sched.selectors import iter_ranked
from accelshare.sched.snapshot import AgentSnapshot, SchedulingSnapshot

__all__ = ["plan_pass"]

_EMPTY = ResourceSlot()
_MAX_REASONS_IN_MSG = 3
MAX_AGENT_REASONS = 10
"""A failure lists the per-agent reasons of the first 10 agents (by id) and one
``"... and N more agent(s)"`` line: a 1,000-agent cluster would otherwise compute (a
per-device dry run each) and store 1,000 lines for every pending session on every pass."""

_ShapeKey = tuple[tuple[tuple[str, Decimal], ...], bool, str | None, ImageRequirement | None]


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
    :func:`plan_pass`): where it could fit when empty, and what it asks for."""

    priority: int
    requested: ResourceSlot
    agents: frozenset[str]


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
class _Fit:
    """A shape's failed fit: reasons per agent, agents it could use when empty, and
    whether a waiting higher-priority session held it back."""

    reasons: list[str]
    usable: frozenset[str]
    deferred_by: int | None
    refused: int = 1  # how many agents refused (the reasons list at most MAX_AGENT_REASONS)
    # per agent: the reason, or None for a totals shortfall explained when the pass ends
    raw: dict[str, str | None] | None = None
    shape: _ShapeKey | None = None


@dataclass(slots=True)
class _Pass:
    """The mutable state of one pass (never escapes :func:`plan_pass`).

    Caches (exact, never stale): a commit bumps the agent's version and the pass's
    generation.  Per shape (:func:`_shape`) and agent, the totals verdict and a failed
    device dry run are kept with the agent's version; a shape's whole failure is kept
    with the generation (and the number of blockers), so the thousands of pending
    sessions of a full cluster cost one evaluation per distinct request, not one per
    session and agent.  Whether a shape could fit an agent when empty never changes.
    """

    snapshot: SchedulingSnapshot
    ctx: PredicateContext
    states: dict[str, AgentState]
    trials: dict[str, TrialMaps]
    drf_occupancy: dict[str, ResourceSlot]
    total_capacity: ResourceSlot
    last_roundrobin: str | None
    assignments: list[Assignment] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    versions: dict[str, int] = field(default_factory=dict)
    generation: int = 0
    blockers: list[_Blocker] = field(default_factory=list)
    protections: dict[str, _Protection] = field(default_factory=dict)
    _totals: dict[_ShapeKey, dict[str, tuple[int, bool]]] = field(default_factory=dict)
    _unexplained: list[tuple[int, PendingSession, tuple[PredicateResult, ...], _Fit]] = field(
        default_factory=list
    )
    _device_failures: dict[_ShapeKey, dict[str, tuple[int, str]]] = field(default_factory=dict)
    _capacity: dict[_ShapeKey, frozenset[str]] = field(default_factory=dict)
    _empty_fit: dict[tuple[int, _ShapeKey], bool] = field(default_factory=dict)
    signatures: dict[str, int] = field(default_factory=dict)  # agents built alike: same int
    _failed: dict[_ShapeKey, tuple[int, int, _Fit]] = field(default_factory=dict)

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

    def try_session(self, session: PendingSession) -> _Blocker | None:
        """Try one session; returns a blocker when it waits for resources (see plan_pass)."""
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
            return None
        result = self.place(session)
        if isinstance(result, Assignment):
            self.assignments.append(replace(result, passed_predicates=tuple(passed)))
            return None
        self._unexplained.append((len(self.failures), session, tuple(passed), result))
        self.failures.append(self.failure_for(session, tuple(passed), result))  # placeholder
        if not result.usable:
            return None
        return _Blocker(session.priority, session.requested_slots, result.usable)

    def failure_for(
        self, session: PendingSession, passed: tuple[PredicateResult, ...], result: _Fit
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
                NEVER_FITS if not result.usable else "No agent can hold the request now: "
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
            blocks_lower_priorities=bool(result.usable),
        )

    def explain_failures(self) -> None:
        """Fill in the reasons of the sessions left pending, as of the end of the pass:
        ``<agent>: <why>`` for the first :data:`MAX_AGENT_REASONS` agents by id (a
        totals shortfall is explained here, per device where that says more), then how
        many more agents refused.  Worked out once per shape and agent."""
        explained: dict[tuple[_ShapeKey, str], str] = {}
        for index, session, passed, fit in self._unexplained:
            if fit.raw is not None and not fit.reasons:
                assert fit.shape is not None
                shown = sorted(fit.raw)[:MAX_AGENT_REASONS]
                for agent_id in shown:
                    reason = fit.raw[agent_id]
                    if reason is None:
                        reason = explained.get((fit.shape, agent_id))
                        if reason is None:
                            agent = self.states[agent_id]
                            short = totals_shortfall(
                                agent.available_slots,
                                agent.occupied_slots,
                                session.requested_slots,
                            )
                            reason = self.shortfall_reason(agent, session, short)
                            explained[(fit.shape, agent_id)] = reason
                    fit.reasons.append(f"{agent_id}: {reason}")
                if len(fit.raw) > len(shown):
                    fit.reasons.append(f"... and {len(fit.raw) - len(shown)} more agent(s)")
            self.failures[index] = self.failure_for(session, passed, fit)

    def place(self, session: PendingSession) -> Assignment | _Fit:
        requested = session.requested_slots
        if session.designated_agent is not None:
            designated = self.states.get(session.designated_agent)
            if designated is None:
                why = (
                    f"{session.designated_agent}: the designated agent is not ALIVE and"
                    f" schedulable in scaling group {self.snapshot.scaling_group}"
                )
                return _Fit([why], frozenset(), None)
            pool = [designated]
        else:
            pool = list(self.states.values())
        if not pool:
            why = f"no ALIVE agent in scaling group {self.snapshot.scaling_group}"
            return _Fit([why], frozenset(), None)
        shape = _shape(session)
        known = self._failed.get(shape)
        if known is not None and known[0] == self.generation and known[1] == len(self.blockers):
            return known[2]  # nothing changed since a session of this shape failed
        reasons: dict[str, str | None] = {}  # None: a totals shortfall, explained lazily
        if session.image is not None:  # only agents that can run the image (sched.images)
            can_run = []
            for agent in pool:
                refusal = image_refusal(
                    session.image,
                    agent_runtime=agent.runtime,
                    agent_architecture=agent.architecture,
                    agent_images=agent.images,
                )
                if refusal is None:
                    can_run.append(agent)
                else:
                    reasons[agent.id] = refusal
            pool = can_run
        fitting: list[AgentState] = []
        totals = self._totals.setdefault(shape, {})
        versions = self.versions
        for agent in pool:
            version = versions[agent.id]
            cached = totals.get(agent.id)
            if cached is not None and cached[0] == version:
                fits = cached[1]
            else:
                fits = _totals_fit(agent.available_slots, agent.occupied_slots, requested)
                totals[agent.id] = (version, fits)
            if fits:
                fitting.append(agent)
            else:
                reasons[agent.id] = None
        options = self.snapshot.options
        device_failures = self._device_failures.setdefault(shape, {})
        deferred_by: int | None = None
        packs: tuple[str, ...] = ()
        if not session.allow_fragmentation and session.designated_agent is None:
            packs = tuple(s for s, v in requested.items() if v > 0 and _is_accelerator(s))
        packing: list[tuple[Decimal, int, AgentState]] = []
        for agent in iter_ranked(
            options.selector,
            session,
            fitting,
            resource_priority=options.resource_priority,
            last_roundrobin_agent=self.last_roundrobin,
        ):
            held = self.held_for(agent, requested)
            if held is not None:
                priority, slot = held
                reasons[agent.id] = (
                    f"held for a waiting priority-{priority} session ({slot} it needs here)"
                )
                deferred_by = max(deferred_by or priority, priority)
                continue
            version = versions[agent.id]
            failed = device_failures.get(agent.id)
            if failed is not None and failed[0] == version:
                reasons[agent.id] = failed[1]
                continue
            if packs:  # the least hole loss among the first PACK_CANDIDATES that fit
                checked = self.trials[agent.id].check(requested, allow_fragmentation=False)
                if isinstance(checked, FitFailure):
                    device_failures[agent.id] = (version, checked.reason)
                    reasons[agent.id] = checked.reason
                    continue
                positive = tuple((s, v) for s, v in requested.items() if v > 0)
                loss = self.trials[agent.id].hole_loss(positive, packs)
                packing.append((loss, len(packing), agent))
                if len(packing) == PACK_CANDIDATES:
                    break
                continue
            placed = self.trials[agent.id].place(
                requested, allow_fragmentation=session.allow_fragmentation
            )
            if isinstance(placed, FitFailure):
                device_failures[agent.id] = (version, placed.reason)
                reasons[agent.id] = placed.reason
                continue
            self.commit(session, agent)
            return Assignment(session.id, agent.id, requested, placed)
        if packing:
            agent = min(packing, key=lambda p: (p[0], p[1]))[2]
            placed = self.trials[agent.id].place(requested, allow_fragmentation=False)
            assert not isinstance(placed, FitFailure)
            self.commit(session, agent)
            return Assignment(session.id, agent.id, requested, placed)
        usable = self.usable_agents(shape, session, pool)
        fit = _Fit([], usable, deferred_by, len(reasons), raw=reasons, shape=shape)
        self._failed[shape] = (self.generation, len(self.blockers), fit)
        return fit

    def usable_agents(
        self, shape: _ShapeKey, session: PendingSession, pool: Sequence[AgentState]
    ) -> frozenset[str]:
        """The agents of ``pool`` that could hold the session if they were empty (agents
        built alike — same totals, same devices — are dry-run once)."""
        usable = self._capacity.get(shape)
        if usable is None:
            ids = []
            for a in pool:
                key = (self.signatures[a.id], shape)
                fits = self._empty_fit.get(key)
                if fits is None:
                    fits = self._empty_fit[key] = fits_capacity(
                        a.available_slots,
                        self.trials[a.id],
                        session.requested_slots,
                        allow_fragmentation=session.allow_fragmentation,
                    )
                if fits:
                    ids.append(a.id)
            usable = frozenset(ids)
            self._capacity[shape] = usable
        return usable

    def held_for(self, agent: AgentState, requested: ResourceSlot) -> tuple[int, str] | None:
        """``(priority, slot)`` when placing ``requested`` on ``agent`` would take what a
        waiting higher-priority session needs there (the rule of :func:`plan_pass`)."""
        protection = self.protections.get(agent.id)
        if protection is None:
            return None
        for slot, amount in requested.items():
            if amount <= 0:
                continue
            if slot in protection.accelerators:
                return protection.priority, slot
            need = protection.needs.get(slot)
            if need is None:
                continue
            free = agent.available_slots.get_amount(slot) - agent.occupied_slots.get_amount(slot)
            if free - amount < need:
                return protection.priority, slot
        return None

    def add_blockers(self, blockers: Sequence[_Blocker]) -> None:
        """Sessions of a finished band that wait for resources protect what they need
        on every agent they could use, from every lower band."""
        seen: set[tuple[ResourceSlot, frozenset[str]]] = set()
        for blocker in blockers:
            key = (blocker.requested, blocker.agents)
            if key in seen:
                continue
            seen.add(key)
            self.blockers.append(blocker)
            for agent_id in blocker.agents:
                protection = self.protections.get(agent_id)
                if protection is None:
                    protection = self.protections[agent_id] = _Protection(blocker.priority)
                protection.priority = max(protection.priority, blocker.priority)
                for slot, amount in blocker.requested.items():
                    if amount <= 0:
                        continue
                    if _is_accelerator(slot):
                        protection.accelerators.add(slot)
                    else:
                        protection.needs[slot] = max(protection.needs.get(slot, amount), amount)

    def shortfall_reason(self, agent: AgentState, session: PendingSession, short: list[str]) -> str:
        """The totals' reason, or the devices' one when it says more (per-device free)."""
        trial = self.trials[agent.id]
        requested = session.requested_slots
        short_slots = {
            slot
            for slot, amount in requested.items()
            if amount
            > agent.available_slots.get_amount(slot) - agent.occupied_slots.get_amount(slot)
        }
        if short_slots and short_slots <= trial.slots:
            checked = trial.check(requested, allow_fragmentation=session.allow_fragmentation)
            if isinstance(checked, FitFailure):
                return checked.reason
        return "; ".join(short)

    def commit(self, session: PendingSession, agent: AgentState) -> None:
        requested = session.requested_slots
        self.states[agent.id] = replace(agent, occupied_slots=agent.occupied_slots + requested)
        self.versions[agent.id] += 1
        self.generation += 1
        self.ctx.occupy(session)
        key = session.access_key
        self.drf_occupancy[key] = self.drf_occupancy.get(key, _EMPTY) + requested
        self.last_roundrobin = agent.id


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


def fits_capacity(
    available: ResourceSlot,
    trial: TrialMaps,
    requested: ResourceSlot,
    *,
    allow_fragmentation: bool = True,
) -> bool:
    """The old ``sched.fit.fits_capacity``: one allocate_kernel on freshly built empty maps."""
    if totals_shortfall(available, ResourceSlot(), requested):
        return False
    request = {s: v for s, v in requested.items() if v > 0 and s in trial.slots}
    if not request:
        return True
    maps = {state.key: state.build(empty=True) for state in trial.states}
    try:
        allocate_kernel(maps, request, allow_resource_fragmentation=allow_fragmentation)
    except ResourceError:
        return False
    return True


def _totals_fit(available: ResourceSlot, occupied: ResourceSlot, requested: ResourceSlot) -> bool:
    """``not totals_shortfall(available, occupied, requested)``, without the messages."""
    for slot, amount in requested.items():
        if amount <= 0:
            continue
        total = available.get_amount(slot)
        if slot not in available or total <= 0 or total - occupied.get_amount(slot) < amount:
            return False
    return True


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
        trials={a.state.id: TrialMaps(a.state.id, a.maps) for a in snapshot.agents},
        drf_occupancy=dict(snapshot.occupancy_by_access_key),
        total_capacity=total,
        last_roundrobin=snapshot.last_roundrobin_agent,
        versions=dict.fromkeys(states, 0),
        signatures=_signature_ids(snapshot.agents),
    )
    bands: dict[int, list[PendingSession]] = {}
    for session in snapshot.pending:
        bands.setdefault(session.priority, []).append(session)
    for priority in sorted(bands, reverse=True):
        waiting = [
            blocker
            for session in run.pick_sequence(bands[priority])
            if (blocker := run.try_session(session)) is not None
        ]
        run.add_blockers(waiting)
    run.explain_failures()
    return SchedulingPlan(
        snapshot.scaling_group,
        tuple(run.assignments),
        tuple(run.failures),
        run.last_roundrobin,
    )
