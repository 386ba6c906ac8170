"""The streaming-multiprocessor (SM) count of full GPUs, from the CUDA driver API.

Why not NVML: ``nvmlDeviceGetAttributes(_v2)`` is documented for MIG device handles
only, so on a full GPU NVML cannot tell the SM count.  The CUDA driver
(``libcuda.so.1``, shipped with the NVIDIA driver like ``libnvidia-ml.so.1``) can,
without creating a context (no GPU memory is used)::

    cuInit(0)
    cuDeviceGetByPCIBusId(&dev, "0000:17:00.0")          # NVML's PCI bus id
    cuDeviceGetAttribute(&n, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev)   # 16

Backend.AI's cuda plugin gets the same number from ``cudaGetDeviceProperties``.
Matching by PCI bus id, not by index, keeps the answer right whatever order
``CUDA_DEVICE_ORDER`` gives; a GPU hidden by ``CUDA_VISIBLE_DEVICES`` in the agent's
own environment is reported as an error for that GPU.

:class:`LibcudaDriver` takes the library loader as a parameter, so tests pass
:class:`accelshare.accel.cuda.fake.FakeLibcuda` and run exactly this code without a
GPU.  The plugin only talks to the :class:`CudaDriver` protocol.  ``cuInit`` in the
agent process is harmless for kernels: they are started with fork + exec.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any, Protocol

__all__ = [
    "CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT",
    "LIBCUDA",
    "CudaDriver",
    "CudaDriverError",
    "LibcudaDriver",
]

LIBCUDA = "libcuda.so.1"
CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16
CUDA_SUCCESS = 0


class CudaDriverError(Exception):
    """The driver cannot tell; ``str()`` says why in words an operator can act on."""


class CudaDriver(Protocol):
    def multiprocessor_count(self, pci_bus_id: str) -> int:
        """SMs of the GPU at ``pci_bus_id`` (``"0000:17:00.0"``); :class:`CudaDriverError`
        when the driver cannot tell."""
        ...


class LibcudaDriver:
    """:class:`CudaDriver` over ``libcuda.so.1`` through ctypes (or a fake library)."""

    def __init__(self, loader: Callable[[str], Any] = ctypes.CDLL) -> None:
        self._loader = loader
        self._lib: Any = None
        self._init_error: CudaDriverError | None = None

    def _error_name(self, code: int) -> str:
        name = ctypes.c_char_p()
        try:
            if self._lib.cuGetErrorName(code, ctypes.pointer(name)) == CUDA_SUCCESS and name.value:
                return f"{name.value.decode(errors='replace')} ({code})"
        except (AttributeError, ctypes.ArgumentError):
            pass
        return f"CUresult {code}"

    def _open(self) -> Any:
        """Load the library and call ``cuInit`` once; a failure is remembered."""
        if self._init_error is not None:
            raise self._init_error
        if self._lib is not None:
            return self._lib
        try:
            lib = self._loader(LIBCUDA)
        except OSError as e:
            self._init_error = CudaDriverError(
                f"the CUDA driver library {LIBCUDA} cannot be loaded ({e}); in a container "
                "it needs the 'compute' driver capability (NVIDIA_DRIVER_CAPABILITIES)"
            )
            raise self._init_error from e
        lib.cuInit.argtypes = [ctypes.c_uint]
        lib.cuInit.restype = ctypes.c_int
        lib.cuDeviceGetByPCIBusId.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_char_p]
        lib.cuDeviceGetByPCIBusId.restype = ctypes.c_int
        lib.cuDeviceGetAttribute.argtypes = [
            ctypes.POINTER(ctypes.c_int),
            ctypes.c_int,
            ctypes.c_int,
        ]
        lib.cuDeviceGetAttribute.restype = ctypes.c_int
        lib.cuGetErrorName.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        lib.cuGetErrorName.restype = ctypes.c_int
        self._lib = lib
        code = lib.cuInit(0)
        if code != CUDA_SUCCESS:
            self._init_error = CudaDriverError(f"cuInit failed: {self._error_name(code)}")
            raise self._init_error
        return lib

    def multiprocessor_count(self, pci_bus_id: str) -> int:
        lib = self._open()
        device = ctypes.c_int()
        code = lib.cuDeviceGetByPCIBusId(ctypes.pointer(device), pci_bus_id.encode())
        if code != CUDA_SUCCESS:
            raise CudaDriverError(
                f"cuDeviceGetByPCIBusId({pci_bus_id!r}) failed: {self._error_name(code)} "
                "(is the GPU hidden by CUDA_VISIBLE_DEVICES in the agent's environment?)"
            )
        count = ctypes.c_int()
        code = lib.cuDeviceGetAttribute(
            ctypes.pointer(count), CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device.value
        )
        if code != CUDA_SUCCESS:
            raise CudaDriverError(
                f"cuDeviceGetAttribute(MULTIPROCESSOR_COUNT) of {pci_bus_id} failed: "
                f"{self._error_name(code)}"
            )
        if count.value <= 0:
            raise CudaDriverError(f"the CUDA driver reports {count.value} SMs for {pci_bus_id}")
        return count.value
