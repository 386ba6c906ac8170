"""An agent whose sessions are not sandboxed (``[container] sandbox = "off"``, or a host
that cannot) says so loudly at start and holds one user's kernels at a time."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from accelshare.agent.runtime import RuntimeUnavailable

Factory = Callable[..., Any]


async def _create(agent: Any, owner: str) -> dict[str, Any]:
    kernel_id = f"u-{uuid.uuid4().hex[:8]}"
    body = {
        "kernel_id": kernel_id,
        "session_id": f"s-{kernel_id}",
        "image": "shell",
        "requested_slots": {"cpu": "1", "mem": "1g"},
        "owner_access_key": owner,
    }
    response = await agent.client.post("/v1/kernels", json=body)
    assert response.status_code == 200, response.text
    return dict(response.json())


async def test_an_unsandboxed_agent_is_loud_and_single_user(
    agent_toml: Factory, start_agent: Factory, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="accelshare.agent.service"):
        agent = await start_agent(agent_toml(container={"sandbox": "off"}))
    assert any("SESSIONS ARE NOT SANDBOXED" in r.getMessage() for r in caplog.records)
    assert agent.service.runtime.sandbox is None
    first = await _create(agent, "AKALICE")
    assert first["status"] == "RUNNING", first
    assert (await _create(agent, "AKALICE"))["status"] == "RUNNING"  # the same user: fine
    refused = await _create(agent, "AKBOB")
    assert refused["status"] == "FAILED", refused
    assert "unsandboxed and single-user" in refused["reason"]
    assert "sandbox = 'off'" in refused["reason"]
    assert refused["allocations"] == {}
    for report in (await agent.client.get("/v1/kernels")).json()["kernels"]:
        if report["status"] == "RUNNING":
            await agent.client.delete(f"/v1/kernels/{report['kernel_id']}")
    # Once the first user's kernels are gone, another user's may start.
    assert (await _create(agent, "AKBOB"))["status"] == "RUNNING"


async def test_required_sandbox_that_cannot_be_made_stops_the_agent(
    agent_toml: Factory, start_agent: Factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")  # no bubblewrap for the agent's probe
    with pytest.raises(RuntimeUnavailable, match=r"sandbox = 'required'.*bubblewrap"):
        await start_agent(agent_toml(container={"sandbox": "required"}))
