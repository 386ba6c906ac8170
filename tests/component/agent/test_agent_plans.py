"""A create request with the manager's plan: the agent checks it against its maps and
takes exactly that placement, or refuses it (a conflict when it no longer fits)."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Any

Factory = Callable[..., Any]
Eventually = Callable[..., Awaitable[Any]]

GPU1 = "c59395cd-ac91-4cd3-a1b0-3d2568aa2d01"
GPU2 = "c59395cd-ac91-4cd3-a1b0-3d2568aa2d02"
MEM = {"root": str(1 << 30)}


def kid() -> str:
    return f"p-{uuid.uuid4().hex[:10]}"


async def _create(
    agent: Any,
    kernel_id: str,
    slots: dict[str, str],
    plan: dict[str, dict[str, str]] | None,
    *,
    fragmentation: bool = True,
) -> dict[str, Any]:
    body = {
        "kernel_id": kernel_id,
        "session_id": f"s-{kernel_id}",
        "image": "shell",
        "requested_slots": slots,
        "planned_allocations": plan,
        "allow_fractional_resource_fragmentation": fragmentation,
    }
    response = await agent.client.post("/v1/kernels", json=body)
    assert response.status_code == 200, response.text
    return dict(response.json())


async def _cpus(agent: Any) -> list[str]:
    view = await agent.alloc_map()
    return [d["device_id"] for d in view["maps"]["cpu"]["devices"]]


async def _fractional_agent(agent_toml: Factory, set_mode: Factory, start_agent: Factory) -> Any:
    path = agent_toml()
    await set_mode(path, "fractional")
    agent: Any = await start_agent(path)
    return agent


async def test_the_plan_is_taken_exactly_not_as_the_strategy_would_place_it(
    agent_toml: Factory, set_mode: Factory, start_agent: Factory
) -> None:
    agent = await _fractional_agent(agent_toml, set_mode, start_agent)
    last_cpu = (await _cpus(agent))[-1]
    # EVENLY alone puts 0.2 on GPU2 (best fit from the least-free end): the plan says GPU1
    plan = {"cpu": {last_cpu: "1"}, "mem": MEM, "cuda.shares": {GPU1: "0.2"}}
    slots = {"cpu": "1", "mem": str(1 << 30), "cuda.shares": "0.2"}
    report = await _create(agent, kid(), slots, plan)
    assert report["status"] == "RUNNING", report
    assert report["allocations"] == plan
    assert not report["conflict"]
    assert await agent.alloc_map("compat") == {GPU1: "0.20", GPU2: "0.00"}


async def test_a_plan_that_no_longer_fits_is_a_conflict_nothing_recorded_and_a_heartbeat_soon(
    agent_toml: Factory, set_mode: Factory, start_agent: Factory, eventually: Eventually
) -> None:
    agent = await _fractional_agent(agent_toml, set_mode, start_agent)
    await eventually(lambda: agent.manager.heartbeats, what="the registration heartbeat")
    cpu0, cpu1 = (await _cpus(agent))[:2]
    slots = {"cpu": "1", "mem": str(1 << 30), "cuda.shares": "0.8"}
    first = await _create(
        agent, kid(), slots, {"cpu": {cpu0: "1"}, "mem": MEM, "cuda.shares": {GPU1: "0.8"}}
    )
    assert first["status"] == "RUNNING", first
    before = await agent.alloc_map()
    beats = len(agent.manager.heartbeats)

    refused = kid()
    half = {"cpu": "1", "mem": str(1 << 30), "cuda.shares": "0.5"}
    report = await _create(
        agent, refused, half, {"cpu": {cpu1: "1"}, "mem": MEM, "cuda.shares": {GPU1: "0.5"}}
    )
    assert report["status"] == "FAILED"
    assert report["conflict"] is True
    assert report["reason"].startswith("PlanConflict: ")
    assert GPU1 in report["reason"]
    assert await agent.alloc_map() == before  # cpu1 and mem were not taken either
    listed = (await agent.client.get("/v1/kernels")).json()["kernels"]
    assert refused not in {k["kernel_id"] for k in listed}  # the kernel never was
    assert agent.manager.events_of(refused) == []  # no "failed" event: the session lives on
    await eventually(
        lambda: len(agent.manager.heartbeats) > beats, what="a heartbeat right after the conflict"
    )
    # the same kernel id with a plan that fits (the manager's next pass) is created
    again = await _create(
        agent, refused, half, {"cpu": {cpu1: "1"}, "mem": MEM, "cuda.shares": {GPU2: "0.5"}}
    )
    assert again["status"] == "RUNNING", again
    assert await agent.alloc_map("compat") == {GPU1: "0.80", GPU2: "0.50"}


async def test_a_device_the_agent_does_not_have_is_a_conflict(
    agent_toml: Factory, set_mode: Factory, start_agent: Factory
) -> None:
    agent = await _fractional_agent(agent_toml, set_mode, start_agent)
    cpu0 = (await _cpus(agent))[0]
    slots = {"cpu": "1", "mem": str(1 << 30), "cuda.shares": "0.5"}
    plan = {"cpu": {cpu0: "1"}, "mem": MEM, "cuda.shares": {"GPU-gone": "0.5"}}
    report = await _create(agent, kid(), slots, plan)
    assert report["conflict"] is True
    assert "GPU-gone is not a device of cuda.shares" in report["reason"]


async def test_a_wrong_plan_fails_the_kernel_and_is_no_conflict(
    agent_toml: Factory, set_mode: Factory, start_agent: Factory
) -> None:
    agent = await _fractional_agent(agent_toml, set_mode, start_agent)
    cpu0, cpu1 = (await _cpus(agent))[:2]
    before = await agent.alloc_map()
    slots = {"cpu": "1", "mem": str(1 << 30), "cuda.shares": "0.5"}
    cases = [
        # off the quantum grid (0.1)
        ({"cpu": {cpu0: "1"}, "mem": MEM, "cuda.shares": {GPU1: "0.25", GPU2: "0.25"}},
         "NotMultipleOfQuantum"),
        # the totals differ from the request's
        ({"cpu": {cpu0: "1", cpu1: "1"}, "mem": MEM, "cuda.shares": {GPU1: "0.5"}},
         "the request asks for 1"),
        # a requested slot the plan leaves out
        ({"cpu": {cpu0: "1"}, "mem": MEM}, "places nothing of cuda.shares"),
        # a malformed amount
        ({"cpu": {cpu0: "one"}, "mem": MEM, "cuda.shares": {GPU1: "0.5"}}, "KernelRequestError"),
    ]  # fmt: skip
    for plan, expected in cases:
        report = await _create(agent, kid(), slots, plan)
        assert report["status"] == "FAILED", (plan, report)
        assert report["conflict"] is False
        assert expected in report["reason"], (expected, report["reason"])
    # with a plan, amounts are exact decimals: the user's grammar was the manager's to parse
    report = await _create(
        agent,
        kid(),
        {"cpu": "1", "mem": "1g", "cuda.shares": "0.5"},
        {"cpu": {cpu0: "1"}, "mem": MEM, "cuda.shares": {GPU1: "0.5"}},
    )
    assert report["status"] == "FAILED"
    assert report["reason"].startswith("KernelRequestError: ")
    # fragmentation refused: 0.8 must be on one device
    report = await _create(
        agent,
        kid(),
        {"cpu": "1", "mem": str(1 << 30), "cuda.shares": "0.8"},
        {"cpu": {cpu0: "1"}, "mem": MEM, "cuda.shares": {GPU1: "0.4", GPU2: "0.4"}},
        fragmentation=False,
    )
    assert report["status"] == "FAILED"
    assert "fragmented" in report["reason"]
    assert await agent.alloc_map() == before  # nothing half-applied by any of them


async def test_without_a_plan_the_agent_places_the_request_itself(
    agent_toml: Factory, set_mode: Factory, start_agent: Factory
) -> None:
    agent = await _fractional_agent(agent_toml, set_mode, start_agent)
    report = await _create(agent, kid(), {"cpu": "1", "mem": "1g", "cuda.shares": "0.2"}, None)
    assert report["status"] == "RUNNING", report
    assert report["allocations"]["cuda.shares"] == {GPU2: "0.2"}  # EVENLY's best fit
