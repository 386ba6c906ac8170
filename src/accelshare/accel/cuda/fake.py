"""Fake ``pynvml`` and ``libcuda.so.1`` for tests: GPUs, MIG instances, readings, SMs.

:class:`FakeNvml` implements the subset of NVML functions :class:`~.nvml.PynvmlLayer`
calls, with NVML's error behaviour (calls before ``nvmlInit`` fail, unsupported
queries raise ``NVMLError_NotSupported`` -- among them ``nvmlDeviceGetAttributes`` on a
full GPU, which real NVML supports only for MIG device handles --, empty MIG slots
``NVMLError_NotFound``).  :class:`FakeLibcuda` is the CUDA driver library of the same
machine, as :class:`~.driver.LibcudaDriver` sees it through ctypes (``CUresult``
codes, out-parameters written through pointers, ``CUDA_ERROR_NOT_INITIALIZED``
before ``cuInit``)::

    nvml = FakeNvml([FakeGpu.a100(0), FakeGpu.a100(1, mig=["1g.5gb", "1g.5gb", "3g.20gb"])])
    layer = PynvmlLayer(nvml)
    driver = LibcudaDriver(loader=nvml.libcuda().load)   # SM counts of the full GPUs

``FakeNvml(library_missing=True)`` behaves like a machine without the NVIDIA driver,
``FakeLibcuda(..., library_missing=True)`` like one without ``libcuda.so.1`` (a
container without the ``compute`` capability).  Readings are plain attributes of
:class:`FakeGpu` / :class:`FakeMig`; tests change them between ticks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

__all__ = ["FakeGpu", "FakeLibcuda", "FakeMig", "FakeNvml"]

_GIB = 2**30
# (SMs, memory GiB) of A100-40GB MIG profiles
_A100_MIG_PROFILES = {
    "1g.5gb": (14, 5),
    "2g.10gb": (28, 10),
    "3g.20gb": (42, 20),
    "4g.20gb": (56, 20),
    "7g.40gb": (98, 40),
}


class NVMLError(Exception):
    """Mirrors ``pynvml.NVMLError``: ``str()`` is NVML's message."""

    message = "Unknown Error"

    def __str__(self) -> str:
        return self.message


class NVMLError_LibraryNotFound(NVMLError):
    message = "NVML Shared Library Not Found"


class NVMLError_DriverNotLoaded(NVMLError):
    message = "Driver Not Loaded"


class NVMLError_Uninitialized(NVMLError):
    message = "Uninitialized"


class NVMLError_NotSupported(NVMLError):
    message = "Not Supported"


class NVMLError_NotFound(NVMLError):
    message = "Not Found"


class NVMLError_FunctionNotFound(NVMLError):
    message = "Function Not Found"


class NVMLError_InvalidArgument(NVMLError):
    message = "Invalid Argument"


@dataclass
class FakeMig:
    uuid: str
    profile: str  # "1g.5gb"
    memory_bytes: int
    multiprocessors: int
    gpu_instance_id: int = 0
    compute_instance_id: int = 0
    mem_used: int = 0
    processes: dict[int, int] = field(default_factory=dict)  # pid -> bytes


@dataclass
class FakeGpu:
    uuid: str
    name: str = "NVIDIA A100-SXM4-40GB"
    memory_bytes: int = 40 * _GIB
    multiprocessors: int = 108  # SMs: only the CUDA driver (FakeLibcuda) reports them
    bus_id: str = "00000000:17:00.0"
    numa_node: int | None = 0  # None: nvmlDeviceGetNumaNodeId not available
    minor_number: int = 0
    mig: list[FakeMig] | None = None  # None: MIG mode disabled
    mig_slots: int = 7  # nvmlDeviceGetMaxMigDeviceCount
    mem_used: int = 0
    util_percent: int = 0
    power_mw: int = 60_000
    power_limit_mw: int = 400_000
    temperature_c: int = 35
    processes: dict[int, int] = field(default_factory=dict)  # pid -> bytes
    mps_processes: dict[int, int] = field(default_factory=dict)  # MPS clients: pid -> bytes

    @classmethod
    def a100(
        cls, index: int, *, mig: list[str] | None = None, numa_node: int | None = 0
    ) -> FakeGpu:
        """An A100-40GB at bus ``0000:<17+index>:00.0``, optionally split into MIG profiles."""
        uuid = f"GPU-00000000-0000-0000-0000-{index:012d}"
        instances = None
        if mig is not None:
            instances = []
            for i, profile in enumerate(mig):
                sms, gib = _A100_MIG_PROFILES[profile]
                instances.append(
                    FakeMig(
                        uuid=f"MIG-00000000-0000-0000-{index:04d}-{i:012d}",
                        profile=profile,
                        memory_bytes=gib * _GIB,
                        multiprocessors=sms,
                        gpu_instance_id=i + 1,
                    )
                )
        return cls(
            uuid=uuid,
            bus_id=f"00000000:{0x17 + index:02X}:00.0",
            numa_node=numa_node,
            minor_number=index,
            mig=instances,
        )

    @classmethod
    def h100(cls, index: int, *, numa_node: int | None = 0) -> FakeGpu:
        """An H100 80GB (132 SMs) at bus ``0000:<17+index>:00.0``."""
        gpu = cls.a100(index, numa_node=numa_node)
        gpu.name = "NVIDIA H100 80GB HBM3"
        gpu.memory_bytes = 80 * _GIB
        gpu.multiprocessors = 132
        return gpu


@dataclass
class _Handle:
    gpu: FakeGpu
    mig: FakeMig | None = None


class FakeNvml:
    """The fake module; pass it to ``PynvmlLayer(FakeNvml(...))``."""

    NVMLError = NVMLError
    NVMLError_LibraryNotFound = NVMLError_LibraryNotFound
    NVMLError_DriverNotLoaded = NVMLError_DriverNotLoaded
    NVMLError_Uninitialized = NVMLError_Uninitialized
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_NotFound = NVMLError_NotFound
    NVMLError_FunctionNotFound = NVMLError_FunctionNotFound
    NVMLError_InvalidArgument = NVMLError_InvalidArgument
    NVML_TEMPERATURE_GPU = 0
    NVML_DEVICE_MIG_DISABLE = 0
    NVML_DEVICE_MIG_ENABLE = 1

    def __init__(
        self,
        gpus: list[FakeGpu] | None = None,
        *,
        driver_version: str = "550.54.15",
        cuda_version: int = 12040,
        library_missing: bool = False,
        driver_not_loaded: bool = False,
        bytes_strings: bool = False,  # old bindings returned bytes
    ) -> None:
        self.gpus = list(gpus or [])
        self.driver_version = driver_version
        self.cuda_version = cuda_version
        self.library_missing = library_missing
        self.driver_not_loaded = driver_not_loaded
        self.bytes_strings = bytes_strings
        self.init_count = 0
        self.shutdown_count = 0
        self.attribute_calls = 0

    def libcuda(self, **kwargs: Any) -> FakeLibcuda:
        """The CUDA driver library of this machine (same GPUs, same SM counts)."""
        return FakeLibcuda(self.gpus, **kwargs)

    # -- helpers -------------------------------------------------------------------
    def _check(self) -> None:
        if self.init_count <= self.shutdown_count:
            raise NVMLError_Uninitialized()

    def _str(self, value: str) -> str | bytes:
        return value.encode() if self.bytes_strings else value

    @staticmethod
    def _full(handle: _Handle) -> FakeGpu:
        if handle.mig is not None:
            raise NVMLError_NotSupported()
        return handle.gpu

    # -- system --------------------------------------------------------------------
    def nvmlInit(self) -> None:
        if self.library_missing:
            raise NVMLError_LibraryNotFound()
        if self.driver_not_loaded:
            raise NVMLError_DriverNotLoaded()
        self.init_count += 1

    def nvmlShutdown(self) -> None:
        self._check()
        self.shutdown_count += 1

    def nvmlSystemGetDriverVersion(self) -> str | bytes:
        self._check()
        return self._str(self.driver_version)

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._check()
        return self.cuda_version

    # -- devices -------------------------------------------------------------------
    def nvmlDeviceGetCount(self) -> int:
        self._check()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        self._check()
        if not 0 <= index < len(self.gpus):
            raise NVMLError_InvalidArgument()
        return _Handle(self.gpus[index])

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> _Handle:
        self._check()
        for gpu in self.gpus:
            if gpu.uuid == uuid:
                return _Handle(gpu)
            for mig in gpu.mig or []:
                if mig.uuid == uuid:
                    return _Handle(gpu, mig)
        raise NVMLError_NotFound()

    def nvmlDeviceGetUUID(self, handle: _Handle) -> str | bytes:
        self._check()
        return self._str(handle.mig.uuid if handle.mig else handle.gpu.uuid)

    def nvmlDeviceGetName(self, handle: _Handle) -> str | bytes:
        self._check()
        if handle.mig is not None:
            return self._str(f"{handle.gpu.name} MIG {handle.mig.profile}")
        return self._str(handle.gpu.name)

    def nvmlDeviceGetMemoryInfo(self, handle: _Handle) -> SimpleNamespace:
        self._check()
        total = handle.mig.memory_bytes if handle.mig else handle.gpu.memory_bytes
        used = handle.mig.mem_used if handle.mig else handle.gpu.mem_used
        return SimpleNamespace(total=total, used=used, free=total - used)

    def nvmlDeviceGetAttributes(self, handle: _Handle) -> SimpleNamespace:
        """Like real NVML: supported for MIG device handles only."""
        self._check()
        self.attribute_calls += 1
        if handle.mig is None:
            raise NVMLError_NotSupported()
        return SimpleNamespace(
            multiprocessorCount=handle.mig.multiprocessors,
            memorySizeMB=handle.mig.memory_bytes // 2**20,
        )

    def nvmlDeviceGetPciInfo(self, handle: _Handle) -> SimpleNamespace:
        self._check()
        return SimpleNamespace(busId=self._str(handle.gpu.bus_id))

    def nvmlDeviceGetNumaNodeId(self, handle: _Handle) -> int:
        self._check()
        if handle.gpu.numa_node is None:
            raise NVMLError_FunctionNotFound()
        return handle.gpu.numa_node

    def nvmlDeviceGetMinorNumber(self, handle: _Handle) -> int:
        self._check()
        return self._full(handle).minor_number

    def nvmlDeviceGetMigMode(self, handle: _Handle) -> list[int]:
        self._check()
        gpu = self._full(handle)
        if gpu.mig is None:
            return [self.NVML_DEVICE_MIG_DISABLE, self.NVML_DEVICE_MIG_DISABLE]
        return [self.NVML_DEVICE_MIG_ENABLE, self.NVML_DEVICE_MIG_ENABLE]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: _Handle) -> int:
        self._check()
        return self._full(handle).mig_slots

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: _Handle, index: int) -> _Handle:
        self._check()
        gpu = self._full(handle)
        if gpu.mig is None or not 0 <= index < len(gpu.mig):
            raise NVMLError_NotFound()
        return _Handle(gpu, gpu.mig[index])

    def nvmlDeviceGetGpuInstanceId(self, handle: _Handle) -> int:
        self._check()
        if handle.mig is None:
            raise NVMLError_InvalidArgument()
        return handle.mig.gpu_instance_id

    def nvmlDeviceGetComputeInstanceId(self, handle: _Handle) -> int:
        self._check()
        if handle.mig is None:
            raise NVMLError_InvalidArgument()
        return handle.mig.compute_instance_id

    # -- readings ------------------------------------------------------------------
    def nvmlDeviceGetUtilizationRates(self, handle: _Handle) -> SimpleNamespace:
        self._check()
        gpu = self._full(handle)
        return SimpleNamespace(gpu=gpu.util_percent, memory=0)

    def nvmlDeviceGetPowerUsage(self, handle: _Handle) -> int:
        self._check()
        return self._full(handle).power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: _Handle) -> int:
        self._check()
        return self._full(handle).power_limit_mw

    def nvmlDeviceGetTemperature(self, handle: _Handle, sensor: int) -> int:
        self._check()
        if sensor != self.NVML_TEMPERATURE_GPU:
            raise NVMLError_InvalidArgument()
        return self._full(handle).temperature_c

    def nvmlDeviceGetComputeRunningProcesses(self, handle: _Handle) -> list[Any]:
        self._check()
        processes = handle.mig.processes if handle.mig else handle.gpu.processes
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in processes.items()]

    def nvmlDeviceGetMPSComputeRunningProcesses(self, handle: _Handle) -> list[Any]:
        """MPS clients (``mps_processes``); a MIG instance has none here."""
        self._check()
        processes = {} if handle.mig else handle.gpu.mps_processes
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in processes.items()]


# -- libcuda.so.1 ------------------------------------------------------------------
CUDA_SUCCESS = 0
CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_NOT_INITIALIZED = 3
CUDA_ERROR_NO_DEVICE = 100
CUDA_ERROR_INVALID_DEVICE = 101
_CU_ERROR_NAMES = {
    CUDA_SUCCESS: b"CUDA_SUCCESS",
    CUDA_ERROR_INVALID_VALUE: b"CUDA_ERROR_INVALID_VALUE",
    CUDA_ERROR_NOT_INITIALIZED: b"CUDA_ERROR_NOT_INITIALIZED",
    CUDA_ERROR_NO_DEVICE: b"CUDA_ERROR_NO_DEVICE",
    CUDA_ERROR_INVALID_DEVICE: b"CUDA_ERROR_INVALID_DEVICE",
}
_CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16


def _bus_key(bus_id: str) -> tuple[int, ...] | None:
    """``"00000000:17:00.0"``, ``"0000:17:00.0"`` or ``"17:00.0"`` -> (domain, bus, dev, fn),
    hexadecimal, as ``cuDeviceGetByPCIBusId`` parses them; None if unparsable."""
    head, _, function = bus_id.partition(".")
    parts = head.split(":")
    if len(parts) == 2:
        parts.insert(0, "0")
    try:
        return (*(int(part, 16) for part in parts), int(function or "0", 16))
    except ValueError:
        return None


class _CFunction:
    """A fake ctypes function: callable, with ``argtypes`` / ``restype`` to set."""

    def __init__(self, call: Callable[..., int]) -> None:
        self._call = call
        self.argtypes: list[Any] | None = None
        self.restype: Any = None

    def __call__(self, *args: Any) -> int:
        return self._call(*args)


class FakeLibcuda:
    """The CUDA driver API subset :class:`~.driver.LibcudaDriver` uses.

    The GPUs are CUDA devices in list order, minus ``hidden_bus_ids`` (as
    ``CUDA_VISIBLE_DEVICES`` would hide them); out-parameters are the real ctypes
    pointers the caller passes.  ``init_error`` makes ``cuInit`` fail with that
    ``CUresult``.
    """

    def __init__(
        self,
        gpus: Iterable[FakeGpu],
        *,
        library_missing: bool = False,
        init_error: int = CUDA_SUCCESS,
        hidden_bus_ids: Iterable[str] = (),
    ) -> None:
        self._gpus = gpus  # shared with FakeNvml: changes show on both sides
        self.library_missing = library_missing
        self.init_error = init_error
        self.hidden = {_bus_key(b) for b in hidden_bus_ids}
        self.initialized = False
        self.loaded_names: list[str] = []
        self.attribute_queries: list[tuple[int, int]] = []  # (attribute, device)
        self.cuInit = _CFunction(self._init)
        self.cuDeviceGetByPCIBusId = _CFunction(self._by_bus_id)
        self.cuDeviceGetAttribute = _CFunction(self._attribute)
        self.cuGetErrorName = _CFunction(self._error_name)

    def load(self, name: str) -> FakeLibcuda:
        """Use as ``LibcudaDriver(loader=fake.load)`` in place of ``ctypes.CDLL``."""
        self.loaded_names.append(name)
        if self.library_missing:
            raise OSError(f"{name}: cannot open shared object file: No such file or directory")
        return self

    def _devices(self) -> list[FakeGpu]:
        return [g for g in self._gpus if _bus_key(g.bus_id) not in self.hidden]

    def _init(self, flags: int) -> int:
        if flags != 0:
            return CUDA_ERROR_INVALID_VALUE
        if self.init_error != CUDA_SUCCESS:
            return self.init_error
        if not self._devices():
            return CUDA_ERROR_NO_DEVICE
        self.initialized = True
        return CUDA_SUCCESS

    def _by_bus_id(self, device: Any, bus_id: bytes) -> int:
        if not self.initialized:
            return CUDA_ERROR_NOT_INITIALIZED
        if not isinstance(bus_id, bytes):
            return CUDA_ERROR_INVALID_VALUE  # ctypes would have refused a str
        wanted = _bus_key(bus_id.decode())
        if wanted is None:
            return CUDA_ERROR_INVALID_VALUE
        for ordinal, gpu in enumerate(self._devices()):
            if _bus_key(gpu.bus_id) == wanted:
                device.contents.value = ordinal
                return CUDA_SUCCESS
        return CUDA_ERROR_INVALID_DEVICE

    def _attribute(self, value: Any, attribute: int, device: int) -> int:
        if not self.initialized:
            return CUDA_ERROR_NOT_INITIALIZED
        self.attribute_queries.append((attribute, device))
        devices = self._devices()
        if not 0 <= device < len(devices):
            return CUDA_ERROR_INVALID_DEVICE
        if attribute != _CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT:
            return CUDA_ERROR_INVALID_VALUE  # the only attribute this fake knows
        value.contents.value = devices[device].multiprocessors
        return CUDA_SUCCESS

    def _error_name(self, code: int, name: Any) -> int:
        if code not in _CU_ERROR_NAMES:
            return CUDA_ERROR_INVALID_VALUE
        name.contents.value = _CU_ERROR_NAMES[code]
        return CUDA_SUCCESS
