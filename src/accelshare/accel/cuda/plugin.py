"""The ``cuda`` plugin: real NVIDIA GPUs through NVML.

Devices: every GPU not in MIG mode (device id = its NVML uuid ``GPU-...``) and every
MIG instance of a GPU in MIG mode (``MIG-...``; the parent is then not a device).
Slots and exclusivity are those of the mock with key ``cuda``: ``cuda.device`` or
``cuda.shares`` by allocation mode, ``cuda.device:<profile>-mig`` (unique) per MIG
profile.  Options come from ``config/plugins/accelerator/cuda/`` (default quantum
0.01); shares follow the same unit_mem / unit_proc rule as the mock (memory only when
NVML cannot tell the number of multiprocessors).

A kernel gets ``CUDA_VISIBLE_DEVICES`` and ``NVIDIA_VISIBLE_DEVICES`` (uuids, which
CUDA accepts and which stay valid inside a container), a docker device request for the
nvidia driver with the same uuids, and the ``CUDA_*`` resource.txt lines, including
per-device memory/processor limits in fractional mode (advisory: enforcing them needs
a CUDA hook library that accelshare does not ship).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from decimal import Decimal

from accelshare import __version__
from accelshare.common import SlotTypes

from ..accelerator import (
    attached_devices,
    cuda_resource_lines,
    held_devices,
    kernel_metrics,
    node_metrics,
)
from ..errors import PluginConfigError, PluginUnavailable
from ..options import (
    AcceleratorOptions,
    RawOptions,
    parse_accelerator_options,
    read_accelerator_options,
)
from ..protocol import PluginContext
from ..stats import TEMPERATURE_MAX_C, DeviceSample
from ..types import (
    AllocationMode,
    Device,
    KernelAllocation,
    KernelMetric,
    KernelResources,
    KernelStatTarget,
    Measurement,
    NodeMetric,
    NumberFormat,
    PluginInventory,
    SlotMetadata,
)
from .nvml import NvmlGpu, NvmlLayer, PynvmlLayer

__all__ = ["CUDA_DEFAULT_QUANTUM", "CudaPlugin", "create_plugin", "cuda_devices", "mig_slot_name"]

CUDA_DEFAULT_QUANTUM = Decimal("0.01")
_SLOT_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
_FORMATS = {
    "device": ("GPU", "CUDA-capable GPU", "GPU", NumberFormat(binary=False, round_length=0)),
    "shares": ("GPU", "CUDA-capable GPU (fractional)", "fGPU", NumberFormat(False, 2)),
    "mig": ("MIG GPU", "CUDA-capable GPU (MIG slice)", "GPU", NumberFormat(False, 0)),
}


def mig_slot_name(profile: str) -> str:
    """``1g.5gb`` -> ``cuda.device:1g.5gb-mig``; characters a slot name cannot hold become
    ``-`` (H100's ``1g.10gb+me`` -> ``cuda.device:1g.10gb-me-mig``)."""
    return f"cuda.device:{_SLOT_UNSAFE.sub('-', profile)}-mig"


def _metadata(slot: str, kind: str) -> SlotMetadata:
    name, description, unit, number_format = _FORMATS[kind]
    if kind == "mig":
        description = f"{description} {slot.split(':', 1)[1].removesuffix('-mig')}"
    return SlotMetadata(slot, name, description, unit, "gpu1", number_format)


def _shares(options: AcceleratorOptions, memory_bytes: int, processors: int | None) -> Decimal:
    if processors is None:  # NVML could not tell: memory alone decides
        return options.shares(memory_bytes, 10**9)
    return options.shares(memory_bytes, processors)


def cuda_devices(gpus: Sequence[NvmlGpu], options: AcceleratorOptions) -> list[Device]:
    """Devices (pure): full GPUs and MIG instances, minus the masked ones.

    A mask entry may be a GPU uuid (with or without ``GPU-``; masks the GPU and its MIG
    instances) or a MIG uuid.  An entry matching nothing is a configuration error.
    """
    mode = options.allocation_mode
    main_slot = "cuda.device" if mode is AllocationMode.DISCRETE else "cuda.shares"
    mask = set(options.device_mask)
    known: set[str] = set()
    devices: list[Device] = []
    for gpu in gpus:
        gpu_ids = {gpu.uuid, gpu.uuid.removeprefix("GPU-")}
        known |= gpu_ids
        gpu_masked = bool(gpu_ids & mask)
        if not gpu.mig_enabled:
            if gpu_masked:
                continue
            capacity = (
                _shares(options, gpu.memory_bytes, gpu.multiprocessors)
                if mode is AllocationMode.FRACTIONAL
                else Decimal(1)
            )
            devices.append(
                Device(
                    device_id=gpu.uuid,
                    slot_name=main_slot,
                    capacity=capacity,
                    model_name=gpu.name,
                    numa_node=gpu.numa_node,
                    memory_bytes=gpu.memory_bytes,
                    processors=gpu.multiprocessors or 0,
                    hw_location=gpu.pci_bus_id,
                )
            )
            continue
        for mig in gpu.mig_instances:
            known.add(mig.uuid)
            if gpu_masked or mig.uuid in mask:
                continue
            devices.append(
                Device(
                    device_id=mig.uuid,
                    slot_name=mig_slot_name(mig.profile),
                    capacity=Decimal(1),
                    model_name=mig.name,
                    numa_node=gpu.numa_node,
                    memory_bytes=mig.memory_bytes,
                    processors=mig.multiprocessors or 0,
                    hw_location=gpu.pci_bus_id,
                    is_mig=True,
                    mother_id=gpu.uuid,
                )
            )
    unknown = sorted(mask - known)
    if unknown:
        raise PluginConfigError(
            options.source("device_mask"),
            "device_mask",
            f"comma-separated uuids of GPUs or MIG instances NVML reports "
            f"(one of: {', '.join(sorted(k for k in known if '-' in k))})",
            ",".join(unknown),
        )
    return devices


class CudaPlugin:
    """NVIDIA GPUs through an :class:`NvmlLayer` (real ``pynvml`` or a fake)."""

    def __init__(
        self,
        nvml: NvmlLayer,
        gpus: Sequence[NvmlGpu],
        options: AcceleratorOptions,
        *,
        driver_version: str = "",
        cuda_version: str = "",
    ) -> None:
        self._nvml = nvml
        self.options = options
        mode = options.allocation_mode
        main_slot = "cuda.device" if mode is AllocationMode.DISCRETE else "cuda.shares"
        devices = cuda_devices(gpus, options)
        slot_types: dict[str, SlotTypes] = {main_slot: SlotTypes.COUNT}
        metadata = {main_slot: _metadata(main_slot, main_slot.split(".", 1)[1])}
        for device in devices:
            if device.is_mig and device.slot_name not in slot_types:
                slot_types[device.slot_name] = SlotTypes.UNIQUE
                metadata[device.slot_name] = _metadata(device.slot_name, "mig")
        self._inventory = PluginInventory(
            key="cuda",
            version=__version__,
            slot_types=slot_types,
            devices=tuple(devices),
            allocation_mode=mode,
            strategy="EVENLY",
            quantum_size=options.quantum_size if mode is AllocationMode.FRACTIONAL else None,
            exclusive_slot_types=frozenset({"cuda.device", "cuda.shares", "cuda.device:*-mig"}),
            metadata=metadata,
            extra_info={
                "cuda_support": True,
                "nvidia_driver": driver_version,
                "cuda_runtime": cuda_version,
            },
            settings=options.describe(),
        )

    @property
    def inventory(self) -> PluginInventory:
        return self._inventory

    def kernel_resources(self, allocation: KernelAllocation) -> KernelResources:
        held = held_devices(self._inventory, allocation)
        if not held:
            return KernelResources()
        uuids = [h.device.device_id for h in held]
        visible = ",".join(uuids)
        return KernelResources(
            env={"CUDA_VISIBLE_DEVICES": visible, "NVIDIA_VISIBLE_DEVICES": visible},
            resource_lines=cuda_resource_lines(held, options=self.options),
            attached_devices=attached_devices(held, options=self.options),
            device_requests=({"Driver": "nvidia", "DeviceIDs": uuids, "Capabilities": [["gpu"]]},),
        )

    def _samples(self) -> dict[str, DeviceSample]:
        samples: dict[str, DeviceSample] = {}
        for device in self._inventory.devices:
            reading = self._nvml.sample(device.device_id)
            temperature = reading.temperature_c
            power_limit_w = Decimal(reading.power_limit_mw or 0) / 1000
            power_w = Decimal(reading.power_mw) / 1000 if reading.power_mw is not None else None
            if power_w is not None:
                power_limit_w = max(power_limit_w, power_w)
            samples[device.device_id] = DeviceSample(
                mem_used=reading.mem_used,
                mem_total=reading.mem_total,
                util=Decimal(reading.util_percent) if reading.util_percent is not None else None,
                power=power_w,
                temperature=Decimal(temperature) if temperature is not None else None,
                power_max=power_limit_w,
                temperature_max=Decimal(max(TEMPERATURE_MAX_C, temperature or 0)),
            )
        return samples

    async def node_stats(self) -> Sequence[NodeMetric]:
        return node_metrics("cuda", self._samples())

    async def kernel_stats(self, kernels: Mapping[str, KernelStatTarget]) -> Sequence[KernelMetric]:
        metrics = kernel_metrics(self._inventory, self.options, self._samples(), kernels)
        # With the kernels' pids, NVML tells the memory their processes really use.
        measured: dict[str, Measurement] = {}
        estimated = metrics[0].per_kernel
        for kernel_id, target in kernels.items():
            if not target.pids:
                measured[kernel_id] = estimated[kernel_id]
                continue
            used = 0
            for h in held_devices(self._inventory, target.allocation, strict=False):
                per_pid = self._nvml.process_memory(h.device.device_id)
                used += sum(v for pid, v in per_pid.items() if pid in target.pids)
            measured[kernel_id] = Measurement(Decimal(used), estimated[kernel_id].capacity)
        return [KernelMetric("cuda_mem", "bytes", measured), *metrics[1:]]

    async def close(self) -> None:
        self._nvml.close()


async def load_cuda_options(ctx: PluginContext) -> AcceleratorOptions:
    raw = RawOptions()
    if ctx.store is not None:
        raw = await read_accelerator_options(ctx.store, "cuda")
    return parse_accelerator_options(raw, default_quantum=CUDA_DEFAULT_QUANTUM)


async def create_plugin(ctx: PluginContext, *, nvml: NvmlLayer | None = None) -> CudaPlugin:
    """Entry point ``cuda``.  No NVML library / driver / GPU: :class:`PluginUnavailable`."""
    options = await load_cuda_options(ctx)
    layer: NvmlLayer = nvml if nvml is not None else PynvmlLayer(host_root=ctx.host_root)
    layer.open()
    try:
        gpus = layer.gpus()
        if not gpus:
            raise PluginUnavailable("cuda: NVML works but reports no GPU on this machine")
        return CudaPlugin(
            layer,
            gpus,
            options,
            driver_version=layer.driver_version(),
            cuda_version=layer.cuda_driver_version(),
        )
    except BaseException:
        layer.close()
        raise
