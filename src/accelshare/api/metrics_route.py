"""``GET /metrics``: Prometheus text (public, like the agents'; counts only, no names)."""

from __future__ import annotations

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST

from accelshare.manager.enums import AgentStatus
from accelshare.sched.lifecycle import SessionStatus

from .deps import ManagerDep

__all__ = ["router"]

router = APIRouter(tags=["meta"])


@router.get("/metrics", response_class=Response)
async def metrics(manager: ManagerDep) -> Response:
    sessions = await manager.count_sessions_by_status()
    for status in SessionStatus:
        manager.metrics.sessions.labels(status.value).set(sessions.get(status.value, 0))
    agents = await manager.count_agents_by_status()
    for agent_status in AgentStatus:
        manager.metrics.agents.labels(agent_status.value).set(agents.get(agent_status.value, 0))
    return Response(manager.metrics.render(), media_type=CONTENT_TYPE_LATEST)
