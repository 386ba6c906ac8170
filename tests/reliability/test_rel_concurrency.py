"""Concurrency: 100 creators against room for 10, repeated (on SQLite and on PostgreSQL);
create/destroy storms; a keypair quota under concurrent creation.

Short run: 5 repetitions on SQLite and 3 on PostgreSQL, 3 storm rounds, 2 quota rounds;
``ACCELSHARE_RELIABILITY_FULL=1``: 100 repetitions on each, 20 rounds, 10 quota rounds.  Every repetition checks the accounting invariants of
:mod:`.invariants` (the manager's counters against a recount from the DB and against
the agents' own alloc maps).
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import AsyncIterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from accelshare.common import ResourceSlot
from accelshare.manager.models import Kernel, Session
from accelshare.manager.transitions import OCCUPYING
from component.manager.cluster import Cluster, running_cluster
from component.manager.conftest import temporary_pg_database

from .conftest import scaled
from .invariants import all_sessions, assert_accounted, assert_allocations_agree, live_sessions

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


@pytest.fixture(
    params=["sqlite", pytest.param("postgresql", marks=pytest.mark.integration)],
)
async def any_cluster(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    """A manager on SQLite, or on a fresh PostgreSQL database (skips if unreachable)."""
    if request.param == "sqlite":
        url = f"sqlite+aiosqlite:///{tmp_path / 'manager.db'}"
        async with running_cluster(url, tmp_path / "state") as running:
            yield running
        return
    async with (
        temporary_pg_database() as url,
        running_cluster(url, tmp_path / "state") as running,
    ):
        yield running


async def test_hundred_creators_room_for_ten_repeated(
    any_cluster: Cluster, request: pytest.FixtureRequest
) -> None:
    cluster = any_cluster
    agents = [await cluster.add_agent(f"i-node0{i}", cpus=16) for i in (1, 2)]
    acknowledged: set[str] = set()
    on_postgresql = "postgresql" in request.node.callspec.id
    repetitions = scaled(3 if on_postgresql else 5, 100)
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
        await assert_allocations_agree(cluster.manager, agents)
        assert sum(len(a.kernels) for a in agents) == 10
        # cancel the waiting ones first, so that no freed room starts one of them
        listed = {s["sessionId"]: s["status"] for s in await live_sessions(cluster.admin)}
        await _drain(cluster, [sid for sid in ids if listed[sid] == "PENDING"])
        await _drain(cluster, ids)
        await assert_allocations_agree(cluster.manager, agents)
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
        await assert_allocations_agree(cluster.manager, agents)
        assert_accounted(acknowledged, await all_sessions(cluster.admin))
    # pending sessions still start once room frees up
    await _drain(cluster, list(live))
    late = [await cluster.create({"cuda.shares": "1.0"}, maxWaitSeconds=20) for _ in range(4)]
    assert [r.json()["status"] for r in late] == ["RUNNING"] * 4, [r.text for r in late]
    await assert_allocations_agree(cluster.manager, agents)


async def _occupied_by(cluster: Cluster, access_key: str) -> ResourceSlot:
    """A recount from the DB: what the keypair's occupying kernels hold."""
    async with cluster.manager.db.begin() as db:
        rows = (
            await db.execute(
                sa.select(Kernel.occupied_slots)
                .join(Session, Session.id == Kernel.session_id)
                .where(Kernel.status.in_(OCCUPYING), Session.access_key == access_key)
            )
        ).scalars()
        total = ResourceSlot()
        for slots in rows:
            total = total + slots
        return total


async def test_a_keypair_quota_holds_under_concurrent_creation(sqlite_cluster: Cluster) -> None:
    """50 creators of a capped user (cuda.shares 1.2 = three 0.4 sessions) race 50 of the
    uncapped admin for room for 10: the user never holds more than the quota (recounted
    from the DB), the admin fills the rest, and the user's waiting sessions start as the
    user's own sessions end — the quota is a limit, not a drifting counter."""
    cluster = sqlite_cluster
    agents = [await cluster.add_agent(f"i-node0{i}", cpus=16) for i in (1, 2)]
    made = await cluster.admin.post(
        "/admin/resource-policies",
        json={
            "name": "capped",
            "default_for_unspecified": "UNLIMITED",
            "total_resource_slots": {"cuda.shares": "1.2"},
        },
    )
    assert made.status_code == 201, made.text
    answer = await cluster.admin.post(
        "/admin/users",
        json={
            "email": "capped@example.com",
            "password": "long enough password",
            "resource_policy": "capped",
        },
    )
    assert answer.status_code == 201, answer.text
    keypair = answer.json()["keypair"]
    quota = Decimal("1.2")
    async with cluster.client(keypair["access_key"], keypair["secret_key"]) as user:
        for rnd in range(scaled(2, 10)):
            jobs = [cluster.create(SHARE, client=user) for _ in range(50)]
            jobs += [cluster.create(SHARE) for _ in range(50)]
            order = list(range(100))
            random.Random(rnd).shuffle(order)
            responses = await asyncio.gather(*(jobs[i] for i in order))
            assert [r.status_code for r in responses] == [201] * 100, responses[0].text
            by_id = {r.json()["sessionId"]: i for r, i in zip(responses, order, strict=True)}
            mine = {sid for sid, i in by_id.items() if i < 50}

            async def settled(mine: set[str] = mine) -> Counter[tuple[bool, str]] | None:
                listed = await live_sessions(cluster.admin)
                counts = Counter((s["sessionId"] in mine, s["status"]) for s in listed)
                running = counts[(True, "RUNNING")] + counts[(False, "RUNNING")]
                return counts if running == 10 else None

            counts = await cluster.until(settled, timeout_s=60, what=f"round {rnd}: room full")
            # FIFO decides who came first; the quota decides how many of the user's run
            assert counts[(True, "RUNNING")] <= 3, counts
            held = await _occupied_by(cluster, keypair["access_key"])
            assert held.get("cuda.shares", 0) == Decimal("0.4") * counts[(True, "RUNNING")]
            for agent in agents:
                await agent.heartbeat()
            await assert_allocations_agree(cluster.manager, agents)

            # End the admin's sessions (room for 7 more and then some): the user gets
            # exactly its quota, and its waiting sessions say why.
            await _drain(cluster, [sid for sid in by_id if sid not in mine])

            async def at_quota() -> list[dict[str, Any]] | None:
                listed = await live_sessions(cluster.admin)
                return listed if len(_running(listed)) == 3 else None

            listed = await cluster.until(at_quota, timeout_s=30, what="the user at its quota")
            await cluster.manager.scheduler.run_once()  # another pass starts none of them
            listed = await live_sessions(cluster.admin)
            assert len(_running(listed)) == 3, listed
            assert (await _occupied_by(cluster, keypair["access_key"])).get("cuda.shares") == quota
            waiting = await cluster.session(next(iter(mine - _running(listed))))
            assert "Keypair resource quota exceeded" in waiting["statusInfo"], waiting
            # End the user's running ones one at a time: each is replaced, never exceeded.
            for _ in range(3):
                ended = next(iter(_running(listed) & mine))
                await _drain(cluster, [ended])

                async def replaced() -> set[str] | None:
                    now = _running(await live_sessions(cluster.admin))
                    return now if len(now) == 3 else None

                listed_ids = await cluster.until(replaced, timeout_s=30, what="a replacement")
                assert ended not in listed_ids
                held = await _occupied_by(cluster, keypair["access_key"])
                assert held.get("cuda.shares") == quota, held
                listed = await live_sessions(cluster.admin)
            await _drain(cluster, list(mine))
            await assert_allocations_agree(cluster.manager, agents)
    assert (await _occupied_by(cluster, keypair["access_key"])).get("cuda.shares", 0) == 0


def _running(listed: list[dict[str, Any]]) -> set[str]:
    return {s["sessionId"] for s in listed if s["status"] == "RUNNING"}
