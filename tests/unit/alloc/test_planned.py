"""Taking a placement planned elsewhere: ``allocate_planned`` / ``allocate_planned_kernel``."""

from __future__ import annotations

from decimal import Decimal

import pytest

from accelshare.alloc import (
    InsufficientResource,
    InvalidResourceArgument,
    InvalidResourceCombination,
    NotMultipleOfQuantum,
    PlanConflict,
    UnsupportedResource,
    allocate_planned_kernel,
)
from accelshare.alloc.strategies import is_unfragmented_split

from .builders import D, dmap, fmap


def test_a_plan_that_fits_is_taken_exactly_not_as_the_strategy_would_place_it() -> None:
    m = fmap(["1", "1"], quantum="0.1")  # EVENLY would put 0.2 on a1 (best fit)
    taken = m.allocate_planned({"cuda.shares": D("0.2")}, {"cuda.shares": {"a0": D("0.2")}})
    assert taken == {"cuda.shares": {"a0": D("0.2")}}
    assert m.allocations == {"cuda.shares": {"a0": D("0.2"), "a1": D(0)}}
    # the map's free units follow: 0.8 + 1.0 free, and a second plan may fill a0
    m.allocate_planned({"cuda.shares": D("0.8")}, {"cuda.shares": {"a0": D("0.8")}})
    assert m.largest_fit("cuda.shares") == D(1)


def test_a_split_plan_is_taken_over_its_devices() -> None:
    m = dmap([2, 2, 2, 2])
    taken = m.allocate_planned({"cpu": D(3)}, {"cpu": {"a3": D(2), "a1": D(1)}})
    assert taken == {"cpu": {"a3": D(2), "a1": D(1)}}
    assert m.allocations["cpu"] == {"a0": D(0), "a1": D(1), "a2": D(0), "a3": D(2)}


def test_a_plan_that_does_not_fit_is_a_conflict_and_changes_nothing() -> None:
    m = fmap(["1", "1"], quantum="0.1")
    m.allocate({"cuda.shares": D("0.7")})  # someone the planner did not know about
    before = m.allocations
    holder = next(d for d, a in before["cuda.shares"].items() if a)
    with pytest.raises(PlanConflict) as caught:
        m.allocate_planned({"cuda.shares": D("0.5")}, {"cuda.shares": {holder: D("0.5")}})
    assert caught.value.devices == {holder: D("0.3")}
    assert "no longer fits" in str(caught.value)
    assert holder in str(caught.value)
    assert m.allocations == before


def test_a_device_that_is_not_there_is_a_conflict() -> None:
    m = dmap([2, 2])
    with pytest.raises(PlanConflict, match="GPU9 is not a device of cpu"):
        m.allocate_planned({"cpu": D(1)}, {"cpu": {"GPU9": D(1)}})
    assert m.allocations["cpu"] == {"a0": D(0), "a1": D(0)}


@pytest.mark.parametrize(
    ("request_", "plan", "error", "match"),
    [
        # off the quantum grid: the map's own check (nearest valid amounts named)
        ({"cuda.shares": D("0.5")}, {"cuda.shares": {"a0": D("0.25"), "a1": D("0.25")}},
         NotMultipleOfQuantum, "quantum 0.1"),
        # the plan's total differs from the request's
        ({"cuda.shares": D("0.5")}, {"cuda.shares": {"a0": D("0.4")}},
         InvalidResourceArgument, "places 0.4 of cuda.shares, the request asks for 0.5"),
        # a slot the request does not ask for
        ({"cuda.shares": D("0.5")}, {"cuda.shares": {"a0": D("0.5")}, "cuda.x": {"a0": D(1)}},
         InvalidResourceArgument, "places cuda.x"),
        # nothing for a requested slot
        ({"cuda.shares": D("0.5")}, {}, InvalidResourceArgument, "places nothing of cuda.shares"),
        # a negative or float amount
        ({"cuda.shares": D("0.5")}, {"cuda.shares": {"a0": 0.5}},
         InvalidResourceArgument, "float"),
        # not a mapping at all, or not one for a slot
        ({"cuda.shares": D("0.5")}, ["a0"], InvalidResourceArgument, "expected slot -> device"),
        ({"cuda.shares": D("0.5")}, {"cuda.shares": "a0"},
         InvalidResourceArgument, "expected device -> amount for cuda.shares"),
    ],
)  # fmt: skip
def test_a_wrong_plan_is_refused_as_invalid_not_as_a_conflict(
    request_: dict[str, Decimal], plan: dict[str, dict[str, object]], error: type, match: str
) -> None:
    m = fmap(["1", "1"], quantum="0.1")
    with pytest.raises(error, match=match) as caught:
        m.allocate_planned(request_, plan)  # type: ignore[arg-type]
    assert not isinstance(caught.value, PlanConflict)
    assert m.allocations == {"cuda.shares": {"a0": D(0), "a1": D(0)}}


def test_a_wrong_plan_is_reported_as_wrong_even_when_a_device_is_also_short() -> None:
    m = fmap(["1", "1"], quantum="0.1")
    m.allocate_planned({"cuda.shares": D(1)}, {"cuda.shares": {"a0": D(1)}})
    with pytest.raises(InvalidResourceArgument, match=r"the request asks for 0\.5"):
        m.allocate_planned({"cuda.shares": D("0.5")}, {"cuda.shares": {"a0": D("0.6")}})


def test_a_zero_amount_in_a_plan_places_nothing_there() -> None:
    m = fmap(["1", "1"], quantum="0.1")
    taken = m.allocate_planned(
        {"cuda.shares": D("0.5")}, {"cuda.shares": {"a0": D(0), "a1": D("0.5")}}
    )
    assert taken == {"cuda.shares": {"a1": D("0.5")}}
    assert m.allocations == {"cuda.shares": {"a0": D(0), "a1": D("0.5")}}


def test_discrete_amounts_must_be_whole_units() -> None:
    m = dmap([4, 4])
    with pytest.raises(InvalidResourceArgument, match="whole units"):
        m.allocate_planned({"cpu": D(2)}, {"cpu": {"a0": D("1.5"), "a1": D("0.5")}})


def test_the_request_is_checked_as_allocate_checks_it() -> None:
    m = dmap([4], slot="cuda.device:1g-mig", exclusive_slot_types=("cuda.device:*",))
    with pytest.raises(UnsupportedResource):
        m.allocate_planned({"cpu": D(1)}, {"cpu": {"a0": D(1)}})
    two = dmap([1, 1], slot="cuda.device:1g-mig", exclusive_slot_types=("cuda.device:*",))
    with pytest.raises((InvalidResourceCombination, UnsupportedResource)):
        two.allocate_planned(
            {"cuda.device:1g-mig": D(1), "cuda.device:2g-mig": D(1)},
            {"cuda.device:1g-mig": {"a0": D(1)}},
        )


def test_fragmentation_refused_needs_the_guards_shape() -> None:
    m = fmap(["1", "1"], quantum="0.1")
    plan = {"cuda.shares": {"a0": D("0.4"), "a1": D("0.4")}}
    with pytest.raises(InvalidResourceArgument, match="fragmented"):
        m.allocate_planned({"cuda.shares": D("0.8")}, plan, allow_resource_fragmentation=False)
    assert m.allocate_planned({"cuda.shares": D("0.8")}, plan) == plan  # allowed by default
    even = fmap(["1", "1"], quantum="0.1")
    split = {"cuda.shares": {"a0": D("0.6"), "a1": D("0.6")}}
    assert (
        even.allocate_planned({"cuda.shares": D("1.2")}, split, allow_resource_fragmentation=False)
        == split
    )


def test_is_unfragmented_split() -> None:
    assert is_unfragmented_split([8], 10, 8)
    assert not is_unfragmented_split([4, 4], 10, 8)
    assert is_unfragmented_split([7, 6], 10, 13)
    assert not is_unfragmented_split([10, 3], 10, 13)
    assert not is_unfragmented_split([6, 6], 10, 13)  # does not add up


def test_kernel_plan_over_several_maps_is_all_or_nothing() -> None:
    maps = {"cuda": fmap(["1", "1"], quantum="0.1"), "cpu": dmap([1, 1, 1, 1])}
    maps["cpu"].allocate_planned({"cpu": D(1)}, {"cpu": {"a2": D(1)}})  # a stranger on a2
    before = {k: m.allocations for k, m in maps.items()}
    request = {"cuda.shares": D("0.5"), "cpu": D(2)}
    with pytest.raises(PlanConflict):
        allocate_planned_kernel(
            maps, request, {"cuda.shares": {"a1": D("0.5")}, "cpu": {"a2": D(1), "a3": D(1)}}
        )
    assert {k: m.allocations for k, m in maps.items()} == before  # cuda rolled back too
    taken = allocate_planned_kernel(
        maps, request, {"cuda.shares": {"a1": D("0.5")}, "cpu": {"a0": D(1), "a3": D(1)}}
    )
    assert taken == {
        "cuda": {"cuda.shares": {"a1": D("0.5")}},
        "cpu": {"cpu": {"a0": D(1), "a3": D(1)}},
    }


def test_kernel_plan_naming_a_slot_no_map_owns_is_invalid() -> None:
    maps = {"cpu": dmap([2])}
    with pytest.raises(InvalidResourceArgument, match=r"places tpu\.device"):
        allocate_planned_kernel(
            maps, {"cpu": D(1)}, {"cpu": {"a0": D(1)}, "tpu.device": {"t0": D(1)}}
        )
    assert maps["cpu"].allocations == {"cpu": {"a0": D(0)}}


def test_a_plan_is_not_an_insufficient_resource_error() -> None:
    # the agent tells a conflict from a request that does not fit by the class
    assert not issubclass(PlanConflict, InsufficientResource)


def test_kernel_plan_for_an_empty_request_is_invalid() -> None:
    maps = {"cpu": dmap([2])}
    with pytest.raises(InvalidResourceArgument, match=r"places tpu\.device"):
        allocate_planned_kernel(maps, {}, {"tpu.device": {"t0": D(1)}})
    assert maps["cpu"].allocations == {"cpu": {"a0": D(0)}}
