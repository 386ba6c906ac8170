"""The per-device fit: dry runs on rebuilt maps, in-pass commits, readable reasons."""

from decimal import Decimal

import pytest

from accelshare.alloc import DiscreteAllocMap, FractionAllocMap
from accelshare.common import AllocationMode, ResourceSlot, SlotTypes
from accelshare.sched import fit
from accelshare.sched.fit import (
    DeviceState,
    FitFailure,
    MapLayouts,
    MapState,
    TrialMaps,
    device_allocation,
    device_taken_amount,
    fits_capacity,
    sum_allocations,
    totals_shortfall,
)

from .builders import cpu_map, gpu_map, mem_map, slots

D = Decimal


def test_canonical_example_places_like_the_agent() -> None:
    trial = TrialMaps("i-node01", (gpu_map(0, 0),))
    first = trial.place({"cuda.shares": D("0.2")})
    second = trial.place({"cuda.shares": D("1.2")})
    assert first == {"cuda": {"cuda.shares": {"GPU2": D("0.2")}}}
    assert second == {"cuda": {"cuda.shares": {"GPU1": D("0.6"), "GPU2": D("0.6")}}}
    assert trial.maps["cuda"].allocations == {"cuda.shares": {"GPU1": D("0.6"), "GPU2": D("0.8")}}


def test_insufficient_reason_names_largest_placement_and_free_devices() -> None:
    trial = TrialMaps("i-node01", (gpu_map("0.6", "0.2"),))
    result = trial.place({"cuda.shares": D("1.5")})
    assert isinstance(result, FitFailure)
    assert result.reason == "cuda.shares needs 1.5, largest placement 1.2 (GPU1 0.4, GPU2 0.8 free)"
    # a failed trial leaves the trial untouched
    assert trial.maps["cuda"].allocations["cuda.shares"] == {"GPU1": D("0.6"), "GPU2": D("0.2")}


def test_fragmentation_option_is_honoured() -> None:
    trial = TrialMaps("i-node01", (gpu_map("0.6", "0.2"),))
    refused = trial.check({"cuda.shares": D("1.0")}, allow_fragmentation=False)
    assert isinstance(refused, FitFailure)
    assert refused.reason == (
        "cuda.shares needs 1, largest placement 0.8 without fragmentation"
        " (fragmented: GPU1 0.4, GPU2 0.8 free)"
    )
    allowed = trial.check({"cuda.shares": D("1.0")}, allow_fragmentation=True)
    assert not isinstance(allowed, FitFailure)


def test_check_is_a_dry_run() -> None:
    trial = TrialMaps("a", (gpu_map(0, 0),))
    assert trial.check({"cuda.shares": D("0.5")}) == {"cuda": {"cuda.shares": {"GPU2": D("0.5")}}}
    assert trial.check({"cuda.shares": D("0.5")}) == {"cuda": {"cuda.shares": {"GPU2": D("0.5")}}}


def test_quantum_mismatch_reason() -> None:
    trial = TrialMaps("a", (gpu_map(0, 0),))
    result = trial.check({"cuda.shares": D("0.15")})
    assert isinstance(result, FitFailure)
    assert result.reason == "cuda.shares 0.15 is not a multiple of this agent's quantum 0.1"


def test_multi_map_request_rolls_back_every_map() -> None:
    trial = TrialMaps("a", (gpu_map(0, 0), cpu_map(2)))
    result = trial.place({"cuda.shares": D("0.5"), "cpu": D(3)})
    assert isinstance(result, FitFailure)
    assert result.reason.startswith("cpu needs 3, largest placement 2")
    assert trial.maps["cuda"].allocations["cuda.shares"] == {"GPU1": D(0), "GPU2": D(0)}


def test_mem_reason_is_humanized() -> None:
    trial = TrialMaps("a", (mem_map(2 << 30, 1 << 30),))
    result = trial.check({"mem": D(2 << 30)})
    assert isinstance(result, FitFailure)
    assert result.reason == "mem needs 2g, largest placement 1g (1g free)"


def test_slots_without_a_map_are_left_to_totals() -> None:
    trial = TrialMaps("a", (gpu_map(0),))
    assert trial.place({"cpu": D(4), "mem": D(1 << 30)}) == {}


@pytest.mark.parametrize(
    ("available", "occupied", "requested", "expected"),
    [
        pytest.param(
            slots(cpu=8), slots(cpu=7), slots(cpu=2), ["cpu needs 2, 1 free of 8"], id="short"
        ),
        pytest.param(
            slots(cpu=8),
            slots(),
            slots(cpu=1, cuda_shares="0.5"),
            ["no cuda.shares slot"],
            id="missing",
        ),
        pytest.param(
            slots(cpu=8), slots(), slots(cpu=1, cuda_shares=0), [], id="zero-of-missing-fits"
        ),
        pytest.param(
            ResourceSlot({"mem": D(4 << 30)}),
            ResourceSlot({"mem": D(3 << 30)}),
            ResourceSlot({"mem": D(2 << 30)}),
            ["mem needs 2g, 1g free of 4g"],
            id="mem-humanized",
        ),
    ],
)
def test_totals_shortfall(
    available: ResourceSlot, occupied: ResourceSlot, requested: ResourceSlot, expected: list[str]
) -> None:
    assert totals_shortfall(available, occupied, requested) == expected


def test_fits_capacity_ignores_current_allocations() -> None:
    trial = TrialMaps("a", (gpu_map(1, 1),))
    assert fits_capacity(slots(cuda_shares=2), trial, slots(cuda_shares="1.5"))
    assert not fits_capacity(slots(cuda_shares=2), trial, slots(cuda_shares="2.5"))
    # fragmentation refused: 1.5 over two 1.0 devices is an even split (0.8 + 0.7) -> fits
    assert fits_capacity(
        slots(cuda_shares=2), trial, slots(cuda_shares="1.5"), allow_fragmentation=False
    )
    assert isinstance(trial.check({"cuda.shares": D("0.1")}), FitFailure)  # still full


@pytest.mark.parametrize(
    ("reported", "by_kernel", "manager", "known", "expected"),
    [
        pytest.param(
            "0.8", {"k1": "0.2", "x": "0.6"}, "0.2", {"k1"}, "0.8", id="unknown-kernel-counts"
        ),
        pytest.param(
            "0.2", {"k1": "0.2"}, "0.8", {"k1", "k2"}, "0.8", id="manager-ahead-of-report"
        ),
        pytest.param("0.6", {"gone": "0.6"}, "0", {"gone"}, "0", id="ended-kernel-is-free"),
        pytest.param("0.5", {}, "0", set(), "0.5", id="unattributed-counts"),
    ],
)
def test_device_taken_amount(
    reported: str, by_kernel: dict[str, str], manager: str, known: set[str], expected: str
) -> None:
    merged = device_taken_amount(
        D(reported), {k: D(v) for k, v in by_kernel.items()}, D(manager), known
    )
    assert merged == D(expected)


def test_flatten_and_sum_allocations() -> None:
    flat = device_allocation({"cuda": {"cuda.shares": {"GPU1": D(1)}}, "cpu": {"cpu": {"0": D(1)}}})
    assert flat == {"cuda.shares": {"GPU1": D(1)}, "cpu": {"0": D(1)}}
    assert sum_allocations([flat, {"cuda.shares": {"GPU1": D("0.5")}}])["cuda.shares"] == {
        "GPU1": D("1.5")
    }


def test_cpu_cores_are_labelled() -> None:
    trial = TrialMaps("a", (cpu_map(2, used=2),))
    result = trial.check({"cpu": D(1)})
    assert isinstance(result, FitFailure)
    assert result.reason == "cpu needs 1, largest placement 0 (cpu0 0, cpu1 0 free)"


@pytest.mark.parametrize("allow_fragmentation", [True, False])
@pytest.mark.parametrize(
    "request_",
    [
        slots(cuda_shares="0.5", cpu=1),
        slots(cuda_shares="1.5", cpu=1),
        slots(cuda_shares="0.9", cpu=1),
        slots(cuda_shares="0.15", cpu=1),
        slots(cuda_shares="0.4", cpu=5),
        slots(cpu=2, mem=2**31),
        slots(cpu=1, mem=2**33),
        slots(cuda_shares="0.2", cpu=3, mem=2**30),
    ],
    ids=repr,
)
def test_refusal_reads_like_a_full_dry_run(
    request_: ResourceSlot, allow_fragmentation: bool
) -> None:
    # map by map (cuda, cpu, mem), remembered until the trial changes: the same verdict
    # and the same words as allocate_kernel over every map
    maps = (gpu_map("0.6", "0.2", "0.9"), cpu_map(4, used=1), mem_map(2**32, used=2**31))
    trial = TrialMaps("a", maps)
    positive = tuple((s, v) for s, v in request_.items() if v > 0)
    for _ in range(2):  # the second time from the memo
        checked = trial.check(request_, allow_fragmentation=allow_fragmentation)
        expected = checked.reason if isinstance(checked, FitFailure) else None
        assert trial.refusal(positive, allow_fragmentation=allow_fragmentation) == expected
    placed = trial.place(slots(cpu=1), allow_fragmentation=allow_fragmentation)
    assert not isinstance(placed, FitFailure)
    checked = trial.check(request_, allow_fragmentation=allow_fragmentation)  # after a change
    expected = checked.reason if isinstance(checked, FitFailure) else None
    assert trial.refusal(positive, allow_fragmentation=allow_fragmentation) == expected


def _fresh(state: MapState) -> DiscreteAllocMap | FractionAllocMap:
    """The map built the long way, as ``MapState.build`` did before its layout cache."""
    capacities: dict[str, dict[str, Decimal]] = {}
    allocations: dict[str, dict[str, Decimal]] = {}
    for d in state.devices:
        capacities.setdefault(d.slot_name, {})[d.device_id] = d.capacity
        if d.allocated > 0:
            allocations.setdefault(d.slot_name, {})[d.device_id] = min(d.allocated, d.capacity)
    options = {
        "slot_types": {d.slot_name: d.slot_type for d in state.devices},
        "allocation_strategy": state.strategy,
        "exclusive_slot_types": state.exclusive_slot_types,
        "numa_nodes": {d.device_id: d.numa_node for d in state.devices},
    }
    if state.kind is AllocationMode.FRACTIONAL:
        return FractionAllocMap.from_state(
            capacities, allocations, quantum_size=state.quantum or D("0.01"), **options
        )
    return DiscreteAllocMap.from_state(capacities, allocations, **options)


def test_maps_of_one_layout_are_copies_of_one_template_with_their_own_allocations() -> None:
    layouts = MapLayouts()
    busy, idle = gpu_map("0.6", "0.2"), gpu_map(0, 0)
    first, second = busy.build(layouts), idle.build(layouts)
    assert layouts.kept == (1, 0)  # one layout: built once
    assert first.allocations == {"cuda.shares": {"GPU1": D("0.6"), "GPU2": D("0.2")}}
    assert second.allocations == {"cuda.shares": {"GPU1": D(0), "GPU2": D(0)}}
    second.allocate({"cuda.shares": D("1.5")})
    assert first.allocations["cuda.shares"] == {"GPU1": D("0.6"), "GPU2": D("0.2")}
    assert idle.build(layouts).allocations["cuda.shares"] == {"GPU1": D(0), "GPU2": D(0)}
    assert busy.build(layouts, empty=True).allocations == {
        "cuda.shares": {"GPU1": D(0), "GPU2": D(0)}
    }


@pytest.mark.parametrize(
    "state",
    [
        gpu_map("0.6", "0.2"),
        gpu_map("0.3", "1.5", capacity="1.0"),  # over capacity: clamped to full
        gpu_map(0, "0.5", quantum="0.25", strategy="FILL"),
        cpu_map(8, used=3),
        mem_map(2**34, used=2**30),
        MapState(
            "cuda",
            AllocationMode.DISCRETE,
            (
                DeviceState("GPU1", "cuda.device", SlotTypes.COUNT, D(1), D(1), numa_node=1),
                DeviceState("GPU2", "cuda.device", SlotTypes.COUNT, D(1), D(0), numa_node=0),
            ),
            exclusive_slot_types=("cuda.device",),
        ),
    ],
    ids=["fractional", "clamped", "fill-quantum", "cores", "memory", "exclusive-numa"],
)
def test_a_built_map_behaves_like_one_built_from_scratch(state: MapState) -> None:
    layouts = MapLayouts()
    state.build(layouts)  # the template now exists: the next build is a copy
    cached, fresh = state.build(layouts), _fresh(state)
    assert cached.allocations == fresh.allocations
    assert cached.device_slots == fresh.device_slots
    assert cached.exclusive_slot_types == fresh.exclusive_slot_types
    assert cached.allocation_strategy is fresh.allocation_strategy
    slot = state.devices[0].slot_name
    for amount in (D(1), D("0.5"), D(3), D("0.25")):
        assert str(cached.check({slot: amount})) == str(fresh.check({slot: amount}))
    assert state.build(layouts, empty=True).allocations == {
        s: dict.fromkeys(per_device, D(0)) for s, per_device in fresh.allocations.items()
    }


def test_layouts_that_differ_in_anything_but_the_allocations_get_their_own_template() -> None:
    layouts = MapLayouts()
    gpu_map(0, 0).build(layouts)
    gpu_map("0.5", 0).build(layouts)  # only the trial differs: the same template
    gpu_map(0, 0, capacity="2").build(layouts)
    gpu_map(0, 0, quantum="0.25").build(layouts)
    gpu_map(0, 0, strategy="FILL").build(layouts)
    gpu_map(0, 0, 0).build(layouts)
    assert layouts.kept == (5, 0)


def test_layouts_are_bounded_and_a_build_without_them_keeps_nothing() -> None:
    layouts = MapLayouts(max_layouts=2)
    for n in range(1, 6):
        built = gpu_map(*[0] * n).build(layouts)
        assert len(built.device_slots) == n
        assert layouts.kept[0] <= 2
    alone = gpu_map("0.5", 0).build()  # no layouts: built from scratch, nothing shared
    assert alone.allocations == {"cuda.shares": {"GPU1": D("0.5"), "GPU2": D(0)}}


def test_empty_fit_verdicts_are_shared_by_layout_and_never_mixed() -> None:
    """``fits_when_empty`` remembers a verdict per (device layout, request part) across
    trials and passes: agents of one layout share it whatever they hold; a layout that
    differs only in a capacity gets its own, whichever is asked first."""
    request = {"cuda.shares": D("0.8")}
    for first, second in ((("1", True), ("0.5", False)), (("0.5", False), ("1", True))):
        layouts = MapLayouts()
        for capacity, expected in (first, second):
            fresh = TrialMaps("a", (gpu_map(0, capacity=capacity),), layouts)
            assert fresh.fits_when_empty(request) is expected, capacity
            full = TrialMaps("b", (gpu_map(capacity, capacity=capacity),), layouts)  # all held
            assert full.fits_when_empty(request) is expected, capacity
            assert isinstance(full.check(request), FitFailure)  # its real trial is full
        assert layouts.kept[1] == 2  # one verdict per layout, reused by "b"
    # the request part is part of the key: two GPUs of one layout, two amounts
    two = TrialMaps("c", (gpu_map(0, 0),))
    assert two.fits_when_empty({"cuda.shares": D("1.5")})
    assert not two.fits_when_empty({"cuda.shares": D("2.5")})
    assert TrialMaps("d", (gpu_map(1, 1),)).fits_when_empty({"cuda.shares": D("1.5")})


# -- largest_placements: a request no agent could hold even when empty --------------------------


def test_largest_placements_none_when_some_empty_agent_fits() -> None:
    full = TrialMaps("a", (gpu_map(1, 1), cpu_map(8, 8)))  # busy now, fine when empty
    assert (
        fit.largest_placements([(slots(cuda_shares=2, cpu=8), full)], slots(cuda_shares=2)) is None
    )
    assert fit.largest_placements([], slots(cuda_shares=9)) is None  # nothing to judge by


def test_largest_placements_names_each_slot_on_the_biggest_agent() -> None:
    small = TrialMaps("a", (gpu_map(0, 0), cpu_map(4)))
    big = TrialMaps("b", (gpu_map(0, 0, 0), cpu_map(2)))
    agents = [(slots(cuda_shares=2, cpu=4, mem=100), small), (slots(cuda_shares=3, cpu=2), big)]
    largest = fit.largest_placements(agents, slots(cuda_shares=4, cpu=1, mem=10, tpu=0))
    # cuda.shares: 3 GPUs of 1.0; cpu: 4 cores; mem: no per-device map, its total; tpu: 0 asked
    assert largest == {"cuda.shares": D(3), "cpu": D(4), "mem": D(100)}


def test_largest_placements_of_a_slot_no_agent_has_is_zero() -> None:
    trial = TrialMaps("a", (gpu_map(0, 0),))
    request = slots(cuda_shares="1.5", rocm_device=1)
    largest = fit.largest_placements([(slots(cuda_shares=2), trial)], request)
    assert largest == {"cuda.shares": D(2), "rocm.device": D(0)}
    assert trial.largest_when_empty("rocm.device") is None
    # an even split over empty GPUs is not fragmentation: 2.0 either way
    assert trial.largest_when_empty("cuda.shares", allow_fragmentation=False) == D(2)
