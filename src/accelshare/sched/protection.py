"""No starvation (pure, no I/O): a session of a finished band that waits for resources
(a :class:`Blocker`) protects what it needs on each agent it could use when empty from
every lower band (a :class:`Protection` per agent).  The rule, with an example, is in
:mod:`accelshare.sched.onepass`; :func:`held_for` applies it to one agent and
:class:`Protections` keeps the protections of one pass, band after band."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal

from accelshare.common import ResourceSlot

from .capacity import Capacity
from .memo import ShapeKey
from .shapes import Fit, Shape, is_accelerator

__all__ = ["Blocker", "Protection", "Protections", "held_for"]

_ZERO = Decimal(0)


@dataclass(frozen=True, slots=True)
class Blocker:
    """A session that waits for resources and holds lower priorities back: what it asks
    for, and its shape (where it could fit when empty)."""

    priority: int
    requested: ResourceSlot
    shape: Shape


@dataclass(slots=True)
class Protection:
    """Per agent, what the waiting higher-priority sessions that could use it need:
    the largest amount of each slot, and the accelerator slots (never shared)."""

    priority: int
    needs: dict[str, Decimal] = field(default_factory=dict)
    accelerators: set[str] = field(default_factory=set)


def held_for(
    capacity: Capacity,
    index: int,
    request: Sequence[tuple[str, Decimal]],
    protections: Mapping[str, Protection],
) -> tuple[int, str] | None:
    """``(priority, slot)`` when placing ``request`` (positive amounts) on the agent
    would take what a waiting higher-priority session needs there; the agent's
    remaining totals cover the request."""
    protection = protections.get(capacity.ids[index])
    if protection is None:
        return None
    free = capacity.free[index]
    for slot, amount in request:
        if slot in protection.accelerators:
            return protection.priority, slot
        need = protection.needs.get(slot)
        if need is None:
            continue
        if free.get(slot, _ZERO) - amount < need:
            return protection.priority, slot
    return None


class Protections:
    """The protections of one pass: they only grow, band after band."""

    __slots__ = ("blockers", "by_agent", "capacity", "commits")

    def __init__(self, capacity: Capacity) -> None:
        self.capacity = capacity
        self.blockers: list[Blocker] = []
        # per agent; replaced (never changed in place) when a band adds blockers, so a
        # failure can be explained with the protections its band saw
        self.by_agent: dict[str, Protection] = {}
        self.commits = 0  # placements on protected agents (deferred_by may change)

    def refresh(self, fit: Fit) -> Fit:
        """``fit`` with ``deferred_by`` as of now: only protected agents can defer a
        session, so it changes only with the blockers or a placement on one of them."""
        if not self.by_agent:
            if fit.deferred_by is None:
                return fit
            return replace(fit, deferred_by=None, deferral_key=(0, 0))
        key = (len(self.blockers), self.commits)
        if fit.deferral_key == key:
            return fit
        shape = fit.shape
        assert shape is not None
        deferred_by: int | None = None
        pool = None if shape.pool is None else set(shape.pool)
        capacity = self.capacity
        for agent_id in self.by_agent:
            index = capacity.index.get(agent_id)
            if index is None or (pool is not None and index not in pool):
                continue
            if not capacity.fits(index, shape.request):
                continue
            held = held_for(capacity, index, shape.request, self.by_agent)
            if held is not None:
                deferred_by = max(deferred_by or held[0], held[0])
        fitted = replace(fit, deferred_by=deferred_by, deferral_key=key)
        shape.failed = fitted
        return fitted

    def add(
        self, blockers: Sequence[Blocker], usable_agents: Callable[[Shape], frozenset[str]]
    ) -> None:
        """Sessions of a finished band that wait for resources protect what they need
        on every agent they could use (``usable_agents``), from every lower band."""
        if not blockers:
            return
        protections = {
            agent_id: Protection(p.priority, dict(p.needs), set(p.accelerators))
            for agent_id, p in self.by_agent.items()
        }
        seen: set[tuple[ResourceSlot, ShapeKey]] = set()
        for blocker in blockers:
            key = (blocker.requested, blocker.shape.key)
            if key in seen:
                continue
            seen.add(key)
            self.blockers.append(blocker)
            for agent_id in usable_agents(blocker.shape):
                protection = protections.get(agent_id)
                if protection is None:
                    protection = protections[agent_id] = Protection(blocker.priority)
                protection.priority = max(protection.priority, blocker.priority)
                for slot, amount in blocker.requested.items():
                    if amount <= 0:
                        continue
                    if is_accelerator(slot):
                        protection.accelerators.add(slot)
                    else:
                        protection.needs[slot] = max(protection.needs.get(slot, amount), amount)
        self.by_agent = protections
