"""Agent routes (read-only; admin and superadmin): list, details, live allocation map.

| route | answer |
|---|---|
| ``GET /agents`` | ``{"items": [agent...]}``; ``?status=ALIVE&scaling_group=default`` |
| ``GET /agents/{id}`` | the agent: ``id, status, region, scalingGroup, address, availableSlots, occupiedSlots, computePlugins, quanta, firstContact, lastHeartbeat, lostAt, statusData`` plus ``allocMap`` (last heartbeat's per-device view) |
| ``GET /agents/{id}/alloc-map`` | live from the agent: ``{agent_id, maps: {plugin: PluginMapView}, source}``; ``?form=compat``: ``{alloc_map: {device: "0.80"}, source}`` |

Who sees what: agents are shared by every domain, so a domain admin may read them (the
console's Agents page), but the kernels holding a device are other people's sessions.
A superadmin sees every kernel id; an admin sees the ids of its own domain's kernels,
and every other kernel is renamed ``hidden-1``, ``hidden-2``... (:func:`hide_kernels`;
amounts and devices stay exact, so the bars still add up).  A user gets 403.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Set
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query

from accelshare.manager.agents import agent_json, full_from_views, views_of
from accelshare.manager.enums import AgentStatus
from accelshare.manager.runtime import Manager

from .auth import AdminIdentity, Identity
from .deps import ManagerDep
from .problems import InvalidAPIParameters

__all__ = [
    "HIDDEN_PREFIX",
    "hide_kernels",
    "hide_other_domains",
    "kernel_ids_in",
    "router",
]

router = APIRouter(tags=["agents"])

HIDDEN_PREFIX = "hidden-"


def kernel_ids_in(alloc_map: Mapping[str, Any]) -> set[str]:
    """Every kernel id holding a device in a full allocation map (``{maps: {...}}``)."""
    found: set[str] = set()
    for view in (alloc_map.get("maps") or {}).values():
        for device in view.get("devices") or ():
            found.update(device.get("kernels") or {})
    return found


def hide_kernels(
    alloc_map: Mapping[str, Any], shown: Set[str], tokens: dict[str, str]
) -> dict[str, Any]:
    """A copy of a full allocation map in which every kernel not in ``shown`` is renamed.

    ``tokens`` (kernel id -> ``hidden-N``) is filled as kernels are met and may be shared
    by several maps of one answer, so one foreign kernel holding two devices (or devices
    on two agents) keeps one name.  Devices are walked in the map's order, so the same
    map gives the same names.  Example, ``shown = {"k1"}``::

        GPU1 kernels {k1: 0.2, k9: 0.4}, GPU2 kernels {k9: 0.8}
        -> GPU1 {k1: 0.2, hidden-1: 0.4}, GPU2 {hidden-1: 0.8}
    """

    def name(kernel_id: str) -> str:
        if kernel_id in shown:
            return kernel_id
        return tokens.setdefault(kernel_id, f"{HIDDEN_PREFIX}{len(tokens) + 1}")

    maps: dict[str, Any] = {}
    for key, view in (alloc_map.get("maps") or {}).items():
        devices = [
            {**device, "kernels": {name(k): a for k, a in (device.get("kernels") or {}).items()}}
            for device in view.get("devices") or ()
        ]
        maps[key] = {**view, "devices": devices}
    return {**alloc_map, "maps": maps}


def hide_other_domains(
    domain: str, alloc_maps: Iterable[Mapping[str, Any] | None], holders: Mapping[str, Any]
) -> tuple[list[dict[str, Any] | None], dict[str, Any]]:
    """What a domain admin may see of the agents' maps and of who holds each kernel.

    ``holders`` maps kernel id -> ``{sessionId, sessionName, accessKey, status,
    domainName}``.  Kernels of ``domain``'s sessions keep their id and holder; every
    other kernel gets a ``hidden-N`` name whose holder is only ``{"hidden": true}``.
    """
    shown = {k for k, holder in holders.items() if holder.get("domainName") == domain}
    tokens: dict[str, str] = {}
    maps = [None if m is None else hide_kernels(m, shown, tokens) for m in alloc_maps]
    visible: dict[str, Any] = {k: holders[k] for k in sorted(shown)}
    visible.update({token: {"hidden": True} for token in tokens.values()})
    return maps, visible


async def _for(identity: Identity, manager: Manager, alloc_map: dict[str, Any]) -> dict[str, Any]:
    if identity.is_superadmin:
        return alloc_map
    ids = kernel_ids_in(alloc_map)
    shown = await manager.holders.in_domain(identity.domain_name, ids)
    return hide_kernels(alloc_map, shown, {})


@router.get("/agents")
async def list_agents(
    _identity: AdminIdentity,
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
async def get_agent(agent_id: str, identity: AdminIdentity, manager: ManagerDep) -> dict[str, Any]:
    agent = await manager.get_agent(agent_id)
    body = agent_json(agent)
    body["allocMap"] = await _for(identity, manager, full_from_views(agent.id, views_of(agent)))
    body["slotMetadata"] = agent.slot_metadata or {}
    return body


@router.get("/agents/{agent_id}/alloc-map")
async def agent_alloc_map(
    agent_id: str,
    identity: AdminIdentity,
    manager: ManagerDep,
    form: Annotated[Literal["full", "compat"], Query()] = "full",
) -> dict[str, Any]:
    agent = await manager.get_agent(agent_id)
    alloc_map = await manager.alloc_map(agent, compat=form == "compat")
    return alloc_map if form == "compat" else await _for(identity, manager, alloc_map)
