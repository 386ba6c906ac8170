"""Packing with the anti-fragmentation guard on (fractional EVENLY).

With fragmentation refused, a fractional EVENLY map places a request in the guard's
shape and keeps the free share in holes as large as possible
(:func:`~accelshare.alloc.strategies.pack_unfragmented`).  The properties:

* the verdict (placed, or which error) is the one the map gave before packing existed,
  on any allocated amounts, with the guard on and off;
* with the guard off, the placement itself is unchanged;
* with the guard on, the placement is the guard's shape and sums exactly;
* with the guard off, nothing is ever refused while the total free share covers it;
* :func:`pack_unfragmented` admits exactly what the guard admits and finds the best
  hole score of all the guard's shapes (checked by brute force).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accelshare.alloc import (
    AffinityHint,
    AffinityPolicy,
    FractionAllocMap,
    FractionalResourceFragmented,
    ResourceError,
)
from accelshare.alloc.strategies import (
    fits_unfragmented,
    is_unfragmented_split,
    pack_unfragmented,
)

from .builders import FILL, D, devices, fmap

S = "cuda.shares"


class _Unpacked(FractionAllocMap):
    """The map as it placed before packing: the old choice, for comparison."""

    def _packed(self, slot: str, ordered: list[str], need: int, min_units: int) -> None:
        return None


def _old(m: FractionAllocMap) -> FractionAllocMap:
    old = m.copy()
    old.__class__ = _Unpacked
    return old


def _verdict(m: FractionAllocMap, request: Decimal, **options: Any) -> Any:
    try:
        return m.plan({S: request}, **options)
    except ResourceError as e:
        return type(e)


def _with_spares(spares: Sequence[str], capacity: str = "1", **kw: Any) -> FractionAllocMap:
    m = fmap([capacity] * len(spares), quantum="0.1", **kw)
    m.apply_allocation({S: {f"a{i}": D(capacity) - D(s) for i, s in enumerate(spares)}})
    return m


# -- worked examples ---------------------------------------------------------------------------
def test_issue_example_keeps_the_two_largest_devices_whole() -> None:
    """Capacities 1, 1.5, 2, 3, 3, 4, 4.5, 5, 5, request 11, min_memory 0.84."""
    caps = ["1", "1.5", "2", "3", "3", "4", "4.5", "5", "5"]
    m = fmap(caps)
    packed = m.allocate({S: D(11)}, min_memory=D("0.84"), allow_resource_fragmentation=False)
    # 2.75 on the devices of 3, 3, 4 and 4.5; the two of 5 stay whole.
    assert packed == {S: {"a3": D("2.75"), "a4": D("2.75"), "a5": D("2.75"), "a6": D("2.75")}}
    # With fragmentation allowed EVENLY is unchanged: its window scoring avoids the
    # 0.25 leftovers (below min_memory) and takes the most-free window.
    m = fmap(caps)
    evenly = m.allocate({S: D(11)}, min_memory=D("0.84"))
    assert evenly == {S: {"a5": D("2.75"), "a6": D("2.75"), "a7": D("2.75"), "a8": D("2.75")}}


@pytest.mark.parametrize(
    ("spares", "request_", "expected"),
    [
        # Up to one device: best fit, as before.
        (["1", "0.5", "0.3"], "0.4", {"a1": "0.4"}),
        # 1.5 over two free GPUs, one with 0.8 and one with 0.7 free: those two are
        # filled, both whole GPUs stay whole (EVENLY alone: 0.5 on three devices).
        (["1", "1", "0.8", "0.7"], "1.5", {"a2": "0.8", "a3": "0.7"}),
        # 1.3: 0.7 + 0.6 needs two devices with 0.6 free.  0.5 + 0.4 + 0.4 would leave
        # 0.5 + 0.4 free (hole score 25 + 16 = 41, in tenths); 0.3 x 3 + 0.4 leaves 0.7
        # + 0.1 + 0.1 (49 + 1 + 1 = 51): the four-device split keeps the larger hole.
        (["1", "0.4", "0.4", "0.4"], "1.3", {"a0": "0.3", "a1": "0.3", "a2": "0.3", "a3": "0.4"}),
    ],
)
def test_packed_placements(spares: list[str], request_: str, expected: dict[str, str]) -> None:
    m = _with_spares(spares)
    got = m.allocate({S: D(request_)}, allow_resource_fragmentation=False)
    assert got == {S: {d: D(v) for d, v in expected.items()}}


def test_a_tier_without_the_shape_widens_to_every_device() -> None:
    """Old EVENLY split 0.8 as 0.4 + 0.4 inside the hinted NUMA node although the
    request refused fragmentation; now it goes whole on the other node."""
    m = FractionAllocMap(
        devices(S, ["1", "1", "1"]), quantum_size=D("0.1"), numa_nodes={"a0": 0, "a1": 0, "a2": 1}
    )
    m.apply_allocation({S: {"a0": D("0.6"), "a1": D("0.6")}})
    hint = AffinityHint((0,), AffinityPolicy.PREFER_SINGLE_NODE)
    old = _old(m).plan({S: D("0.8")}, affinity_hint=hint, allow_resource_fragmentation=False)
    assert old == {S: {"a0": D("0.4"), "a1": D("0.4")}}
    got = m.plan({S: D("0.8")}, affinity_hint=hint, allow_resource_fragmentation=False)
    assert got == {S: {"a2": D("0.8")}}


def test_guard_shape_only_below_min_memory_keeps_the_old_split() -> None:
    """The guard admits 1.5 as 0.3 x 5, but min_memory 0.4 leaves only the devices with
    1.0 and 0.6 free, where no even split fits: the old EVENLY split stands."""
    m = _with_spares(["1", "0.6", "0.3", "0.3", "0.3"])
    options: dict[str, Any] = {"min_memory": D("0.4"), "allow_resource_fragmentation": False}
    got = m.plan({S: D("1.5")}, **options)
    assert got == _old(m).plan({S: D("1.5")}, **options)
    assert got == {S: {"a0": D("0.9"), "a1": D("0.6")}}


def test_fill_is_not_packed() -> None:
    m = fmap(["1", "1"], quantum="0.1", strategy=FILL)
    assert m.allocate({S: D("0.4")}, allow_resource_fragmentation=False) == {S: {"a0": D("0.4")}}


def test_refusal_is_unchanged() -> None:
    m = _with_spares(["0.6", "0.6"])
    with pytest.raises(FractionalResourceFragmented):
        m.allocate({S: D("0.8")}, allow_resource_fragmentation=False)


# -- pack_unfragmented ---------------------------------------------------------------------------
def _score(spares: Sequence[int], amounts: Sequence[int]) -> int:
    return sum((s - a) ** 2 for s, a in zip(spares, amounts, strict=True))


def _best_shape_score(spares: Sequence[int], capacity: int, need: int) -> int | None:
    """Brute force: the best hole score over every placement the guard allows."""
    best = None
    choices = sorted({0, need} | {need // n + e for n in range(1, len(spares) + 1) for e in (0, 1)})
    for amounts in itertools.product(choices, repeat=len(spares)):
        if all(a <= s for a, s in zip(amounts, spares, strict=True)) and is_unfragmented_split(
            amounts, capacity, need
        ):
            score = _score(spares, amounts)
            best = score if best is None else max(best, score)
    return best


@settings(max_examples=300, deadline=None)
@given(
    spares=st.lists(st.integers(0, 10), min_size=1, max_size=5).map(
        lambda s: sorted(s, reverse=True)
    ),
    need=st.integers(1, 30),
)
def test_pack_admits_what_the_guard_admits_with_the_best_holes(
    spares: list[int], need: int
) -> None:
    capacity = 10
    packed = pack_unfragmented(spares, capacity, need)
    assert (packed is not None) == fits_unfragmented(spares, capacity, need)
    if packed is None:
        return
    assert sum(packed) == need
    assert all(0 <= a <= s for a, s in zip(packed, spares, strict=True))
    assert is_unfragmented_split(packed, capacity, need)
    assert _score(spares, packed) == _best_shape_score(spares, capacity, need)


def test_pack_single_device_none() -> None:
    assert pack_unfragmented([3, 2], 10, 4) is None


# -- the map: verdicts, sums, shapes over random allocated amounts -----------------------------------------
@settings(max_examples=200, deadline=None)
@given(
    n_devices=st.integers(1, 6),
    quantum=st.sampled_from(["0.1", "0.25"]),
    ops=st.lists(
        st.tuples(st.booleans(), st.integers(1, 24), st.integers(0, 100)), min_size=1, max_size=30
    ),
    min_units=st.integers(1, 3),
    allow=st.booleans(),
)
def test_verdict_unchanged_and_sums_exact(
    n_devices: int,
    quantum: str,
    ops: list[tuple[bool, int, int]],
    min_units: int,
    allow: bool,
) -> None:
    m = fmap(["1"] * n_devices, quantum=quantum)
    unit = D(quantum)
    options: dict[str, Any] = {
        "min_memory": unit * min_units,
        "allow_resource_fragmentation": allow,
    }
    live: list[dict[str, dict[str, Decimal]]] = []
    for allocate, units, index in ops:
        if not allocate and live:
            m.free(live.pop(index % len(live)))
            continue
        request = unit * units
        new, old = _verdict(m, request, **options), _verdict(_old(m), request, **options)
        if isinstance(new, dict):
            assert isinstance(old, dict)
            assert sum(new[S].values(), D(0)) == request  # exact
            assert all(v > 0 and v % unit == 0 for v in new[S].values())
            if allow:
                assert new == old  # the guard off: the placement is unchanged too
            elif min_units == 1:
                per_unit = [int(v / unit) for v in new[S].values()]
                assert is_unfragmented_split(per_unit, int(1 / unit), units)
            live.append(m.allocate({S: request}, **options))
        else:
            assert new == old


@settings(max_examples=100, deadline=None)
@given(ops=st.lists(st.tuples(st.booleans(), st.integers(1, 20), st.integers(0, 100)), max_size=40))
def test_guard_off_never_refuses_what_the_free_total_covers(
    ops: list[tuple[bool, int, int]],
) -> None:
    m = fmap(["1"] * 8, quantum="0.1")
    live: list[dict[str, dict[str, Decimal]]] = []
    for allocate, units, index in ops:
        if not allocate and live:
            m.free(live.pop(index % len(live)))
            continue
        request = D("0.1") * units
        free = sum(m.free_per_device(S).values(), D(0))
        try:
            live.append(m.allocate({S: request}))
        except ResourceError:
            assert free < request  # refused only for want of share, never for its shape
        else:
            assert free >= request
