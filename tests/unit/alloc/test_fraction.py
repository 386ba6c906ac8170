"""Fractional maps: EVENLY details, min_memory, the anti-fragmentation guard, dry runs."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accelshare.alloc import (
    DiscreteAllocMap,
    FractionAllocMap,
    FractionalResourceFragmented,
    InsufficientResource,
    NotMultipleOfQuantum,
)
from accelshare.alloc.strategies import split_over_windows
from accelshare.common import SlotTypes

from .builders import EVENLY, FILL, D, amounts, devices, dmap, fmap

S = "cuda.shares"


def with_allocated(caps: list[str], used: list[str], **kw: Any) -> FractionAllocMap:
    m = fmap(caps, **kw)
    m.apply_allocation({S: {f"a{i}": D(u) for i, u in enumerate(used)}})
    return m


# -- EVENLY ------------------------------------------------------------------------------------
EVENLY_CASES: dict[str, tuple[list[str], list[str], str, dict[str, str]]] = {
    # Best fit: the least-free device that still holds it.
    "best-fit-smallest-hole": (["1", "1", "1"], ["0.5", "0.2", "0"], "0.4", {"a0": "0.4"}),
    "best-fit-ties-go-to-the-last": (["1", "1", "1"], ["0", "0", "0"], "0.4", {"a2": "0.4"}),
    # A device below (still needed)/(devices left) is filled completely first.
    # spares 1.0, 1.0, 0.1: a2 gives its 0.1, the rest 2.0 splits 1.0 + 1.0.
    "fill-small-device-completely": (
        ["1", "1", "1"],
        ["0", "0", "0.9"],
        "2.1",
        {"a0": "1", "a1": "1", "a2": "0.1"},
    ),
    # Leftover quanta go one each to the most-free devices of the window.
    # spares 0.9, 1.0, 1.0 -> ordered a1, a2, a0; 2.02 = 3 x 0.67 + 0.01 (to a1).
    "leftover-quanta-to-most-free": (
        ["1", "1", "1"],
        ["0.1", "0", "0"],
        "2.02",
        {"a0": "0.67", "a1": "0.68", "a2": "0.67"},
    ),
    # spares 0.5, 1, 1: the window {a1, a2} gives 0.75 + 0.75 (perfectly even).
    "split-prefers-the-most-even-window": (
        ["1", "1", "1"],
        ["0.5", "0", "0"],
        "1.5",
        {"a1": "0.75", "a2": "0.75"},
    ),
}


@pytest.mark.parametrize("case", EVENLY_CASES.values(), ids=EVENLY_CASES.keys())
def test_evenly_cases(case: tuple[list[str], list[str], str, dict[str, str]]) -> None:
    caps, used, request, expected = case
    assert with_allocated(caps, used).allocate({S: D(request)})[S] == amounts(expected)


def test_evenly_ignores_devices_below_min_memory() -> None:
    m = with_allocated(["1", "1"], ["0.98", "0.5"])
    with pytest.raises(InsufficientResource, match=r"less than 0.05 free are not used"):
        m.allocate({S: D("0.52")}, min_memory=D("0.05"))
    assert m.allocate({S: D("0.52")})[S] == amounts({"a0": "0.02", "a1": "0.5"})


def test_fill_ignores_min_memory() -> None:
    m = with_allocated(["1", "1"], ["0.98", "0.5"], strategy=FILL)
    assert m.allocate({S: D("0.52")}, min_memory=D("0.5"))[S] == amounts(
        {"a0": "0.02", "a1": "0.5"}
    )


def test_capacity_off_the_grid_is_floored() -> None:
    m = fmap(["0.25", "0.25"], quantum="0.1")
    assert m.largest_fit(S) == D("0.4")
    assert m.allocate({S: D("0.4")})[S] == amounts({"a0": "0.2", "a1": "0.2"})
    with pytest.raises(InsufficientResource):
        m.allocate({S: D("0.1")})


# -- anti-fragmentation guard -----------------------------------------------------------------------
GUARD_CASES: dict[str, tuple[list[str], list[str], str, bool]] = {
    # R <= C must fit on one device.
    "small-fits-one-device": (["1", "1"], ["0.6", "0.2"], "0.8", True),
    "small-only-in-fragments": (["1", "1"], ["0.6", "0.6"], "0.5", False),
    # R > C: an even split over whole devices, extra devices taking D + q.
    "large-even-split": (["1", "1", "1", "1"], ["0", "0", "0.5", "0.5"], "1.5", True),
    "large-no-even-split": (["1", "1", "1", "1"], ["0", "0", "0.5", "0.5"], "2.6", False),
    "large-needs-more-devices": (["1", "1", "1"], ["0.4", "0.4", "0.4"], "1.8", True),
}


@pytest.mark.parametrize("strategy", [FILL, EVENLY])
@pytest.mark.parametrize("case", GUARD_CASES.values(), ids=GUARD_CASES.keys())
def test_fragmentation_guard(case: tuple[list[str], list[str], str, bool], strategy: Any) -> None:
    caps, used, request, fits = case
    m = with_allocated(caps, used, quantum="0.1", strategy=strategy)
    before = m.allocations
    # With fragmentation allowed (the default) every case fits.
    assert m.check({S: D(request)}).fits
    if fits:
        result = m.allocate({S: D(request)}, allow_resource_fragmentation=False)
        assert sum(result[S].values()) == D(request)
        return
    with pytest.raises(FractionalResourceFragmented) as info:
        m.allocate({S: D(request)}, allow_resource_fragmentation=False, context_tag="s1")
    assert info.value.devices == m.free_per_device(S)
    assert info.value.requested == D(request)
    assert "only in fragments" in str(info.value)
    assert m.allocations == before


def test_insufficient_wins_over_fragmented() -> None:
    m = with_allocated(["1", "1"], ["0.6", "0.6"], quantum="0.1")
    with pytest.raises(InsufficientResource):
        m.allocate({S: D("0.9")}, allow_resource_fragmentation=False)


# -- dry runs: plan, check, largest_fit, from_state -------------------------------------------------
def test_from_state_then_plan_check_and_largest_fit() -> None:
    m = FractionAllocMap.from_state(
        {S: {"GPU1": D(1), "GPU2": D(1)}},
        {S: {"GPU1": D("0.6"), "GPU2": D("0.2")}},
        quantum_size=D("0.1"),
    )
    assert m.plan({S: D("1.2")}) == {S: amounts({"GPU1": "0.4", "GPU2": "0.8"})}
    assert m.allocations[S] == amounts({"GPU1": "0.6", "GPU2": "0.2"})  # untouched
    fit = m.check({S: D("1.5")})
    assert not fit.fits
    assert fit.allocation is None
    assert fit.reason.startswith("InsufficientResource: cannot allocate 1.5")
    assert isinstance(fit.error, InsufficientResource)
    ok = m.check({S: D("0.3")})
    assert (ok.fits, ok.reason, ok.allocation) == (True, "", {S: {"GPU1": D("0.3")}})
    assert not m.check({S: D("0.35")}).fits  # off this agent's grid: does not fit here
    assert m.largest_fit(S) == D("1.2")


def test_from_state_with_slot_types_and_discrete() -> None:
    m = DiscreteAllocMap.from_state(
        {"cpu": {"c0": D(2), "c1": D(2)}, "x.device": {"m0": D(1)}},
        {"cpu": {"c0": D(1)}},
        slot_types={"x.device": "unique"},
        allocation_strategy=FILL,
    )
    assert m.slot_types == {"cpu": SlotTypes.COUNT, "x.device": SlotTypes.UNIQUE}
    assert m.largest_fit("cpu") == D(3)
    assert m.largest_fit("x.device") == D(1)
    m.allocate({"x.device": D(1)})
    assert m.largest_fit("x.device") == D(0)


LARGEST_CASES: dict[str, tuple[list[str], list[str], Any, bool, str]] = {
    "fill-total": (["1", "1"], ["0.6", "0.2"], FILL, True, "1.2"),
    "evenly-total": (["1", "1"], ["0.6", "0.2"], EVENLY, True, "1.2"),
    "guard-above-capacity": (["1", "1"], ["0.4", "0.4"], EVENLY, False, "1.2"),
    "guard-single-device": (["1", "1"], ["0.6", "0.2"], EVENLY, False, "0.8"),
    "guard-extra-quanta": (["1", "1", "1"], ["0.1", "0", "0.5"], EVENLY, False, "1.9"),
    "guard-nothing-free": (["1", "1"], ["1", "1"], FILL, False, "0"),
}


@pytest.mark.parametrize("case", LARGEST_CASES.values(), ids=LARGEST_CASES.keys())
def test_largest_fit(case: tuple[list[str], list[str], Any, bool, str]) -> None:
    caps, used, strategy, allow, expected = case
    m = with_allocated(caps, used, quantum="0.1", strategy=strategy)
    largest = m.largest_fit(S, allow_resource_fragmentation=allow)
    assert largest == D(expected)
    opts = {"allow_resource_fragmentation": allow}
    if largest:
        assert m.check({S: largest}, **opts).fits
    assert not m.check({S: largest + D("0.1")}, **opts).fits


def test_largest_fit_min_memory_and_unknown_slot() -> None:
    m = with_allocated(["1", "1"], ["0.98", "0.5"])
    assert m.largest_fit(S) == D("0.52")
    assert m.largest_fit(S, min_memory=D("0.05")) == D("0.5")
    with pytest.raises(Exception, match="no devices for slot 'nope'"):
        m.largest_fit("nope")


@settings(max_examples=200, deadline=None)
@given(
    spares=st.lists(st.integers(0, 10), min_size=1, max_size=5),
    strategy=st.sampled_from([FILL, EVENLY]),
    min_units=st.integers(1, 3),
)
def test_largest_fit_is_the_largest_request_that_fits(
    spares: list[int], strategy: Any, min_units: int
) -> None:
    m = with_allocated(
        ["1"] * len(spares), [str(D(10 - s) / 10) for s in spares], quantum="0.1", strategy=strategy
    )
    min_memory = D(min_units) / 10
    for allow in (True, False):
        opts = {"allow_resource_fragmentation": allow, "min_memory": min_memory}
        largest = m.largest_fit(S, **opts)
        fitting = [k for k in range(1, sum(spares) + 2) if m.check({S: D(k) / 10}, **opts).fits]
        assert largest == (D(max(fitting)) / 10 if fitting else D(0))


# -- the window search against a literal reading of the spec --------------------------------------
def _reference_split(spares: list[int], need: int, min_units: int) -> list[int]:
    """Spec 02's EVENLY multi-device split, literally, without the early stop."""

    def split(window: list[int]) -> list[int]:
        amounts = [0] * len(window)
        rest, alive = Fraction(need), list(range(len(window)))
        while alive and window[alive[-1]] < rest / len(alive):
            amounts[alive[-1]] = window[alive[-1]]
            rest -= window[alive.pop()]
        base, extra = divmod(int(rest), len(alive))
        for rank, index in enumerate(alive):
            amounts[index] = base + (1 if rank < extra else 0)
        return amounts

    def score(window: list[int], amounts: list[int]) -> tuple[int, int, int]:
        used = sorted(a for a in amounts if a)
        evenness = -sum(abs(used[i + 1] - used[i]) for i in range(len(used) - 1))
        frags = sum(1 for s, a in zip(window, amounts, strict=True) if a and 0 < s - a < min_units)
        return (evenness, -len(used), -frags)

    n = next(k for k in range(1, len(spares) + 1) if sum(spares[:k]) >= need)
    best: tuple[tuple[int, int, int], list[int]] | None = None
    for width in range(n, len(spares) + 1):
        first = None
        for start in range(len(spares) - width + 1):
            window = spares[start : start + width]
            if sum(window) < need:
                break
            amounts = split(window)
            sc = score(window, amounts)
            if first is None:
                first = sc[0]
            elif sc[0] < first:
                break
            if best is None or sc >= best[0]:
                best = (sc, [0] * start + amounts + [0] * (len(spares) - start - width))
    assert best is not None
    return best[1]


@settings(max_examples=300, deadline=None)
@given(
    spares=st.lists(st.integers(1, 30), min_size=2, max_size=9),
    data=st.data(),
    min_units=st.integers(1, 4),
)
def test_window_search_matches_the_literal_spec(
    spares: list[int], data: st.DataObject, min_units: int
) -> None:
    spares = sorted(spares, reverse=True)
    total = sum(spares)
    if spares[0] >= total:  # pragma: no cover - min_size=2 with spares >= 1
        return
    need = data.draw(st.integers(spares[0] + 1, total))
    got = split_over_windows(spares, need, min_units)
    assert got == _reference_split(spares, need, min_units)
    assert sum(got) == need
    assert all(0 <= a <= s for a, s in zip(got, spares, strict=True))


def test_quantum_is_exposed_and_used_for_discrete_like_requests() -> None:
    m = FractionAllocMap(devices(S, ["2", "2"]), quantum_size=D("0.5"))
    assert m.quantum_size == D("0.5")
    assert m.allocate({S: D(3)}) == {S: amounts({"a0": "1.5", "a1": "1.5"})}
    with pytest.raises(NotMultipleOfQuantum):
        m.allocate({S: D("0.7")})


def test_repr_names_strategy_and_slots() -> None:
    assert repr(dmap([1, 1])) == "DiscreteAllocMap(EVENLY, {cpu: 2 devices})"
    assert repr(fmap(["1"], strategy=FILL)) == "FractionAllocMap(FILL, {cuda.shares: 1 devices})"


def test_discrete_map_ignores_fraction_only_options() -> None:
    m = dmap([2, 2])
    assert m.allocate({"cpu": D(2)}, min_memory=D(5), allow_resource_fragmentation=False) == {
        "cpu": {"a0": D(1), "a1": D(1)}
    }
