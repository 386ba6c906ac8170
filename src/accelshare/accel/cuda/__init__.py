"""The cuda plugin: NVIDIA GPUs and MIG instances through NVML (``nvidia-ml-py``), with
full GPUs' SM counts from the CUDA driver API (``libcuda.so.1``)."""

from .driver import CudaDriver, CudaDriverError, LibcudaDriver
from .nvml import NvmlGpu, NvmlLayer, NvmlMigInstance, NvmlSample, PynvmlLayer
from .plugin import (
    CUDA_DEFAULT_QUANTUM,
    CudaPlugin,
    create_plugin,
    cuda_devices,
    mig_slot_name,
    with_sm_counts,
)

__all__ = [
    "CUDA_DEFAULT_QUANTUM",
    "CudaDriver",
    "CudaDriverError",
    "CudaPlugin",
    "LibcudaDriver",
    "NvmlGpu",
    "NvmlLayer",
    "NvmlMigInstance",
    "NvmlSample",
    "PynvmlLayer",
    "create_plugin",
    "cuda_devices",
    "mig_slot_name",
    "with_sm_counts",
]
