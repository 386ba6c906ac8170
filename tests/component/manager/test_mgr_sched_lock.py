"""PostgreSQL: one scheduling pass per scaling group at a time, across manager replicas.

The compare-and-set of the plan applier alone already prevents double allocation (so
``test_two_manager_replicas_never_give_resources_twice`` would pass without the lock);
these tests watch the lock itself: a pass waits while another connection holds the
scaling group's ``pg_advisory_xact_lock``, and two replicas' passes never overlap.
Nothing sleeps: the tests look at ``pg_locks`` to see a pass waiting for the lock.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from sqlalchemy.engine import make_url

from accelshare.manager.scheduler import loop
from accelshare.manager.scheduler.loop import advisory_key
from accelshare_testkit.hollow_agent import HollowCluster

from .cluster import Cluster, running_cluster
from .conftest import temporary_pg_database

pytestmark = pytest.mark.integration


@pytest.fixture
async def pg_url() -> AsyncIterator[str]:
    async with temporary_pg_database() as url:
        yield url


async def connect(url: str) -> asyncpg.Connection:
    raw = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    return await asyncpg.connect(raw, timeout=5)


async def waiting_for_the_lock(watcher: asyncpg.Connection, scaling_group: str) -> int:
    """How many backends of this database wait for the scaling group's advisory lock."""
    key = advisory_key(scaling_group) & 0xFFFF_FFFF_FFFF_FFFF  # pg_locks shows it as two oids
    count: int = await watcher.fetchval(
        "SELECT count(*) FROM pg_locks"
        " WHERE locktype = 'advisory' AND NOT granted AND objsubid = 1"
        " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        " AND classid::bigint = $1 AND objid::bigint = $2",
        key >> 32,
        key & 0xFFFF_FFFF,
    )
    return count


async def until(condition: Callable[[], Awaitable[bool]], what: str, cluster: Cluster) -> None:
    await cluster.until(condition, timeout_s=20, what=what)


async def test_a_pass_waits_while_another_connection_holds_the_lock(
    pg_url: str, tmp_path: Path
) -> None:
    async with running_cluster(pg_url, tmp_path / "state", background=False) as cluster:
        await cluster.add_agent("i-node01")
        created = await cluster.create({"cuda.shares": "0.5"}, name="waits", enqueueOnly=True)
        assert created.status_code == 201, created.text
        holder, watcher = await connect(pg_url), await connect(pg_url)
        try:
            held = holder.transaction()
            await held.start()
            await holder.execute("SELECT pg_advisory_xact_lock($1)", advisory_key("default"))
            scheduling = asyncio.create_task(cluster.manager.scheduler.run_once())

            async def blocked_or_done() -> bool:
                return scheduling.done() or await waiting_for_the_lock(watcher, "default") == 1

            await until(blocked_or_done, "the pass to wait for the advisory lock", cluster)
            assert not scheduling.done(), "the pass ran while another connection held the lock"
            assert (await cluster.session("waits"))["status"] == "PENDING"  # the API still answers
            await held.commit()  # the lock goes with the transaction
            results = await asyncio.wait_for(scheduling, 20)
        finally:
            await holder.close()
            await watcher.close()
        assert [r.scaling_group for r in results] == ["default"]
        assert (await cluster.session("waits"))["status"] != "PENDING"


async def test_passes_of_two_replicas_never_overlap(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Replica A's pass is held inside its locked section until replica B's pass is seen
    waiting for the lock; the recorded enter/leave of the locked section never interleave."""
    trace: list[str] = []
    release_first = asyncio.Event()
    load_snapshot, apply_plan = loop.load_snapshot, loop.apply_plan

    async def entering(*args: Any, **kwargs: Any) -> Any:  # first call inside the lock
        trace.append("enter")
        if trace.count("enter") == 1:
            await release_first.wait()
        return await load_snapshot(*args, **kwargs)

    async def leaving(*args: Any, **kwargs: Any) -> Any:  # last call before the commit
        applied = await apply_plan(*args, **kwargs)
        trace.append("leave")
        return applied

    monkeypatch.setattr(loop, "load_snapshot", entering)
    monkeypatch.setattr(loop, "apply_plan", leaving)
    hollow = HollowCluster()
    async with (
        running_cluster(pg_url, tmp_path / "state", hollow=hollow, background=False) as a,
        running_cluster(pg_url, tmp_path / "state", hollow=hollow, background=False) as b,
    ):
        agent = await a.add_agent("i-node01")
        b.agents["i-node01"] = agent
        for i in range(4):
            response = await (a, b)[i % 2].create({"cuda.shares": "0.5"}, enqueueOnly=True)
            assert response.status_code == 201, response.text
        watcher = await connect(pg_url)
        try:
            first = asyncio.create_task(a.manager.scheduler.run_once())

            async def a_inside() -> bool:
                return trace == ["enter"]

            await until(a_inside, "replica A inside its pass", a)
            second = asyncio.create_task(b.manager.scheduler.run_once())

            async def b_blocked_or_inside() -> bool:
                return len(trace) > 1 or await waiting_for_the_lock(watcher, "default") == 1

            await until(b_blocked_or_inside, "replica B to wait for the lock", b)
            assert trace == ["enter"], f"replica B entered while A was inside: {trace}"
            release_first.set()
            await asyncio.wait_for(asyncio.gather(first, second), 30)
        finally:
            release_first.set()
            await watcher.close()
        assert trace == ["enter", "leave", "enter", "leave"]
        listed = (await a.admin.get("/sessions", params={"status": "all"})).json()["items"]
        assert sorted(s["status"] for s in listed).count("PENDING") == 0
