"""Concurrency: 100 creators against room for 10, repeated; create/destroy storms.

Short run: 5 repetitions and 3 storm rounds; ``ACCELSHARE_RELIABILITY_FULL=1``:
100 repetitions and 20 rounds.  Every repetition checks the accounting invariants of
:mod:`.invariants` (the manager's counters against a recount from the DB and against
the agents' own alloc maps).
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from typing import Any

from component.manager.cluster import Cluster

from .conftest import scaled
from .invariants import all_sessions, assert_accounted, assert_ledgers_agree, live_sessions

SHARE = {"cpu": 1, "mem": "256m", "cuda.shares": "0.4"}  # 2 agents x 2 GPUs: room for 10
TERMINAL = {"TERMINATED", "CANCELLED"}


async def _drain(cluster: Cluster, ids: list[str]) -> None:
    responses = await asyncio.gather(*(cluster.admin.delete(f"/session/{sid}") for sid in ids))
    assert all(r.status_code in (200, 404) for r in responses), [r.text for r in responses]

    async def gone() -> bool:
        if set(ids) & {s["sessionId"] for s in await live_sessions(cluster.admin)}:
            return False
        held = {k.request.session_id for a in cluster.agents.values() for k in a.kernels.values()}
        return not held & set(ids)

    await cluster.until(gone, timeout_s=60, what="the sessions ended and released")


async def test_hundred_creators_room_for_ten_repeated(sqlite_cluster: Cluster) -> None:
    cluster = sqlite_cluster
    agents = [await cluster.add_agent(f"i-node0{i}", cpus=16) for i in (1, 2)]
    acknowledged: set[str] = set()
    repetitions = scaled(5, 100)
    for rep in range(repetitions):
        responses = await asyncio.gather(*(cluster.create(SHARE) for _ in range(100)))
        assert [r.status_code for r in responses] == [201] * 100, (rep, responses[0].text)
        ids = [r.json()["sessionId"] for r in responses]
        assert len(set(ids)) == 100
        acknowledged |= set(ids)

        async def settled() -> Counter[str] | None:
            # earlier repetitions have ended: the live sessions are this one's
            counts = Counter(s["status"] for s in await live_sessions(cluster.admin))
            return counts if counts["RUNNING"] == 10 and counts["PENDING"] == 90 else None

        await cluster.until(settled, timeout_s=60, what=f"rep {rep}: 10 RUNNING, 90 PENDING")
        await cluster.manager.scheduler.run_once()  # another pass changes nothing
        counts = Counter(s["status"] for s in await live_sessions(cluster.admin))
        assert counts == {"RUNNING": 10, "PENDING": 90}, (rep, counts)
        for agent in agents:
            await agent.heartbeat()
        await assert_ledgers_agree(cluster.manager, agents)
        assert sum(len(a.kernels) for a in agents) == 10
        # cancel the waiting ones first, so that no freed room starts one of them
        listed = {s["sessionId"]: s["status"] for s in await live_sessions(cluster.admin)}
        await _drain(cluster, [sid for sid in ids if listed[sid] == "PENDING"])
        await _drain(cluster, ids)
        await assert_ledgers_agree(cluster.manager, agents)
    assert cluster.manager.metrics.bind_failures._value.get() == 0
    listed = await all_sessions(cluster.admin)
    counts = assert_accounted(acknowledged, listed)
    assert len(listed) == 100 * repetitions
    assert set(counts) <= TERMINAL
    assert sum(a.created for a in agents) == 10 * repetitions


async def test_create_destroy_storm_never_drifts(sqlite_cluster: Cluster) -> None:
    cluster = sqlite_cluster
    agents = [await cluster.add_agent(f"i-node0{i}", cpus=16) for i in (1, 2)]
    rng = random.Random(11)
    acknowledged: set[str] = set()
    live: list[str] = []

    async def create() -> None:
        amount = rng.choice(["0.1", "0.3", "0.5", "1.0"])
        response = await cluster.create({"cpu": 1, "mem": "128m", "cuda.shares": amount})
        assert response.status_code == 201, response.text
        sid = response.json()["sessionId"]
        acknowledged.add(sid)
        live.append(sid)

    async def destroy() -> None:
        if not live:
            return
        sid = live.pop(rng.randrange(len(live)))
        response = await cluster.admin.delete(f"/session/{sid}")
        assert response.status_code in (200, 404), response.text

    for _ in range(scaled(3, 20)):
        jobs: list[Any] = []
        for _ in range(60):
            jobs.append(create() if rng.random() < 0.6 else destroy())
        await asyncio.gather(*jobs)
        await cluster.manager.scheduler.run_once()

        async def quiet() -> bool:
            listed = await all_sessions(cluster.admin)
            moving = {"SCHEDULED", "PREPARING", "PREPARED", "CREATING", "TERMINATING"}
            return not any(s["status"] in moving for s in listed)

        await cluster.until(quiet, timeout_s=60, what="no session in transit")
        for agent in agents:
            await agent.heartbeat()
        await assert_ledgers_agree(cluster.manager, agents)
        assert_accounted(acknowledged, await all_sessions(cluster.admin))
    # pending sessions still start once room frees up
    await _drain(cluster, list(live))
    late = [await cluster.create({"cuda.shares": "1.0"}, maxWaitSeconds=20) for _ in range(4)]
    assert [r.json()["status"] for r in late] == ["RUNNING"] * 4, [r.text for r in late]
    await assert_ledgers_agree(cluster.manager, agents)
