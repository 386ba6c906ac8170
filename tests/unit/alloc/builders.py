"""Builders for allocation-map test fixtures."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

from accelshare.alloc import (
    AllocationStrategy,
    DeviceSlotInfo,
    DiscreteAllocMap,
    FractionAllocMap,
)
from accelshare.common import SlotTypes

D = Decimal
FILL = AllocationStrategy.FILL
EVENLY = AllocationStrategy.EVENLY


def devices(
    slot: str,
    capacities: Sequence[Any],
    *,
    prefix: str = "a",
    slot_type: SlotTypes = SlotTypes.COUNT,
) -> dict[str, DeviceSlotInfo]:
    """devices("cuda.shares", ["0.3", "0.2"]) -> {"a0": 0.3 share, "a1": 0.2 share}."""
    return {
        f"{prefix}{i}": DeviceSlotInfo(slot_type, slot, D(str(c))) for i, c in enumerate(capacities)
    }


def fmap(
    capacities: Sequence[Any],
    *,
    quantum: str = "0.01",
    strategy: AllocationStrategy = EVENLY,
    slot: str = "cuda.shares",
    prefix: str = "a",
    **kw: Any,
) -> FractionAllocMap:
    return FractionAllocMap(
        devices(slot, capacities, prefix=prefix),
        quantum_size=D(quantum),
        allocation_strategy=strategy,
        **kw,
    )


def dmap(
    capacities: Sequence[Any],
    *,
    strategy: AllocationStrategy = EVENLY,
    slot: str = "cpu",
    prefix: str = "a",
    slot_type: SlotTypes = SlotTypes.COUNT,
    **kw: Any,
) -> DiscreteAllocMap:
    return DiscreteAllocMap(
        devices(slot, capacities, prefix=prefix, slot_type=slot_type),
        allocation_strategy=strategy,
        **kw,
    )


def amounts(per_device: Mapping[str, Any]) -> dict[str, Decimal]:
    """amounts({"a0": "0.2"}) -> {"a0": Decimal("0.2")}."""
    return {device: D(str(v)) for device, v in per_device.items()}


def allocated_of(alloc_map: Any, slot: str) -> dict[str, Decimal]:
    return dict(alloc_map.allocations[slot])
