"""GraphQL at ``/admin/gql`` (strawberry; same authentication as REST; snake_case names).

Backend.AI's field names and shapes; slot maps are JSON *strings* (its ``JSONString``)::

    query ($agent_id: String!) {
      agent(agent_id: $agent_id) { id status available_slots occupied_slots gpu_alloc_map alloc_map }
    }
    -> {"data": {"agent": {"gpu_alloc_map": "{\\"...2d02\\": \\"0.80\\", \\"...2d01\\": \\"0.60\\"}", ...}}}

* ``agent(agent_id)``, ``agents(status, scaling_group)``, ``agent_list(limit, offset,
  status, scaling_group) { items total_count }`` — superadmin;
* ``compute_session(id)`` (id or the caller's session name),
  ``compute_session_list(limit, offset, status, access_key) { items total_count }`` —
  the caller's visibility (user: own, admin: domain, superadmin: all).

``gpu_alloc_map`` and ``alloc_map`` are read live from the agent (see
:mod:`accelshare.manager.agents`).  Errors come back as GraphQL ``errors`` with the
same message a REST problem would carry.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import strawberry
from fastapi import Depends
from strawberry.fastapi import GraphQLRouter
from strawberry.schema.config import StrawberryConfig
from strawberry.types import Info

from accelshare.manager.agents import gpu_alloc_map_string
from accelshare.manager.errors import ManagerError
from accelshare.manager.models import Agent, AgentStatus, UserRole
from accelshare.manager.runtime import Manager
from accelshare.sched.lifecycle import SessionStatus

from .auth import Identity, current_identity
from .deps import get_manager

__all__ = ["create_graphql_router", "schema"]


def _context(info: Info) -> tuple[Manager, Identity]:
    ctx = info.context
    return ctx["manager"], ctx["identity"]


def _require_superadmin(identity: Identity) -> None:
    if not identity.is_superadmin:
        raise PermissionError(
            f"This needs the superadmin role; {identity.email} has {identity.role}"
        )


def _json(value: Any) -> str:
    return json.dumps(value)


@strawberry.type(name="Agent")
class AgentNode:
    id: str
    status: str
    status_changed: str | None
    region: str
    scaling_group: str
    addr: str
    architecture: str
    version: str
    schedulable: bool
    available_slots: str
    occupied_slots: str
    compute_plugins: str
    first_contact: str | None
    last_heartbeat: str | None
    lost_at: str | None
    _row: strawberry.Private[Agent]

    @classmethod
    def from_row(cls, row: Agent) -> AgentNode:
        return cls(
            id=row.id,
            status=row.status.value,
            status_changed=row.status_changed_at.isoformat() if row.status_changed_at else None,
            region=row.region,
            scaling_group=row.scaling_group,
            addr=row.address,
            architecture=row.architecture,
            version=row.version,
            schedulable=row.is_schedulable,
            available_slots=_json(row.available_slots.to_json()),
            occupied_slots=_json(row.occupied_slots.to_json()),
            compute_plugins=_json(row.compute_plugins or {}),
            first_contact=row.first_contact_at.isoformat() if row.first_contact_at else None,
            last_heartbeat=row.last_heartbeat_at.isoformat() if row.last_heartbeat_at else None,
            lost_at=row.lost_at.isoformat() if row.lost_at else None,
            _row=row,
        )

    @strawberry.field
    async def gpu_alloc_map(self, info: Info) -> str:
        """Live ``{device: "0.80"}`` of the accelerators, as a JSON string."""
        manager, _ = _context(info)
        answer = await manager.alloc_map(self._row, compat=True)
        return gpu_alloc_map_string(answer.get("alloc_map", {}))

    @strawberry.field
    async def alloc_map(self, info: Info) -> str:
        """Live full allocation map (every plugin, slot and device), as a JSON string."""
        manager, _ = _context(info)
        return _json(await manager.alloc_map(self._row, compat=False))


@strawberry.type
class AgentList:
    items: list[AgentNode]
    total_count: int


@strawberry.type(name="ComputeSession")
class ComputeSessionNode:
    id: str
    session_id: str
    name: str
    session_name: str
    type: str
    image: str
    architecture: str
    status: str
    status_info: str | None
    status_data: str
    status_changed: str | None
    result: str
    priority: int
    scaling_group: str
    agent: str | None
    agent_ids: list[str]
    access_key: str
    user_id: str
    group_id: str
    domain_name: str
    requested_slots: str
    occupied_slots: str
    resource_opts: str
    created_at: str | None
    scheduled_at: str | None
    starts_at: str | None
    terminated_at: str | None

    @classmethod
    def from_json(cls, s: dict[str, Any]) -> ComputeSessionNode:
        return cls(
            id=s["sessionId"],
            session_id=s["sessionId"],
            name=s["sessionName"],
            session_name=s["sessionName"],
            type=s["type"],
            image=s["image"],
            architecture=s["architecture"],
            status=s["status"],
            status_info=s["statusInfo"],
            status_data=_json(s["statusData"]),
            status_changed=s["statusChangedAt"],
            result=s["result"],
            priority=s["priority"],
            scaling_group=s["scalingGroup"],
            agent=s["agentId"],
            agent_ids=[s["agentId"]] if s["agentId"] else [],
            access_key=s["accessKey"],
            user_id=s["userId"],
            group_id=s["groupId"],
            domain_name=s["domainName"],
            requested_slots=_json(s["requestedSlots"]),
            occupied_slots=_json(s["occupiedSlots"]),
            resource_opts=_json(s["resourceOpts"]),
            created_at=s["creationTime"],
            scheduled_at=s["scheduledAt"],
            starts_at=s["startsAt"],
            terminated_at=s["terminationTime"],
        )


@strawberry.type
class ComputeSessionList:
    items: list[ComputeSessionNode]
    total_count: int


def _agent_status(status: str | None) -> AgentStatus | None:
    if not status:
        return None
    try:
        return AgentStatus(status.upper())
    except ValueError:
        raise ValueError(
            f"Unknown agent status {status!r}: expected one of {', '.join(AgentStatus)}"
        ) from None


def _session_statuses(status: str | None) -> list[SessionStatus] | None:
    if not status:
        return None
    try:
        return [SessionStatus(s.strip().upper()) for s in status.split(",")]
    except ValueError:
        raise ValueError(
            f"Unknown session status in {status!r}: expected some of {', '.join(SessionStatus)}"
        ) from None


@strawberry.type
class Query:
    @strawberry.field
    async def agent(self, info: Info, agent_id: str) -> AgentNode | None:
        manager, identity = _context(info)
        _require_superadmin(identity)
        try:
            return AgentNode.from_row(await manager.get_agent(agent_id))
        except ManagerError:
            return None

    @strawberry.field
    async def agents(
        self, info: Info, status: str | None = None, scaling_group: str | None = None
    ) -> list[AgentNode]:
        manager, identity = _context(info)
        _require_superadmin(identity)
        rows = await manager.list_agents(status=_agent_status(status), scaling_group=scaling_group)
        return [AgentNode.from_row(r) for r in rows]

    @strawberry.field
    async def agent_list(
        self,
        info: Info,
        limit: int = 20,
        offset: int = 0,
        status: str | None = None,
        scaling_group: str | None = None,
    ) -> AgentList:
        manager, identity = _context(info)
        _require_superadmin(identity)
        rows = await manager.list_agents(status=_agent_status(status), scaling_group=scaling_group)
        page = rows[offset : offset + limit]
        return AgentList(items=[AgentNode.from_row(r) for r in page], total_count=len(rows))

    @strawberry.field
    async def compute_session(self, info: Info, id: str) -> ComputeSessionNode | None:
        manager, identity = _context(info)
        try:
            return ComputeSessionNode.from_json(await manager.sessions.get(identity, id))
        except ManagerError:
            return None

    @strawberry.field
    async def compute_session_list(
        self,
        info: Info,
        limit: int = 20,
        offset: int = 0,
        status: str | None = None,
        access_key: str | None = None,
    ) -> ComputeSessionList:
        manager, identity = _context(info)
        statuses = _session_statuses(status)
        if statuses is None:
            statuses = list(SessionStatus)
        if access_key and identity.role is UserRole.USER and access_key != identity.access_key:
            return ComputeSessionList(items=[], total_count=0)
        page = await manager.sessions.list_sessions(
            identity, statuses=statuses, access_key=access_key, limit=limit, offset=offset
        )
        return ComputeSessionList(
            items=[ComputeSessionNode.from_json(s) for s in page["items"]],
            total_count=page["total"],
        )


schema = strawberry.Schema(query=Query, config=StrawberryConfig(auto_camel_case=False))


async def _get_context(
    identity: Annotated[Identity, Depends(current_identity)],
    manager: Annotated[Manager, Depends(get_manager)],
) -> dict[str, Any]:
    return {"identity": identity, "manager": manager}


def create_graphql_router() -> GraphQLRouter[Any, Any]:
    return GraphQLRouter(
        schema,
        graphql_ide=None,
        allow_queries_via_get=False,
        context_getter=_get_context,
        tags=["graphql"],
    )
