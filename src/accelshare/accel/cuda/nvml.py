"""A thin layer over NVML (``nvidia-ml-py``, module ``pynvml``).

:class:`PynvmlLayer` turns NVML calls into plain data (:class:`NvmlGpu`,
:class:`NvmlSample`); it takes the NVML module as a parameter so tests pass
:class:`accelshare.accel.cuda.fake.FakeNvml` instead of the real ``pynvml`` and run
exactly this code without a GPU.  The plugin only talks to the :class:`NvmlLayer`
protocol.

Handled NVML quirks: strings may be ``bytes`` (old bindings); ``nvmlDeviceGetNumaNodeId``
is missing on older drivers (then ``/sys/bus/pci/devices/<bus>/numa_node``); MIG device
handles do not support utilisation, power or temperature (utilisation is then unknown,
power and temperature are the parent GPU's); a GPU in MIG mode is not a device itself,
its MIG instances are; ``nvmlDeviceGetAttributes`` (the SM count) is documented for MIG
device handles only, so it is asked for MIG instances and a full GPU's SM count is
left ``None`` here -- the plugin gets it from the CUDA driver (:mod:`.driver`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol, TypeVar

from ..errors import PluginUnavailable

__all__ = ["NvmlGpu", "NvmlLayer", "NvmlMigInstance", "NvmlSample", "PynvmlLayer", "mig_profile_of"]

T = TypeVar("T")
_MIG_NAME = re.compile(r"\bMIG\s+(\S+)")


def mig_profile_of(name: str) -> str:
    """``"NVIDIA A100-SXM4-40GB MIG 1g.5gb"`` -> ``"1g.5gb"`` (the profile NVML reports)."""
    match = _MIG_NAME.search(name)
    return match[1] if match else name.rsplit(" ", 1)[-1]


@dataclass(frozen=True, slots=True)
class NvmlMigInstance:
    uuid: str  # "MIG-..." (or the legacy "MIG-GPU-<uuid>/<gi>/<ci>")
    name: str
    profile: str  # "1g.5gb"
    memory_bytes: int
    multiprocessors: int | None
    gpu_instance_id: int | None
    compute_instance_id: int | None


@dataclass(frozen=True, slots=True)
class NvmlGpu:
    index: int
    uuid: str  # "GPU-..."
    name: str
    memory_bytes: int
    # None from this layer (NVML cannot tell for a full GPU); create_plugin fills it in
    # from the CUDA driver, and leaves None only when the driver cannot tell either.
    multiprocessors: int | None
    pci_bus_id: str  # "0000:17:00.0" (sysfs spelling)
    numa_node: int
    minor_number: int | None
    mig_enabled: bool
    mig_instances: tuple[NvmlMigInstance, ...] = ()


@dataclass(frozen=True, slots=True)
class NvmlSample:
    mem_used: int
    mem_total: int
    util_percent: int | None  # None: not supported (MIG instances)
    power_mw: int | None
    power_limit_mw: int | None
    temperature_c: int | None


class NvmlLayer(Protocol):
    def open(self) -> None:
        """``nvmlInit``; :class:`PluginUnavailable` naming NVML when there is no driver."""
        ...

    def close(self) -> None: ...

    def driver_version(self) -> str: ...

    def cuda_driver_version(self) -> str:
        """``"12.4"``."""
        ...

    def gpus(self) -> list[NvmlGpu]: ...

    def sample(self, device_id: str) -> NvmlSample:
        """Current readings of a GPU or MIG instance (by uuid)."""
        ...

    def process_memory(self, device_id: str) -> dict[int, int]:
        """pid -> bytes of device memory used by compute processes on the device."""
        ...


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _sysfs_bus_id(bus_id: str) -> str:
    """NVML ``"00000000:17:00.0"`` -> sysfs ``"0000:17:00.0"``."""
    domain, _, rest = bus_id.partition(":")
    try:
        return f"{int(domain, 16):04x}:{rest.lower()}"
    except ValueError:
        return bus_id.lower()


class PynvmlLayer:
    """:class:`NvmlLayer` over the ``pynvml`` module (or a fake with the same functions)."""

    def __init__(self, module: ModuleType | Any | None = None, *, host_root: Path = Path("/")):
        if module is None:
            import pynvml

            module = pynvml
        self._nvml: Any = module
        self._host_root = host_root
        self._handles: dict[str, Any] = {}
        self._parents: dict[str, Any] = {}  # MIG uuid -> parent GPU handle
        self._is_open = False

    def _optional(self, call: Callable[[], T]) -> T | None:
        try:
            return call()
        except self._nvml.NVMLError:
            return None

    def open(self) -> None:
        nvml = self._nvml
        try:
            nvml.nvmlInit()
        except nvml.NVMLError_LibraryNotFound as e:
            raise PluginUnavailable(
                "cuda: the NVIDIA management library (NVML, libnvidia-ml.so) was not found "
                f"({e}); install the NVIDIA driver, or do not enable the cuda plugin"
            ) from e
        except nvml.NVMLError_DriverNotLoaded as e:
            raise PluginUnavailable(
                f"cuda: NVML is installed but the NVIDIA driver is not loaded ({e})"
            ) from e
        except nvml.NVMLError as e:
            raise PluginUnavailable(f"cuda: NVML failed to initialise ({e})") from e
        self._is_open = True

    def close(self) -> None:
        if self._is_open:
            self._is_open = False
            self._optional(self._nvml.nvmlShutdown)

    def driver_version(self) -> str:
        return _text(self._nvml.nvmlSystemGetDriverVersion())

    def cuda_driver_version(self) -> str:
        version = int(self._nvml.nvmlSystemGetCudaDriverVersion())
        return f"{version // 1000}.{version % 1000 // 10}"

    def _numa_node(self, handle: Any, bus_id: str) -> int:
        node = self._optional(lambda: int(self._nvml.nvmlDeviceGetNumaNodeId(handle)))
        if node is None:
            path = self._host_root / "sys/bus/pci/devices" / bus_id / "numa_node"
            try:
                node = int(path.read_text().strip())
            except (OSError, ValueError):
                node = 0
        return max(node, 0)

    def _multiprocessors(self, handle: Any) -> int | None:
        """SMs of a MIG device handle (NVML supports the query for those only)."""
        attributes = self._optional(lambda: self._nvml.nvmlDeviceGetAttributes(handle))
        count = getattr(attributes, "multiprocessorCount", None)
        return int(count) if count else None

    def _mig_instances(self, handle: Any) -> tuple[NvmlMigInstance, ...]:
        nvml = self._nvml
        instances: list[NvmlMigInstance] = []
        for slot in range(int(nvml.nvmlDeviceGetMaxMigDeviceCount(handle))):
            mig = self._optional(partial(nvml.nvmlDeviceGetMigDeviceHandleByIndex, handle, slot))
            if mig is None:
                continue  # an empty MIG slot
            uuid = _text(nvml.nvmlDeviceGetUUID(mig))
            name = _text(nvml.nvmlDeviceGetName(mig))
            self._handles[uuid] = mig
            self._parents[uuid] = handle
            instances.append(
                NvmlMigInstance(
                    uuid=uuid,
                    name=name,
                    profile=mig_profile_of(name),
                    memory_bytes=int(nvml.nvmlDeviceGetMemoryInfo(mig).total),
                    multiprocessors=self._multiprocessors(mig),
                    gpu_instance_id=self._optional(partial(nvml.nvmlDeviceGetGpuInstanceId, mig)),
                    compute_instance_id=self._optional(
                        partial(nvml.nvmlDeviceGetComputeInstanceId, mig)
                    ),
                )
            )
        return tuple(instances)

    def gpus(self) -> list[NvmlGpu]:
        nvml = self._nvml
        found: list[NvmlGpu] = []
        for index in range(int(nvml.nvmlDeviceGetCount())):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            uuid = _text(nvml.nvmlDeviceGetUUID(handle))
            self._handles[uuid] = handle
            bus_id = _sysfs_bus_id(_text(nvml.nvmlDeviceGetPciInfo(handle).busId))
            mode: Any = self._optional(partial(nvml.nvmlDeviceGetMigMode, handle))
            mig_enabled = bool(mode) and mode[0] == nvml.NVML_DEVICE_MIG_ENABLE
            found.append(
                NvmlGpu(
                    index=index,
                    uuid=uuid,
                    name=_text(nvml.nvmlDeviceGetName(handle)),
                    memory_bytes=int(nvml.nvmlDeviceGetMemoryInfo(handle).total),
                    multiprocessors=None,  # NVML: MIG handles only; see the docstring
                    pci_bus_id=bus_id,
                    numa_node=self._numa_node(handle, bus_id),
                    minor_number=self._optional(partial(nvml.nvmlDeviceGetMinorNumber, handle)),
                    mig_enabled=mig_enabled,
                    mig_instances=self._mig_instances(handle) if mig_enabled else (),
                )
            )
        return found

    def _handle(self, device_id: str) -> Any:
        if device_id not in self._handles:
            self._handles[device_id] = self._nvml.nvmlDeviceGetHandleByUUID(device_id)
        return self._handles[device_id]

    def sample(self, device_id: str) -> NvmlSample:
        nvml = self._nvml
        handle = self._handle(device_id)
        physical = self._parents.get(device_id, handle)
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        util = self._optional(lambda: nvml.nvmlDeviceGetUtilizationRates(handle))
        return NvmlSample(
            mem_used=int(memory.used),
            mem_total=int(memory.total),
            util_percent=int(util.gpu) if util is not None else None,
            power_mw=self._optional(lambda: int(nvml.nvmlDeviceGetPowerUsage(physical))),
            power_limit_mw=self._optional(
                lambda: int(nvml.nvmlDeviceGetEnforcedPowerLimit(physical))
            ),
            temperature_c=self._optional(
                lambda: int(nvml.nvmlDeviceGetTemperature(physical, nvml.NVML_TEMPERATURE_GPU))
            ),
        )

    def process_memory(self, device_id: str) -> dict[int, int]:
        nvml = self._nvml
        handle = self._handle(device_id)
        processes = self._optional(lambda: nvml.nvmlDeviceGetComputeRunningProcesses(handle)) or []
        used = {int(p.pid): int(p.usedGpuMemory or 0) for p in processes}
        # Under MPS the compute process is the MPS server; its clients (the kernels'
        # processes) are listed apart, with their own memory.
        mps_clients = getattr(nvml, "nvmlDeviceGetMPSComputeRunningProcesses", None)
        if mps_clients is not None:
            for p in self._optional(lambda: mps_clients(handle)) or []:
                used[int(p.pid)] = int(p.usedGpuMemory or 0)
        return used
