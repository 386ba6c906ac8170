"""``client.agents`` (superadmin) and ``client.config`` (slot types, UI metadata)."""

from __future__ import annotations

import builtins
from typing import Any
from urllib.parse import quote

from .http import HttpCaller
from .models import AgentInfo, AllocMap, CompatAllocMap

__all__ = ["AgentsAPI", "ConfigAPI"]


def _path(agent_id: str, suffix: str = "") -> str:
    return f"/agents/{quote(agent_id, safe='')}{suffix}"


class AgentsAPI:
    def __init__(self, http: HttpCaller) -> None:
        self._http = http

    async def list(
        self, *, status: str | None = None, scaling_group: str | None = None
    ) -> builtins.list[AgentInfo]:
        answer = await self._http.request(
            "GET", "/agents", params={"status": status, "scaling_group": scaling_group}
        )
        return [AgentInfo.model_validate(item) for item in answer.get("items", [])]

    async def get(self, agent_id: str) -> AgentInfo:
        """The agent with its last heartbeat's allocation map and slot metadata."""
        return AgentInfo.model_validate(await self._http.request("GET", _path(agent_id)))

    async def alloc_map(self, agent_id: str) -> AllocMap:
        """Live from the agent: every plugin, slot and device (``source="agent"``)."""
        return AllocMap.model_validate(
            await self._http.request("GET", _path(agent_id, "/alloc-map"))
        )

    async def alloc_map_compat(self, agent_id: str) -> CompatAllocMap:
        """Backend.AI's ``{device: "0.80"}`` (accelerator slots, two decimals)."""
        answer = await self._http.request(
            "GET", _path(agent_id, "/alloc-map"), params={"form": "compat"}
        )
        return CompatAllocMap.model_validate(answer)


class ConfigAPI:
    def __init__(self, http: HttpCaller) -> None:
        self._http = http

    async def resource_slots(self) -> dict[str, str]:
        """``{slot: type}`` of every slot the agents have reported (``cpu: count``...)."""
        answer = await self._http.request("GET", "/config/resource-slots")
        return {str(k): str(v) for k, v in answer.items()}

    async def resource_slot_details(self, *, scaling_group: str | None = None) -> dict[str, Any]:
        """UI metadata per slot (``human_readable_name``, ``display_unit``...)."""
        answer = await self._http.request(
            "GET", "/config/resource-slots/details", params={"sgroup": scaling_group}
        )
        return dict(answer)
