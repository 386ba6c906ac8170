"""Pure pieces shared by the accelerator plugins (mock and cuda).

- :func:`held_devices`: the devices an allocation gives a kernel, in inventory order
- :func:`cuda_resource_lines`: the ``CUDA_*`` lines of ``resource.txt``
- :func:`attached_devices`: devices as the kernel sees them (memory/processor limits)
- :func:`node_metrics` / :func:`kernel_metrics`: ``<key>_mem``, ``<key>_util``,
  ``<key>_power``, ``<key>_temperature`` from per-device samples

Worked example (``two-fgpu.toml``, fractional, default units 2 GiB / 8 SMs, a kernel
holding 0.6 shares of each GPU)::

    CUDA_GLOBAL_DEVICE_IDS=0:c59395cd-...-2d01,1:c59395cd-...-2d02
    CUDA_RESOURCE_VIRTUALIZED=1
    CUDA_MEMORY_LIMITS=c59395cd-...-2d01:1288490188,c59395cd-...-2d02:1288490188
    CUDA_PROCESSOR_LIMITS=c59395cd-...-2d01:4,c59395cd-...-2d02:4
    CUDA_RESERVED_MEMORY=67108864

(2 GiB × 0.6 = 1288490188.8 -> 1288490188 bytes; floor(8 × 0.6) = 4, at least 4.)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal

from accelshare.common import Allocation, AllocationMode

from .options import AcceleratorOptions
from .stats import DeviceSample
from .types import (
    AttachedDevice,
    Device,
    KernelMetric,
    KernelStatTarget,
    Measurement,
    NodeMetric,
    PluginInventory,
)

__all__ = [
    "Held",
    "attached_devices",
    "cuda_resource_lines",
    "held_devices",
    "kernel_metrics",
    "node_metrics",
]


@dataclass(frozen=True, slots=True)
class Held:
    """One device a kernel holds, with the slot and amount it holds it by."""

    device: Device
    slot: str
    amount: Decimal

    @property
    def is_shares(self) -> bool:
        return self.slot.endswith(".shares")


def held_devices(
    inventory: PluginInventory, allocation: Allocation, *, strict: bool = True
) -> list[Held]:
    """Devices with an amount > 0 in this plugin's slots, in inventory order.

    Slots of other plugins are ignored; an unknown device, or a device under a slot it
    does not belong to, is a ValueError (the allocation did not come from this plugin's
    map) unless ``strict`` is false (stats of kernels restored from an older plugin
    configuration), in which case such entries are skipped.
    """
    amounts: dict[str, tuple[str, Decimal]] = {}
    for slot, per_device in allocation.items():
        if slot not in inventory.slot_types:
            if (
                strict
                and slot.startswith(f"{inventory.key}.")
                and any(amount > 0 for amount in per_device.values())
            ):
                raise ValueError(
                    f"{inventory.key}: the allocation uses the slot {slot!r}, which this plugin "
                    f"does not declare now (declared: {', '.join(inventory.slot_types)})"
                )
            continue
        for device_id, amount in per_device.items():
            if amount <= 0:
                continue
            try:
                device = inventory.device(device_id)
            except KeyError:
                if not strict:
                    continue
                raise ValueError(
                    f"{inventory.key}: the allocation names device {device_id!r}, "
                    "which this plugin does not have"
                ) from None
            if device.slot_name != slot:
                if not strict:
                    continue
                raise ValueError(
                    f"{inventory.key}: device {device_id!r} belongs to {device.slot_name!r}, "
                    f"not {slot!r}"
                )
            amounts[device_id] = (slot, amount)
    return [
        Held(device, *amounts[device.device_id])
        for device in inventory.devices
        if device.device_id in amounts
    ]


def cuda_resource_lines(held: Sequence[Held], *, options: AcceleratorOptions) -> dict[str, str]:
    """The ``CUDA_*`` resource.txt lines (see the module docstring).

    ``CUDA_RESOURCE_VIRTUALIZED`` is 1 only when the kernel holds fractional shares; a
    MIG slice or a whole device is not virtualized, and then no limit lines are written.
    """
    lines = {
        "CUDA_GLOBAL_DEVICE_IDS": ",".join(
            f"{index}:{h.device.device_id}" for index, h in enumerate(held)
        )
    }
    shares = [h for h in held if h.is_shares]
    virtualized = options.allocation_mode is AllocationMode.FRACTIONAL and bool(shares)
    lines["CUDA_RESOURCE_VIRTUALIZED"] = "1" if virtualized else "0"
    if virtualized:
        limits = [(h.device.device_id, *options.limits(h.amount)) for h in shares]
        lines["CUDA_MEMORY_LIMITS"] = ",".join(f"{dev}:{mem}" for dev, mem, _ in limits)
        lines["CUDA_PROCESSOR_LIMITS"] = ",".join(f"{dev}:{proc}" for dev, _, proc in limits)
        lines["CUDA_RESERVED_MEMORY"] = str(options.reserved_memory)
    return lines


def attached_devices(
    held: Sequence[Held], *, options: AcceleratorOptions
) -> tuple[AttachedDevice, ...]:
    """What each held device looks like to the kernel (its share's limits if fractional)."""
    attached: list[AttachedDevice] = []
    for h in held:
        memory, processors = h.device.memory_bytes, h.device.processors
        if h.is_shares:
            memory, processors = options.limits(h.amount)
        attached.append(AttachedDevice(h.device.device_id, h.device.model_name, memory, processors))
    return tuple(attached)


def node_metrics(key: str, samples: Mapping[str, DeviceSample]) -> list[NodeMetric]:
    """Node and per-device ``<key>_mem/_util/_power/_temperature`` from one tick.

    Node values: sums against summed capacities, except temperature (the average
    against the highest ceiling).  Readings a device cannot give are left out.
    """
    mem = {d: Measurement(Decimal(s.mem_used), Decimal(s.mem_total)) for d, s in samples.items()}
    util = {d: Measurement(s.util, Decimal(100)) for d, s in samples.items() if s.util is not None}
    power = {
        d: Measurement(s.power, s.power_max) for d, s in samples.items() if s.power is not None
    }
    temp = {
        d: Measurement(s.temperature, s.temperature_max)
        for d, s in samples.items()
        if s.temperature is not None
    }
    count = len(temp)
    zero = Decimal(0)

    def total(readings: Mapping[str, Measurement]) -> Measurement:
        value = sum((m.value for m in readings.values()), zero)
        capacity = sum((m.capacity or zero for m in readings.values()), zero)
        return Measurement(value, capacity)

    average_temp = (
        (sum((m.value for m in temp.values()), zero) / count).quantize(Decimal("0.1"))
        if count
        else zero
    )
    max_temp = max((m.capacity or zero for m in temp.values()), default=zero)
    return [
        NodeMetric(f"{key}_mem", "bytes", total(mem), mem),
        NodeMetric(f"{key}_util", "percent", total(util), util),
        NodeMetric(f"{key}_power", "watts", total(power), power),
        NodeMetric(f"{key}_temperature", "celsius", Measurement(average_temp, max_temp), temp),
    ]


def kernel_metrics(
    inventory: PluginInventory,
    options: AcceleratorOptions,
    samples: Mapping[str, DeviceSample],
    kernels: Mapping[str, KernelStatTarget],
) -> list[KernelMetric]:
    """Per-kernel ``<key>_mem`` and ``<key>_util`` derived from the device samples.

    A kernel holding ``s`` of a device's ``C`` shares accounts for the part
    ``p = min(1, (s / C) / allocated)`` of the device's load where the sample says what is
    allocated (mock devices, whose load follows the allocations: its part of them), else
    ``p = s / C`` (real GPUs).  It sees ``util × p``; its memory is ``min(held, used × p)``
    with ``allocated`` known, else the device's memory fraction of the ``unit_mem × s``
    bytes it holds.  A whole device or a MIG slice is seen in full.  Capacities: the
    memory held, 100 % per device.
    """
    mem: dict[str, Measurement] = {}
    util: dict[str, Measurement] = {}
    for kernel_id, target in kernels.items():
        mem_used = mem_held = util_value = Decimal(0)
        devices = 0
        for h in held_devices(inventory, target.allocation, strict=False):
            sample = samples.get(h.device.device_id)
            if sample is None:
                continue
            share = Decimal(1)
            if h.is_shares and h.device.capacity > 0:
                share = min(Decimal(1), h.amount / h.device.capacity)
            part = sample.part(share)
            if sample.util is not None:
                devices += 1
                util_value += (sample.util * part).quantize(Decimal("0.1"))
            if h.is_shares:
                held_bytes = Decimal(options.limits(h.amount)[0])
            else:
                held_bytes = Decimal(h.device.memory_bytes)
            mem_held += held_bytes
            if sample.allocated is None:
                used = held_bytes * sample.mem_fraction
            else:
                used = min(held_bytes, sample.mem_used * part)
            mem_used += used.to_integral_value()
        mem[kernel_id] = Measurement(min(mem_used, mem_held), mem_held)
        util[kernel_id] = Measurement(util_value, Decimal(100 * devices))
    return [
        KernelMetric(f"{inventory.key}_mem", "bytes", mem),
        KernelMetric(f"{inventory.key}_util", "percent", util),
    ]
