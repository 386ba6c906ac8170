"""Builders for compute-plugin tests: sample configs, options, fake machines."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

from accelshare.accel.cpu import CPUPlugin, plan_cpu_cores
from accelshare.accel.cuda import CudaPlugin, LibcudaDriver, PynvmlLayer, with_sm_counts
from accelshare.accel.cuda.fake import FakeGpu, FakeLibcuda, FakeNvml
from accelshare.accel.cuda.plugin import query_sm_counts
from accelshare.accel.mem import MemoryPlugin
from accelshare.accel.mock import MockPlugin, load_mock_config
from accelshare.accel.options import AcceleratorOptions
from accelshare.common import AllocationMode

REPO = Path(__file__).resolve().parents[3]
SAMPLES = REPO / "configs" / "accelerator"
SAMPLE_NAMES = ("mock-accelerator.toml", "cuda-mock-mig.toml", "rocm-mock.toml", "two-fgpu.toml")
GIB = 2**30
U = "c59395cd-ac91-4cd3-a1b0-3d2568aa2d0"  # + 1..4: the sample device ids

DISCRETE = AllocationMode.DISCRETE
FRACTIONAL = AllocationMode.FRACTIONAL


def options(mode: AllocationMode = DISCRETE, **kwargs: object) -> AcceleratorOptions:
    return AcceleratorOptions(allocation_mode=mode, **kwargs)  # type: ignore[arg-type]


def mock_plugin(name: str, mode: AllocationMode = DISCRETE, **kwargs: object) -> MockPlugin:
    return MockPlugin(load_mock_config(SAMPLES / name), options(mode, **kwargs))


def cpu_plugin() -> CPUPlugin:
    cores = plan_cpu_cores(
        {0, 1, 2, 3},
        numa_nodes={0: 0, 1: 0, 2: 1, 3: 1},
        cgroup_cores=None,
        reserved=1,
        fixed_count=None,
    )
    return CPUPlugin(cores)


def mem_plugin() -> MemoryPlugin:
    return MemoryPlugin(8 * GIB)


def fake_machine() -> FakeNvml:
    """Two full A100s (NUMA 0, 1) and one A100 split into 1g.5gb, 1g.5gb, 3g.20gb."""
    gpus = [
        FakeGpu.a100(0, numa_node=0),
        FakeGpu.a100(1, numa_node=1),
        FakeGpu.a100(2, mig=["1g.5gb", "1g.5gb", "3g.20gb"], numa_node=1),
    ]
    gpus[0].mem_used, gpus[0].util_percent, gpus[0].temperature_c = 10 * GIB, 50, 60
    return FakeNvml(gpus)


def cuda_plugin(
    mode: AllocationMode = DISCRETE,
    nvml: FakeNvml | None = None,
    libcuda: FakeLibcuda | None = None,
) -> CudaPlugin:
    """The cuda plugin over a fake machine, discovered as ``create_plugin`` does (NVML,
    then the CUDA driver for full GPUs' SM counts), without the config store."""
    nvml = nvml or fake_machine()
    layer = PynvmlLayer(nvml)
    layer.open()
    driver = LibcudaDriver(loader=(libcuda or nvml.libcuda()).load)
    discovered = layer.gpus()
    gpus, unknown_sm = with_sm_counts(discovered, query_sm_counts(discovered, driver))
    return CudaPlugin(
        layer,
        gpus,
        options(mode, quantum_size=Decimal("0.01")),
        driver_version=layer.driver_version(),
        cuda_version=layer.cuda_driver_version(),
        unknown_sm=unknown_sm,
    )
