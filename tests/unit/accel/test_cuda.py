"""The cuda plugin and its NVML layer, against the fake NVML module."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest

from accelshare.accel import (
    PluginConfigError,
    PluginContext,
    PluginUnavailable,
    validate_inventory,
)
from accelshare.accel.cuda import (
    CudaDriverError,
    CudaPlugin,
    LibcudaDriver,
    PynvmlLayer,
    create_plugin,
    mig_slot_name,
    with_sm_counts,
)
from accelshare.accel.cuda.fake import FakeGpu, FakeLibcuda, FakeNvml
from accelshare.accel.cuda.nvml import mig_profile_of
from accelshare.accel.maps import build_alloc_map
from accelshare.accel.types import KernelStatTarget
from accelshare.alloc import FractionAllocMap
from accelshare.common import SlotTypes

from .builders import DISCRETE, FRACTIONAL, GIB, cuda_plugin, fake_machine, options

D = Decimal
GPU0 = "GPU-00000000-0000-0000-0000-000000000000"
GPU1 = "GPU-00000000-0000-0000-0000-000000000001"
GPU2 = "GPU-00000000-0000-0000-0000-000000000002"
MIG = [f"MIG-00000000-0000-0000-0002-{i:012d}" for i in range(3)]


def test_layer_discovers_gpus_and_mig_instances() -> None:
    nvml = fake_machine()
    layer = PynvmlLayer(nvml)
    layer.open()
    gpus = layer.gpus()
    assert [g.uuid for g in gpus] == [GPU0, GPU1, GPU2]
    assert [g.pci_bus_id for g in gpus] == ["0000:17:00.0", "0000:18:00.0", "0000:19:00.0"]
    assert [g.numa_node for g in gpus] == [0, 1, 1]
    assert [g.mig_enabled for g in gpus] == [False, False, True]
    # NVML supports nvmlDeviceGetAttributes for MIG handles only: the layer asks it for
    # the three MIG instances and leaves full GPUs' SM counts to the CUDA driver.
    assert [g.multiprocessors for g in gpus] == [None, None, None]
    assert nvml.attribute_calls == 3
    assert gpus[0].memory_bytes == 40 * GIB
    assert [
        (m.uuid, m.profile, m.memory_bytes, m.multiprocessors) for m in gpus[2].mig_instances
    ] == [
        (MIG[0], "1g.5gb", 5 * GIB, 14),
        (MIG[1], "1g.5gb", 5 * GIB, 14),
        (MIG[2], "3g.20gb", 20 * GIB, 42),
    ]
    assert gpus[2].mig_instances[2].gpu_instance_id == 3
    assert layer.driver_version() == "550.54.15"
    assert layer.cuda_driver_version() == "12.4"


def test_layer_handles_old_bindings_and_older_drivers(tmp_path: Path) -> None:
    gpu = FakeGpu.a100(0, numa_node=None)
    nvml = FakeNvml([gpu], bytes_strings=True)
    sysfs = tmp_path / "sys/bus/pci/devices/0000:17:00.0"
    sysfs.mkdir(parents=True)
    sysfs.joinpath("numa_node").write_text("1\n")
    layer = PynvmlLayer(nvml, host_root=tmp_path)
    layer.open()
    (found,) = layer.gpus()
    assert found.uuid == GPU0
    assert found.name == "NVIDIA A100-SXM4-40GB"
    assert found.numa_node == 1  # from sysfs: nvmlDeviceGetNumaNodeId is missing
    assert found.multiprocessors is None
    sysfs.joinpath("numa_node").write_text("-1\n")
    assert layer.gpus()[0].numa_node == 0  # no NUMA information: node 0


def test_full_gpu_sm_count_comes_from_the_cuda_driver() -> None:
    """An 80 GB H100: min(80 GiB / 2 GiB, 132 / 8) = 16.50 shares, not 40.00."""
    nvml = FakeNvml([FakeGpu.h100(0)])
    libcuda = nvml.libcuda()
    plugin = cuda_plugin(FRACTIONAL, nvml, libcuda)
    (device,) = plugin.inventory.devices
    assert device.capacity == D("16.50")
    assert device.processors == 132
    assert plugin.warnings == ()
    assert libcuda.loaded_names == ["libcuda.so.1"]
    assert libcuda.attribute_queries == [(16, 0)]  # CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
    discrete = cuda_plugin(DISCRETE, FakeNvml([FakeGpu.h100(0)]))
    assert [(d.capacity, d.processors) for d in discrete.inventory.devices] == [(D(1), 132)]


def test_driver_matches_gpus_by_pci_bus_id_not_by_index() -> None:
    """GPU 0 hidden from CUDA (CUDA_VISIBLE_DEVICES): CUDA ordinals shift, bus ids do not."""
    gpus = [FakeGpu.a100(0), FakeGpu.h100(1), FakeGpu.a100(2)]
    gpus[2].multiprocessors = 98
    nvml = FakeNvml(gpus)
    libcuda = nvml.libcuda(hidden_bus_ids=["0000:17:00.0"])
    plugin = cuda_plugin(DISCRETE, nvml, libcuda)
    assert [d.processors for d in plugin.inventory.devices] == [0, 132, 98]
    (warning,) = plugin.warnings
    assert warning.startswith(f"cuda: the SM count of {GPU0} (0000:17:00.0) is unknown")
    assert "CUDA_ERROR_INVALID_DEVICE (101)" in warning
    assert "CUDA_VISIBLE_DEVICES" in warning
    with pytest.raises(PluginConfigError) as info:
        cuda_plugin(FRACTIONAL, FakeNvml(gpus), FakeNvml(gpus).libcuda(hidden_bus_ids=["17:00.0"]))
    assert info.value.key == "allocation_mode"
    assert GPU0 in str(info.value)


def test_real_driver_layer_against_a_fake_libcuda() -> None:
    gpus = [FakeGpu.a100(0), FakeGpu.h100(1)]
    libcuda = FakeNvml(gpus).libcuda()
    driver = LibcudaDriver(loader=libcuda.load)
    assert driver.multiprocessor_count("0000:18:00.0") == 132
    assert driver.multiprocessor_count("00000000:17:00.0") == 108  # NVML's spelling works too
    assert libcuda.initialized
    with pytest.raises(CudaDriverError, match=r"'0000:99:00.0'.*CUDA_ERROR_INVALID_DEVICE"):
        driver.multiprocessor_count("0000:99:00.0")
    assert libcuda.loaded_names == ["libcuda.so.1"]  # loaded and initialised once


@pytest.mark.parametrize(
    ("libcuda", "message"),
    [
        pytest.param(
            {"library_missing": True},
            r"libcuda\.so\.1 cannot be loaded .*'compute' driver capability",
            id="no-libcuda",
        ),
        pytest.param(
            {"init_error": 100}, r"cuInit failed: CUDA_ERROR_NO_DEVICE \(100\)", id="cuinit"
        ),
        pytest.param({"init_error": 999}, r"cuInit failed: CUresult 999", id="unnamed-code"),
    ],
)
def test_driver_failures_are_explained_and_remembered(
    libcuda: dict[str, object], message: str
) -> None:
    fake = FakeLibcuda([FakeGpu.a100(0)], **libcuda)  # type: ignore[arg-type]
    driver = LibcudaDriver(loader=fake.load)
    for _ in range(2):
        with pytest.raises(CudaDriverError, match=message):
            driver.multiprocessor_count("0000:17:00.0")
    assert fake.loaded_names == ["libcuda.so.1"]


def test_sm_count_unknown_discrete_warns_fractional_refuses() -> None:
    nvml = FakeNvml([FakeGpu.h100(0), FakeGpu.a100(1, mig=["1g.5gb"])])
    missing = nvml.libcuda(library_missing=True)
    discrete = cuda_plugin(DISCRETE, nvml, missing)
    assert [d.processors for d in discrete.inventory.devices] == [0, 14]  # MIG: from NVML
    (warning,) = discrete.warnings
    assert "libcuda.so.1 cannot be loaded" in warning
    assert "reported as 0 processors" in warning
    with pytest.raises(PluginConfigError) as info:
        cuda_plugin(FRACTIONAL, nvml, missing)
    err = info.value
    assert (err.key, err.received) == ("allocation_mode", "fractional")
    assert str(err).startswith("config store: key 'allocation_mode': expected 'discrete' on")
    assert f"SM count of {GPU0} (0000:17:00.0) is unknown" in str(err)
    assert "libcuda.so.1 cannot be loaded" in str(err)
    assert "device_mask" in str(err)


def test_sm_count_unknown_on_a_masked_gpu_is_no_obstacle() -> None:
    nvml = FakeNvml([FakeGpu.a100(0), FakeGpu.h100(1)])
    layer = PynvmlLayer(nvml)
    layer.open()
    discovered = layer.gpus()
    gpus, unknown = with_sm_counts(discovered, {GPU0: "no driver", GPU1: 132})
    assert unknown == {GPU0: "NVML did not report it for a full GPU, and no driver"}
    plugin = CudaPlugin(layer, gpus, options(FRACTIONAL, device_mask=(GPU0,)), unknown_sm=unknown)
    assert [(d.device_id, d.capacity) for d in plugin.inventory.devices] == [(GPU1, D("16.50"))]
    assert plugin.warnings == ()


def test_a_gpu_below_one_quantum_of_shares_is_refused() -> None:
    layer = PynvmlLayer(FakeNvml([FakeGpu.a100(0)]))
    layer.open()
    gpus, _ = with_sm_counts(layer.gpus(), {GPU0: 108})
    too_big = options(FRACTIONAL, unit_mem=100 * GIB, quantum_size=D("0.5"))
    with pytest.raises(PluginConfigError) as info:
        CudaPlugin(layer, gpus, too_big)
    assert info.value.key == "unit_mem"  # memory is what limits: 40/100 = 0.40 < 0.5
    assert "0.40" in str(info.value)
    assert GPU0 in str(info.value)


async def test_create_plugin_logs_unknown_sm_counts_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    nvml = FakeNvml([FakeGpu.h100(0)])
    driver = LibcudaDriver(loader=nvml.libcuda(library_missing=True).load)
    with caplog.at_level("WARNING", logger="accelshare.accel.cuda.plugin"):
        plugin = await create_plugin(PluginContext(), nvml=PynvmlLayer(nvml), driver=driver)
    assert [r.getMessage() for r in caplog.records] == list(plugin.warnings)
    assert len(plugin.warnings) == 1
    await plugin.close()


def test_real_libcuda_without_a_gpu_says_why() -> None:
    """This machine has no NVIDIA driver: the real ctypes path must explain, not crash."""
    from accelshare.accel.cuda.nvml import PynvmlLayer as Real

    try:
        layer = Real()
        layer.open()
    except PluginUnavailable:
        with pytest.raises(CudaDriverError, match=r"libcuda\.so\.1|cuInit"):
            LibcudaDriver().multiprocessor_count("0000:17:00.0")
        return
    try:  # pragma: no cover - only on a GPU machine: the real driver gives every SM count
        gpus = [g for g in layer.gpus() if not g.mig_enabled]
        driver = LibcudaDriver()
        for gpu in gpus:
            assert driver.multiprocessor_count(gpu.pci_bus_id) > 0
    finally:
        layer.close()


@pytest.mark.parametrize(
    ("nvml", "message"),
    [
        (FakeNvml(library_missing=True), "NVML, libnvidia-ml.so"),
        (FakeNvml(driver_not_loaded=True), "driver is not loaded"),
        (FakeNvml([]), "reports no GPU"),
    ],
)
async def test_no_driver_is_unavailable_with_a_clear_message(nvml: FakeNvml, message: str) -> None:
    with pytest.raises(PluginUnavailable, match=message):
        await create_plugin(PluginContext(), nvml=PynvmlLayer(nvml))


async def test_real_pynvml_without_a_driver_is_unavailable() -> None:
    """This machine has no NVIDIA driver: the real binding must say so, not crash."""
    from accelshare.accel.cuda.nvml import PynvmlLayer as Real

    try:
        Real().open()
    except PluginUnavailable:
        pass
    else:  # pragma: no cover - only on a GPU machine
        pytest.skip("this machine has an NVIDIA driver")
    with pytest.raises(PluginUnavailable, match=r"^cuda: "):
        await create_plugin(PluginContext())


def test_discrete_inventory() -> None:
    inv = cuda_plugin().inventory
    assert inv.key == "cuda"
    assert dict(inv.slot_types) == {
        "cuda.device": SlotTypes.COUNT,
        "cuda.device:1g.5gb-mig": SlotTypes.UNIQUE,
        "cuda.device:3g.20gb-mig": SlotTypes.UNIQUE,
    }
    assert {k: str(v) for k, v in inv.capacities().items()} == {
        "cuda.device": "2",
        "cuda.device:1g.5gb-mig": "2",
        "cuda.device:3g.20gb-mig": "1",
    }
    assert [d.device_id for d in inv.devices] == [GPU0, GPU1, *MIG]
    assert inv.devices[2].mother_id == GPU2
    assert inv.devices[2].is_mig
    assert inv.exclusive_slot_types == frozenset(
        {"cuda.device", "cuda.shares", "cuda.device:*-mig"}
    )
    assert set(inv.metadata) == set(inv.slot_types)
    assert inv.extra_info["cuda_support"] is True
    assert inv.extra_info["nvidia_driver"] == "550.54.15"


def test_fractional_inventory_and_limits() -> None:
    plugin = cuda_plugin(FRACTIONAL)
    inv = plugin.inventory
    assert inv.capacities()["cuda.shares"] == D("27.00")
    assert inv.quantum_size == D("0.01")
    alloc_map = build_alloc_map(inv)
    assert isinstance(alloc_map, FractionAllocMap)
    allocation = alloc_map.allocate({"cuda.shares": D("1.5")})
    res = plugin.kernel_resources(allocation)
    (held,) = allocation["cuda.shares"]
    assert dict(res.env) == {"CUDA_VISIBLE_DEVICES": held, "NVIDIA_VISIBLE_DEVICES": held}
    assert dict(res.resource_lines) == {
        "CUDA_GLOBAL_DEVICE_IDS": f"0:{held}",
        "CUDA_RESOURCE_VIRTUALIZED": "1",
        "CUDA_MEMORY_LIMITS": f"{held}:{3 * GIB}",
        "CUDA_PROCESSOR_LIMITS": f"{held}:12",
        "CUDA_RESERVED_MEMORY": str(64 * 2**20),
    }
    assert res.device_requests == (
        {"Driver": "nvidia", "DeviceIDs": [held], "Capabilities": [["gpu"]]},
    )


def test_discrete_kernel_env_lists_uuids_in_inventory_order() -> None:
    plugin = cuda_plugin()
    res = plugin.kernel_resources({"cuda.device": {GPU1: D(1), GPU0: D(1)}})
    assert res.env["CUDA_VISIBLE_DEVICES"] == f"{GPU0},{GPU1}"
    assert res.resource_lines["CUDA_RESOURCE_VIRTUALIZED"] == "0"
    mig = plugin.kernel_resources({"cuda.device:3g.20gb-mig": {MIG[2]: D(1)}})
    assert mig.env["CUDA_VISIBLE_DEVICES"] == MIG[2]
    assert mig.attached_devices[0].memory_bytes == 20 * GIB


def test_device_mask() -> None:
    layer = PynvmlLayer(fake_machine())
    layer.open()
    gpus = layer.gpus()
    masked = CudaPlugin(layer, gpus, options(device_mask=(GPU1, MIG[0])))
    assert [d.device_id for d in masked.inventory.devices] == [GPU0, MIG[1], MIG[2]]
    whole = CudaPlugin(layer, gpus, options(device_mask=(GPU2.removeprefix("GPU-"),)))
    assert [d.device_id for d in whole.inventory.devices] == [GPU0, GPU1]
    with pytest.raises(PluginConfigError, match="device_mask"):
        CudaPlugin(layer, gpus, options(device_mask=("GPU-nope",)))


async def test_stats_from_nvml() -> None:
    nvml = fake_machine()
    plugin = cuda_plugin(DISCRETE, nvml)
    metrics = {m.key: m for m in await plugin.node_stats()}
    assert metrics["cuda_mem"].per_device[GPU0].value == 10 * GIB
    assert metrics["cuda_mem"].per_device[GPU0].capacity == 40 * GIB
    assert metrics["cuda_util"].per_device[GPU0].value == 50
    assert MIG[0] not in metrics["cuda_util"].per_device  # MIG: utilisation not supported
    assert metrics["cuda_power"].per_device[GPU0].value == 60  # watts from milliwatts
    assert metrics["cuda_power"].per_device[GPU0].capacity == 400
    assert metrics["cuda_power"].per_device[MIG[0]].value == 60  # the parent GPU's
    assert metrics["cuda_temperature"].per_device[GPU0].value == 60
    nvml.gpus[0].util_percent = 90
    again = {m.key: m for m in await plugin.node_stats()}
    assert again["cuda_util"].per_device[GPU0].value == 90


async def test_kernel_stats_use_process_memory_when_pids_are_known() -> None:
    nvml = fake_machine()
    nvml.gpus[0].processes = {1234: 3 * GIB, 999: GIB}
    plugin = cuda_plugin(DISCRETE, nvml)
    kernels = {
        "with-pids": KernelStatTarget({"cuda.device": {GPU0: D(1)}}, frozenset({1234})),
        "without": KernelStatTarget({"cuda.device": {GPU0: D(1)}}),
    }
    stats = {m.key: m.per_kernel for m in await plugin.kernel_stats(kernels)}
    assert stats["cuda_mem"]["with-pids"].value == 3 * GIB
    assert stats["cuda_mem"]["with-pids"].capacity == 40 * GIB
    assert stats["cuda_mem"]["without"].value == 10 * GIB  # device fraction of what it holds
    assert stats["cuda_util"]["without"].value == 50


async def test_kernel_stats_count_mps_clients_not_the_mps_server() -> None:
    """Under MPS, NVML's compute process is the MPS server; the kernels' processes are
    its clients, listed apart with their own memory."""
    nvml = fake_machine()
    nvml.gpus[0].processes = {77: 66 * 2**20}  # nvidia-cuda-mps-server
    nvml.gpus[0].mps_processes = {1234: 2 * GIB, 5678: GIB}
    plugin = cuda_plugin(DISCRETE, nvml)
    kernels = {
        "a": KernelStatTarget({"cuda.device": {GPU0: D(1)}}, frozenset({1234})),
        "b": KernelStatTarget({"cuda.device": {GPU0: D(1)}}, frozenset({5678, 9})),
    }
    stats = {m.key: m.per_kernel for m in await plugin.kernel_stats(kernels)}
    assert stats["cuda_mem"]["a"].value == 2 * GIB
    assert stats["cuda_mem"]["b"].value == GIB


async def test_close_shuts_nvml_down_once() -> None:
    nvml = fake_machine()
    plugin = await create_plugin(PluginContext(), nvml=PynvmlLayer(nvml))
    await plugin.close()
    await plugin.close()
    assert (nvml.init_count, nvml.shutdown_count) == (1, 1)


async def test_failed_discovery_shuts_nvml_down() -> None:
    nvml = FakeNvml([])
    with pytest.raises(PluginUnavailable):
        await create_plugin(PluginContext(), nvml=PynvmlLayer(nvml))
    assert (nvml.init_count, nvml.shutdown_count) == (1, 1)


@pytest.mark.parametrize(
    ("name", "profile"),
    [
        ("NVIDIA A100-SXM4-40GB MIG 1g.5gb", "1g.5gb"),
        ("NVIDIA H100 80GB HBM3 MIG 1g.10gb+me", "1g.10gb+me"),
        ("weird", "weird"),
    ],
)
def test_mig_profile_of(name: str, profile: str) -> None:
    assert mig_profile_of(name) == profile


def test_mig_profiles_become_valid_slot_names() -> None:
    assert mig_slot_name("1g.5gb") == "cuda.device:1g.5gb-mig"
    assert mig_slot_name("1g.10gb+me") == "cuda.device:1g.10gb-me-mig"
    gpu = FakeGpu.a100(0, mig=["1g.5gb"])
    gpu.mig[0].profile = "1g.10gb+me"  # type: ignore[index]
    plugin = cuda_plugin(DISCRETE, FakeNvml([gpu]))
    validate_inventory(plugin.inventory)
    assert "cuda.device:1g.10gb-me-mig" in plugin.inventory.slot_types
