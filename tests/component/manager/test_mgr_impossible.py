"""A session no agent of its scaling group could hold even when empty, through the real
REST API: refused at creation naming each slot's largest single placement, or (opt-in,
``waitForAgents``) queued, saying it waits for an agent that can to join."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from accelshare.sched.outcome import NEVER_FITS
from accelshare_testkit.hollow_agent import TWO_FGPU

from .cluster import Cluster

FOUR_FGPU: dict[str, Any] = {
    **TWO_FGPU,
    "devices": [
        {
            "mother_uuid": f"4f0c1e2a-0000-4000-8000-00000000000{i}",
            "model_name": "CUDA GPU",
            "numa_node": 0,
            "subproc_count": 108,
            "memory_size": "2G",
            "is_mig_device": False,
        }
        for i in range(4)
    ],
}


async def test_a_request_no_agent_could_hold_is_refused_naming_the_largest(
    cluster: Cluster,
) -> None:
    await cluster.add_agent("i-node01")  # two GPUs of 1.0 share, 8 cores, 16 GiB
    response = await cluster.create({"cpu": 1, "mem": "1g", "cuda.shares": 3})
    assert response.status_code == 400, response.text
    problem = response.json()
    assert problem["field"] == "config.resources"
    assert problem["error"] == "NoAgentCouldHold"
    assert problem["largest"] == {"cpu": "8", "mem": str(16 * 2**30), "cuda.shares": "2"}
    assert problem["received"]["cuda.shares"] == "3"
    detail = problem["detail"]
    assert "No agent of scaling group default could hold this session" in detail
    assert "judged by its 1 alive and 0 lost agent(s)" in detail
    assert "the most one agent can give one kernel is cpu 8, mem 16g, cuda.shares 2" in detail
    assert "waitForAgents" in detail
    assert (await cluster.admin.get("/sessions")).json()["total"] == 0  # nothing enqueued

    # each slot on its own: too many cores is refused as well, a fitting request is not
    cores = await cluster.create({"cpu": 9, "mem": "1g"})
    assert (cores.status_code, cores.json()["largest"]["cpu"]) == (400, "8"), cores.text
    fits = await cluster.create({"cpu": 8, "mem": "1g", "cuda.shares": 2}, enqueueOnly=True)
    assert fits.status_code == 201, fits.text


async def test_wait_for_agents_queues_it_and_says_so_until_one_joins(cluster: Cluster) -> None:
    await cluster.add_agent("i-node01")
    response = await cluster.create(
        {"cpu": 1, "mem": "1g", "cuda.shares": 3}, name="big", waitForAgents=True
    )
    assert response.status_code == 201, response.text
    assert response.json()["status"] == "PENDING"
    why = (await cluster.admin.get("/session/big/why")).json()
    assert why["statusInfo"].startswith(NEVER_FITS + "i-node01: cuda.shares needs 3"), why
    assert "waiting for an agent that can to join" in why["statusInfo"]

    await cluster.add_agent("i-node02", mock_config=FOUR_FGPU)
    cluster.manager.trigger()
    body = await cluster.wait_status("big", "SCHEDULED", "PREPARING", "RUNNING")
    assert body["kernels"][0]["agentId"] == "i-node02"


async def test_without_an_alive_agent_nothing_is_judged(cluster: Cluster) -> None:
    """Start-up races (``make run``, tests): no agent alive yet, the session waits."""
    response = await cluster.create({"cpu": 64, "mem": "1g"}, name="early")
    assert response.status_code == 201, response.text
    assert response.json()["status"] == "PENDING"


async def test_each_agent_is_dry_run_until_one_could_hold_it(cluster: Cluster) -> None:
    """0.3 shares: on the grid of i-b (quantum 0.1), not of i-a (0.25), whose totals
    cover it: the first candidate's dry run refuses, the second's accepts."""
    await cluster.add_agent("i-a", quantum=Decimal("0.25"))
    await cluster.add_agent("i-b", quantum=Decimal("0.1"))
    response = await cluster.create({"cuda.shares": "0.3"}, name="odd")
    assert response.status_code == 201, response.text
    body = await cluster.wait_status("odd", "RUNNING")
    assert body["kernels"][0]["agentId"] == "i-b"


async def test_the_verdict_follows_an_agent_whose_devices_changed(cluster: Cluster) -> None:
    """The enqueue keeps each agent's parsed maps while they stay the same; an agent that
    comes back with more GPUs (new maps, same id) is judged by its new ones at once."""
    agent = await cluster.add_agent("i-node01")  # two GPUs
    first = await cluster.create({"cpu": 1, "mem": "1g", "cuda.shares": 3})
    assert first.status_code == 400, first.text
    again = await cluster.create({"cpu": 1, "mem": "1g", "cuda.shares": 3})
    assert again.json()["largest"]["cuda.shares"] == "2"  # the same maps: the same verdict
    cluster.hollow.remove(agent)
    await cluster.add_agent("i-node01", mock_config=FOUR_FGPU)  # restarted with four
    grown = await cluster.create({"cpu": 1, "mem": "1g", "cuda.shares": 3}, enqueueOnly=True)
    assert grown.status_code == 201, grown.text
