"""The bind carries the plan: the agent takes the pass's placement as is, refuses one that
no longer fits as a conflict, and the manager plans that session again (never lost)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from accelshare.protocol import CLUSTER_SECRET_HEADER, CreateKernelRequest, KernelReport
from accelshare_testkit.hollow_agent import HollowAgent

from .cluster import SECRET, Cluster, Frozen


def _record_creates(monkeypatch: pytest.MonkeyPatch, agent: HollowAgent) -> list[Any]:
    """The create requests the agent receives, in order."""
    seen: list[CreateKernelRequest] = []
    create = agent._create_report

    async def recording(body: CreateKernelRequest) -> KernelReport:
        seen.append(body)
        return await create(body)

    monkeypatch.setattr(agent, "_create_report", recording)
    return seen


async def _direct_create(agent: HollowAgent, kernel_id: str, slots: dict[str, str]) -> KernelReport:
    """A kernel created by a direct agent RPC (no plan): the manager does not know it."""
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=agent.app), base_url=agent.rpc_url
    ) as rpc:
        response = await rpc.post(
            "/v1/kernels",
            headers={CLUSTER_SECRET_HEADER: SECRET, "Content-Type": "application/json"},
            content=CreateKernelRequest(
                kernel_id=kernel_id, session_id="stranger", image="python", requested_slots=slots
            ).model_dump_json(),
        )
    assert response.status_code == 200, response.text
    return KernelReport.model_validate_json(response.content)


async def _binds_done(cluster: Cluster) -> None:
    await asyncio.sleep(0)
    await asyncio.wait_for(cluster.manager.binder.idle.wait(), 10)


def _path(body: dict[str, Any]) -> list[str]:
    return [h["to"] for h in body["statusHistory"]]


async def test_the_create_carries_the_plan_in_exact_amounts_and_the_agent_takes_it(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = await cluster.add_agent("i-node01")
    seen = _record_creates(monkeypatch, agent)
    created = await cluster.create(
        {"cpu": "2", "mem": "1g", "cuda.shares": "1.2"}, name="s", enqueueOnly=True
    )
    assert created.status_code == 201, created.text
    body = await cluster.wait_status("s", "RUNNING")
    (request,) = seen
    # user grammar ("1g") was parsed at the API: the wire has exact decimals
    assert request.requested_slots == {"cpu": "2", "mem": "1073741824", "cuda.shares": "1.2"}
    plan = request.planned_allocations
    assert plan is not None
    assert set(plan) == {"cpu", "mem", "cuda.shares"}
    assert sum(float(v) for v in plan["cuda.shares"].values()) == pytest.approx(1.2)
    # the agent holds exactly the plan, and the manager records that
    (kernel,) = agent.kernels.values()
    assert kernel.report().allocations == plan
    assert body["status"] == "RUNNING"
    assert agent.conflicts == 0


async def test_a_plan_that_no_longer_fits_is_planned_again_and_the_session_runs(
    frozen: Frozen,
) -> None:
    cluster, _clock = frozen
    agent = await cluster.add_agent("i-node01")
    # a kernel the manager does not know about takes a whole GPU after the heartbeat:
    # the same one the manager's plan will choose (same maps, same algorithm)
    stranger = await _direct_create(agent, "stranger-1", {"cuda.shares": "1"})
    assert stranger.status.value == "RUNNING"
    (taken,) = stranger.allocations["cuda.shares"]
    created = await cluster.create({"cuda.shares": "1"}, name="s", enqueueOnly=True)
    assert created.status_code == 201, created.text

    await cluster.manager.scheduler.run_once()
    await _binds_done(cluster)
    assert agent.conflicts == 1
    body = await cluster.session("s")
    assert body["status"] == "PENDING"
    assert "refused the plan" in body["statusInfo"]
    assert "PlanConflict" in body["statusInfo"]
    assert _path(body) == ["PENDING", "SCHEDULED", "PREPARING", "PENDING"]
    detail = (await cluster.admin.get("/agents/i-node01")).json()
    assert detail["occupiedSlots"].get("cuda.shares", "0") == "0"  # released
    assert len(agent.kernels) == 1  # the refused kernel was never created

    await agent.heartbeat()  # the agent's maps, with the stranger (a real agent sends it at once)
    await cluster.manager.scheduler.run_once()
    await _binds_done(cluster)
    body = await cluster.wait_status("s", "RUNNING")
    assert _path(body) == [
        "PENDING",
        "SCHEDULED",
        "PREPARING",
        "PENDING",
        "SCHEDULED",
        "PREPARING",
        "PREPARED",
        "CREATING",
        "RUNNING",
    ]
    kernels = [k for k in agent.kernels.values() if k.request.session_id != "stranger"]
    (kernel,) = kernels
    assert set(kernel.report().allocations["cuda.shares"]) != {taken}  # the other GPU
    assert cluster.manager.metrics.bind_conflicts._value.get() == 1
    assert cluster.manager.metrics.bind_failures._value.get() == 0


async def test_binds_to_one_agent_run_concurrently(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = await cluster.add_agent("i-node01", cpus=64, mem_bytes=256 * 2**30)
    monkeypatch.setattr("accelshare.manager.scheduler.binding.binder.BIND_BATCH", 2)
    in_flight = 0
    most = 0
    create = agent._create_report

    async def slow(body: CreateKernelRequest) -> KernelReport:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await asyncio.sleep(0.05)
        in_flight -= 1
        return await create(body)

    monkeypatch.setattr(agent, "_create_report", slow)
    for i in range(6):
        created = await cluster.create({"cuda.shares": "0.2"}, name=f"s{i}", enqueueOnly=True)
        assert created.status_code == 201, created.text
    for i in range(6):
        await cluster.wait_status(f"s{i}", "RUNNING")
    assert most >= 2  # batches of one agent overlapped
    assert agent.conflicts == 0
