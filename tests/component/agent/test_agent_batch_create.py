"""``POST /v1/kernels/batch``: each kernel created as by ``POST /v1/kernels``, one report
per request, in order (a refused one is a FAILED report, not an HTTP error)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from accelshare.protocol import MAX_CREATE_BATCH

AgentFactory = Callable[..., Any]  # the fixtures of conftest.py
AgentTomlFactory = Callable[..., Any]


def _kernel_body(kernel_id: str, cpu: str = "1") -> dict[str, Any]:
    return {
        "kernel_id": kernel_id,
        "session_id": f"s-{kernel_id}",
        "image": "shell",
        "requested_slots": {"cpu": cpu, "mem": "1g"},
    }


async def test_a_batch_creates_each_kernel_and_answers_one_report_each_in_order(
    agent_toml: AgentTomlFactory, start_agent: AgentFactory
) -> None:
    agent = await start_agent(agent_toml())
    bodies = [_kernel_body("k-b1"), _kernel_body("k-huge", cpu="100000"), _kernel_body("k-b2")]
    response = await agent.client.post("/v1/kernels/batch", json=bodies)
    assert response.status_code == 200, response.text[:300]
    reports = response.json()
    assert [r["kernel_id"] for r in reports] == ["k-b1", "k-huge", "k-b2"]
    assert [r["status"] for r in reports] == ["RUNNING", "FAILED", "RUNNING"]
    assert reports[0]["session_id"] == "s-k-b1"
    assert reports[0]["allocations"]["cpu"]
    assert reports[1]["reason"]
    kernels = {k.kernel_id: k.status.value for k in agent.service.list_kernels().kernels}
    assert kernels.get("k-b1") == "RUNNING"
    assert kernels.get("k-b2") == "RUNNING"

    # idempotent by kernel id, as the single create
    again = await agent.client.post("/v1/kernels/batch", json=bodies[:1])
    assert again.status_code == 200
    assert again.json()[0]["status"] == "RUNNING"
    assert again.json()[0]["allocations"] == reports[0]["allocations"]

    # a malformed body, or one over the limit, is a 400 problem and creates nothing
    bad = await agent.client.post("/v1/kernels/batch", json=[{"kernel_id": "k-x"}])
    assert bad.status_code == 400
    assert bad.headers["content-type"] == "application/problem+json"
    many = [_kernel_body(f"k-m{i}") for i in range(MAX_CREATE_BATCH + 1)]
    too_many = await agent.client.post("/v1/kernels/batch", json=many)
    assert too_many.status_code == 400
    assert "k-m0" not in {k.kernel_id for k in agent.service.list_kernels().kernels}

    # the cluster secret is needed, as everywhere under /v1
    unauthenticated = await agent.client.post(
        "/v1/kernels/batch", json=bodies[:1], headers={"X-Accelshare-Cluster-Secret": "wrong"}
    )
    assert unauthenticated.status_code == 401
    for kernel_id in ("k-b1", "k-b2"):
        await agent.destroy(kernel_id)
