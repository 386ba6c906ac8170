"""Could an agent hold a shape if it were empty (pure, no I/O)?  A session waits for
resources, and protects what it needs from lower bands
(:mod:`accelshare.sched.protection`), only on the agents that could (its *usable*
agents); one that no agent could ever hold waits for an agent that can to join.
Agents built alike (same totals, same devices: one *capacity signature*) are dry-run
once per shape."""

from __future__ import annotations

from collections.abc import Sequence

from .capacity import Capacity
from .fit import TrialMaps
from .model import AgentState
from .shapes import Fit, Shape
from .snapshot import AgentSnapshot

__all__ = ["EmptyFit", "capacity_signature", "signature_ids"]


def capacity_signature(agent: AgentSnapshot) -> object:
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


def signature_ids(agents: Sequence[AgentSnapshot]) -> dict[str, int]:
    """Agent id -> an int, the same for agents of one :func:`capacity_signature`."""
    interned: dict[object, int] = {}
    return {a.state.id: interned.setdefault(capacity_signature(a), len(interned)) for a in agents}


class EmptyFit:
    """The when-empty verdicts of one pass, kept on each shape (they do not change while
    the pass places sessions)."""

    __slots__ = ("_signatures", "agents", "capacity", "states", "trials")

    def __init__(
        self,
        agents: Sequence[AgentSnapshot],
        states: dict[str, AgentState],
        trials: dict[str, TrialMaps],
        capacity: Capacity,
    ) -> None:
        self.agents = agents
        self.states = states  # read for the totals only (placements do not change them)
        self.trials = trials
        self.capacity = capacity
        self._signatures: dict[str, int] | None = None  # agents built alike: same int

    def fit_could_fit(self, fit: Fit) -> bool:
        """Whether the failed fit's session could fit some agent of its pool when empty."""
        if fit.could_fit is not None:
            return fit.could_fit
        assert fit.shape is not None
        return self.could_fit(fit.shape)

    def could_fit(self, shape: Shape) -> bool:
        """Could some agent of the shape's pool hold it if that agent were empty?"""
        if shape.could_fit is None:
            pool = range(len(self.capacity.ids)) if shape.pool is None else shape.pool
            shape.could_fit = any(self.fits(shape, i) for i in pool)
        return shape.could_fit

    def fits(self, shape: Shape, index: int) -> bool:
        """Could the agent hold the shape if it were empty?"""
        agent_id = self.capacity.ids[index]
        available = self.states[agent_id].available_slots
        for slot, amount in shape.request:
            if slot not in available or available[slot] < amount or available[slot] <= 0:
                return False
        return self.trials[agent_id].fits_when_empty(
            dict(shape.request), allow_fragmentation=shape.key[1]
        )

    def usable_agents(self, shape: Shape) -> frozenset[str]:
        """The agents of the shape's pool that could hold it if they were empty (agents
        built alike — same totals, same devices — are dry-run once)."""
        if shape.usable is None:
            if self._signatures is None:
                self._signatures = signature_ids(self.agents)
            verdicts: dict[int, bool] = {}
            ids = self.capacity.ids
            pool = range(len(ids)) if shape.pool is None else shape.pool
            usable = []
            for i in pool:
                signature = self._signatures[ids[i]]
                fits = verdicts.get(signature)
                if fits is None:
                    fits = verdicts[signature] = self.fits(shape, i)
                if fits:
                    usable.append(ids[i])
            shape.usable = frozenset(usable)
        return shape.usable
