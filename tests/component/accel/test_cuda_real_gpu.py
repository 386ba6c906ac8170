"""The cuda plugin on a real NVIDIA GPU: real NVML (``pynvml``) and the real CUDA driver
(``libcuda.so.1``), compared with what ``nvidia-smi`` and PyTorch's CUDA runtime report.

These tests skip on machines without an NVIDIA GPU (CI has none); they are run by hand on a
GPU machine (docs/plugins.md, "Checked on a real GPU").  Everything else about the plugin
is tested without a GPU against the fake NVML and the fake libcuda (tests/unit/accel).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncIterator
from decimal import Decimal
from pathlib import Path

import pytest

from accelshare.accel import PluginContext
from accelshare.accel.cuda import CudaPlugin
from accelshare.accel.cuda import create_plugin as create_cuda_plugin
from accelshare.accel.options import DEFAULT_UNIT_MEM, DEFAULT_UNIT_PROC
from accelshare.accel.types import KernelStatTarget
from accelshare.common import AllocationMode
from accelshare.config import ConfigStore
from accelshare.config.embedded import EmbeddedBackend
from accelshare_testkit.gpu import (
    MIB,
    expected_shares,
    nvidia_gpu_unavailable,
    smi_compute_apps,
    smi_driver_version,
    smi_gpus,
    torch_installed,
    torch_sm_counts,
)

pytestmark = pytest.mark.skipif(
    (why := nvidia_gpu_unavailable()) is not None, reason=f"needs an NVIDIA GPU: {why}"
)


async def cuda_plugin(tmp_path: Path, mode: str) -> CudaPlugin:
    async with ConfigStore(EmbeddedBackend(tmp_path / f"{mode}.db")) as store:
        await store.put("config/plugins/accelerator/cuda/allocation_mode", mode)
        return await create_cuda_plugin(PluginContext(store=store))


@pytest.fixture
async def discrete(tmp_path: Path) -> AsyncIterator[CudaPlugin]:
    plugin = await cuda_plugin(tmp_path, "discrete")
    yield plugin
    await plugin.close()


async def test_devices_are_the_gpus_nvidia_smi_lists(discrete: CudaPlugin) -> None:
    inventory = discrete.inventory
    full = [g for g in smi_gpus() if g.mig_mode != "Enabled"]
    assert full, "this check is for full GPUs (every GPU here is in MIG mode)"
    devices = {d.device_id: d for d in inventory.devices}
    for gpu in full:
        device = devices[gpu.uuid]
        assert (device.model_name, device.hw_location) == (gpu.name, gpu.bus_id)
        assert device.slot_name == "cuda.device"
        assert device.capacity == 1
        # NVML gives bytes, nvidia-smi whole MiB of the same total.
        assert device.memory_bytes // MIB == gpu.memory_mib, (device.memory_bytes, gpu)
    assert inventory.slot_types == {"cuda.device": "count"}
    assert inventory.extra_info["nvidia_driver"] == smi_driver_version()


async def test_sm_counts_from_the_driver_match_the_cuda_runtime(discrete: CudaPlugin) -> None:
    """The full GPUs' SM counts come from ``cuDeviceGetAttribute`` matched by PCI bus id;
    PyTorch (``cudaGetDeviceProperties``, a child process) must report the same."""
    counts = torch_sm_counts()
    if counts is None:
        pytest.skip("PyTorch is not installed here (it is the independent SM count)")
    by_uuid = {d.device_id: d.processors for d in discrete.inventory.devices}
    assert {u: by_uuid[u] for u in counts} == counts
    assert all(n > 0 for n in counts.values())


async def test_asking_for_sm_counts_creates_no_cuda_context(discrete: CudaPlugin) -> None:
    """``cuInit`` + attribute queries use no GPU memory: this process is not a compute
    process on any GPU after the plugin started (``--query-compute-apps``)."""
    assert all(d.processors > 0 for d in discrete.inventory.devices)
    assert os.getpid() not in smi_compute_apps()


async def test_fractional_shares_follow_memory_and_sms(tmp_path: Path) -> None:
    counts = torch_sm_counts()
    if counts is None:
        pytest.skip("PyTorch is not installed here (it is the independent SM count)")
    plugin = await cuda_plugin(tmp_path, "fractional")
    try:
        inventory = plugin.inventory
        assert inventory.allocation_mode is AllocationMode.FRACTIONAL
        assert inventory.quantum_size == Decimal("0.01")
        shares = {d.device_id: d.capacity for d in inventory.devices}
        for gpu in smi_gpus():
            if gpu.mig_mode == "Enabled":
                continue
            # The total is between memory_mib and memory_mib + 1 MiB (nvidia-smi rounds).
            low, high = (
                expected_shares(m * MIB, counts[gpu.uuid], DEFAULT_UNIT_MEM, DEFAULT_UNIT_PROC)
                for m in (gpu.memory_mib, gpu.memory_mib + 1)
            )
            assert low <= shares[gpu.uuid] <= high, (gpu, counts[gpu.uuid], shares)
            print(f"{gpu.name}: {counts[gpu.uuid]} SMs, {gpu.memory_mib} MiB -> {shares[gpu.uuid]}")
    finally:
        await plugin.close()


ALLOCATE = """
import sys, torch
block = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")  # 1 GiB
torch.cuda.synchronize()
print("ready", flush=True)
sys.stdin.readline()
"""


async def test_stats_see_a_process_using_gpu_memory(discrete: CudaPlugin) -> None:
    """Per-kernel ``cuda_mem`` is what the kernel's processes really use (NVML by pid),
    the same MiB as nvidia-smi's ``used_memory`` for that pid; the node's readings are real."""
    if not torch_installed():
        pytest.skip("PyTorch is not installed here (it allocates the GPU memory)")
    gpu = discrete.inventory.devices[0]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": gpu.device_id}
    with subprocess.Popen(
        [sys.executable, "-c", ALLOCATE],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    ) as child:
        try:
            assert child.stdout is not None
            assert child.stdout.readline() == "ready\n"
            targets = {
                "holder": KernelStatTarget(
                    {"cuda.device": {gpu.device_id: Decimal(1)}}, frozenset({child.pid})
                ),
                "other": KernelStatTarget(
                    {"cuda.device": {gpu.device_id: Decimal(1)}}, frozenset({1})
                ),
            }
            per_kernel = {m.key: m.per_kernel for m in await discrete.kernel_stats(targets)}
            used = per_kernel["cuda_mem"]["holder"].value
            assert 1 << 30 <= used < 3 << 30, used  # the block plus the CUDA context
            assert int(used) // MIB == smi_compute_apps()[child.pid]
            assert per_kernel["cuda_mem"]["other"].value == 0
            node = {m.key: m for m in await discrete.node_stats()}
            mem = node["cuda_mem"].per_device[gpu.device_id]
            assert mem.capacity == gpu.memory_bytes
            assert used <= mem.value <= gpu.memory_bytes
            assert 0 <= node["cuda_util"].per_device[gpu.device_id].value <= 100
            power = node["cuda_power"].per_device[gpu.device_id]
            assert power.capacity is not None
            assert 0 < power.value <= power.capacity
            assert 0 < node["cuda_temperature"].per_device[gpu.device_id].value < 120
        finally:
            if child.stdin is not None:
                child.stdin.close()
            child.wait(60)
