"""Building a plugin's allocation map from its inventory (pure).

The agent keeps one map per plugin::

    alloc_map = build_alloc_map(plugin.inventory)
    # cpu   -> DiscreteAllocMap(EVENLY), one device per core, capacity 1
    # mem   -> DiscreteAllocMap(FILL), device "root", capacity = bytes
    # mock/cuda discrete   -> DiscreteAllocMap(EVENLY, exclusive {cuda.device, cuda.shares,
    #                         cuda.device:*-mig})
    # mock/cuda fractional -> FractionAllocMap(EVENLY, quantum 0.1 (mock) / 0.01 (cuda))

Every device carries its NUMA node so the agent's multi-map allocation can steer cpu
and mem towards the accelerators' nodes.
"""

from __future__ import annotations

from accelshare.alloc import (
    AllocationStrategy,
    DeviceSlotInfo,
    DiscreteAllocMap,
    FractionAllocMap,
)
from accelshare.common import AllocationMode

from .types import PluginInventory

__all__ = ["build_alloc_map", "device_slots"]


def device_slots(inventory: PluginInventory) -> dict[str, DeviceSlotInfo]:
    """``{device_id: DeviceSlotInfo(type, slot, capacity)}`` in inventory order."""
    return {
        device.device_id: DeviceSlotInfo(
            inventory.slot_types[device.slot_name], device.slot_name, device.capacity
        )
        for device in inventory.devices
    }


def build_alloc_map(inventory: PluginInventory) -> DiscreteAllocMap | FractionAllocMap:
    """A fresh (empty) allocation map for the plugin's devices."""
    strategy = AllocationStrategy[inventory.strategy]
    numa_nodes: dict[str, int | None] = {d.device_id: d.numa_node for d in inventory.devices}
    if inventory.allocation_mode is AllocationMode.FRACTIONAL:
        assert inventory.quantum_size is not None  # validate_inventory guarantees it
        return FractionAllocMap(
            device_slots(inventory),
            allocation_strategy=strategy,
            quantum_size=inventory.quantum_size,
            exclusive_slot_types=sorted(inventory.exclusive_slot_types),
            numa_nodes=numa_nodes,
        )
    return DiscreteAllocMap(
        device_slots(inventory),
        allocation_strategy=strategy,
        exclusive_slot_types=sorted(inventory.exclusive_slot_types),
        numa_nodes=numa_nodes,
    )
