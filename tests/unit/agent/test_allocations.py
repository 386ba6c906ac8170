"""The agent's allocation allocations: allocate/release once, views, restore, renamed slots."""

from __future__ import annotations

import contextlib
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accelshare.agent.allocations import AgentAllocations, DeviceDetails
from accelshare.alloc import (
    AbstractAllocMap,
    AllocationStrategy,
    DeviceSlotInfo,
    DiscreteAllocMap,
    FractionAllocMap,
    InsufficientResource,
    PlanConflict,
    ResourceError,
    UnsupportedResource,
)
from accelshare.common import SlotTypes

GPU1 = "c59395cd-ac91-4cd3-a1b0-3d2568aa2d01"
GPU2 = "c59395cd-ac91-4cd3-a1b0-3d2568aa2d02"
ORDER = ("cuda", "cpu", "mem")
EXCLUSIVE = ("cuda.device", "cuda.shares", "cuda.device:*-mig")
D = Decimal


def cpu_map(cores: int = 4) -> DiscreteAllocMap:
    return DiscreteAllocMap(
        {str(i): DeviceSlotInfo(SlotTypes.COUNT, "cpu", D(1)) for i in range(cores)},
        allocation_strategy=AllocationStrategy.EVENLY,
    )


def mem_map(size: int = 16 << 30) -> DiscreteAllocMap:
    return DiscreteAllocMap(
        {"root": DeviceSlotInfo(SlotTypes.BYTES, "mem", D(size))},
        allocation_strategy=AllocationStrategy.FILL,
    )


def fgpu_map(capacity: str = "1", devices: tuple[str, ...] = (GPU1, GPU2)) -> FractionAllocMap:
    return FractionAllocMap(
        {d: DeviceSlotInfo(SlotTypes.COUNT, "cuda.shares", D(capacity)) for d in devices},
        quantum_size=D("0.1"),
        exclusive_slot_types=EXCLUSIVE,
    )


def gpu_map(devices: tuple[str, ...] = (GPU1, GPU2)) -> DiscreteAllocMap:
    return DiscreteAllocMap(
        {d: DeviceSlotInfo(SlotTypes.COUNT, "cuda.device", D(1)) for d in devices},
        exclusive_slot_types=EXCLUSIVE,
    )


def allocations(cuda: AbstractAllocMap | None = None, **kw: int) -> AgentAllocations:
    maps: dict[str, AbstractAllocMap] = {
        "cpu": cpu_map(kw.get("cores", 4)),
        "mem": mem_map(kw.get("mem", 16 << 30)),
    }
    if cuda is not None:
        maps["cuda"] = cuda
    details = {("cuda", d): DeviceDetails("CUDA GPU") for d in (GPU1, GPU2)}
    return AgentAllocations(maps, details)


def req(cpu: int = 1, mem: int = 1 << 30, **accel: str) -> dict[str, Decimal]:
    request = {"cpu": D(cpu), "mem": D(mem)}
    request.update({k.replace("_", "."): D(v) for k, v in accel.items()})
    return request


def alloc(led: AgentAllocations, kernel_id: str, request: dict[str, Decimal]) -> None:
    led.allocate(kernel_id, request, allocation_order=ORDER, affinity_policy="INTERLEAVED")


def test_canonical_fgpu_example_compat_and_full_view() -> None:
    led = allocations(fgpu_map())
    alloc(led, "k1", req(cuda_shares="0.2"))
    alloc(led, "k2", req(cuda_shares="1.2"))
    assert led.compat_view() == {GPU2: "0.80", GPU1: "0.60"}
    view = led.view("i-1").maps["cuda"]
    assert view.kind == "fractional"
    assert view.quantum == "0.1"
    assert view.strategy == "EVENLY"
    assert [(d.device_id, d.capacity, d.allocated, d.kernels) for d in view.devices] == [
        (GPU1, "1", "0.6", {"k2": "0.6"}),
        (GPU2, "1", "0.8", {"k1": "0.2", "k2": "0.6"}),
    ]
    assert [d.free for d in view.devices] == ["0.4", "0.2"]
    assert view.devices[0].model_name == "CUDA GPU"
    assert view.exclusive_slot_types == sorted(EXCLUSIVE)


def test_compat_view_strips_gpu_prefix_and_counts_whole_devices() -> None:
    led = allocations(gpu_map(("GPU-aaa", "GPU-bbb")))
    alloc(led, "k1", req(cuda_device="1"))
    assert led.compat_view() == {"aaa": "1.00", "bbb": "0.00"}
    assert allocations().compat_view() == {}  # no cuda plugin


def test_release_frees_exactly_once() -> None:
    led = allocations(fgpu_map())
    empty = led.view("i-1")
    alloc(led, "k1", req(cpu=2, cuda_shares="1.5"))
    assert led.holds("k1")
    assert led.release("k1") is True
    assert led.release("k1") is False  # second release: nothing, never a negative allocations
    assert led.view("i-1") == empty
    assert not led.holds("k1")


def test_failed_second_map_rolls_back_every_map() -> None:
    led = allocations(fgpu_map(), mem=4 << 30)
    before = led.view("i-1")
    with pytest.raises(InsufficientResource, match="mem"):
        alloc(led, "k1", req(mem=8 << 30, cuda_shares="0.5"))  # cuda and cpu fit, mem not
    assert led.view("i-1") == before
    assert not led.holds("k1")
    alloc(led, "k2", req(cuda_shares="0.5"))  # the maps still work
    assert led.holds("k2")


def test_unknown_slot_and_double_allocation_are_refused() -> None:
    led = allocations()
    with pytest.raises(UnsupportedResource):
        alloc(led, "k1", req(cuda_shares="0.5"))
    alloc(led, "k1", req())
    with pytest.raises(ValueError, match="already holds"):
        alloc(led, "k1", req())


def test_view_is_cached_until_a_change() -> None:
    led = allocations(fgpu_map())
    first = led.view("i-1")
    assert led.view("i-1") is first
    alloc(led, "k1", req(cuda_shares="0.2"))
    second = led.view("i-1")
    assert second is not first
    assert led.compat_view() == {GPU1: "0.00", GPU2: "0.20"}


def test_view_json_is_the_views_json_cached_until_a_change() -> None:
    led = allocations(fgpu_map())
    first = led.view_json("i-1")
    assert first == led.view("i-1").model_dump_json().encode()
    assert led.view_json("i-1") is first
    alloc(led, "k1", req(cuda_shares="0.2"))
    second = led.view_json("i-1")
    assert second != first
    assert b'"kernels":{"k1":"0.2"}' in second
    assert led.view_json("i-2") == second.replace(b'"i-1"', b'"i-2"', 1)


LEGACY_START = [("k-old", {"cpu": {"0": D(1)}, "cuda.device": {GPU1: D(1)}})]
Step = tuple[str, int, int, str]
STEPS = st.lists(
    st.one_of(
        st.tuples(
            st.just("alloc"),
            st.integers(1, 2),
            st.integers(1, 3),
            st.sampled_from(["0", "0.1", "0.5", "1.2"]),
        ),
        st.tuples(st.just("release"), st.integers(0, 12), st.just(0), st.just("")),
    ),
    max_size=14,
)


def apply(led: AgentAllocations, index: int, step: Step) -> None:
    kind, a, b, shares = step
    if kind == "release":
        led.release("k-old" if a == 12 else f"k{a:02}")
        return
    with contextlib.suppress(ResourceError):
        alloc(led, f"k{index:02}", req(cpu=a, mem=b << 30, cuda_shares=shares))


def replay(with_legacy: bool, steps: list[Step]) -> AgentAllocations:
    """A allocations (2 fractional GPUs of 2 shares, 8 cores) after ``steps``; with_legacy:
    started by a restart holding a renamed-slot kernel (``k-old``, 12 = its release)."""
    led = allocations(fgpu_map("2"), cores=8)
    if with_legacy:
        led.restore(LEGACY_START, old_capacities={"cuda.device": {GPU1: D(1), GPU2: D(1)}})
    for index, step in enumerate(steps):
        apply(led, index, step)
    return led


@settings(max_examples=60, deadline=None)
@given(st.booleans(), STEPS)
def test_incremental_views_equal_a_full_rebuild(with_legacy: bool, steps: list[Step]) -> None:
    """After every step, the view and JSON updated in place (only touched devices
    rebuilt) equal those of a allocations that builds them from scratch, and the JSON is
    byte for byte ``model_dump_json`` of the view."""
    led = replay(with_legacy, [])
    for done in range(len(steps) + 1):
        if done:
            apply(led, done - 1, steps[done - 1])
        data = led.view_json("i-1")
        view = led.view("i-1")
        assert data == view.model_dump_json().encode()
        scratch = replay(with_legacy, steps[:done])
        assert scratch.view("i-1") == view
        assert scratch.view_json("i-1") == data


def test_totals_per_slot() -> None:
    led = allocations(fgpu_map())
    alloc(led, "k1", req(cpu=2, mem=2 << 30, cuda_shares="1.2"))
    totals = led.totals()
    assert totals["cpu"] == (D(4), D(2))
    assert totals["mem"] == (D(16 << 30), D(2 << 30))
    assert totals["cuda.shares"] == (D(2), D("1.2"))


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 2), st.integers(1, 3), st.sampled_from(["0.1", "0.3", "0.5"])),
        min_size=1,
        max_size=6,
    )
)
def test_restore_from_recorded_allocations_reproduces_the_view(
    requests: list[tuple[int, int, str]],
) -> None:
    led = allocations(fgpu_map("2"), cores=8)
    for i, (cpu, gib, shares) in enumerate(requests):
        try:
            alloc(led, f"k{i:02}", req(cpu=cpu, mem=gib << 30, cuda_shares=shares))
        except ResourceError:
            continue
    before = led.view("i-1")
    recorded = [(k, led.recorded(k)) for k in reversed(led.kernel_ids())]  # any order
    again = allocations(fgpu_map("2"), cores=8)
    report = again.restore(recorded)
    assert again.view("i-1") == before
    assert report.legacy == ()
    assert set(report.restored) == set(led.kernel_ids())


def test_restore_clears_previous_state() -> None:
    led = allocations(fgpu_map())
    alloc(led, "k1", req(cuda_shares="0.5"))
    led.restore([])
    assert led.kernel_ids() == []
    assert led.compat_view() == {GPU1: "0.00", GPU2: "0.00"}


# -- renamed slots (spec 04) ----------------------------------------------------------------


def test_fractional_to_discrete_reserves_the_whole_device() -> None:
    led = allocations(gpu_map())
    report = led.restore(
        [("k-old", {"cpu": {"0": D(1)}, "cuda.shares": {GPU1: D("0.5")}})],
        old_capacities={"cuda.shares": {GPU1: D(1), GPU2: D(1)}},
    )
    assert report.legacy == ("k-old",)
    assert any("cuda.shares" in m and GPU1 in m for m in report.messages)
    view = led.view("i-1").maps["cuda"]
    assert view.legacy_allocations == {"cuda.shares": {GPU1: "0.5"}}
    assert [(d.device_id, d.allocated, d.kernels) for d in view.devices] == [
        (GPU1, "1", {"k-old": "0.5"}),
        (GPU2, "0", {}),
    ]
    assert led.compat_view() == {GPU1: "1.00", GPU2: "0.00"}
    assert led.recorded("k-old") == {"cpu": {"0": D(1)}, "cuda.shares": {GPU1: D("0.5")}}
    with pytest.raises(InsufficientResource):
        alloc(led, "k-new", req(cuda_device="2"))  # GPU1 is not handed out whole
    alloc(led, "k-new", req(cuda_device="1"))
    assert led.held_by_plugin("k-new")["cuda"] == {"cuda.device": {GPU2: D(1)}}
    assert led.release("k-old") is True
    view = led.view("i-1").maps["cuda"]
    assert view.legacy_allocations == {}
    assert [d.allocated for d in view.devices] == ["0", "1"]


def test_two_legacy_kernels_on_one_device_keep_it_until_both_end() -> None:
    led = allocations(gpu_map())
    led.restore(
        [
            ("k-a", {"cuda.shares": {GPU1: D("0.3")}}),
            ("k-b", {"cuda.shares": {GPU1: D("0.3"), GPU2: D("0.2")}}),
        ],
        old_capacities={"cuda.shares": {GPU1: D(1), GPU2: D(1)}},
    )
    assert led.compat_view() == {GPU1: "1.00", GPU2: "1.00"}
    led.release("k-a")
    assert led.compat_view() == {GPU1: "1.00", GPU2: "1.00"}  # k-b still holds both
    led.release("k-b")
    assert led.compat_view() == {GPU1: "0.00", GPU2: "0.00"}


def test_discrete_to_fractional_reserves_in_proportion_rounded_up_to_the_quantum() -> None:
    led = allocations(fgpu_map("13.5"))
    led.restore(
        [("k-old", {"cuda.device": {GPU1: D(1)}})],
        old_capacities={"cuda.device": {GPU1: D(1), GPU2: D(1)}},
    )
    view = led.view("i-1").maps["cuda"]
    assert [d.allocated for d in view.devices] == ["13.5", "0"]
    assert view.legacy_allocations == {"cuda.device": {GPU1: "1"}}

    led = allocations(fgpu_map("2"))
    led.restore(  # 1 of an old capacity of 3 -> 2/3 of 2 shares -> 0.7 on the 0.1 grid
        [("k-old", {"cuda.device": {GPU1: D(1)}})],
        old_capacities={"cuda.device": {GPU1: D(3)}},
    )
    assert led.compat_view()[GPU1] == "0.70"
    assert led.view("i-1").maps["cuda"].devices[0].kernels == {"k-old": "0.666667"}


def test_same_slot_with_a_new_capacity_is_applied_as_recorded() -> None:
    led = allocations(fgpu_map("2"))
    report = led.restore([("k", {"cuda.shares": {GPU1: D("0.25")}})])
    assert report.restored == ("k",)
    assert led.compat_view()[GPU1] == "0.25"


def test_unknown_old_capacity_reserves_the_whole_device() -> None:
    led = allocations(fgpu_map("2"))
    led.restore([("k-old", {"cuda.device": {GPU2: D(1)}})])
    assert led.compat_view() == {GPU1: "0.00", GPU2: "2.00"}


def test_removed_plugin_keeps_the_kernel_and_its_recorded_allocation() -> None:
    led = allocations()  # no cuda plugin any more
    report = led.restore([("k-old", {"cpu": {"1": D(1)}, "cuda.shares": {GPU1: D("0.5")}})])
    assert report.legacy == ("k-old",)
    assert led.recorded("k-old") == {"cpu": {"1": D(1)}, "cuda.shares": {GPU1: D("0.5")}}
    assert led.view("i-1").maps["cpu"].devices[1].kernels == {"k-old": "1"}
    assert led.release("k-old") is True
    assert led.view("i-1").maps["cpu"].devices[1].allocated == "0"


def test_shrunk_capacity_keeps_the_kernel_and_reserves_what_is_left() -> None:
    led = allocations(mem=4 << 30)
    report = led.restore(
        [("k-a", {"mem": {"root": D(3 << 30)}}), ("k-b", {"mem": {"root": D(3 << 30)}})]
    )
    assert report.restored == ("k-a",)
    assert report.legacy == ("k-b",)
    assert any("no longer fits" in m for m in report.messages)
    mem = led.view("i-1").maps["mem"].devices[0]
    assert mem.allocated == str(4 << 30)  # full: nothing over capacity, nothing negative
    led.release("k-a")
    assert led.view("i-1").maps["mem"].devices[0].allocated == str(1 << 30)
    led.release("k-b")
    assert led.view("i-1").maps["mem"].devices[0].allocated == "0"


def test_restart_with_legacy_holdings_gives_the_same_view() -> None:
    recorded = [
        ("k-old", {"cpu": {"0": D(1)}, "cuda.shares": {GPU1: D("0.5")}}),
        ("k-new", {"cpu": {"1": D(1)}, "cuda.device": {GPU2: D(1)}}),
    ]
    old = {"cuda.shares": {GPU1: D(1), GPU2: D(1)}}
    first, second = allocations(gpu_map()), allocations(gpu_map())
    first.restore(recorded, old_capacities=old)
    second.restore(list(reversed(recorded)), old_capacities=old)
    assert first.view("i-1") == second.view("i-1")


def test_a_plan_is_taken_as_is_and_a_conflicting_one_changes_nothing() -> None:
    allocations = AgentAllocations({"cuda": fgpu_map(), "cpu": cpu_map(), "mem": mem_map()})
    request = {"cuda.shares": D("0.2"), "cpu": D(1), "mem": D(1 << 30)}
    plan = {"cuda.shares": {GPU1: D("0.2")}, "cpu": {"3": D(1)}, "mem": {"root": D(1 << 30)}}
    allocations.allocate_planned("k1", request, plan)
    assert allocations.recorded("k1") == plan
    assert allocations.compat_view() == {GPU1: "0.20", GPU2: "0.00"}
    view = allocations.view_json("i-test")
    version = allocations.version
    # GPU1 has 0.8 free, cpu 3 is taken: the plan no longer fits, nothing is recorded
    stale = {"cuda.shares": {GPU1: D("0.5")}, "cpu": {"3": D(1)}, "mem": {"root": D(1 << 30)}}
    with pytest.raises(PlanConflict):
        allocations.allocate_planned("k2", {**request, "cuda.shares": D("0.5")}, stale)
    assert not allocations.holds("k2")
    assert (allocations.version, allocations.view_json("i-test")) == (version, view)
    with pytest.raises(ValueError, match="already holds"):
        allocations.allocate_planned("k1", request, plan)
    assert allocations.release("k1")
    assert allocations.compat_view() == {GPU1: "0.00", GPU2: "0.00"}
