"""Remaining totals of every agent during one pass, and the selectors' orders kept sorted.

:mod:`accelshare.sched.selectors` ranks a list of agents from scratch (a key per agent
per call).  A pass places thousands of sessions on the same agents, so it keeps here,
per agent, the remaining amount of every slot it has (a plain ``dict`` of exact
``Decimal``\\ s, updated in place by :meth:`Capacity.commit`) and, per *rank signature*
(the slots a request asks for in priority order, and the accelerators it uses), the
selector's order of all agents as a sorted list of the same keys
:func:`~accelshare.sched.selectors.iter_ranked` compares.  A commit moves one agent's
key (two bisections); a query walks the order from the best end and stops at the first
agent that fits, so choosing an agent costs O(log n) when the best candidate fits.

The first slot of the order bounds the walk: with ``dispersed`` (most remaining
first) the agents whose remaining first slot covers the request are a prefix of each
"unused accelerators" group, with ``concentrated`` a suffix (found by bisection).

Example: dispersed, request {cuda.shares: 0.5, cpu: 1}; agents A (1.5 shares, 8 cores
left), B (2.0, 2), C (0.2, 30), all GPU agents (0 unused accelerators).  The order is
B, A, C; C is past the prefix (0.2 < 0.5) and never looked at; B is tried first.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence
from decimal import Decimal

from .model import AgentState
from .selectors import SelectorName, accelerator_devices, ordered_slots

__all__ = ["Capacity", "RankSignature"]

_NO_SLOT = Decimal("-Infinity")  # ranks an agent without the slot behind every fitting one

RankSignature = tuple[tuple[str, ...], frozenset[str]]
"""The positive slots of a request in the selectors' order, and the accelerator devices
it uses: requests with the same signature rank agents alike."""

_Key = tuple[object, ...]


class _Order:
    """One selector order of every agent (dispersed or concentrated), kept sorted."""

    __slots__ = ("current", "descending", "groups", "keys", "slots", "uses")

    def __init__(self, capacity: Capacity, signature: RankSignature, descending: bool) -> None:
        self.slots, self.uses = signature
        self.descending = descending
        self.current = [self.key(capacity, i) for i in range(len(capacity.ids))]
        self.keys = sorted(self.current)
        self.groups = sorted({k[0] for k in self.current})  # type: ignore[type-var]

    def key(self, capacity: Capacity, index: int) -> _Key:
        free = capacity.free[index]
        has = capacity.accelerators[index]
        unused = len(has - self.uses) if has else 0
        if self.descending:
            values = [-free.get(s, _NO_SLOT) for s in self.slots]
        else:
            values = [free.get(s, _NO_SLOT) for s in self.slots]
        return (unused, *values, capacity.ids[index], index)

    def move(self, capacity: Capacity, index: int) -> None:
        old = self.current[index]
        keys = self.keys
        del keys[bisect.bisect_left(keys, old)]
        new = self.current[index] = self.key(capacity, index)
        bisect.insort(keys, new)

    def walk(self, first: Decimal | None) -> Iterator[int]:
        """Agent indexes best first, skipping those whose first slot cannot cover ``first``."""
        keys = self.keys
        for group in self.groups:
            if first is None or self.descending:
                start = bisect.bisect_left(keys, (group,))
            else:
                start = bisect.bisect_left(keys, (group, first))
            limit = -first if (first is not None and self.descending) else None
            for pos in range(start, len(keys)):
                key = keys[pos]
                if key[0] != group:
                    break
                if limit is not None and key[1] > limit:  # type: ignore[operator]
                    break
                yield key[-1]  # type: ignore[misc]


class _FirstFit:
    """A fixed order of agents (legacy, roundrobin) with, per slot, a max tree of what
    remains: the first agent at or after a position whose remaining totals cover a
    request is found in O(log n) per slot when few agents have room (a subtree whose
    largest remaining amount of some slot is too small is skipped whole).

    Example: 8 agents, only the 6th has 1 share left; a request for 0.5 share walks
    the root, the right half, its left quarter, then the 6th leaf: 4 nodes, not 8.
    """

    __slots__ = ("capacity", "order", "size", "trees")

    def __init__(self, capacity: Capacity, order: list[int]) -> None:
        self.capacity = capacity
        self.order = order
        size = 1
        while size < max(1, len(order)):
            size *= 2
        self.size = size
        self.trees: dict[str, list[Decimal]] = {}

    def tree(self, slot: str) -> list[Decimal]:
        tree = self.trees.get(slot)
        if tree is None:
            size, free = self.size, self.capacity.free
            tree = [_NO_SLOT] * (2 * size)
            for position, index in enumerate(self.order):
                tree[size + position] = free[index].get(slot, _NO_SLOT)
            for node in range(size - 1, 0, -1):
                tree[node] = max(tree[2 * node], tree[2 * node + 1])
            self.trees[slot] = tree
        return tree

    def update(self, index: int, position: int) -> None:
        free = self.capacity.free[index]
        for slot, tree in self.trees.items():
            node = self.size + position
            tree[node] = free.get(slot, _NO_SLOT)
            node //= 2
            while node:
                tree[node] = max(tree[2 * node], tree[2 * node + 1])
                node //= 2

    def first(self, request: Sequence[tuple[str, Decimal]], start: int, stop: int) -> int | None:
        """The first position in ``[start, stop)`` whose agent's totals cover ``request``."""
        trees = [(self.tree(slot), amount) for slot, amount in request]
        size = self.size
        stack = [(1, 0, size)]
        while stack:
            node, low, high = stack.pop()
            if high <= start or low >= stop:
                continue
            if any(tree[node] < amount for tree, amount in trees):
                continue
            if node >= size:
                return low
            middle = (low + high) // 2
            stack.append((2 * node + 1, middle, high))
            stack.append((2 * node, low, middle))
        return None

    def walk(self, request: Sequence[tuple[str, Decimal]], start: int, stop: int) -> Iterator[int]:
        position = self.first(request, start, stop)
        while position is not None:
            yield self.order[position]
            position = self.first(request, position + 1, stop)


class Capacity:
    """Per-agent remaining totals of one pass (mutable; never escapes the pass).

    ``free[i]`` maps every slot agent ``i`` has (available and above 0) to what remains
    of it; a slot the agent lacks is absent, so it never fits a request for it.
    """

    def __init__(
        self,
        agents: Sequence[AgentState],
        selector: SelectorName,
        resource_priority: Sequence[str],
    ) -> None:
        self.ids = [a.id for a in agents]
        self.index = {a.id: i for i, a in enumerate(agents)}
        self.free: list[dict[str, Decimal]] = []
        self.accelerators: list[frozenset[str]] = []
        for a in agents:
            occupied = a.occupied_slots
            self.free.append(
                {
                    slot: total - occupied.get_amount(slot)
                    for slot, total in a.available_slots.items()
                    if total > 0
                }
            )
            positive = tuple(s for s, v in a.available_slots.items() if v > 0)
            self.accelerators.append(accelerator_devices(positive))
        self.selector = selector
        self.resource_priority = tuple(resource_priority)
        self._orders: dict[RankSignature, _Order] = {}
        self._static: dict[RankSignature, tuple[_FirstFit, dict[int, int]]] = {}
        self._by_id: tuple[_FirstFit, dict[int, int]] | None = None
        self._sorted_ids: list[str] = []
        self._available = [a.available_slots for a in agents]

    def signature(self, positive: Sequence[str]) -> RankSignature:
        return (
            tuple(ordered_slots(positive, self.resource_priority)),
            accelerator_devices(tuple(positive)),
        )

    def fits(self, index: int, request: Sequence[tuple[str, Decimal]]) -> bool:
        """The remaining totals cover ``request`` (its positive amounts)."""
        free = self.free[index]
        for slot, amount in request:
            left = free.get(slot)
            if left is None or left < amount:
                return False
        return True

    def commit(self, index: int, requested: Sequence[tuple[str, Decimal]]) -> None:
        """Take ``requested`` (every amount, as ``occupied + requested`` does) from agent ``index``."""
        free = self.free[index]
        for slot, amount in requested:
            if slot in free:
                free[slot] -= amount
        for order in self._orders.values():
            order.move(self, index)
        for fixed, positions in (*self._static.values(), *((self._by_id,) if self._by_id else ())):
            fixed.update(index, positions[index])

    def walk(
        self,
        signature: RankSignature,
        request: Sequence[tuple[str, Decimal]],
        last_roundrobin: str | None,
    ) -> Iterator[int]:
        """The agents that may hold ``request`` (positive amounts), in the selector's
        order; agents whose remaining totals surely cannot are left out."""
        selector = self.selector
        if selector is SelectorName.ROUNDROBIN:
            yield from self._roundrobin(request, last_roundrobin)
            return
        if selector is SelectorName.LEGACY:
            fixed = self._static.get(signature)
            if fixed is None:
                order = self._legacy(signature)
                fixed = self._static[signature] = (
                    _FirstFit(self, order),
                    {index: position for position, index in enumerate(order)},
                )
            yield from fixed[0].walk(request, 0, len(self.ids))
            return
        first = dict(request)[signature[0][0]] if signature[0] else None
        ranked = self._orders.get(signature)
        if ranked is None:
            descending = selector is not SelectorName.CONCENTRATED
            ranked = self._orders[signature] = _Order(self, signature, descending)
        yield from ranked.walk(first)

    def _legacy(self, signature: RankSignature) -> list[int]:
        slots, uses = signature

        def key(i: int) -> _Key:
            has = self.accelerators[i]
            unused = len(has - uses) if has else 0
            available = self._available[i]
            return (unused, *(-available.get_amount(s) for s in slots), self.ids[i])

        return sorted(range(len(self.ids)), key=key)

    def _roundrobin(
        self, request: Sequence[tuple[str, Decimal]], last: str | None
    ) -> Iterator[int]:
        """By id, starting after the last agent chosen (the first one after the end)."""
        if self._by_id is None:
            order = sorted(range(len(self.ids)), key=self.ids.__getitem__)
            self._sorted_ids = [self.ids[i] for i in order]
            self._by_id = (
                _FirstFit(self, order),
                {index: position for position, index in enumerate(order)},
            )
        fixed = self._by_id[0]
        count = len(self.ids)
        start = 0
        if last is not None:
            start = bisect.bisect_right(self._sorted_ids, last)
            if start >= count:
                start = 0
        yield from fixed.walk(request, start, count)
        yield from fixed.walk(request, 0, start)
