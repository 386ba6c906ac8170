"""The cuda plugin: NVIDIA GPUs and MIG instances through NVML (``nvidia-ml-py``)."""

from .nvml import NvmlGpu, NvmlLayer, NvmlMigInstance, NvmlSample, PynvmlLayer
from .plugin import CUDA_DEFAULT_QUANTUM, CudaPlugin, create_plugin, cuda_devices, mig_slot_name

__all__ = [
    "CUDA_DEFAULT_QUANTUM",
    "CudaPlugin",
    "NvmlGpu",
    "NvmlLayer",
    "NvmlMigInstance",
    "NvmlSample",
    "PynvmlLayer",
    "create_plugin",
    "cuda_devices",
    "mig_slot_name",
]
