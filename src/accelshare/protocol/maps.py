"""An agent's allocation maps as it shows them: per plugin, per device, what is held.

The agent answers ``GET /v1/alloc-map`` with an :class:`AllocMapView` and puts each
:class:`PluginMapView` in its heartbeat; the manager's planner makes its per-device dry
run from them, and the client renders them (``accelshare admin agent``).
"""

from __future__ import annotations

from pydantic import Field

from accelshare.common import SlotTypes

from .fields import Amount, HeldAllocation, HeldAmount, WireModel

__all__ = ["AllocMapView", "DeviceView", "PluginMapView"]


class DeviceView(WireModel):
    device_id: str
    slot_name: str
    slot_type: SlotTypes
    capacity: HeldAmount
    allocated: HeldAmount
    free: Amount | None = None  # capacity - allocated (added later; None from older agents)
    numa_node: int | None = None
    model_name: str = ""
    kernels: dict[str, HeldAmount] = Field(default_factory=dict)  # kernel id -> amount held


class PluginMapView(WireModel):
    """One plugin's allocation map: enough for the manager's per-device dry run."""

    key: str
    kind: str  # "discrete" | "fractional"
    strategy: str  # "FILL" | "EVENLY"
    quantum: HeldAmount | None = None  # fractional maps only
    exclusive_slot_types: list[str] = Field(default_factory=list)
    devices: list[DeviceView]
    # Devices still held by kernels under a slot the current plugin set renamed
    # (e.g. fractional -> discrete); counted as occupied until those kernels end.
    legacy_allocations: HeldAllocation = Field(default_factory=dict)


class AllocMapView(WireModel):
    agent_id: str
    maps: dict[str, PluginMapView]  # plugin key -> map
