"""Why every session a pass left pending stays so (pure, no I/O): a :class:`Failure`
with the reasons as of the end of the pass, ``<agent>: <why>`` for the first
:data:`~accelshare.sched.outcome.MAX_AGENT_REASONS` agents by id, then how many more
agents refused, and the accelerator shortages of the first shown agents.  Worked out
once per shape, agent and band; a shown agent's reason is taken from the previous
pass's :class:`~accelshare.sched.memo.PlanMemo` where that is exact."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from decimal import Decimal

from .capacity import Capacity
from .fit import TrialMaps, totals_shortfall
from .images import image_refusal
from .memo import PlanMemo, ShapeKey
from .model import AgentState, PendingSession, PredicateResult
from .outcome import (
    MAX_AGENT_REASONS,
    MAX_SHORTAGE_AGENTS,
    NEVER_FITS,
    DeviceShortage,
    Failure,
    FailureKind,
)
from .protection import Protection, held_for
from .shapes import Fit, Shape
from .snapshot import AgentSnapshot

__all__ = ["Explainer", "Unexplained"]

_ZERO = Decimal(0)
_MAX_REASONS_IN_MSG = 3

Unexplained = tuple[int, PendingSession, tuple[PredicateResult, ...], Fit, dict[str, Protection]]
"""A session left pending by its fit: its index in the pass's failures, the session,
the predicates it passed, its failed fit and the protections its band saw."""


class Explainer:
    """Explains the failed fits of one pass, after its placements."""

    __slots__ = (
        "_agents",
        "agent_ids",
        "agents",
        "capacity",
        "could_fit",
        "current",
        "memo",
        "memo_used",
        "touched",
        "trials",
    )

    def __init__(
        self,
        *,
        agents: Sequence[AgentSnapshot],
        capacity: Capacity,
        trials: dict[str, TrialMaps],
        current: Callable[[str], AgentState],
        could_fit: Callable[[Fit], bool],
        memo: PlanMemo | None,
        touched: set[str],
    ) -> None:
        self.agents = agents
        self.agent_ids = trials.keys()  # every agent of the pass
        self.capacity = capacity
        self.trials = trials
        self.current = current  # the agent with what the pass placed on it
        self.could_fit = could_fit
        self.memo = memo
        self.touched = touched  # agents the pass placed on
        self._agents: dict[str, AgentSnapshot] = {}
        # the reasons this pass used or worked out: the next pass's memo entries
        self.memo_used: dict[tuple[ShapeKey, str], tuple[AgentSnapshot, str]] = {}

    def failure_for(
        self,
        session: PendingSession,
        passed: tuple[PredicateResult, ...],
        result: Fit,
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
                NEVER_FITS if not self.could_fit(result) else "No agent can hold the request now: "
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
            blocks_lower_priorities=self.could_fit(result),
            shortages=shortages if kind is FailureKind.NO_AGENT else (),
        )

    def explain(self, unexplained: Sequence[Unexplained], failures: list[Failure | None]) -> None:
        """Fill in ``failures`` of the sessions left pending, with their reasons as of the
        end of the pass: ``<agent>: <why>`` for the first :data:`MAX_AGENT_REASONS` agents
        by id, then how many more agents refused.  Worked out once per shape, agent and
        band (the protections a band saw), for the shown agents only; sessions of one
        shape and priority share the message."""
        explained: dict[tuple[ShapeKey, int, int], str] = {}
        twins: dict[str, int] = {}  # agent -> the same int for agents that explain alike
        interned: dict[object, int] = {}
        lists: dict[tuple[ShapeKey, int], tuple[list[str], tuple[DeviceShortage, ...]]] = {}
        made: dict[tuple[int, int, int], Failure] = {}  # (fit, band, priority) -> a failure
        first_ids = sorted(self.agent_ids)[:MAX_AGENT_REASONS]
        for index, session, passed, fit, protections in unexplained:
            shape = fit.shape
            if shape is None or fit.reasons:
                failures[index] = self.failure_for(session, passed, fit)
                continue
            like = made.get((id(fit), id(protections), session.priority))
            if like is not None:
                failures[index] = Failure(
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
            failures[index] = failure

    def shortages(
        self, session: PendingSession, agent_id: str, reason: str
    ) -> list[DeviceShortage]:
        """The accelerator slots (a plugin's, ``vendor.kind``) that ``reason`` says the
        agent could not give, with the agent's devices of each as the pass ends."""
        found: list[DeviceShortage] = []
        trial = self.trials[agent_id]
        for slot, amount in session.requested_slots.items():
            if "." not in slot or amount <= 0 or not reason.startswith(f"{slot} needs"):
                continue
            devices = trial.devices_of(slot)
            if devices:
                found.append(DeviceShortage(agent_id, slot, amount, devices))
        return found

    def remembered_reason(
        self,
        session: PendingSession,
        shape: Shape,
        agent_id: str,
        protections: dict[str, Protection],
    ) -> str:
        """:meth:`reason`, from the previous pass's :class:`~accelshare.sched.memo.PlanMemo` where that is
        exact (see its docstring); what is worked out goes into this pass's memo."""
        memo = self.memo
        if memo is None or agent_id in protections or agent_id in self.touched:
            return self.reason(session, shape, agent_id, protections)
        if not self._agents:
            self._agents = {a.state.id: a for a in self.agents}
        agent = self._agents[agent_id]
        key = (shape.key, agent_id)
        entry = memo.entries.get(key)
        if entry is not None and entry[0] is agent:
            memo.hits += 1
            reason = entry[1]
        else:
            reason = self.reason(session, shape, agent_id, protections)
        self.memo_used[key] = (agent, reason)
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
            self.trials[agent_id].fingerprint,
        )
        return interned.setdefault(state, len(interned))

    def reason(
        self,
        session: PendingSession,
        shape: Shape,
        agent_id: str,
        protections: dict[str, Protection],
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
        held = held_for(self.capacity, index, shape.request, protections)
        if held is not None:
            priority, slot = held
            return f"held for a waiting priority-{priority} session ({slot} it needs here)"
        refusal = self.trials[agent_id].refusal(
            shape.request, allow_fragmentation=session.allow_fragmentation
        )
        # An agent that refused the shape refuses it at the end of the pass (monotone).
        return refusal or "no room when it was tried"

    def shortfall_reason(self, agent: AgentState, session: PendingSession, shape: Shape) -> str:
        """The totals' reason, or the devices' one when it says more (per-device free)."""
        trial = self.trials[agent.id]
        free = self.capacity.free[self.capacity.index[agent.id]]
        short_slots = {slot for slot, amount in shape.request if free.get(slot, _ZERO) < amount}
        if short_slots and short_slots <= trial.slots:
            refusal = trial.refusal(shape.request, allow_fragmentation=session.allow_fragmentation)
            if refusal is not None:
                return refusal
        short = totals_shortfall(
            agent.available_slots, agent.occupied_slots, session.requested_slots
        )
        return "; ".join(short)
