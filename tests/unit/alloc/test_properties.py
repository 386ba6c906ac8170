"""Property-based tests of the invariants at the end of spec 02, for both map kinds and
both strategies:

* the allocated amounts never exceed any device's capacity and never go negative;
* ``free(allocate(x))`` restores the allocated amounts exactly; a failed allocate changes nothing;
* a returned allocation sums exactly to the request (per slot);
* every fractional amount returned is a multiple of the quantum;
* re-applying the recorded allocations (``apply_allocation``) reproduces the allocated amounts.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from accelshare.alloc import (
    AffinityHint,
    AffinityPolicy,
    AllocationStrategy,
    DeviceSlotInfo,
    DiscreteAllocMap,
    FractionAllocMap,
    ResourceError,
)
from accelshare.alloc.base import AbstractAllocMap
from accelshare.common import SlotTypes

SLOTS = ("x.shares", "y.shares")


@dataclass(frozen=True)
class Scenario:
    fractional: bool
    strategy: AllocationStrategy
    unit: Decimal
    capacities: dict[str, tuple[str, Decimal]]  # device -> (slot, capacity)
    numa: dict[str, int]
    ops: list[tuple[str, dict[str, int], int]]  # ("alloc", units per slot, _) / ("free", _, index)
    allow_fragmentation: bool
    min_units: int
    hint: AffinityHint | None

    def build(self) -> AbstractAllocMap:
        device_slots = {
            d: DeviceSlotInfo(SlotTypes.COUNT, slot, cap)
            for d, (slot, cap) in self.capacities.items()
        }
        if self.fractional:
            return FractionAllocMap(
                device_slots,
                allocation_strategy=self.strategy,
                quantum_size=self.unit,
                numa_nodes=self.numa,
            )
        return DiscreteAllocMap(
            device_slots, allocation_strategy=self.strategy, numa_nodes=self.numa
        )


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    fractional = draw(st.booleans())
    unit = Decimal(draw(st.sampled_from(["0.1", "0.25", "0.01"]))) if fractional else Decimal(1)
    capacities: dict[str, tuple[str, Decimal]] = {}
    for slot in SLOTS[: draw(st.integers(1, 2))]:
        for i in range(draw(st.integers(1, 6))):
            units = draw(st.integers(1, 12))
            # Now and then a capacity off the grid: its spare is floored onto the grid.
            off = unit / 2 if fractional and draw(st.integers(0, 5)) == 0 else Decimal(0)
            capacities[f"{slot[0]}{i}"] = (slot, units * unit + off)
    numa = {d: draw(st.integers(0, 1)) for d in capacities}
    total = max(1, int(sum(cap for _, cap in capacities.values()) / unit))
    slots_here = sorted({slot for slot, _ in capacities.values()})
    request = st.dictionaries(
        st.sampled_from(slots_here), st.integers(0, total // 2 + 2), min_size=1
    )
    op = st.tuples(st.sampled_from(["alloc", "alloc", "free"]), request, st.integers(0, 100))
    hint = draw(
        st.one_of(
            st.none(),
            st.builds(
                AffinityHint,
                st.tuples(st.integers(0, 1)) | st.just(()),
                st.sampled_from(list(AffinityPolicy)),
            ),
        )
    )
    return Scenario(
        fractional=fractional,
        strategy=draw(st.sampled_from(list(AllocationStrategy))),
        unit=unit,
        capacities=capacities,
        numa=numa,
        ops=draw(st.lists(op, min_size=1, max_size=25)),
        allow_fragmentation=draw(st.booleans()),
        min_units=draw(st.integers(1, 3)),
        hint=hint,
    )


def _check_allocated(m: AbstractAllocMap, s: Scenario) -> None:
    for slot, per_device in m.allocations.items():
        for device, allocated in per_device.items():
            assert s.capacities[device][0] == slot
            assert 0 <= allocated <= s.capacities[device][1]


def _check_result(
    result: dict[str, dict[str, Decimal]], wanted: dict[str, Decimal], s: Scenario
) -> None:
    assert result.keys() == wanted.keys()
    for slot, per_device in result.items():
        assert sum(per_device.values()) == wanted[slot]  # exact, per slot
        for device, amount in per_device.items():
            assert s.capacities[device][0] == slot
            assert amount > 0
            assert amount % s.unit == 0  # on the quantum grid (whole units if discrete)


@settings(max_examples=200, deadline=None)
@given(s=scenarios())
def test_invariants_hold_over_any_sequence(s: Scenario) -> None:
    m = s.build()
    options: dict[str, Any] = {
        "allow_resource_fragmentation": s.allow_fragmentation,
        "min_memory": s.min_units * s.unit,
        "affinity_hint": s.hint,
    }
    live: list[dict[str, dict[str, Decimal]]] = []
    for action, units, index in s.ops:
        before = m.allocations
        if action == "free" and live:
            released = live.pop(index % len(live))
            m.free(released)
            for slot, per_device in released.items():
                for device, amount in per_device.items():
                    before[slot][device] -= amount
            assert m.allocations == before
            continue
        wanted = {slot: n * s.unit for slot, n in units.items()}
        planned = m.check(wanted, **options)
        try:
            result = m.allocate(wanted, **options)
        except ResourceError:
            assert not planned.fits
            assert m.allocations == before  # a failed allocate changes nothing
            continue
        assert planned.allocation == result  # the dry run predicts the allocation
        _check_result(result, {k: v for k, v in wanted.items() if v}, s)
        after = m.allocations
        m.free(result)
        assert m.allocations == before  # free(allocate(x)) restores exactly
        m.apply_allocation(result)
        assert m.allocations == after
        live.append(result)
        _check_allocated(m, s)
    replay = s.build()
    for recorded in live:
        replay.apply_allocation(recorded)
    assert replay.allocations == m.allocations  # apply_allocation reproduces the allocated amounts
    replay.clear()
    assert all(v == 0 for per in replay.allocations.values() for v in per.values())


@settings(max_examples=100, deadline=None)
@given(s=scenarios())
def test_snapshot_restore_round_trips(s: Scenario) -> None:
    m = s.build()
    snapshot = m.snapshot()
    for _, units, _ in s.ops:
        with contextlib.suppress(ResourceError):
            m.allocate({slot: n * s.unit for slot, n in units.items()})
    m.restore(snapshot)
    assert all(v == 0 for per in m.allocations.values() for v in per.values())


def _replay(
    m: AbstractAllocMap, s: Scenario, ops: list[tuple[str, dict[str, int], int]]
) -> list[Any]:
    """What each op does to ``m``: the allocation, or the error's type and text."""
    options: dict[str, Any] = {
        "allow_resource_fragmentation": s.allow_fragmentation,
        "min_memory": s.min_units * s.unit,
        "affinity_hint": s.hint,
    }
    seen: list[Any] = []
    for _, units, _ in ops:
        try:
            seen.append(m.allocate({slot: n * s.unit for slot, n in units.items()}, **options))
        except ResourceError as e:
            seen.append((type(e).__name__, str(e)))
    return seen


@settings(max_examples=100, deadline=None)
@given(s=scenarios(), split=st.integers(0, 20))
def test_a_copy_behaves_as_the_map_and_keeps_its_own_allocations(s: Scenario, split: int) -> None:
    """``copy()`` shares the devices, not the allocated amounts: the copy goes on exactly like the
    original would, and neither sees the other's allocations."""
    m = s.build()
    twin = s.build()
    _replay(m, s, s.ops[:split])
    _replay(twin, s, s.ops[:split])
    frozen = m.allocations
    copied = m.copy()
    assert type(copied) is type(m)
    assert copied.allocations == frozen
    rest = _replay(twin, s, s.ops[split:])
    assert _replay(copied, s, s.ops[split:]) == rest
    assert copied.allocations == twin.allocations
    assert m.allocations == frozen  # the original's allocated amounts are untouched
    assert _replay(m, s, s.ops[split:]) == rest  # and it goes on as if never copied
