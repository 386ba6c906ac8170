"""The binder's batched create (``POST /v1/kernels/batch``) and its fallback to single
creates for an agent without it (an older agent answers 404)."""

from __future__ import annotations

from .cluster import Cluster

PATH = ["PENDING", "SCHEDULED", "PREPARING", "PREPARED", "CREATING", "RUNNING"]


def _path(body: dict[str, object]) -> list[str]:
    history = body["statusHistory"]
    assert isinstance(history, list)
    return [h["to"] for h in history]


async def test_batched_and_single_creates_record_the_same_transitions(cluster: Cluster) -> None:
    new = await cluster.add_agent("i-node01")
    old = await cluster.add_agent("i-node02")
    old.batch_route = False  # answers 404: the manager falls back to single creates
    for i in range(4):
        response = await cluster.create({"cuda.shares": "1"}, name=f"s{i}", enqueueOnly=True)
        assert response.status_code == 201, response.text
    for i in range(4):
        body = await cluster.wait_status(f"s{i}", "RUNNING")
        assert _path(body) == PATH
    assert new.created == old.created == 2  # 4 whole GPUs: both agents full
    assert new.batch_creates >= 1
    assert old.batch_creates == 1  # asked once, then single creates only
    for agent in (new, old):
        assert len(agent.kernels) == agent.created
    assert cluster.manager.metrics.bind_failures._value.get() == 0


async def test_a_preparing_report_goes_creating_and_the_started_event_moves_it_on(
    cluster: Cluster,
) -> None:
    agent = await cluster.add_agent("i-node01", start_running=False)
    await cluster.create({"cuda.shares": "1"}, name="slow", enqueueOnly=True)
    body = await cluster.wait_status("slow", "CREATING")
    assert _path(body) == PATH[:-1]
    assert agent.batch_creates == 1
    (kernel_id,) = agent.kernels
    await agent.start_kernel(kernel_id)
    body = await cluster.wait_status("slow", "RUNNING")
    assert _path(body) == PATH


async def test_a_refused_batch_cancels_each_session_with_the_reason(cluster: Cluster) -> None:
    agent = await cluster.add_agent("i-node01")
    agent.refuse_creates = "the image cannot be found"
    for name in ("a", "b"):
        await cluster.create({"cuda.shares": "0.5"}, name=name, enqueueOnly=True)
    for name in ("a", "b"):
        body = await cluster.wait_status(name, "CANCELLED")
        assert "the image cannot be found" in body["statusInfo"]
    detail = (await cluster.admin.get("/agents/i-node01")).json()
    assert detail["occupiedSlots"].get("cuda.shares", "0") == "0"
