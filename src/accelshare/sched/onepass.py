"""One scheduling pass over a frozen snapshot: sessions in, a plan out (pure, no I/O).

The manager loads a :class:`~accelshare.sched.snapshot.SchedulingSnapshot` of one
scaling group inside one transaction (ALIVE agents with their per-device state, PENDING
sessions, counters for the predicates), calls :func:`~accelshare.sched.plan.plan_pass`,
and applies the returned :class:`~accelshare.sched.outcome.SchedulingPlan` with an
optimistic check (spec 05, STYLE: Nomad).  The pass:

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
   trial, totals and the predicate counters at once, so later sessions in the same
   pass see it (in-pass accounting: a plan never over-commits an agent or a device).
5. Sessions that were not placed get a :class:`~accelshare.sched.outcome.Failure` with
   the reasons (failed predicates, and per agent why it did not fit — the first
   :data:`~accelshare.sched.outcome.MAX_AGENT_REASONS` agents by id, then how many
   more) for ``why``.

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

Where the parts live: the bands and the picker's order in :mod:`accelshare.sched.bands`;
remaining totals and the selectors' orders in :mod:`accelshare.sched.capacity`; what a
pass knows per shape of request in :mod:`accelshare.sched.shapes` (kept between passes
by :mod:`accelshare.sched.memo`); the no-starvation protections in
:mod:`accelshare.sched.protection`, over the agents that could hold a session when
empty (:mod:`accelshare.sched.emptyfit`); the reasons of the sessions left pending in
:mod:`accelshare.sched.reasons`.  This module holds the pass that composes them
(:class:`Pass`), placing session after session.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from datetime import datetime
from decimal import Decimal

from accelshare.common import ResourceSlot

from .bands import BandOrders, priority_bands
from .capacity import Capacity
from .emptyfit import EmptyFit
from .fit import FitFailure, MapLayouts, TrialMaps
from .memo import PlanMemo, memo_number
from .model import AgentState, PendingSession
from .outcome import Assignment, Failure, FailureKind
from .pickers import PickerName
from .predicates import PredicateContext, passed_without_limits, predicate_results
from .protection import Blocker, Protections, held_for
from .reasons import Explainer, Unexplained
from .selectors import iter_ranked
from .shapes import Fit, Shape, ShapeBook
from .snapshot import SchedulingSnapshot

__all__ = ["PACK_CANDIDATES", "Pass"]

_EMPTY = ResourceSlot()

#: A session refusing fragmentation is dry-run on up to this many fitting agents, in the
#: selector's order, and placed where it costs the least hole score (docs/scheduler.md,
#: *Packing with the anti-fragmentation guard*).
PACK_CANDIDATES = 32


def copy_context(ctx: PredicateContext | None, now: datetime) -> PredicateContext:
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


class Pass:
    """The mutable state of one pass (never escapes :func:`~accelshare.sched.plan.place_pass`).

    Remaining totals live in :class:`~accelshare.sched.capacity.Capacity` (plain dicts
    and the selectors' orders kept sorted), per-device state in one
    :class:`~accelshare.sched.fit.TrialMaps` per agent, per shape a
    :class:`~accelshare.sched.shapes.Shape` (which agents refused it, whether it
    failed), and the protections of the bands done in
    :class:`~accelshare.sched.protection.Protections`.
    """

    __slots__ = (
        "_placed",
        "assignments",
        "bands",
        "capacity",
        "counts_occupancy",
        "ctx",
        "drf",
        "empty",
        "failures",
        "guard",
        "last_roundrobin",
        "memo",
        "shapes",
        "snapshot",
        "states",
        "touched",
        "trials",
        "trivially_passed",
        "unexplained",
    )

    def __init__(
        self, snapshot: SchedulingSnapshot, memo: PlanMemo | None, layouts: MapLayouts | None
    ) -> None:
        """``layouts``: kept across passes by a caller without a memo (else the memo's)."""
        if layouts is None:
            layouts = memo.layouts if memo is not None else MapLayouts()
        options = snapshot.options
        self.snapshot = snapshot
        self.memo = memo
        self.states = {a.state.id: a.state for a in snapshot.agents}
        self.trials = {a.state.id: TrialMaps(a.state.id, a.maps, layouts) for a in snapshot.agents}
        self.capacity = capacity = Capacity(
            [a.state for a in snapshot.agents], options.selector, options.resource_priority
        )
        self.ctx = ctx = copy_context(snapshot.predicate_context, snapshot.now)
        # predicates.passed_without_limits: what every session without a start time and
        # dependencies passes, when no limit or quota exists (None: run them per session)
        self.trivially_passed = passed_without_limits(ctx, options.predicates)
        # the default predicates read the counters only through a keypair limit on running
        # sessions or a quota: exactly when there is no pass-wide "every one passes"
        self.counts_occupancy = self.trivially_passed is None
        self.drf = options.picker is PickerName.DRF
        total = _EMPTY  # only drf reads it
        if self.drf:
            for a in snapshot.agents:
                total = total + a.state.available_slots
        self.bands = BandOrders(options, memo, dict(snapshot.occupancy_by_access_key), total)
        self.shapes = ShapeBook(capacity, self.states, memo)
        self.empty = EmptyFit(snapshot.agents, self.states, self.trials, capacity)
        self.guard = Protections(capacity)
        self.last_roundrobin = snapshot.last_roundrobin_agent
        self.assignments: list[Assignment] = []
        self.failures: list[Failure | None] = []  # None: explained when the pass ends
        self.unexplained: list[Unexplained] = []
        self.touched: set[str] = set()  # agents this pass placed on
        self._placed: dict[str, list[ResourceSlot]] = {}  # not in states yet

    def run(self) -> None:
        """Place the sessions, band after band; a band's waiting sessions protect what
        they need from the bands below it."""
        bands = priority_bands(self.snapshot.pending)
        for n, band in enumerate(bands):
            blocking = n + 1 < len(bands)  # the last band protects nothing: none follows
            waiting = [
                blocker
                for session in self.bands.sequence(band)
                if (blocker := self.try_session(session, blocking)) is not None
            ]
            if blocking:
                self.guard.add(waiting, self.empty.usable_agents)

    def try_session(self, session: PendingSession, blocking: bool) -> Blocker | None:
        """Try one session; returns a blocker when it waits for resources (see the module
        docstring) and ``blocking`` (a band follows)."""
        trivial = self.trivially_passed
        memo = self.memo
        protections = self.guard.by_agent  # replaced, not changed, when a band ends
        if (
            trivial is not None
            and memo is not None
            and not protections
            and session.starts_at is None
            and not session.dependencies
            and session.designated_agent is None
        ):
            # The common case on a full cluster, in O(1): every predicate passes, and
            # the session's shape (its memo entry) already failed in this pass with
            # nothing deferring it: it fails the same, as the general path below would
            # find, without its calls.
            number = memo_number(memo, session)
            if number is not None:
                shapes = self.shapes
                shape = shapes.numbered.get(number)
                fit = None if shape is None else shape.failed
                if shape is not None and fit is not None and fit.deferred_by is None:
                    shapes.session_shapes[id(session)] = (session, number)
                    self.unexplained.append(
                        (len(self.failures), session, trivial, fit, protections)
                    )
                    self.failures.append(None)
                    # no blocker: it would repeat the one of the shape's first session
                    # in this band (Protections.add keeps one per request and shape), or
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
        entry = (len(self.failures), session, passed, result, protections)
        self.unexplained.append(entry)
        self.failures.append(None)  # filled in by explain()
        if not blocking or result.shape is None or not self.empty.fit_could_fit(result):
            return None
        return Blocker(session.priority, session.requested_slots, result.shape)

    def place(self, session: PendingSession) -> Assignment | Fit:
        if session.designated_agent is not None and session.designated_agent not in self.states:
            why = (
                f"{session.designated_agent}: the designated agent is not ALIVE and"
                f" schedulable in scaling group {self.snapshot.scaling_group}"
            )
            return Fit([why], False, None)
        if not self.states:
            why = f"no ALIVE agent in scaling group {self.snapshot.scaling_group}"
            return Fit([why], False, None)
        shape = self.shapes.of(session)
        if shape.failed is not None:  # it failed earlier in the pass: it fails again
            return self.guard.refresh(shape.failed)
        capacity, request, dead = self.capacity, shape.request, shape.dead
        protections = self.guard.by_agent
        ids = capacity.ids
        packing: list[tuple[Decimal, int, int]] = []  # (hole loss, rank, agent index)
        for index in self.candidates(session, shape):
            if index in dead:
                continue
            if not capacity.fits(index, request):
                dead.add(index)
                continue
            if protections and held_for(capacity, index, request, protections) is not None:
                dead.add(index)
                continue
            agent_id = ids[index]
            if shape.packs:  # the first fitting agent and a few more: the least hole loss
                trial = self.trials[agent_id]
                if trial.refusal(request, allow_fragmentation=False) is not None:
                    dead.add(index)
                    continue
                loss = trial.hole_loss(request, shape.packs)
                packing.append((loss, len(packing), index))
                if len(packing) < PACK_CANDIDATES:
                    continue
                break
            placed = self.trials[agent_id].place(
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
            placed = self.trials[agent_id].place(session.requested_slots, allow_fragmentation=False)
            assert not isinstance(placed, FitFailure)  # its dry run just succeeded
            self.commit(session, shape, index)
            return Assignment(session.id, agent_id, session.requested_slots, placed)
        refused = len(ids) if session.designated_agent is None else 1
        fit = Fit([], None, None, refused, shape=shape, deferral_key=(-1, -1))
        shape.failed = fit
        return self.guard.refresh(fit)

    def candidates(self, session: PendingSession, shape: Shape) -> Iterator[int]:
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

    def commit(self, session: PendingSession, shape: Shape, index: int) -> None:
        """Account a placement: the agent's remaining totals (its ``AgentState`` is
        brought up to date when read, :meth:`current`), the predicates' counters (only
        when a predicate can read them) and the DRF shares (only for drf)."""
        requested = session.requested_slots
        agent_id = self.capacity.ids[index]
        self.touched.add(agent_id)
        self._placed.setdefault(agent_id, []).append(requested)
        self.capacity.commit(index, shape.items)
        if agent_id in self.guard.by_agent:
            self.guard.commits += 1
        if self.counts_occupancy:
            self.ctx.occupy(session)
        if self.drf:
            self.bands.placed(session)
        self.last_roundrobin = agent_id

    def explain(self) -> tuple[Failure, ...]:
        """Once the placements are out: why every other session stays pending, as of the
        end of the placements (:mod:`accelshare.sched.reasons`); the memo then keeps
        what this pass worked out, for the next."""
        explainer = Explainer(
            agents=self.snapshot.agents,
            capacity=self.capacity,
            trials=self.trials,
            current=self.current,
            could_fit=self.empty.fit_could_fit,
            memo=self.memo,
            touched=self.touched,
        )
        explainer.explain(self.unexplained, self.failures)
        memo = self.memo
        if memo is not None:
            memo.entries = explainer.memo_used
            memo.orders = self.bands.orders
            self.shapes.keep()
        failures = tuple(f for f in self.failures if f is not None)
        assert len(failures) == len(self.failures)
        return failures
