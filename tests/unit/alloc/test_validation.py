"""Bad input gets a clear error naming slot, value and what was expected; nothing changes."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from accelshare.alloc import (
    AllocMapConfigError,
    DeviceSlotInfo,
    DiscreteAllocMap,
    FractionAllocMap,
    InsufficientResource,
    InvalidResourceArgument,
    InvalidResourceCombination,
    NotMultipleOfQuantum,
    ResourceError,
    UnsupportedResource,
)
from accelshare.alloc.base import AbstractAllocMap
from accelshare.common import SlotTypes

from .builders import EVENLY, FILL, D, amounts, devices, dmap, fmap

BOTH_KINDS = {
    "discrete": lambda: dmap([4, 4], slot="cuda.shares"),
    "fractional": lambda: fmap(["1", "1"], quantum="0.1"),
}

BAD_AMOUNTS: dict[str, tuple[Any, str]] = {
    "negative": (D("-1"), "negative"),
    "nan": (D("NaN"), "NaN"),
    "snan": (D("sNaN"), "NaN"),
    "infinite": (D("Infinity"), "infinite"),
    "float": (0.5, "float"),
    "string": ("1", "str"),
    "none": (None, "NoneType"),
    "bool": (True, "bool"),
}


@pytest.mark.parametrize("kind", BOTH_KINDS.values(), ids=BOTH_KINDS.keys())
@pytest.mark.parametrize("value_why", BAD_AMOUNTS.values(), ids=BAD_AMOUNTS.keys())
def test_bad_amounts_are_refused_by_name(kind: Any, value_why: tuple[Any, str]) -> None:
    value, why = value_why
    m = kind()
    with pytest.raises(InvalidResourceArgument) as info:
        m.allocate({"cuda.shares": value})
    message = str(info.value)
    assert "cuda.shares" in message
    assert why in message
    assert "expected a finite Decimal >= 0" in message
    assert info.value.slot == "cuda.shares"
    assert info.value.expected.startswith("a finite Decimal")
    assert m.allocations == {"cuda.shares": amounts({"a0": 0, "a1": 0})}


def test_int_amounts_are_accepted_as_exact() -> None:
    assert dmap([4]).allocate({"cpu": 3}) == {"cpu": {"a0": D(3)}}  # type: ignore[dict-item]


def test_request_must_be_a_mapping() -> None:
    with pytest.raises(InvalidResourceArgument, match="expected a mapping"):
        dmap([4]).allocate([("cpu", D(1))])  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", BOTH_KINDS.values(), ids=BOTH_KINDS.keys())
def test_zero_amounts_are_dropped_and_all_zero_returns_empty(kind: Any) -> None:
    m = kind()
    assert m.allocate({"cuda.shares": D(0), "unknown.slot": D(0)}) == {}
    assert m.allocate({}) == {}


@pytest.mark.parametrize("kind", BOTH_KINDS.values(), ids=BOTH_KINDS.keys())
def test_unknown_slot_is_unsupported(kind: Any) -> None:
    m = kind()
    with pytest.raises(UnsupportedResource) as info:
        m.allocate({"cuda.shares": D(1), "rocm.device": D(1)}, context_tag="k-1")
    assert info.value.slot == "rocm.device"
    assert info.value.requested == D(1)
    assert info.value.known_slots == ("cuda.shares",)
    assert info.value.context_tag == "k-1"
    assert "'rocm.device' (requested 1)" in str(info.value)
    assert "[context: k-1]" in str(info.value)
    assert m.allocations["cuda.shares"] == amounts({"a0": 0, "a1": 0})


def test_map_without_devices_supports_nothing() -> None:
    m = DiscreteAllocMap({})
    assert m.allocate({"cpu": D(0)}) == {}
    with pytest.raises(UnsupportedResource, match="slots available here: none"):
        m.allocate({"cpu": D(1)})


# -- exclusivity -------------------------------------------------------------------------------
EXCLUSIVE = ("cuda.device", "cuda.shares", "cuda.device:*-mig")


def _cuda_map() -> DiscreteAllocMap:
    slots = {
        "GPU0": DeviceSlotInfo(SlotTypes.COUNT, "cuda.device", D(1)),
        "MIG0": DeviceSlotInfo(SlotTypes.UNIQUE, "cuda.device:1g-mig", D(1)),
        "MIG1": DeviceSlotInfo(SlotTypes.UNIQUE, "cuda.device:2g-mig", D(1)),
        "MIG2": DeviceSlotInfo(SlotTypes.UNIQUE, "cuda.device:2g-mig", D(1)),
    }
    return DiscreteAllocMap(slots, exclusive_slot_types=EXCLUSIVE)


COMBINATIONS = {
    "device+shares": {"cuda.device": D(1), "cuda.shares": D("0.5")},
    "device+mig": {"cuda.device": D(1), "cuda.device:1g-mig": D(1)},
    "two-mig-profiles": {"cuda.device:1g-mig": D(1), "cuda.device:2g-mig": D(1)},
}


@pytest.mark.parametrize("request_", COMBINATIONS.values(), ids=COMBINATIONS.keys())
def test_exclusive_slots_cannot_be_combined(request_: dict[str, Decimal]) -> None:
    m = _cuda_map()
    with pytest.raises(InvalidResourceCombination) as info:
        m.allocate(request_)
    assert info.value.slots == tuple(request_)
    assert "cannot be allocated together" in str(info.value)
    assert info.value.exclusive_slot_types == EXCLUSIVE
    assert all(v == 0 for per in m.allocations.values() for v in per.values())


def test_exclusive_slot_alone_and_with_others_is_fine() -> None:
    m = _cuda_map()
    assert m.allocate({"cuda.device:2g-mig": D(1)}) == {"cuda.device:2g-mig": {"MIG1": D(1)}}
    # A zero amount does not count as requested.
    assert m.allocate({"cuda.device": D(1), "cuda.shares": D(0)}) == {"cuda.device": {"GPU0": D(1)}}


def test_a_lone_exclusive_name_is_not_split_into_characters() -> None:
    m = dmap([1, 1], exclusive_slot_types="cpu")
    assert m.exclusive_slot_types == ("cpu",)


# -- unique, whole numbers, quantum -----------------------------------------------------------
UNIQUE_MAPS = {
    "discrete-evenly": lambda: dmap([1, 1], slot="x.device:mig", slot_type=SlotTypes.UNIQUE),
    "discrete-fill": lambda: dmap(
        [1, 1], slot="x.device:mig", slot_type=SlotTypes.UNIQUE, strategy=FILL
    ),
    "fraction-evenly": lambda: FractionAllocMap(
        {"m0": DeviceSlotInfo(SlotTypes.UNIQUE, "x.device:mig", D(1))}
    ),
    "fraction-fill": lambda: FractionAllocMap(
        {"m0": DeviceSlotInfo(SlotTypes.UNIQUE, "x.device:mig", D(1))}, allocation_strategy=FILL
    ),
}


@pytest.mark.parametrize("build", UNIQUE_MAPS.values(), ids=UNIQUE_MAPS.keys())
@pytest.mark.parametrize("amount", ["2", "0.5"])
def test_unique_slot_must_be_exactly_one(build: Any, amount: str) -> None:
    m = build()
    with pytest.raises(InvalidResourceArgument, match="unique slot") as info:
        m.allocate({"x.device:mig": D(amount)})
    assert info.value.expected == "exactly 1"
    assert m.allocate({"x.device:mig": D(1)})["x.device:mig"] != {}


@pytest.mark.parametrize("slot_type", [SlotTypes.COUNT, SlotTypes.BYTES, SlotTypes.UNIFIED])
@pytest.mark.parametrize("strategy", [FILL, EVENLY])
def test_discrete_refuses_non_whole_amounts(slot_type: SlotTypes, strategy: Any) -> None:
    m = dmap([4, 4], slot_type=slot_type, strategy=strategy)
    with pytest.raises(InvalidResourceArgument) as info:
        m.allocate({"cpu": D("1.5")})
    assert str(info.value) == (
        "InvalidResourceArgument: cannot allocate 1.5 of cpu: it is counted in whole units"
        " (nearest whole amounts: 1 and 2)"
    )
    assert (info.value.slot, info.value.requested, info.value.expected) == (
        "cpu",
        D("1.5"),
        "a whole number",
    )


def test_discrete_accepts_whole_amounts_written_with_decimals() -> None:
    assert dmap([4]).allocate({"cpu": D("2.000")}) == {"cpu": {"a0": D(2)}}


@pytest.mark.parametrize("strategy", [FILL, EVENLY])
def test_fraction_refuses_off_grid_naming_nearest_amounts(strategy: Any) -> None:
    m = fmap(["1", "1"], quantum="0.1", strategy=strategy)
    with pytest.raises(NotMultipleOfQuantum) as info:
        m.allocate({"cuda.shares": D("0.05")}, context_tag="sess-1")
    error = info.value
    assert isinstance(error, InvalidResourceArgument)
    assert (error.quantum, error.lower, error.upper) == (D("0.1"), D(0), D("0.1"))
    assert str(error) == (
        "NotMultipleOfQuantum: cannot allocate 0.05 of cuda.shares: not a multiple of the"
        " quantum 0.1 (nearest valid amounts: 0 and 0.1) [context: sess-1]"
    )


def test_every_slot_is_validated_before_anything_is_placed() -> None:
    m = FractionAllocMap(
        {
            "g0": DeviceSlotInfo(SlotTypes.COUNT, "cuda.shares", D(1)),
            "h0": DeviceSlotInfo(SlotTypes.COUNT, "rocm.shares", D(1)),
        },
        quantum_size=D("0.1"),
    )
    with pytest.raises(NotMultipleOfQuantum):
        m.allocate({"cuda.shares": D("0.5"), "rocm.shares": D("0.55")})
    with pytest.raises(InsufficientResource):
        m.allocate({"cuda.shares": D("0.5"), "rocm.shares": D("2")})
    assert m.allocations == {"cuda.shares": {"g0": D(0)}, "rocm.shares": {"h0": D(0)}}


@pytest.mark.parametrize("value", [D(-1), D("NaN"), 0.01])
def test_min_memory_is_validated(value: Any) -> None:
    with pytest.raises(InvalidResourceArgument, match="min_memory"):
        fmap(["1"]).allocate({"cuda.shares": D("0.1")}, min_memory=value)


# -- free and apply_allocation ------------------------------------------------------------------
MAPS = {
    "discrete": lambda: dmap([4, 4], slot="cuda.shares"),
    "fractional": lambda: fmap(["4", "4"], quantum="0.5"),
}

BAD_EXISTING: dict[str, tuple[Any, type[ResourceError], str]] = {
    "unknown-slot": ({"rocm.shares": {"a0": D(1)}}, UnsupportedResource, "rocm.shares"),
    "unknown-device": (
        {"cuda.shares": {"GPU9": D(1)}},
        InvalidResourceArgument,
        "'GPU9': not a device of cuda.shares (devices: a0, a1)",
    ),
    "negative": ({"cuda.shares": {"a0": D(-1)}}, InvalidResourceArgument, "negative"),
    "float": ({"cuda.shares": {"a0": 1.0}}, InvalidResourceArgument, "float"),
    "not-a-mapping": ([("cuda.shares", 1)], InvalidResourceArgument, "expected slot -> device"),
    "inner-not-a-mapping": ({"cuda.shares": [1]}, InvalidResourceArgument, "expected device"),
}


@pytest.mark.parametrize("build", MAPS.values(), ids=MAPS.keys())
@pytest.mark.parametrize("action", ["free", "apply_allocation"])
@pytest.mark.parametrize("bad", BAD_EXISTING.values(), ids=BAD_EXISTING.keys())
def test_free_and_apply_refuse_what_the_map_does_not_have(
    build: Any, action: str, bad: tuple[Any, type[ResourceError], str]
) -> None:
    alloc, error, text = bad
    m: AbstractAllocMap = build()
    m.apply_allocation({"cuda.shares": {"a0": D(2)}})
    before = m.allocations
    with pytest.raises(error, match=text.replace("(", r"\(").replace(")", r"\)")):
        getattr(m, action)(alloc)
    assert m.allocations == before


@pytest.mark.parametrize("build", MAPS.values(), ids=MAPS.keys())
def test_freeing_more_than_allocated_is_refused_atomically(build: Any) -> None:
    m: AbstractAllocMap = build()
    m.apply_allocation({"cuda.shares": {"a0": D(2), "a1": D(1)}})
    with pytest.raises(InvalidResourceArgument) as info:
        m.free({"cuda.shares": {"a0": D(1), "a1": D(2)}})
    assert str(info.value) == (
        "InvalidResourceArgument: cannot free 2 of cuda.shares from a1: only 1 allocated"
    )
    assert info.value.device == "a1"
    assert info.value.expected == "at most 1"
    assert m.allocations["cuda.shares"] == {"a0": D(2), "a1": D(1)}
    m.free({"cuda.shares": {"a0": D(2), "a1": D(0)}})
    assert m.allocations["cuda.shares"] == {"a0": D(0), "a1": D(1)}


@pytest.mark.parametrize("build", MAPS.values(), ids=MAPS.keys())
def test_apply_refuses_to_exceed_capacity_atomically(build: Any) -> None:
    m: AbstractAllocMap = build()
    with pytest.raises(InsufficientResource, match="would exceed a1's capacity"):
        m.apply_allocation({"cuda.shares": {"a0": D(1), "a1": D(5)}})
    assert m.allocations["cuda.shares"] == {"a0": D(0), "a1": D(0)}


def test_apply_accepts_off_grid_amounts_it_restores() -> None:
    # A recorded allocation is a fact; the grid only constrains new requests.
    m = fmap(["1"], quantum="0.1")
    m.apply_allocation({"cuda.shares": {"a0": D("0.25")}})
    assert m.allocations["cuda.shares"] == {"a0": D("0.25")}
    assert m.largest_fit("cuda.shares") == D("0.7")  # 0.75 free, floored onto the grid


# -- snapshot / restore / clear -------------------------------------------------------------------
def test_snapshot_restore_and_clear() -> None:
    m = fmap(["1", "1"], quantum="0.1")
    m.allocate({"cuda.shares": D("0.5")})
    snap = m.snapshot()
    m.allocate({"cuda.shares": D("1.2")})
    m.restore(snap)
    assert m.allocations["cuda.shares"] == {"a0": D(0), "a1": D("0.5")}
    assert snap.as_dict() == {"a0": D(0), "a1": D("0.5")}
    m.clear()
    assert m.allocations["cuda.shares"] == {"a0": D(0), "a1": D(0)}
    assert m.largest_fit("cuda.shares") == D(2)


@pytest.mark.parametrize(
    "snapshot",
    [
        fmap(["1"]).snapshot(),  # other devices
        fmap(["1", "1"], prefix="b").snapshot(),  # other ids
        "not a snapshot",
    ],
    ids=["fewer-devices", "other-ids", "wrong-type"],
)
def test_restore_refuses_a_foreign_snapshot(snapshot: Any) -> None:
    m = fmap(["1", "1"])
    with pytest.raises(InvalidResourceArgument, match="cannot restore a snapshot"):
        m.restore(snapshot)


def test_restore_refuses_a_snapshot_over_capacity() -> None:
    big = fmap(["2", "2"])
    big.allocate({"cuda.shares": D("1.5")})
    with pytest.raises(InvalidResourceArgument):
        fmap(["1", "1"]).restore(big.snapshot())


# -- configuration ----------------------------------------------------------------------------------
CONFIG_ERRORS: dict[str, tuple[Any, str]] = {
    "bad-slot-type": (lambda: DeviceSlotInfo("weird", "cpu", D(1)), "unknown slot type"),  # type: ignore[arg-type]
    "empty-slot-name": (lambda: DeviceSlotInfo(SlotTypes.COUNT, "", D(1)), "invalid slot name"),
    "negative-capacity": (
        lambda: DeviceSlotInfo(SlotTypes.COUNT, "cpu", D(-1)),
        "invalid capacity",
    ),
    "float-capacity": (lambda: DeviceSlotInfo(SlotTypes.COUNT, "cpu", 1.5), "invalid capacity"),  # type: ignore[arg-type]
    "infinite-capacity": (
        lambda: DeviceSlotInfo(SlotTypes.COUNT, "cpu", D("Infinity")),
        "invalid capacity",
    ),
    "bad-device-id": (
        lambda: DiscreteAllocMap({"": DeviceSlotInfo(SlotTypes.COUNT, "cpu", D(1))}),
        "invalid device id",
    ),
    "not-a-device-slot-info": (
        lambda: DiscreteAllocMap({"c0": (SlotTypes.COUNT, "cpu", D(1))}),  # type: ignore[dict-item]
        "expected a DeviceSlotInfo",
    ),
    "mixed-slot-types": (
        lambda: DiscreteAllocMap(
            {
                "c0": DeviceSlotInfo(SlotTypes.COUNT, "cpu", D(1)),
                "c1": DeviceSlotInfo(SlotTypes.UNIQUE, "cpu", D(1)),
            }
        ),
        "slot cpu is count on other devices, not unique",
    ),
    "bad-strategy": (lambda: dmap([1], strategy="spread"), "unknown allocation strategy"),  # type: ignore[arg-type]
    "zero-quantum": (lambda: fmap(["1"], quantum="0"), "invalid quantum_size"),
    "float-quantum": (
        lambda: FractionAllocMap({}, quantum_size=0.1),  # type: ignore[arg-type]
        "invalid quantum_size",
    ),
    "numa-unknown-device": (lambda: dmap([1], numa_nodes={"zz": 0}), "unknown device 'zz'"),
    "numa-not-int": (lambda: dmap([1], numa_nodes={"a0": "0"}), "must be an int or None"),
    "numa-bool": (lambda: dmap([1], numa_nodes={"a0": True}), "must be an int or None"),
}


@pytest.mark.parametrize("build_text", CONFIG_ERRORS.values(), ids=CONFIG_ERRORS.keys())
def test_configuration_errors(build_text: tuple[Any, str]) -> None:
    build, text = build_text
    with pytest.raises(AllocMapConfigError, match=text):
        build()


def test_config_values_are_coerced() -> None:
    info = DeviceSlotInfo("count", "cpu", 2)  # type: ignore[arg-type]
    assert info == DeviceSlotInfo(SlotTypes.COUNT, "cpu", D(2))
    assert isinstance(info.amount, Decimal)
    assert dmap([1], strategy="fill").allocation_strategy is FILL  # type: ignore[arg-type]
    assert FractionAllocMap({}, quantum_size=1).quantum_size == D(1)  # type: ignore[arg-type]


def test_read_only_views() -> None:
    m = fmap(["1", "2"], numa_nodes={"a1": 1})
    assert dict(m.device_slots) == devices("cuda.shares", ["1", "2"])
    assert dict(m.numa_nodes) == {"a0": None, "a1": 1}
    with pytest.raises(TypeError):
        m.slot_types["x"] = SlotTypes.COUNT  # type: ignore[index]
    view = m.allocations
    view["cuda.shares"]["a0"] = D(5)  # a copy: the allocated amounts are untouched
    assert m.allocations["cuda.shares"]["a0"] == 0
    assert m.free_per_device("cuda.shares") == {"a0": D(1), "a1": D(2)}
