"""Two small read-only routes the web console's launch dialog and agents page need.

| route | auth | answer |
|---|---|---|
| ``GET /config/resource-slots/limits?sgroup=`` | any | ``{slot: {quantum, max_per_agent}}`` over the ALIVE agents (of one scaling group when given): the step of a fractional slot (``"0.1"``; null for others) and the most one agent offers |
| ``GET /agents/{id}/stats`` | admin | the agent's live node stats: ``{agent_id, at, metrics: [{name, device_id, value, capacity, unit}], source}`` (``cuda_util``, ``cuda_mem``, ``cuda_power``, ``cuda_temperature``...); ``source`` is ``redis`` (with ``seq``, ``missed``, ``gapS``, ``ageS``) when the manager has a Redis bus, else ``agent``; 503 with the reason when there are none |

A user may not list agents, yet a launch dialog needs the fractional quantum to offer
valid amounts (a request off the grid is refused with ``NotMultipleOfQuantum``) and a
sensible slider range; ``limits`` gives exactly that and nothing about single agents.
When agents disagree on a quantum the coarsest one is reported (a multiple of it is
valid wherever the finer ones divide it, which is how quanta are configured: 0.1 and
0.05, 0.01...).
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation
from typing import Any

from fastapi import APIRouter

from accelshare.common import canonical_decimal
from accelshare.manager.enums import AgentStatus
from accelshare.manager.runtime import StatsUnavailable

from .auth import AdminIdentity, CurrentIdentity
from .deps import ManagerDep, ScalingGroupParam
from .problems import ServiceUnavailable

__all__ = ["router"]

router = APIRouter(tags=["console"])


def _decimal(value: Any) -> Decimal | None:
    try:
        amount = Decimal(str(value))
    except InvalidOperation:
        return None
    return amount if amount.is_finite() else None


@router.get("/config/resource-slots/limits")
async def resource_slot_limits(
    _identity: CurrentIdentity, manager: ManagerDep, scaling_group: ScalingGroupParam = None
) -> dict[str, Any]:
    agents = await manager.list_agents(status=AgentStatus.ALIVE, scaling_group=scaling_group)
    quanta: dict[str, Decimal] = {}
    largest: dict[str, Decimal] = {}
    for agent in agents:
        for slot, raw in (agent.quanta or {}).items():
            quantum = _decimal(raw)
            if quantum is not None and quantum > 0:
                quanta[slot] = max(quanta.get(slot, quantum), quantum)
        for slot, raw in agent.available_slots.to_json().items():
            amount = _decimal(raw)
            if amount is not None:
                largest[slot] = max(largest.get(slot, amount), amount)
    return {
        slot: {
            "quantum": canonical_decimal(quanta[slot]) if slot in quanta else None,
            "max_per_agent": canonical_decimal(largest[slot]),
        }
        for slot in sorted(largest)
    }


@router.get("/agents/{agent_id}/stats")
async def agent_stats(
    agent_id: str, _identity: AdminIdentity, manager: ManagerDep
) -> dict[str, Any]:
    agent = await manager.get_agent(agent_id)
    try:
        return await manager.node_stats(agent)
    except StatsUnavailable as e:
        raise ServiceUnavailable(str(e)) from None
