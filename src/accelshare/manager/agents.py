"""Agents as the API shows them: rows, live allocation maps, UI slot metadata.

``gpu_alloc_map`` (GraphQL) is Backend.AI's shape, a JSON *string* of device ->
allocated amount with two decimals, e.g. ``{"...2d02": "0.80", "...2d01": "0.60"}``:
the live per-device sum of the accelerator slots (``cuda.shares``, ``cuda.device``...)
read from the agent's ``GET /v1/alloc-map?form=compat`` (spec 00, deliberate
difference 7: live, not a cached copy).  Devices are listed most allocated first
(then by id).  When the agent cannot be reached, the last heartbeat's view is used
and the answer says so (``"source": "heartbeat"``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Any, TypeAlias

from accelshare.common import INTRINSIC_SLOTS, SlotName
from accelshare.protocol import PluginMapView

from .models import Agent
from .scheduler.snapshot import parse_views

__all__ = [
    "AgentRecord",
    "agent_json",
    "compat_from_views",
    "format_compat",
    "full_from_views",
    "gpu_alloc_map_string",
    "slot_details",
    "views_of",
]

_HUNDREDTH = Decimal("0.01")

AgentRecord: TypeAlias = Agent
"""An agent's row as :meth:`~accelshare.manager.runtime.Manager.get_agent` and
``list_agents`` hand it to the API layer, which only reads it (never writes or queries
through it)."""


def _iso(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


def agent_json(agent: Agent) -> dict[str, Any]:
    return {
        "id": agent.id,
        "status": agent.status.value,
        "statusChangedAt": _iso(agent.status_changed_at),
        "region": agent.region,
        "scalingGroup": agent.scaling_group,
        "address": agent.address,
        "architecture": agent.architecture,
        "version": agent.version,
        "isSchedulable": agent.is_schedulable,
        "availableSlots": agent.available_slots.to_json(),
        "occupiedSlots": agent.occupied_slots.to_json(),
        "computePlugins": agent.compute_plugins or {},
        "quanta": agent.quanta or {},
        "firstContact": _iso(agent.first_contact_at),
        "lastHeartbeat": _iso(agent.last_heartbeat_at),
        "lostAt": _iso(agent.lost_at),
        "statusData": agent.status_data or {},
        "images": list(agent.images or ()),
    }


def _is_accelerator(slot: str) -> bool:
    if slot in INTRINSIC_SLOTS:
        return False
    try:
        return SlotName(slot).is_accelerator
    except ValueError:
        return True


def compat_from_views(views: Mapping[str, PluginMapView]) -> dict[str, Decimal]:
    """device -> allocated, over the accelerator slots of the heartbeat's views."""
    result: dict[str, Decimal] = {}
    for view in views.values():
        for d in view.devices:
            if _is_accelerator(d.slot_name):
                result[d.device_id] = result.get(d.device_id, Decimal(0)) + Decimal(d.allocated)
    return result


def full_from_views(agent_id: str, views: Mapping[str, PluginMapView]) -> dict[str, Any]:
    return {
        "agent_id": agent_id,
        "maps": {key: view.model_dump(mode="json") for key, view in views.items()},
    }


def format_compat(raw: Mapping[str, Any]) -> dict[str, str]:
    """Two decimals, most allocated first then by device id: ``{"GPU2": "0.80", ...}``."""
    amounts: dict[str, Decimal] = {}
    for device, value in raw.items():
        try:
            amounts[str(device)] = Decimal(str(value))
        except InvalidOperation:
            continue
    ordered = sorted(amounts.items(), key=lambda item: (-item[1], item[0]))
    return {device: str(amount.quantize(_HUNDREDTH)) for device, amount in ordered}


def gpu_alloc_map_string(raw: Mapping[str, Any]) -> str:
    return json.dumps(format_compat(raw))


def views_of(agent: Agent) -> dict[str, PluginMapView]:
    return parse_views(agent.map_views)


def slot_details(agents: list[Agent], known: Mapping[str, Any]) -> dict[str, Any]:
    """``GET /config/resource-slots/details``: UI metadata per slot from the agents."""
    details: dict[str, Any] = {}
    for agent in agents:
        for slot, meta in (agent.slot_metadata or {}).items():
            if isinstance(meta, Mapping):
                details.setdefault(slot, dict(meta))
    for slot in known:
        details.setdefault(
            slot,
            {
                "slot_name": slot,
                "human_readable_name": {"cpu": "CPU", "mem": "RAM"}.get(slot, slot),
                "description": {"cpu": "CPU", "mem": "Memory"}.get(slot, slot),
                "display_unit": {"cpu": "Core", "mem": "GiB"}.get(slot, ""),
                "number_format": {"binary": slot == "mem", "round_length": 0},
                "display_icon": {"cpu": "cpu", "mem": "memory"}.get(slot, ""),
            },
        )
    return {slot: details[slot] for slot in sorted(details)}
