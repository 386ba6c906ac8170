"""Agent routes (superadmin): list, details, live allocation map.

| route | answer |
|---|---|
| ``GET /agents`` | ``{"items": [agent...]}``; ``?status=ALIVE&scaling_group=default`` |
| ``GET /agents/{id}`` | the agent: ``id, status, region, scalingGroup, address, availableSlots, occupiedSlots, computePlugins, quanta, firstContact, lastHeartbeat, lostAt, statusData`` plus ``allocMap`` (last heartbeat's per-device view) |
| ``GET /agents/{id}/alloc-map`` | live from the agent: ``{agent_id, maps: {plugin: PluginMapView}, source}``; ``?form=compat``: ``{alloc_map: {device: "0.80"}, source}`` |
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query

from accelshare.manager.agents import agent_json, full_from_views, views_of
from accelshare.manager.models import AgentStatus

from .auth import SuperadminIdentity
from .deps import ManagerDep
from .problems import InvalidAPIParameters

__all__ = ["router"]

router = APIRouter(tags=["agents"])


@router.get("/agents")
async def list_agents(
    _identity: SuperadminIdentity,
    manager: ManagerDep,
    status: str | None = None,
    scaling_group: str | None = None,
) -> dict[str, Any]:
    wanted: AgentStatus | None = None
    if status:
        try:
            wanted = AgentStatus(status.upper())
        except ValueError:
            raise InvalidAPIParameters(
                f"Unknown agent status {status!r}",
                field="status",
                expected="one of " + ", ".join(AgentStatus),
                received=status,
            ) from None
    agents = await manager.list_agents(status=wanted, scaling_group=scaling_group)
    return {"items": [agent_json(a) for a in agents]}


@router.get("/agents/{agent_id}")
async def get_agent(
    agent_id: str, _identity: SuperadminIdentity, manager: ManagerDep
) -> dict[str, Any]:
    agent = await manager.get_agent(agent_id)
    body = agent_json(agent)
    body["allocMap"] = full_from_views(agent.id, views_of(agent))
    body["slotMetadata"] = agent.slot_metadata or {}
    return body


@router.get("/agents/{agent_id}/alloc-map")
async def agent_alloc_map(
    agent_id: str,
    _identity: SuperadminIdentity,
    manager: ManagerDep,
    form: Annotated[Literal["full", "compat"], Query()] = "full",
) -> dict[str, Any]:
    agent = await manager.get_agent(agent_id)
    return await manager.alloc_map(agent, compat=form == "compat")
