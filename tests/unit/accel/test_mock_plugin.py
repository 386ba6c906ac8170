"""The mock plugin over the shipped sample configurations, in both modes."""

from __future__ import annotations

import dataclasses
import itertools
from decimal import Decimal
from pathlib import Path

import pytest

from accelshare.accel import ComputePlugin, PluginContext
from accelshare.accel.errors import PluginConfigError
from accelshare.accel.maps import build_alloc_map
from accelshare.accel.mock import MockPlugin, load_mock_config
from accelshare.accel.mock import create_plugin as create_mock
from accelshare.accel.mock.plugin import device_loads
from accelshare.accel.stats import DeviceLoad, memory_baseline
from accelshare.accel.types import KernelStatTarget
from accelshare.alloc import FractionAllocMap, InvalidResourceCombination
from accelshare.common import SlotTypes
from accelshare.config.agent_file import load_agent_config

from .builders import DISCRETE, FRACTIONAL, GIB, SAMPLES, U, mock_plugin, options

D = Decimal
CUDA_EXCLUSIVE = frozenset({"cuda.device", "cuda.shares", "cuda.device:*-mig"})


def capacities(plugin: MockPlugin) -> dict[str, str]:
    return {slot: str(amount) for slot, amount in plugin.inventory.capacities().items()}


# -- slots and capacities --------------------------------------------------------------


def test_mock_accelerator_discrete() -> None:
    plugin = mock_plugin("mock-accelerator.toml")
    inv = plugin.inventory
    assert inv.key == "cuda"
    assert dict(inv.slot_types) == {"cuda.device": SlotTypes.COUNT}
    assert capacities(plugin) == {"cuda.device": "4"}
    assert [d.device_id for d in inv.devices] == [f"{U}{i}" for i in range(1, 5)]
    assert [d.numa_node for d in inv.devices] == [0, 1, 0, 1]
    assert {(d.model_name, d.memory_bytes, d.processors) for d in inv.devices} == {
        ("CUDA GPU", 40 * GIB, 108)
    }
    assert inv.exclusive_slot_types == CUDA_EXCLUSIVE
    assert inv.quantum_size is None
    assert inv.strategy == "EVENLY"
    assert inv.extra_info == {
        "cuda_support": True,
        "nvidia_driver": "450.00.00",
        "cuda_runtime": "11.0",
    }


def test_mock_accelerator_fractional_default_units() -> None:
    plugin = mock_plugin("mock-accelerator.toml", FRACTIONAL)
    inv = plugin.inventory
    assert dict(inv.slot_types) == {"cuda.shares": SlotTypes.COUNT}
    assert [str(d.capacity) for d in inv.devices] == ["13.50"] * 4
    assert capacities(plugin) == {"cuda.shares": "54.00"}
    assert inv.quantum_size == D("0.1")


def test_mock_accelerator_fractional_custom_units() -> None:
    plugin = mock_plugin("mock-accelerator.toml", FRACTIONAL, unit_mem=GIB, unit_proc=10)
    assert [str(d.capacity) for d in plugin.inventory.devices] == ["10.80"] * 4
    assert capacities(plugin) == {"cuda.shares": "43.20"}


MIG_SLOTS = {
    "cuda.device:20g-mig": "1",
    "cuda.device:10g-mig": "2",
    "cuda.device:5g-mig": "4",
}


def test_cuda_mock_mig_discrete() -> None:
    plugin = mock_plugin("cuda-mock-mig.toml")
    inv = plugin.inventory
    assert capacities(plugin) == {"cuda.device": "2", **MIG_SLOTS}
    assert list(inv.slot_types) == ["cuda.device", *MIG_SLOTS]
    assert {inv.slot_types[s] for s in MIG_SLOTS} == {SlotTypes.UNIQUE}
    mig = [d for d in inv.devices if d.is_mig]
    assert [d.device_id for d in mig][:3] == [f"MIG-{U}3/{i}/0" for i in (2, 3, 4)]
    assert mig[0].mother_id == f"{U}3"
    assert [d.hw_location for d in mig][-1] == "0000:99:08.0"
    assert set(inv.metadata) == set(inv.slot_types)
    assert inv.metadata["cuda.device:10g-mig"].slot_name == "cuda.device:10g-mig"
    assert inv.metadata["cuda.device:10g-mig"].human_readable_name == "MIG GPU"


def test_cuda_mock_mig_fractional() -> None:
    plugin = mock_plugin("cuda-mock-mig.toml", FRACTIONAL)
    assert capacities(plugin) == {"cuda.shares": "27.00", **MIG_SLOTS}
    assert {str(d.capacity) for d in plugin.inventory.devices if d.is_mig} == {"1"}


def test_rocm_mock() -> None:
    discrete = mock_plugin("rocm-mock.toml")
    assert discrete.inventory.key == "rocm"
    assert capacities(discrete) == {"rocm.device": "4"}
    assert discrete.inventory.exclusive_slot_types == frozenset()
    assert {d.model_name for d in discrete.inventory.devices} == {"AMD MI250"}
    fractional = mock_plugin("rocm-mock.toml", FRACTIONAL)
    assert capacities(fractional) == {"rocm.shares": "54.00"}
    assert fractional.inventory.metadata["rocm.shares"].display_unit == "fGPU"
    assert fractional.inventory.extra_info["rocm_support"] is True


def test_two_fgpu() -> None:
    assert capacities(mock_plugin("two-fgpu.toml")) == {"cuda.device": "2"}
    plugin = mock_plugin("two-fgpu.toml", FRACTIONAL)
    assert capacities(plugin) == {"cuda.shares": "2.00"}
    assert [str(d.capacity) for d in plugin.inventory.devices] == ["1.00", "1.00"]
    assert [d.numa_node for d in plugin.inventory.devices] == [0, 1]


# -- device_mask ------------------------------------------------------------------------


@pytest.mark.parametrize("mode", [DISCRETE, FRACTIONAL])
def test_device_mask_removes_devices_from_slots_allocation_and_stats(mode: object) -> None:
    plugin = mock_plugin("mock-accelerator.toml", mode, device_mask=(f"{U}2", f"{U}4"))  # type: ignore[arg-type]
    inv = plugin.inventory
    assert [d.device_id for d in inv.devices] == [f"{U}1", f"{U}3"]
    expected = {"cuda.device": "2"} if mode is DISCRETE else {"cuda.shares": "27.00"}
    assert capacities(plugin) == expected
    alloc_map = build_alloc_map(inv)
    assert set(alloc_map.device_slots) == {f"{U}1", f"{U}3"}


async def test_masked_devices_have_no_stats() -> None:
    plugin = mock_plugin("mock-accelerator.toml", device_mask=(f"{U}2",))
    metrics = await plugin.node_stats()
    for metric in metrics:
        assert f"{U}2" not in metric.per_device
        assert len(metric.per_device) == 3


def test_device_mask_by_mother_uuid_masks_all_its_slices() -> None:
    plugin = mock_plugin("cuda-mock-mig.toml", device_mask=(f"{U}4", f"MIG-{U}3/3/0"))
    assert capacities(plugin) == {
        "cuda.device": "2",
        "cuda.device:20g-mig": "1",
        "cuda.device:10g-mig": "1",
    }


def test_device_mask_of_an_unknown_device_is_an_error() -> None:
    opts = options(device_mask=("nope",), sources={"device_mask": "config store X/"})
    with pytest.raises(PluginConfigError) as info:
        MockPlugin(load_mock_config(SAMPLES / "mock-accelerator.toml"), opts)
    assert info.value.key == "device_mask"
    assert str(info.value).startswith("config store X/: key 'device_mask'")
    assert "'nope'" in str(info.value)


def test_empty_device_list_in_the_file_is_refused(tmp_path: Path) -> None:
    text = (SAMPLES / "two-fgpu.toml").read_text()
    head = text.split("[[devices]]", 1)[0]
    path = tmp_path / "mock-accelerator.toml"
    path.write_text("devices = []\n" + head)  # top level: before the first table
    with pytest.raises(PluginConfigError) as info:
        load_mock_config(path)
    assert str(info.value) == (
        f"{path}: key 'devices': expected at least one [[devices]] table "
        "(a mock plugin needs devices), received []"
    )


def test_a_device_below_one_quantum_of_shares_is_refused_in_fractional_mode() -> None:
    """two-fgpu.toml has 2 GiB devices; with unit_mem = 64 GiB each would be 0.03 shares."""
    config = load_mock_config(SAMPLES / "two-fgpu.toml")
    opts = options(FRACTIONAL, unit_mem=64 * GIB, sources={"unit_mem": "config store Y/"})
    with pytest.raises(PluginConfigError) as info:
        MockPlugin(config, opts)
    err = info.value
    assert (err.source, err.key, err.received) == ("config store Y/", "unit_mem", 64 * GIB)
    assert f"device '{U}1' ({2 * GIB} bytes of memory, 108 processors)" in str(err)
    assert "at least one quantum (0.1) of shares, instead of 0.03" in str(err)
    zero = options(FRACTIONAL, unit_mem=256 * GIB, quantum_size=Decimal("0.01"))
    with pytest.raises(PluginConfigError, match=r"instead of 0\.00"):
        MockPlugin(config, zero)
    # the same units are fine in discrete mode (no shares), and one quantum is enough
    assert capacities(MockPlugin(config, options(DISCRETE, unit_mem=256 * GIB))) == {
        "cuda.device": "2"
    }
    one_quantum = options(FRACTIONAL, unit_mem=20 * GIB)
    assert capacities(MockPlugin(config, one_quantum)) == {"cuda.shares": "0.20"}


async def test_masking_every_device_is_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    plugin = mock_plugin("two-fgpu.toml", device_mask=(f"{U}1", f"{U}2"))
    assert capacities(plugin) == {"cuda.device": "0"}
    (warning,) = plugin.warnings
    assert "hides every device" in warning
    assert mock_plugin("two-fgpu.toml").warnings == ()
    agent_toml = tmp_path / "agent.toml"
    agent_toml.write_text(f'[agent]\nmock-accelerator-config = "{SAMPLES / "two-fgpu.toml"}"\n')
    with caplog.at_level("WARNING", logger="accelshare.accel.mock.plugin"):
        await create_mock(PluginContext(load_agent_config(agent_toml)))
    assert caplog.records == []  # nothing masked, nothing logged


# -- allocation maps --------------------------------------------------------------------


def test_canonical_fractional_example() -> None:
    """two-fgpu.toml, fractional: 0.2 then 1.2 -> allocated amounts 2d01: 0.6, 2d02: 0.8."""
    alloc_map = build_alloc_map(mock_plugin("two-fgpu.toml", FRACTIONAL).inventory)
    assert isinstance(alloc_map, FractionAllocMap)
    assert alloc_map.quantum_size == D("0.1")
    first = alloc_map.allocate({"cuda.shares": D("0.2")})
    assert first == {"cuda.shares": {f"{U}2": D("0.2")}}
    second = alloc_map.allocate({"cuda.shares": D("1.2")})
    assert second == {"cuda.shares": {f"{U}1": D("0.6"), f"{U}2": D("0.6")}}
    assert alloc_map.allocations["cuda.shares"] == {f"{U}1": D("0.6"), f"{U}2": D("0.8")}


def test_mig_exclusive_set_is_enforced_by_the_map() -> None:
    alloc_map = build_alloc_map(mock_plugin("cuda-mock-mig.toml").inventory)
    with pytest.raises(InvalidResourceCombination):
        alloc_map.allocate({"cuda.device": D(1), "cuda.device:10g-mig": D(1)})
    got = alloc_map.allocate({"cuda.device:10g-mig": D(1)})
    assert list(got) == ["cuda.device:10g-mig"]


# -- what a kernel gets -----------------------------------------------------------------

FRACTIONAL_LINES = {
    "CUDA_GLOBAL_DEVICE_IDS": f"0:{U}1,1:{U}2",
    "CUDA_RESOURCE_VIRTUALIZED": "1",
    "CUDA_MEMORY_LIMITS": f"{U}1:1288490188,{U}2:1288490188",
    "CUDA_PROCESSOR_LIMITS": f"{U}1:4,{U}2:4",
    "CUDA_RESERVED_MEMORY": "67108864",
}


def test_two_fgpu_fractional_env_and_resource_lines() -> None:
    plugin = mock_plugin("two-fgpu.toml", FRACTIONAL)
    allocation = build_alloc_map(plugin.inventory).allocate({"cuda.shares": D("1.2")})
    res = plugin.kernel_resources(allocation)
    assert dict(res.env) == {
        "BACKENDAI_MOCK_CUDA_DEVICES": f"{U}1,{U}2",
        "BACKENDAI_MOCK_CUDA_DEVICE_COUNT": "2",
        "TF_MIN_GPU_MULTIPROCESSOR_COUNT": "4",
    }
    assert dict(res.resource_lines) == FRACTIONAL_LINES
    assert list(res.resource_lines) == list(FRACTIONAL_LINES)  # written in this order
    assert [(a.device_id, a.memory_bytes, a.processors) for a in res.attached_devices] == [
        (f"{U}1", 1288490188, 4),
        (f"{U}2", 1288490188, 4),
    ]
    assert res.device_nodes == ()
    assert res.device_requests == ()
    assert res.mounts == ()


def test_kernel_resources_do_not_depend_on_allocation_order() -> None:
    plugin = mock_plugin("two-fgpu.toml", FRACTIONAL)
    forward = {"cuda.shares": {f"{U}1": D("0.6"), f"{U}2": D("0.6")}}
    backward = {"cuda.shares": {f"{U}2": D("0.6"), f"{U}1": D("0.6")}}
    assert plugin.kernel_resources(forward) == plugin.kernel_resources(backward)
    assert dict(plugin.kernel_resources(backward).resource_lines) == FRACTIONAL_LINES


def test_discrete_env_and_lines() -> None:
    plugin = mock_plugin("mock-accelerator.toml")
    res = plugin.kernel_resources({"cuda.device": {f"{U}3": D(1), f"{U}1": D(1), f"{U}2": D(0)}})
    assert res.env["BACKENDAI_MOCK_CUDA_DEVICES"] == f"{U}1,{U}3"
    assert res.env["BACKENDAI_MOCK_CUDA_DEVICE_COUNT"] == "2"
    assert dict(res.resource_lines) == {
        "CUDA_GLOBAL_DEVICE_IDS": f"0:{U}1,1:{U}3",
        "CUDA_RESOURCE_VIRTUALIZED": "0",
    }
    assert "CUDA_VISIBLE_DEVICES" not in res.env  # there is no real device


def test_mig_slice_in_fractional_mode_is_not_virtualized() -> None:
    plugin = mock_plugin("cuda-mock-mig.toml", FRACTIONAL)
    res = plugin.kernel_resources({"cuda.device:20g-mig": {f"MIG-{U}3/2/0": D(1)}})
    assert dict(res.resource_lines) == {
        "CUDA_GLOBAL_DEVICE_IDS": f"0:MIG-{U}3/2/0",
        "CUDA_RESOURCE_VIRTUALIZED": "0",
    }
    assert res.attached_devices[0].memory_bytes == 20 * GIB


def test_rocm_env_has_its_own_key_and_no_cuda_lines() -> None:
    plugin = mock_plugin("rocm-mock.toml")
    res = plugin.kernel_resources({"rocm.device": {f"{U}4": D(1)}})
    assert dict(res.env) == {
        "BACKENDAI_MOCK_ROCM_DEVICES": f"{U}4",
        "BACKENDAI_MOCK_ROCM_DEVICE_COUNT": "1",
    }
    assert dict(res.resource_lines) == {}


def test_empty_allocation_gives_nothing() -> None:
    plugin = mock_plugin("mock-accelerator.toml")
    assert plugin.kernel_resources({}) == plugin.kernel_resources({"cpu": {"0": D(1)}})
    assert dict(plugin.kernel_resources({"cuda.device": {f"{U}1": D(0)}}).env) == {}


def test_allocation_from_another_map_is_refused() -> None:
    plugin = mock_plugin("mock-accelerator.toml")
    with pytest.raises(ValueError, match="does not have"):
        plugin.kernel_resources({"cuda.device": {"GPU-x": D(1)}})
    with pytest.raises(ValueError, match="does not declare"):
        plugin.kernel_resources({"cuda.shares": {f"{U}1": D("0.5")}})
    mig = mock_plugin("cuda-mock-mig.toml")
    with pytest.raises(ValueError, match="belongs to"):
        mig.kernel_resources({"cuda.device": {f"MIG-{U}3/2/0": D(1)}})


# -- stats ------------------------------------------------------------------------------


def seeded(smoothing: str, seed: int = 7) -> MockPlugin:
    config = load_mock_config(SAMPLES / "two-fgpu.toml")
    config = dataclasses.replace(config, stats_smoothing=smoothing, stats_seed=seed)
    return MockPlugin(config, options(FRACTIONAL))


async def test_stats_metrics_and_ranges() -> None:
    plugin = mock_plugin("mock-accelerator.toml")
    plugin.observe_allocations({"k": {"cuda.device": {f"{U}1": D(1), f"{U}3": D(1)}}})
    for _ in range(50):
        metrics = {m.key: m for m in await plugin.node_stats()}
        assert list(metrics) == ["cuda_mem", "cuda_util", "cuda_power", "cuda_temperature"]
        units = {k: m.unit for k, m in metrics.items()}
        assert units == {
            "cuda_mem": "bytes",
            "cuda_util": "percent",
            "cuda_power": "watts",
            "cuda_temperature": "celsius",
        }
        for device_id, m in metrics["cuda_mem"].per_device.items():
            assert m.capacity == 40 * GIB
            if device_id in (f"{U}1", f"{U}3"):  # held whole: baseline + U(0.2, 1) of it
                assert 0.2 * 40 * GIB <= m.value <= 40 * GIB, device_id
            else:  # free: the baseline only
                assert m.value == memory_baseline(40 * GIB), device_id
        for device_id, m in metrics["cuda_util"].per_device.items():
            assert 0 <= m.value <= 100
            assert m.capacity == 100
            assert (m.value >= 70) if device_id in (f"{U}1", f"{U}3") else (m.value == 0)
        for m in metrics["cuda_power"].per_device.values():
            assert 0 <= m.value <= 250
            assert m.capacity == 250
        for m in metrics["cuda_temperature"].per_device.values():
            assert 0 <= m.value <= 120
            assert m.capacity == 120
        assert metrics["cuda_mem"].node.capacity == 160 * GIB
        assert metrics["cuda_util"].node.capacity == 400


async def test_a_free_mock_gpu_idles() -> None:
    """Issue #33: a free mock GPU showed 62 %, 1.75 GiB used and 94 °C."""
    plugin = mock_plugin("mock-accelerator.toml", FRACTIONAL)
    for _ in range(20):
        metrics = {m.key: m for m in await plugin.node_stats()}
        for device_id in metrics["cuda_util"].per_device:
            assert metrics["cuda_util"].per_device[device_id].value == 0
            assert metrics["cuda_mem"].per_device[device_id].value == 256 * 2**20
            assert metrics["cuda_temperature"].per_device[device_id].value < 45
            assert metrics["cuda_power"].per_device[device_id].value < 70


def test_device_loads_sum_what_the_kernels_hold() -> None:
    plugin = mock_plugin("two-fgpu.toml", FRACTIONAL)  # 1.0 share of 2 GiB each
    opts = plugin.options
    loads = device_loads(
        plugin.inventory,
        opts,
        [
            {"cuda.shares": {f"{U}1": D("0.2")}},
            {"cuda.shares": {f"{U}1": D("0.4"), f"{U}2": D("1.0")}},
            {"cuda.device": {f"{U}1": D(1)}},  # not a slot in this mode: skipped
            {"cuda.shares": {"GPU-gone": D("0.5")}},  # not a device here: skipped
            {"cuda.shares": {f"{U}2": D(0)}},
        ],
    )
    assert loads == {
        f"{U}1": DeviceLoad(D("0.6"), opts.limits(D("0.2"))[0] + opts.limits(D("0.4"))[0]),
        f"{U}2": DeviceLoad(D(1), 2 * GIB),
    }
    mig = mock_plugin("cuda-mock-mig.toml")
    assert device_loads(
        mig.inventory, mig.options, [{"cuda.device:10g-mig": {f"MIG-{U}3/3/0": D(1)}}]
    ) == {f"MIG-{U}3/3/0": DeviceLoad(D(1), 10 * GIB)}
    shares = mock_plugin("mock-accelerator.toml", FRACTIONAL)  # 13.50 shares of 40 GiB
    (load,) = device_loads(
        shares.inventory, shares.options, [{"cuda.shares": {f"{U}4": D("2.7")}}]
    ).values()
    assert load == DeviceLoad(D("0.2"), shares.options.limits(D("2.7"))[0])


async def test_readings_follow_allocations_as_they_come_and_go() -> None:
    plugin = seeded("ema")
    held = {"k": {"cuda.shares": {f"{U}1": D("0.5")}}}

    async def util() -> dict[str, Decimal]:
        metric = {m.key: m for m in await plugin.node_stats()}["cuda_util"]
        return {device: m.value for device, m in metric.per_device.items()}

    assert await util() == {f"{U}1": 0, f"{U}2": 0}
    plugin.observe_allocations(held)
    rising = [await util() for _ in range(30)]
    assert all(r[f"{U}2"] == 0 for r in rising)
    assert rising[0][f"{U}1"] <= D("0.3") * 100  # smoothed: it rises over ticks
    assert 35 <= rising[-1][f"{U}1"] <= 50  # 0.5 × U(70, 100)
    plugin.observe_allocations({})
    assert await util() == {f"{U}1": 0, f"{U}2": 0}  # released: the work stops


@pytest.mark.parametrize("smoothing", ["none", "ema", "random-walk"])
async def test_seed_makes_stats_reproducible(smoothing: str) -> None:
    first, second = seeded(smoothing), seeded(smoothing)
    held = {"k": {"cuda.shares": {f"{U}1": D("0.7")}}}
    first.observe_allocations(held)
    second.observe_allocations(held)
    for _ in range(5):
        assert await first.node_stats() == await second.node_stats()
    assert await seeded(smoothing, seed=1).node_stats() != await seeded(smoothing, 2).node_stats()


async def test_smoothing_makes_stats_move_less() -> None:
    def total_jump(values: list[Decimal]) -> Decimal:
        return sum((abs(a - b) for a, b in itertools.pairwise(values)), D(0))

    series: dict[str, list[Decimal]] = {}
    for smoothing in ("none", "ema", "random-walk"):
        plugin = seeded(smoothing)
        plugin.observe_allocations({"k": {"cuda.shares": {f"{U}1": D("0.8")}}})
        values = []
        for _ in range(200):
            util = {m.key: m for m in await plugin.node_stats()}["cuda_util"]
            values.append(util.per_device[f"{U}1"].value)
        series[smoothing] = values
    assert total_jump(series["ema"]) < total_jump(series["none"]) / 2
    assert total_jump(series["random-walk"]) < total_jump(series["none"]) / 2


async def test_kernel_stats_are_each_kernels_part_of_the_load() -> None:
    plugin = seeded("none")
    allocations = {
        "k-small": {"cuda.shares": {f"{U}1": D("0.2")}},
        "k-two": {"cuda.shares": {f"{U}1": D("0.4"), f"{U}2": D("1.0")}},
        "k-none": {},
    }
    plugin.observe_allocations(allocations)
    node = {m.key: m for m in await plugin.node_stats()}
    util_1 = node["cuda_util"].per_device[f"{U}1"].value
    util_2 = node["cuda_util"].per_device[f"{U}2"].value
    used_1 = node["cuda_mem"].per_device[f"{U}1"].value
    assert util_1 > 0
    assert util_2 > 0
    kernels = {k: KernelStatTarget(a) for k, a in allocations.items()}
    stats = {m.key: m.per_kernel for m in await plugin.kernel_stats(kernels)}
    # 2d01 is 0.6 allocated: k-small accounts for a third of its load, k-two for two.
    third = (util_1 * D("0.2") / D("0.6")).quantize(D("0.1"))
    assert stats["cuda_util"]["k-small"].value == third
    assert stats["cuda_util"]["k-small"].capacity == 100
    assert stats["cuda_util"]["k-two"].capacity == 200
    two_thirds = (util_1 * D("0.4") / D("0.6")).quantize(D("0.1"))
    assert stats["cuda_util"]["k-two"].value == two_thirds + util_2  # 2d02 is all its own
    small = stats["cuda_mem"]["k-small"]
    assert small.capacity == plugin.options.limits(D("0.2"))[0]
    assert 0 < small.value <= small.capacity
    assert small.value <= (used_1 * D("0.2") / D("0.6")).to_integral_value() + 1
    assert stats["cuda_mem"]["k-none"].value == 0
    assert stats["cuda_util"]["k-none"].capacity == 0


async def test_kernel_stats_alone_take_a_tick_with_the_observed_load() -> None:
    plugin = seeded("none")
    allocation = {"cuda.shares": {f"{U}2": D(1)}}
    plugin.observe_allocations({"k": allocation})
    stats = {
        m.key: m.per_kernel for m in await plugin.kernel_stats({"k": KernelStatTarget(allocation)})
    }
    assert stats["cuda_util"]["k"].value >= 70


# -- metadata ---------------------------------------------------------------------------


def test_metadata_for_the_slot_of_the_mode() -> None:
    discrete = mock_plugin("mock-accelerator.toml").inventory.metadata
    assert list(discrete) == ["cuda.device"]
    assert discrete["cuda.device"].to_json() == {
        "slot_name": "cuda.device",
        "human_readable_name": "GPU",
        "description": "CUDA-capable GPU",
        "display_unit": "GPU",
        "number_format": {"binary": False, "round_length": 0},
        "display_icon": "gpu1",
    }
    fractional = mock_plugin("mock-accelerator.toml", FRACTIONAL).inventory.metadata
    assert list(fractional) == ["cuda.shares"]
    assert fractional["cuda.shares"].display_unit == "fGPU"
    assert fractional["cuda.shares"].number_format.round_length == 2


def test_agent_style_allocation_over_every_plugin_with_numa_affinity() -> None:
    """What the agent does: one map per plugin, allocate_kernel, then kernel resources."""
    from accelshare.alloc import allocate_kernel

    from .builders import cpu_plugin, mem_plugin

    plugins: dict[str, ComputePlugin] = {
        "cuda": mock_plugin("two-fgpu.toml"),  # 2d01 on NUMA 0, 2d02 on NUMA 1
        "cpu": cpu_plugin(),  # cores 0, 1 on NUMA 0; core 2 on NUMA 1
        "mem": mem_plugin(),
    }
    maps = {key: build_alloc_map(p.inventory) for key, p in plugins.items()}
    maps["cuda"].allocate({"cuda.device": D(1)})  # someone holds one GPU already
    kernel = allocate_kernel(
        maps,
        {"cuda.device": D(1), "cpu": D(1), "mem": D(GIB)},
        allocation_order=["cuda", "cpu", "mem"],
    )
    (gpu,) = kernel["cuda"]["cuda.device"]
    gpu_node = plugins["cuda"].inventory.device(gpu).numa_node
    (core,) = kernel["cpu"]["cpu"]
    assert plugins["cpu"].inventory.device(core).numa_node == gpu_node
    env: dict[str, str] = {}
    for key, allocation in kernel.items():
        env.update(plugins[key].kernel_resources(allocation).env)
    assert env["BACKENDAI_MOCK_CUDA_DEVICES"] == gpu
    assert env["OMP_NUM_THREADS"] == "1"
