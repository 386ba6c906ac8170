"""The LOST sweep on its own timer: a silent agent goes LOST without anyone calling the
sweep, and is ALIVE again, reconciled, when it heartbeats.

The manager runs with its background loops, ``agent-timeout = 2`` and
``sweep-interval = 0.05`` from manager.toml; the clock is frozen and moved by hand, so
the sweep timer decides *when* to look and the clock *what* it sees (no sleeps).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from accelshare.manager.clock import FrozenClock

from .cluster import Cluster, running_cluster


@pytest.fixture
async def swept(
    db_url: str, tmp_path: Path
) -> AsyncIterator[tuple[Cluster, FrozenClock, list[int]]]:
    clock = FrozenClock(datetime.now(UTC))
    settings = {"agent-timeout": 2.0, "sweep-interval": 0.05}
    async with running_cluster(db_url, tmp_path / "state", clock=clock, **settings) as cluster:
        registry = cluster.manager.registry
        sweep = registry.sweep
        sweeps: list[int] = []  # how many agents each timer-driven sweep marked LOST

        async def counted() -> list[str]:
            lost = await sweep()
            sweeps.append(len(lost))
            return lost

        registry.sweep = counted  # type: ignore[method-assign]  # the timer calls this
        yield cluster, clock, sweeps


async def agent_status(cluster: Cluster, agent_id: str) -> str:
    status: str = (await cluster.admin.get(f"/agents/{agent_id}")).json()["status"]
    return status


async def test_the_sweep_timer_marks_a_silent_agent_lost_and_it_comes_back(
    swept: tuple[Cluster, FrozenClock, list[int]],
) -> None:
    cluster, clock, sweeps = swept
    assert cluster.config.manager.agent_timeout == 2.0
    agent = await cluster.add_agent("i-node01")
    for name in ("keeps", "vanishes"):
        created = await cluster.create({"cuda.shares": "0.5"}, name=name, maxWaitSeconds=10)
        assert created.json()["status"] == "RUNNING", created.text
    vanishing = (await cluster.session("vanishes"))["kernels"][0]["kernelId"]
    await agent.settle()

    # silent for less than agent-timeout: the timer sweeps, the agent stays ALIVE
    clock.advance(timedelta(seconds=1.5))
    seen = len(sweeps)
    await cluster.until(lambda: _more_than(sweeps, seen + 2), what="two more sweeps")
    assert await agent_status(cluster, "i-node01") == "ALIVE"
    assert sum(sweeps) == 0

    # past agent-timeout: the next sweep of the timer marks it LOST
    clock.advance(timedelta(seconds=1))
    lost_at = clock()

    async def swept_one() -> bool:  # the whole sweep: LOST, then the sessions' notes
        return sum(sweeps) > 0

    await cluster.until(swept_one, what="the sweep timer to mark i-node01 LOST")
    assert sum(sweeps) == 1
    assert await agent_status(cluster, "i-node01") == "LOST"
    detail = (await cluster.admin.get("/agents/i-node01")).json()
    assert detail["lostAt"] == lost_at.isoformat()
    keeps = await cluster.session("keeps")
    assert keeps["status"] == "RUNNING"  # the kernel may still run
    assert keeps["statusInfo"].startswith("agent i-node01 is LOST (no heartbeat since")

    # a LOST agent gets no new work
    scheduler = cluster.manager.scheduler
    mark = scheduler.next_pass_mark()
    waiting = await cluster.create({"cuda.shares": "0.5"}, name="waits", enqueueOnly=True)
    assert waiting.status_code == 201, waiting.text
    assert await scheduler.wait_for_pass(mark, 10), "no pass after the enqueue"
    assert (await cluster.session("waits"))["status"] == "PENDING"

    # while away, one kernel ended without a word; then the agent heartbeats again
    assert agent._drop(vanishing) is not None
    ack = await agent.heartbeat()
    assert ack.destroy_kernels == []
    detail = (await cluster.admin.get("/agents/i-node01")).json()
    assert (detail["status"], detail["lostAt"]) == ("ALIVE", None)
    assert detail["statusData"]["returned_at"] == clock().isoformat()
    assert detail["statusData"]["unknown_kernels"] == []
    assert (await cluster.session("keeps"))["statusInfo"] == "agent i-node01 is back"
    gone = await cluster.session("vanishes")
    assert gone["status"] == "TERMINATED"
    assert gone["statusInfo"] == "the agent i-node01 no longer reports the kernel"
    # and it is scheduled again (its return triggers a pass)
    await cluster.wait_status("waits", "RUNNING")
    assert sum(sweeps) == 1  # never LOST twice


async def _more_than(sweeps: list[int], count: int) -> bool:
    return len(sweeps) >= count
