"""Accounting invariants checked after storms and faults (issue #11).

* every session the API acknowledged is listed exactly once (none lost, none doubled);
* each agent's ``occupied_slots`` (the manager's counter) equals a recount from the DB:
  the sum of the occupying kernels' ``occupied_slots`` on that agent;
* a hollow agent's alloc maps equal the sum of its live kernels' allocations, and it
  holds exactly the kernels the manager considers occupying there.
"""

from __future__ import annotations

from collections import Counter
from decimal import Decimal
from typing import Any

import sqlalchemy as sa

from accelshare.common import ResourceSlot
from accelshare.manager.models import Agent, Kernel
from accelshare.manager.runtime import Manager
from accelshare.manager.transitions import OCCUPYING
from accelshare_testkit.hollow_agent import HollowAgent


async def all_sessions(client: Any) -> list[dict[str, Any]]:
    """Every session, page by page (1000 a page)."""
    return await _pages(client, "all")


async def live_sessions(client: Any) -> list[dict[str, Any]]:
    """The sessions not yet TERMINATED or CANCELLED."""
    return await _pages(client, None)


async def _pages(client: Any, status: str | None) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    while True:
        params: dict[str, Any] = {"limit": 1000, "offset": len(items)}
        if status:
            params["status"] = status
        response = await client.get("/sessions", params=params)
        assert response.status_code == 200, response.text
        page = response.json()
        items.extend(page["items"])
        if not page["items"] or len(items) >= page["total"]:
            return items


def assert_accounted(acknowledged: set[str], listed: list[dict[str, Any]]) -> Counter[str]:
    ids = Counter(s["sessionId"] for s in listed)
    doubled = [sid for sid, n in ids.items() if n > 1]
    assert not doubled, f"sessions listed twice: {doubled}"
    lost = acknowledged - set(ids)
    assert not lost, f"acknowledged sessions lost: {sorted(lost)}"
    return Counter(s["status"] for s in listed)


async def db_recount(manager: Manager) -> dict[str, tuple[ResourceSlot, ResourceSlot, set[str]]]:
    """agent id -> (the agent row's occupied_slots, the recount, occupying kernel ids)."""
    async with manager.db.begin() as db:
        agents = (await db.execute(sa.select(Agent))).scalars().all()
        kernels = (
            await db.execute(sa.select(Kernel).where(Kernel.status.in_(OCCUPYING)))
        ).scalars()
        recount: dict[str, ResourceSlot] = {a.id: ResourceSlot() for a in agents}
        held: dict[str, set[str]] = {a.id: set() for a in agents}
        for kernel in kernels:
            assert kernel.agent_id is not None, f"occupying kernel {kernel.id} has no agent"
            recount[kernel.agent_id] = recount[kernel.agent_id] + kernel.occupied_slots
            held[kernel.agent_id].add(str(kernel.id))
        return {a.id: (a.occupied_slots, recount[a.id], held[a.id]) for a in agents}


def hollow_totals(agent: HollowAgent) -> dict[str, Decimal]:
    """slot -> the sum over the agent's alloc maps (what its allocations holds)."""
    totals: dict[str, Decimal] = {}
    for alloc_map in agent.maps.values():
        for slot, per_device in alloc_map.allocations.items():
            totals[slot] = totals.get(slot, Decimal(0)) + sum(per_device.values(), Decimal(0))
    return {k: v for k, v in totals.items() if v}


def kernel_totals(agent: HollowAgent) -> dict[str, Decimal]:
    totals: dict[str, Decimal] = {}
    for kernel in agent.kernels.values():
        for per_slot in kernel.allocation.values():
            for slot, per_device in per_slot.items():
                totals[slot] = totals.get(slot, Decimal(0)) + sum(per_device.values(), Decimal(0))
    return {k: v for k, v in totals.items() if v}


async def assert_allocations_agree(manager: Manager, agents: list[HollowAgent]) -> None:
    recount = await db_recount(manager)
    for agent_id, (counter, counted, _) in recount.items():
        assert counter == counted, f"{agent_id}: occupied_slots {counter} != recount {counted}"
    for agent in agents:
        counter, _, held = recount[agent.agent_id]
        assert set(agent.kernels) == held, (
            f"{agent.agent_id}: agent holds {sorted(agent.kernels)}, manager {sorted(held)}"
        )
        assert hollow_totals(agent) == kernel_totals(agent), agent.agent_id
        manager_view = {k: v for k, v in counter.items() if v}
        assert manager_view == hollow_totals(agent), (
            f"{agent.agent_id}: manager {manager_view} != agent {hollow_totals(agent)}"
        )
