"""Safety under concurrency: resources are never given twice."""

from __future__ import annotations

import asyncio
from collections import Counter
from decimal import Decimal
from pathlib import Path

from accelshare_testkit.hollow_agent import HollowCluster

from .cluster import Cluster, running_cluster

OCCUPYING = {
    "SCHEDULED",
    "PREPARING",
    "PULLING",
    "PREPARED",
    "CREATING",
    "RUNNING",
    "TERMINATING",
    "ERROR",
}


async def test_hundred_concurrent_creations_on_room_for_ten(cluster: Cluster) -> None:
    # two agents x two GPUs of 1.0 share: room for exactly ten sessions of 0.4
    agents = [await cluster.add_agent(f"i-node0{i}", cpus=16) for i in (1, 2)]
    responses = await asyncio.gather(
        *(cluster.create({"cpu": 1, "mem": "256m", "cuda.shares": "0.4"}) for _ in range(100))
    )
    assert [r.status_code for r in responses] == [201] * 100, responses[0].text
    ids = [r.json()["sessionId"] for r in responses]
    assert len(set(ids)) == 100

    async def settled() -> Counter[str] | None:
        listing = (
            await cluster.admin.get("/sessions", params={"status": "all", "limit": 1000})
        ).json()
        counts = Counter(s["status"] for s in listing["items"])
        return counts if counts["RUNNING"] == 10 and counts["PENDING"] == 90 else None

    counts = await cluster.until(settled, what="10 RUNNING and 90 PENDING")
    assert sum(counts[s] for s in OCCUPYING) == 10
    # one more pass must not change anything
    await cluster.manager.scheduler.run_once()
    listing = (await cluster.admin.get("/sessions", params={"status": "all", "limit": 1000})).json()
    assert Counter(s["status"] for s in listing["items"]) == counts

    # the agents' own maps agree with the manager, and nothing was refused
    assert sum(a.created for a in agents) == 10
    assert cluster.manager.metrics.bind_failures._value.get() == 0
    for agent in agents:
        shares = agent.maps["cuda"].allocations["cuda.shares"]
        assert all(v <= 1 for v in shares.values())
        assert sum(shares.values()) == Decimal("0.4") * len(agent.kernels)
        detail = (await cluster.admin.get(f"/agents/{agent.agent_id}")).json()
        assert Decimal(detail["occupiedSlots"]["cuda.shares"]) == Decimal("0.4") * len(
            agent.kernels
        )
    pending = next(s["sessionId"] for s in listing["items"] if s["status"] == "PENDING")
    why = (await cluster.admin.get(f"/session/{pending}/why")).json()
    assert len(why["agents"]) == 2


async def test_two_manager_replicas_never_give_resources_twice(db_url: str, tmp_path: Path) -> None:
    """Two managers on one database schedule at the same time (PostgreSQL: advisory
    lock; SQLite: the write lock) and still place exactly what fits."""
    hollow = HollowCluster()
    async with (
        running_cluster(db_url, tmp_path / "state", hollow=hollow) as a,
        running_cluster(db_url, tmp_path / "state", hollow=hollow) as b,
    ):
        agent = await a.add_agent("i-node01", cpus=16)
        b.agents["i-node01"] = agent

        async def create(c: Cluster) -> int:
            return (await c.create({"cuda.shares": "0.2"})).status_code

        codes = await asyncio.gather(*(create(a if i % 2 else b) for i in range(40)))
        assert codes == [201] * 40

        async def settled() -> Counter[str] | None:
            listing = (
                await a.admin.get("/sessions", params={"status": "all", "limit": 100})
            ).json()
            counts = Counter(s["status"] for s in listing["items"])
            return counts if counts["RUNNING"] == 10 and counts["PENDING"] == 30 else None

        await a.until(settled, what="10 RUNNING, 30 PENDING across two managers")
        await asyncio.gather(a.manager.scheduler.run_once(), b.manager.scheduler.run_once())
        assert agent.created == 10
        assert a.manager.metrics.bind_failures._value.get() == 0
        assert b.manager.metrics.bind_failures._value.get() == 0
