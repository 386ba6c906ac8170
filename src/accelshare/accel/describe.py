"""Plugin inventories as one JSON document (``accelshare agent plugins --json``), pure.

Shape::

    {"plugins": {"cuda": {"entry_point": "mock", "version": "0.1.0",
                          "slots": {"cuda.shares": {"type": "count", "capacity": "54.00"}},
                          "devices": [{"device_id": ..., "model_name": ..., "numa_node": 0,
                                       "memory_bytes": ..., "processors": 108,
                                       "shares": "13.50", ...}],
                          "allocation_mode": "fractional", "quantum_size": "0.1",
                          "strategy": "EVENLY", "exclusive_slot_types": [...],
                          "metadata": {"cuda.shares": {...}},
                          "extra_info": {...}, "settings": {...}}},
     "skipped": {"cuda": "cuda: the NVIDIA management library (NVML) was not found ..."}}

Capacities and amounts are decimal strings (exact).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .types import PluginInventory

__all__ = ["describe_inventory", "describe_plugins"]


def _jsonable(value: Any) -> Any:
    if isinstance(value, bool | int | float | str) or value is None:
        return value
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return str(value)


def describe_inventory(inventory: PluginInventory, *, entry_point: str = "") -> dict[str, Any]:
    capacities = inventory.capacities()
    return {
        "entry_point": entry_point or inventory.key,
        "version": inventory.version,
        "slots": {
            slot: {"type": slot_type.value, "capacity": str(capacities[slot])}
            for slot, slot_type in inventory.slot_types.items()
        },
        "devices": [
            device.to_json(is_shares=device.slot_name.endswith(".shares"))
            for device in inventory.devices
        ],
        "allocation_mode": inventory.allocation_mode.value,
        "quantum_size": str(inventory.quantum_size) if inventory.quantum_size is not None else None,
        "strategy": inventory.strategy,
        "exclusive_slot_types": sorted(inventory.exclusive_slot_types),
        "metadata": {slot: meta.to_json() for slot, meta in inventory.metadata.items()},
        "extra_info": _jsonable(inventory.extra_info),
        "settings": dict(inventory.settings),
    }


def describe_plugins(
    inventories: Mapping[str, PluginInventory],
    *,
    origins: Mapping[str, str] | None = None,
    skipped: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    origins = origins or {}
    return {
        "plugins": {
            key: describe_inventory(inventory, entry_point=origins.get(key, ""))
            for key, inventory in inventories.items()
        },
        "skipped": dict(skipped or {}),
    }
