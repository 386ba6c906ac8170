"""Agent selectors: which of the agents that can hold a session gets it.

The candidates passed in have already passed the fit check (remaining totals cover
the request *and* the per-device dry run succeeded), so a selector only ranks.

* ``dispersed`` (default) — the agent with the most remaining capacity;
* ``concentrated`` — best fit: the least remaining capacity that still fits;
* ``legacy`` — the largest total capacity;
* ``roundrobin`` — agents sorted by id, the first after the last one chosen.

Capacity is compared slot by slot in the order of ``resource_priority`` (device names,
default ``cuda, rocm, tpu, cpu, mem``), restricted to the slots the session asks for.
Before that, every selector prefers agents with fewer *unused accelerators*: a session
asking 0 of ``cuda`` prefers a CPU-only agent, keeping GPUs free for GPU work.

Example (dispersed): a session asks {cpu: 1, cuda.shares: 0.5}; agent A has 1.5
cuda.shares and 8 cpu left, agent B 2.0 cuda.shares and 2 cpu left → B (cuda first).
"""

from __future__ import annotations

import enum
import functools
import heapq
from collections.abc import Iterator, Sequence
from decimal import Decimal

from accelshare.common import ResourceSlot, SlotName

from .model import AgentState, PendingSession

__all__ = [
    "DEFAULT_RESOURCE_PRIORITY",
    "SelectorName",
    "accelerator_devices",
    "iter_ranked",
    "ordered_slots",
    "rank_agents",
    "select_agent",
    "unused_accelerators",
]

DEFAULT_RESOURCE_PRIORITY: tuple[str, ...] = ("cuda", "rocm", "tpu", "cpu", "mem")


class SelectorName(enum.StrEnum):
    DISPERSED = "dispersed"
    CONCENTRATED = "concentrated"
    LEGACY = "legacy"
    ROUNDROBIN = "roundrobin"


@functools.lru_cache(maxsize=4096)
def accelerator_devices(slots: tuple[str, ...]) -> frozenset[str]:
    """The device names (``cuda``...) of the accelerator slots among ``slots`` (cached:
    the same few slot-name tuples come back for every agent and session of a pass)."""
    names = (SlotName(slot) for slot in slots)
    return frozenset(name.device_name for name in names if name.is_accelerator)


def _positive(slots: ResourceSlot) -> tuple[str, ...]:
    return tuple(slot for slot, amount in slots.items() if amount > 0)


def unused_accelerators(agent: AgentState, requested: ResourceSlot) -> int:
    """How many accelerator device kinds the agent has that the session does not use."""
    has = accelerator_devices(_positive(agent.available_slots))
    if not has:
        return 0
    return len(has - accelerator_devices(_positive(requested)))


def _ordered_slots(requested: ResourceSlot, priority: Sequence[str]) -> list[str]:
    return ordered_slots([s for s, v in requested.items() if v > 0], priority)


def ordered_slots(slots: Sequence[str], priority: Sequence[str]) -> list[str]:
    """``slots`` in the order the selectors compare them: by the rank of their device
    name in ``priority`` (unknown devices last), then by name."""
    return list(_ordered(tuple(slots), tuple(priority)))


@functools.lru_cache(maxsize=4096)
def _ordered(slots: tuple[str, ...], priority: tuple[str, ...]) -> tuple[str, ...]:
    # remembered: a pass asks it for every distinct request shape (hundreds), always of
    # a few slot sets, and each SlotName parse is a regular expression match
    rank = {device: i for i, device in enumerate(priority)}
    return tuple(sorted(slots, key=lambda s: (rank.get(SlotName(s).device_name, len(rank)), s)))


def _capacity_key(slots: ResourceSlot, order: Sequence[str]) -> tuple[Decimal, ...]:
    return tuple(slots.get_amount(s) for s in order)


def select_agent(
    selector: SelectorName | str,
    session: PendingSession,
    candidates: Sequence[AgentState],
    *,
    resource_priority: Sequence[str] = DEFAULT_RESOURCE_PRIORITY,
    last_roundrobin_agent: str | None = None,
) -> AgentState | None:
    """Rank the fitting ``candidates`` and return the chosen one (None if there is none)."""
    ranked = rank_agents(
        selector,
        session,
        candidates,
        resource_priority=resource_priority,
        last_roundrobin_agent=last_roundrobin_agent,
    )
    return ranked[0] if ranked else None


def rank_agents(
    selector: SelectorName | str,
    session: PendingSession,
    candidates: Sequence[AgentState],
    *,
    resource_priority: Sequence[str] = DEFAULT_RESOURCE_PRIORITY,
    last_roundrobin_agent: str | None = None,
) -> list[AgentState]:
    """Every candidate, best first: ``rank_agents(...)[0]`` is what :func:`select_agent` picks.

    The pass walks this order and runs the per-device dry run agent by agent, so an
    agent whose totals fit but whose devices are too fragmented costs one extra dry
    run, not a second ranking (O(n log n) per session instead of O(n^2)).
    """
    return list(
        iter_ranked(
            selector,
            session,
            candidates,
            resource_priority=resource_priority,
            last_roundrobin_agent=last_roundrobin_agent,
        )
    )


def iter_ranked(
    selector: SelectorName | str,
    session: PendingSession,
    candidates: Sequence[AgentState],
    *,
    resource_priority: Sequence[str] = DEFAULT_RESOURCE_PRIORITY,
    last_roundrobin_agent: str | None = None,
) -> Iterator[AgentState]:
    """The order of :func:`rank_agents`, lazily: the keys are computed once (O(n)) and a
    heap yields the best agent first (O(log n) each), so a pass whose first choice fits
    never sorts the whole cluster (the keys end with the agent id: no ties)."""
    if not candidates:
        return
    name = SelectorName(selector)
    requested = session.requested_slots
    if name is SelectorName.ROUNDROBIN:
        ordered = sorted(candidates, key=lambda a: a.id)
        if last_roundrobin_agent is None:
            yield from ordered
            return
        start = next((i for i, a in enumerate(ordered) if a.id > last_roundrobin_agent), 0)
        yield from ordered[start:]
        yield from ordered[:start]
        return
    order = _ordered_slots(requested, resource_priority)
    uses = accelerator_devices(_positive(requested))

    def unused(agent: AgentState) -> int:
        has = accelerator_devices(_positive(agent.available_slots))
        return len(has - uses) if has else 0

    def remaining(agent: AgentState) -> tuple[Decimal, ...]:
        # == _capacity_key(agent.remaining_slots, order), without building the slots
        available, occupied = agent.available_slots, agent.occupied_slots
        return tuple(available.get_amount(s) - occupied.get_amount(s) for s in order)

    heap: list[tuple[int, tuple[Decimal, ...], str, int]]
    if name is SelectorName.CONCENTRATED:
        heap = [(unused(a), remaining(a), a.id, i) for i, a in enumerate(candidates)]
    else:
        legacy = name is SelectorName.LEGACY
        heap = [
            (
                unused(a),
                tuple(
                    -v
                    for v in (_capacity_key(a.available_slots, order) if legacy else remaining(a))
                ),
                a.id,
                i,
            )
            for i, a in enumerate(candidates)
        ]
    heapq.heapify(heap)
    while heap:
        yield candidates[heapq.heappop(heap)[3]]
