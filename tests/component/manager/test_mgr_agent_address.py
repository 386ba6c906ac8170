"""An agent that comes back on another RPC address keeps its kernels: the manager must
reach it where it is now (``agents.address``, updated by every heartbeat), never at the
address its kernels were scheduled with."""

from __future__ import annotations

import pytest

from accelshare.manager.scheduler.apply import BindJob
from accelshare_testkit.hollow_agent import HollowAgent

from .cluster import Cluster


async def move(cluster: Cluster, agent: HollowAgent, host: str) -> None:
    """The agent restarts on a new address (the old one no longer answers) and says so."""
    cluster.hollow.remove(agent)
    agent.rpc_url = f"http://{host}.hollow"
    cluster.hollow.add(agent)
    await agent.heartbeat()
    detail = (await cluster.admin.get(f"/agents/{agent.agent_id}")).json()
    assert detail["address"] == agent.rpc_url


async def test_destroy_and_logs_go_to_the_agents_new_address(cluster: Cluster) -> None:
    agent = await cluster.add_agent("i-node01")
    await cluster.create({"cuda.shares": "1"}, name="moved")
    body = await cluster.wait_status("moved", "RUNNING")
    kernel_id = body["kernels"][0]["kernelId"]
    await move(cluster, agent, "i-node01-restarted")

    logs = await cluster.admin.get("/session/moved/logs")
    assert logs.status_code == 200, logs.text
    assert logs.json()["result"]["logs"].startswith("hollow kernel")
    answer = (await cluster.admin.delete("/session/moved")).json()
    # before the fix: TERMINATING, "the agent did not confirm yet" (old address)
    assert answer["status"] == "TERMINATED", answer
    assert agent.destroy_requests == [kernel_id]
    assert kernel_id not in agent.kernels


async def test_a_bind_made_after_the_agent_moved_reaches_it(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = await cluster.add_agent("i-node01")
    binder = cluster.manager.binder
    held: list[BindJob] = []
    monkeypatch.setattr(binder, "submit", held.extend)  # scheduled, not bound yet
    await cluster.create({"cuda.shares": "1"}, name="late", enqueueOnly=True)
    await cluster.wait_status("late", "SCHEDULED")
    await move(cluster, agent, "i-node01-restarted")
    monkeypatch.undo()
    binder.submit(held)  # as the scheduler's bind, or a restarted manager's resume
    await cluster.wait_status("late", "RUNNING")
    assert agent.created == 1
