"""The seed scenarios end to end: real API, real scheduler, hollow agents with real maps."""

from __future__ import annotations

import json

from .cluster import Cluster

GPU1 = "c59395cd-ac91-4cd3-a1b0-3d2568aa2d01"
GPU2 = "c59395cd-ac91-4cd3-a1b0-3d2568aa2d02"

AGENT_QUERY = """
query ($agent_id: String!) {
  agent(agent_id: $agent_id) { id status available_slots occupied_slots gpu_alloc_map alloc_map }
}
"""


async def test_canonical_fractional_placement_shows_in_gpu_alloc_map(cluster: Cluster) -> None:
    await cluster.add_agent("i-node01")
    small = await cluster.create({"cpu": 1, "mem": "1g", "cuda.shares": "0.2"}, name="small")
    assert small.status_code == 201, small.text
    await cluster.wait_status("small", "RUNNING")
    big = await cluster.create({"cpu": 1, "mem": "1g", "cuda.shares": "1.2"}, name="big")
    assert big.status_code == 201, big.text
    await cluster.wait_status("big", "RUNNING")

    body = await cluster.gql(AGENT_QUERY, {"agent_id": "i-node01"})
    agent = body["data"]["agent"]
    assert agent["gpu_alloc_map"] == json.dumps({GPU2: "0.80", GPU1: "0.60"})
    assert json.loads(agent["available_slots"])["cuda.shares"] == "2"
    assert json.loads(agent["occupied_slots"])["cuda.shares"] == "1.4"
    full = json.loads(agent["alloc_map"])
    assert full["source"] == "agent"
    devices = {d["device_id"]: d["allocated"] for d in full["maps"]["cuda"]["devices"]}
    assert devices == {GPU1: "0.6", GPU2: "0.8"}
    # the manager recorded the agent's real per-device placement
    kernels = (await cluster.session("big"))["kernels"]
    assert kernels[0]["deviceAllocs"]["cuda.shares"] == {GPU1: "0.6", GPU2: "0.6"}

    compat = (
        await cluster.admin.get("/agents/i-node01/alloc-map", params={"form": "compat"})
    ).json()
    assert compat == {"alloc_map": {GPU2: "0.80", GPU1: "0.60"}, "source": "agent"}
    live = (await cluster.admin.get("/agents/i-node01/alloc-map")).json()
    assert set(live["maps"]) == {"cuda", "cpu", "mem"}
    # an unreachable agent: the last heartbeat's view, saying so
    await cluster.agents["i-node01"].heartbeat()
    cluster.hollow.remove(cluster.agents["i-node01"])
    stale = (
        await cluster.admin.get("/agents/i-node01/alloc-map", params={"form": "compat"})
    ).json()
    assert stale["alloc_map"] == {GPU2: "0.80", GPU1: "0.60"}
    assert stale["source"] == "heartbeat"
    assert "cannot reach the agent" in stale["error"]


async def test_pending_session_resumes_when_resources_free_up(cluster: Cluster) -> None:
    await cluster.add_agent("i-node01")
    responses = [
        await cluster.create({"cuda.shares": "1"}, name=f"s{i}", enqueueOnly=True) for i in range(3)
    ]
    assert all(r.status_code == 201 for r in responses)
    names = ["s0", "s1", "s2"]

    async def settled() -> list[str] | None:
        statuses = await cluster.statuses(*names)
        return statuses if sorted(statuses) == ["PENDING", "RUNNING", "RUNNING"] else None

    statuses = await cluster.until(settled, what="two RUNNING, one PENDING")
    waiting = names[statuses.index("PENDING")]

    async def verdict() -> dict[str, object] | None:  # the first pass may still be due
        body = (await cluster.admin.get(f"/session/{waiting}/why")).json()
        return body if body["agents"] else None

    why = await cluster.until(verdict, what="a scheduling verdict")
    assert why["status"] == "PENDING"
    assert why["agents"] == [
        f"i-node01: cuda.shares needs 1, largest placement 0 ({GPU1} 0, {GPU2} 0 free)"
    ]
    assert "No agent can hold the request now" in why["statusInfo"]
    # the devices it waits for, with their exact ids (the console words them "GPU 0 ...")
    assert why["scheduler"]["devices"] == [
        {
            "agent": "i-node01",
            "slot": "cuda.shares",
            "needs": "1",
            "devices": [
                {"id": GPU1, "free": "0", "capacity": "1"},
                {"id": GPU2, "free": "0", "capacity": "1"},
            ],
        }
    ]

    running = next(n for n, s in zip(names, statuses, strict=True) if s == "RUNNING")
    destroyed = await cluster.admin.delete(f"/session/{running}")
    assert destroyed.status_code == 200, destroyed.text
    assert destroyed.json()["status"] == "TERMINATED"
    # no further request: the termination triggers a pass
    await cluster.wait_status(waiting, "RUNNING")
    history = [h["to"] for h in (await cluster.session(waiting))["statusHistory"]]
    assert history == ["PENDING", "SCHEDULED", "PREPARING", "PREPARED", "CREATING", "RUNNING"]
