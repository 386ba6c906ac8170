"""NUMA affinity ordering and the multi-map kernel helper (all or nothing)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accelshare.alloc import (
    DEFAULT_ALLOCATION_ORDER,
    AffinityHint,
    AffinityPolicy,
    AllocMapConfigError,
    DeviceSlotInfo,
    DiscreteAllocMap,
    FractionAllocMap,
    InsufficientResource,
    InvalidResourceArgument,
    UnsupportedResource,
    allocate_kernel,
    apply_kernel,
    free_kernel,
)
from accelshare.alloc.affinity import affinity_tiers, numa_groups, walk_order
from accelshare.common import SlotTypes

from .builders import EVENLY, FILL, D, amounts, devices

PREFER = AffinityPolicy.PREFER_SINGLE_NODE
INTERLEAVED = AffinityPolicy.INTERLEAVED
GPUS = ["g0", "g1", "g2", "g3"]
GPU_NODES = {"g0": 0, "g1": 0, "g2": 1, "g3": 1}

ORDER_CASES: dict[str, tuple[AffinityHint | None, dict[str, int], list[str]]] = {
    "no-hint-most-free-first": (None, {}, ["g0", "g1", "g2", "g3"]),
    "no-hint-ties-in-declaration-order": (None, {"g1": 5}, ["g0", "g2", "g3", "g1"]),
    "first-kind-interleaved": (AffinityHint(), {}, ["g0", "g2", "g1", "g3"]),
    "first-kind-prefer-single-node": (AffinityHint(policy=PREFER), {}, ["g0", "g1", "g2", "g3"]),
    "first-kind-least-used-node-first": (
        AffinityHint(policy=PREFER),
        {"g0": 1},
        ["g2", "g3", "g1", "g0"],
    ),
    "hint-node-1-primary-first": (AffinityHint((1,)), {}, ["g2", "g3", "g0", "g1"]),
    "hint-both-nodes-interleaved": (AffinityHint((1, 0)), {}, ["g2", "g0", "g3", "g1"]),
    "hint-both-nodes-prefer": (AffinityHint((1, 0), PREFER), {}, ["g2", "g3", "g0", "g1"]),
    "hint-unknown-node-all-secondary": (AffinityHint((7,)), {"g0": 3}, ["g1", "g2", "g3", "g0"]),
}


@pytest.mark.parametrize("case", ORDER_CASES.values(), ids=ORDER_CASES.keys())
def test_walk_order(case: tuple[AffinityHint | None, dict[str, int], list[str]]) -> None:
    hint, used_units, expected = case
    spare = {g: 10 - used_units.get(g, 0) for g in GPUS}
    used = {g: D(used_units.get(g, 0)) for g in GPUS}
    assert affinity_tiers(GPUS, spare, used, GPU_NODES, hint)[-1] == expected


def test_tiers_narrow_first() -> None:
    spare = dict.fromkeys(GPUS, 10)
    used = dict.fromkeys(GPUS, D(0))
    assert affinity_tiers(GPUS, spare, used, GPU_NODES, AffinityHint((1,), PREFER)) == [
        ["g2", "g3"],
        ["g2", "g3", "g0", "g1"],
    ]
    assert affinity_tiers(GPUS, spare, used, GPU_NODES, AffinityHint((1, 0), PREFER)) == [
        ["g2", "g3"],
        ["g0", "g1"],
        ["g2", "g3", "g0", "g1"],
    ]
    assert affinity_tiers(GPUS, spare, used, GPU_NODES, AffinityHint(policy=PREFER)) == [
        ["g0", "g1"],
        ["g2", "g3"],
        ["g0", "g1", "g2", "g3"],
    ]
    # Everything on the hinted node: a single tier.
    assert affinity_tiers(["g0", "g1"], spare, used, GPU_NODES, AffinityHint((0,))) == [
        ["g0", "g1"]
    ]


def test_hint_normalises_nodes_and_policy() -> None:
    assert AffinityHint((1, 0, 1), "prefer_single_node") == AffinityHint((1, 0), PREFER)  # type: ignore[arg-type]
    with pytest.raises(AllocMapConfigError, match="unknown affinity policy"):
        AffinityHint((), "SPREAD")  # type: ignore[arg-type]


def _gpus(kind: Any = FractionAllocMap, **kw: Any) -> Any:
    return kind(devices("cuda.shares", ["1"] * 4, prefix="g"), numa_nodes=GPU_NODES, **kw)


@pytest.mark.parametrize("strategy", [FILL, EVENLY])
def test_fractional_map_follows_the_hint(strategy: Any) -> None:
    m = _gpus(allocation_strategy=strategy, quantum_size=D("0.1"))
    assert set(
        m.allocate({"cuda.shares": D("0.5")}, affinity_hint=AffinityHint((1,)))["cuda.shares"]
    ) <= {"g2", "g3"}
    # 2.5 cannot fit on node 1 alone any more: it widens to all devices.
    result = m.allocate({"cuda.shares": D("2.5")}, affinity_hint=AffinityHint((1,)))
    assert sum(result["cuda.shares"].values()) == D("2.5")
    assert set(result["cuda.shares"]) & {"g0", "g1"}


def test_evenly_prefers_one_node_with_prefer_single_node() -> None:
    m = _gpus(quantum_size=D("0.1"))
    m.apply_allocation({"cuda.shares": {"g0": D("0.5")}})
    # Node 1 is least used: a 2-device split stays there.
    result = m.allocate({"cuda.shares": D("1.6")}, affinity_hint=AffinityHint(policy=PREFER))
    assert result == {"cuda.shares": amounts({"g2": "0.8", "g3": "0.8"})}


def test_evenly_insufficient_after_all_tiers() -> None:
    m = _gpus(quantum_size=D("0.1"))
    m.apply_allocation({"cuda.shares": {"g0": D("0.5")}})
    # 3.5 free in total, but g0's 0.5 is below min_memory: no tier holds 3.5.
    with pytest.raises(InsufficientResource, match="not used"):
        m.allocate({"cuda.shares": D("3.5")}, affinity_hint=AffinityHint((0,)), min_memory=D(1))


def test_discrete_evenly_takes_cores_on_the_hinted_node_first() -> None:
    cores = DiscreteAllocMap(
        devices("cpu", [1] * 8, prefix="c"),
        numa_nodes={f"c{i}": i // 4 for i in range(8)},
    )
    result = cores.allocate({"cpu": D(3)}, affinity_hint=AffinityHint((1,)))
    assert result == {"cpu": {"c4": D(1), "c5": D(1), "c6": D(1)}}
    assert cores.numa_nodes["c4"] == 1


# -- allocate_kernel --------------------------------------------------------------------------------
def _node_maps() -> dict[str, Any]:
    gpus = FractionAllocMap(
        devices("cuda.shares", ["1", "1"], prefix="g"),
        quantum_size=D("0.1"),
        numa_nodes={"g0": 0, "g1": 1},
    )
    cores = DiscreteAllocMap(
        devices("cpu", [1] * 4, prefix="c"), numa_nodes={"c0": 0, "c1": 0, "c2": 1, "c3": 1}
    )
    mem = DiscreteAllocMap(
        {
            "m0": DeviceSlotInfo(SlotTypes.BYTES, "mem", D(1024)),
            "m1": DeviceSlotInfo(SlotTypes.BYTES, "mem", D(1024)),
        },
        allocation_strategy=FILL,
        numa_nodes={"m0": 0, "m1": 1},
    )
    return {"mem": mem, "cpu": cores, "cuda": gpus}


def test_allocate_kernel_steers_later_kinds_to_the_chosen_nodes() -> None:
    maps = _node_maps()
    maps["cuda"].apply_allocation({"cuda.shares": {"g0": D("0.5")}})
    result = allocate_kernel(
        maps, {"cuda.shares": D("0.8"), "cpu": D(2), "mem": D(512)}, context_tag="k1"
    )
    assert list(result) == ["cuda", "cpu", "mem"]  # allocation order, not dict order
    assert result["cuda"] == {"cuda.shares": {"g1": D("0.8")}}
    assert result["cpu"] == {"cpu": {"c2": D(1), "c3": D(1)}}
    assert result["mem"] == {"mem": {"m1": D(512)}}


def test_allocate_kernel_rolls_every_map_back() -> None:
    maps = _node_maps()
    before = {kind: m.allocations for kind, m in maps.items()}
    with pytest.raises(InsufficientResource) as info:
        allocate_kernel(
            maps, {"cuda.shares": D("0.5"), "cpu": D(2), "mem": D(4096)}, context_tag="k2"
        )
    assert info.value.slot == "mem"
    assert info.value.context_tag == "k2"
    assert {kind: m.allocations for kind, m in maps.items()} == before


def test_allocate_kernel_refuses_unknown_slots_and_bad_amounts_up_front() -> None:
    maps = _node_maps()
    with pytest.raises(UnsupportedResource) as info:
        allocate_kernel(maps, {"cpu": D(1), "tpu.device": D(1)})
    assert info.value.known_slots == ("mem", "cpu", "cuda.shares")
    with pytest.raises(InvalidResourceArgument):
        allocate_kernel(maps, {"cpu": D(-1)})
    assert allocate_kernel(maps, {"tpu.device": D(0)}) == {}
    assert all(
        v == 0 for m in maps.values() for per in m.allocations.values() for v in per.values()
    )


def test_allocate_kernel_custom_order_and_maps_outside_it() -> None:
    maps = _node_maps()
    maps["x"] = DiscreteAllocMap(devices("x.device", [1], prefix="x"))
    result = allocate_kernel(
        maps,
        {"x.device": D(1), "cpu": D(1), "mem": D(1)},
        allocation_order=["mem", "cpu"],
        affinity_policy="PREFER_SINGLE_NODE",
    )
    assert list(result) == ["mem", "cpu", "x"]
    assert DEFAULT_ALLOCATION_ORDER == ("cuda", "rocm", "tpu", "cpu", "mem")


def _allocated_of(maps: dict[str, Any]) -> dict[str, Any]:
    return {kind: m.allocations for kind, m in maps.items()}


def test_free_and_apply_kernel_round_trip() -> None:
    maps = _node_maps()
    zero = _allocated_of(maps)
    result = allocate_kernel(maps, {"cuda.shares": D("0.5"), "cpu": D(1), "mem": D(100)})
    allocated = _allocated_of(maps)
    free_kernel(maps, result)
    assert _allocated_of(maps) == zero
    apply_kernel(maps, result)
    assert _allocated_of(maps) == allocated


def test_free_kernel_rolls_back_maps_already_freed() -> None:
    maps = _node_maps()
    result = allocate_kernel(maps, {"cuda.shares": D("0.5"), "cpu": D(1), "mem": D(100)})
    allocated = _allocated_of(maps)
    # cuda and cpu free cleanly (and are freed first), then mem asks for more than it holds.
    broken = {
        "cuda": result["cuda"],
        "cpu": result["cpu"],
        "mem": {"mem": {"m0": D(100), "m1": D(100)}},
    }
    assert list(broken) == ["cuda", "cpu", "mem"]
    with pytest.raises(InvalidResourceArgument, match="cannot free 100 of mem"):
        free_kernel(maps, broken)
    # Without the rollback cuda and cpu would be zero here.
    assert _allocated_of(maps) == allocated


def test_apply_kernel_rolls_back_maps_already_applied() -> None:
    maps = _node_maps()
    zero = _allocated_of(maps)
    recorded = {
        "cuda": {"cuda.shares": {"g0": D("0.5")}},
        "cpu": {"cpu": {"c0": D(1)}},
        "mem": {"mem": {"m0": D(2048)}},  # beyond m0's 1024: fails after cuda and cpu applied
    }
    with pytest.raises(InsufficientResource, match="exceed m0's capacity"):
        apply_kernel(maps, recorded)
    assert _allocated_of(maps) == zero


def test_free_kernel_refuses_a_kind_without_a_map_and_changes_nothing() -> None:
    maps = _node_maps()
    result = allocate_kernel(maps, {"cpu": D(1)})
    allocated = _allocated_of(maps)
    with pytest.raises(UnsupportedResource):
        free_kernel(maps, {**result, "rocm": {}})
    assert _allocated_of(maps) == allocated


def test_kernel_result_amounts_are_decimal() -> None:
    result = allocate_kernel(_node_maps(), {"cpu": D(1)})
    assert all(isinstance(v, Decimal) for per in result["cpu"].values() for v in per.values())


@st.composite
def _walks(
    draw: st.DrawFn,
) -> tuple[
    list[str], dict[str, int], dict[str, Decimal], dict[str, int | None], AffinityHint | None
]:
    names = [f"d{i}" for i in range(draw(st.integers(1, 9)))]
    numa = {d: draw(st.sampled_from([0, 1, 2, None])) for d in names}
    spare = {d: draw(st.integers(0, 4)) for d in names}
    used = {d: Decimal(draw(st.integers(0, 4))) for d in names}
    hint = draw(
        st.none()
        | st.builds(
            AffinityHint,
            st.lists(st.sampled_from([0, 1, 2, 3, None]), max_size=3).map(tuple),
            st.sampled_from(list(AffinityPolicy)),
        )
    )
    return names, spare, used, numa, hint


@settings(max_examples=500, deadline=None)
@given(case=_walks())
def test_walk_order_is_the_last_tier(
    case: tuple[
        list[str], dict[str, int], dict[str, Decimal], dict[str, int | None], AffinityHint | None
    ],
) -> None:
    """The maps' shortcut for FILL and discrete EVENLY: exactly the last affinity tier."""
    names, spare, used, numa, hint = case
    expected = affinity_tiers(names, spare, used, numa, hint)[-1]
    assert walk_order(names, spare, used, numa, hint) == expected
    assert walk_order(names, spare, used, numa, hint, numa_groups(names, numa)) == expected
