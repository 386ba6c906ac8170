"""The plugin conformance suite: every plugin (and every sample config and mode).

What every ComputePlugin must satisfy:
- its declaration is valid (slot prefixes, unique device ids, metadata per slot);
- declared slots match discovered devices (capacities are the device sums, whole
  devices and MIG slices count 1, only the main slot may be empty);
- an allocation map can be built, and what a kernel gets for an allocation is
  deterministic (same result whatever the dict order, every time, strings only);
- stats are within their declared ranges and only name known devices/kernels;
- metadata covers every exposed slot and names it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from decimal import Decimal

import pytest

from accelshare.accel import ComputePlugin, KernelStatTarget, validate_inventory
from accelshare.accel.maps import build_alloc_map
from accelshare.accel.types import AllocationMode, KernelAllocation
from accelshare.common import SlotName, SlotTypes

from .builders import (
    DISCRETE,
    FRACTIONAL,
    SAMPLE_NAMES,
    cpu_plugin,
    cuda_plugin,
    mem_plugin,
    mock_plugin,
)

BUILDERS: dict[str, Callable[[], ComputePlugin]] = {
    "cpu": cpu_plugin,
    "mem": mem_plugin,
    "cuda-fake-nvml-discrete": lambda: cuda_plugin(DISCRETE),
    "cuda-fake-nvml-fractional": lambda: cuda_plugin(FRACTIONAL),
}
for _name in SAMPLE_NAMES:
    for _mode in (DISCRETE, FRACTIONAL):
        BUILDERS[f"mock-{_name}-{_mode.value}"] = (
            lambda n=_name, m=_mode: mock_plugin(n, m)  # type: ignore[misc]
        )
BUILDERS["mock-masked"] = lambda: mock_plugin(
    "cuda-mock-mig.toml", FRACTIONAL, device_mask=("c59395cd-ac91-4cd3-a1b0-3d2568aa2d01",)
)


@pytest.fixture(params=list(BUILDERS), name="plugin")
def plugin_fixture(request: pytest.FixtureRequest) -> ComputePlugin:
    plugin = BUILDERS[request.param]()
    assert isinstance(plugin, ComputePlugin)
    return plugin


def one_of_each(plugin: ComputePlugin) -> list[KernelAllocation]:
    """For every slot with capacity: allocate one unit (or one quantum) on a fresh map."""
    inv = plugin.inventory
    allocations: list[KernelAllocation] = []
    for slot, capacity in inv.capacities().items():
        if capacity <= 0:
            continue
        alloc_map = build_alloc_map(inv)
        if inv.slot_types[slot] is SlotTypes.BYTES:
            amount = Decimal(2**30)
        elif inv.allocation_mode is AllocationMode.FRACTIONAL and slot.endswith(".shares"):
            assert inv.quantum_size is not None
            amount = min(inv.quantum_size * 3, capacity)
            amount -= amount % inv.quantum_size
        else:
            amount = (
                Decimal(min(2, int(capacity)))
                if inv.slot_types[slot] is SlotTypes.COUNT
                else Decimal(1)
            )
        allocations.append(alloc_map.allocate({slot: amount}))
    return allocations


def test_declaration_is_valid(plugin: ComputePlugin) -> None:
    inv = plugin.inventory
    validate_inventory(inv)
    assert inv.version
    for slot in inv.slot_types:
        SlotName(slot)


def test_declared_slots_match_devices(plugin: ComputePlugin) -> None:
    inv = plugin.inventory
    capacities = inv.capacities()
    assert set(capacities) == set(inv.slot_types)
    main_slots = [
        s for s in inv.slot_types if s in (inv.key, f"{inv.key}.device", f"{inv.key}.shares")
    ]
    assert len(main_slots) == 1  # exactly one slot for the mode
    for slot in inv.slot_types:
        devices = [d for d in inv.devices if d.slot_name == slot]
        assert capacities[slot] == sum((d.capacity for d in devices), Decimal(0))
        if slot not in main_slots:
            assert devices, f"{slot} declared without devices"
        if inv.slot_types[slot] is SlotTypes.UNIQUE or slot.endswith(".device"):
            assert {d.capacity for d in devices} <= {Decimal(1)}
    for device in inv.devices:
        assert device.numa_node >= 0
        assert device.capacity >= 0
        assert device.capacity.is_finite()
    if inv.allocation_mode is AllocationMode.FRACTIONAL:
        assert inv.quantum_size is not None
        assert inv.quantum_size > 0
    else:
        assert inv.quantum_size is None


def test_metadata_covers_every_exposed_slot(plugin: ComputePlugin) -> None:
    inv = plugin.inventory
    assert set(inv.metadata) == set(inv.slot_types)
    for slot, meta in inv.metadata.items():
        assert meta.slot_name == slot
        assert meta.human_readable_name
        assert meta.display_unit
        assert meta.display_icon
        assert meta.number_format.round_length >= 0


def test_kernel_resources_are_deterministic(plugin: ComputePlugin) -> None:
    allocations = one_of_each(plugin)
    assert allocations or not plugin.inventory.devices
    for allocation in allocations:
        first = plugin.kernel_resources(allocation)
        reordered = {
            slot: dict(reversed(list(per_device.items())))
            for slot, per_device in reversed(list(allocation.items()))
        }
        assert plugin.kernel_resources(reordered) == first
        assert plugin.kernel_resources(allocation) == first
        for key, value in [*first.env.items(), *first.resource_lines.items()]:
            assert isinstance(key, str)
            assert isinstance(value, str)
            assert "=" not in key
            assert "\n" not in value
    assert plugin.kernel_resources({}).env == {}


async def test_stats_within_declared_ranges(plugin: ComputePlugin) -> None:
    inv = plugin.inventory
    device_ids = {d.device_id for d in inv.devices}
    for _ in range(3):
        for metric in await plugin.node_stats():
            assert metric.key.startswith(f"{inv.key}_") or metric.key == inv.key
            readings = [metric.node, *metric.per_device.values()]
            assert set(metric.per_device) <= device_ids
            for reading in readings:
                assert reading.value >= 0, metric.key
                if reading.capacity is not None:
                    assert reading.value <= reading.capacity, metric.key
    kernels = {
        f"k{i}": KernelStatTarget(a, frozenset({os.getpid()}))
        for i, a in enumerate(one_of_each(plugin))
    }
    for metric in await plugin.kernel_stats(kernels):
        assert set(metric.per_kernel) == set(kernels)
        for reading in metric.per_kernel.values():
            assert reading.value >= 0, metric.key
            if reading.capacity is not None:
                assert reading.value <= reading.capacity, metric.key
    await plugin.close()
