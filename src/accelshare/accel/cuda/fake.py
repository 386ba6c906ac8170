"""A fake ``pynvml`` module for tests: GPUs, MIG instances and readings without a GPU.

It implements the subset of NVML functions :class:`~.nvml.PynvmlLayer` calls, with
NVML's error behaviour (calls before ``nvmlInit`` fail, unsupported queries raise
``NVMLError_NotSupported``, empty MIG slots ``NVMLError_NotFound``)::

    nvml = FakeNvml([FakeGpu.a100(0), FakeGpu.a100(1, mig=["1g.5gb", "1g.5gb", "3g.20gb"])])
    layer = PynvmlLayer(nvml)

``FakeNvml(library_missing=True)`` behaves like a machine without the NVIDIA driver.
Readings are plain attributes of :class:`FakeGpu` / :class:`FakeMig`; tests change
them between ticks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

__all__ = ["FakeGpu", "FakeMig", "FakeNvml"]

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
    multiprocessors: int | None = 108  # None: nvmlDeviceGetAttributes not supported
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
        self._check()
        if handle.mig is not None:
            return SimpleNamespace(
                multiprocessorCount=handle.mig.multiprocessors,
                memorySizeMB=handle.mig.memory_bytes // 2**20,
            )
        if handle.gpu.multiprocessors is None:
            raise NVMLError_NotSupported()
        return SimpleNamespace(
            multiprocessorCount=handle.gpu.multiprocessors,
            memorySizeMB=handle.gpu.memory_bytes // 2**20,
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
