"""Storage folders through the agent's RPC: ``POST /v1/kernels`` with ``mounts`` (a whole
in-process agent, real kernels in the process runtime's sandbox where this host has one)."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

Factory = Callable[..., Any]
Eventually = Callable[..., Awaitable[Any]]

SCRIPT = r"""
cd "$HOME"
grep '^MOUNTS=' "$ACCELSHARE_RESOURCE_TXT"
echo made > data/out.txt && echo rw=ok || echo rw=fail
( echo x > ro/out.txt ) 2>/dev/null && echo ro=ok || echo ro=fail
echo ro_read=$(cat ro/in.txt)
echo ready
exec sleep 60
"""


def kid() -> str:
    return f"m-{uuid.uuid4().hex[:10]}"


async def _create(agent: Any, kernel_id: str, mounts: list[dict[str, Any]], command: str) -> Any:
    body = {
        "kernel_id": kernel_id,
        "session_id": f"s-{kernel_id}",
        "image": "shell",
        "requested_slots": {"cpu": "1", "mem": "1g"},
        "command": [command],
        "mounts": mounts,
    }
    response = await agent.client.post("/v1/kernels", json=body)
    assert response.status_code == 200, response.text
    return response.json()


async def test_a_kernel_created_with_mounts_sees_them_rw_and_ro(
    agent_toml: Factory,
    start_agent: Factory,
    eventually: Eventually,
    tmp_path: Path,
    sandbox_support: str | None,
) -> None:
    if sandbox_support is not None:  # unsandboxed kernels refuse read-only folders
        pytest.skip(sandbox_support)
    agent = await start_agent(agent_toml())
    rw, ro = tmp_path / "vol" / "rw", tmp_path / "vol" / "ro"
    rw.mkdir(parents=True)
    ro.mkdir(parents=True)
    (ro / "in.txt").write_text("from-host\n")
    kernel_id = kid()
    mounts: list[dict[str, Any]] = [
        {"name": "data", "host_path": str(rw), "kernel_path": "/home/work/data"},
        {"name": "ro", "host_path": str(ro), "kernel_path": "ro", "read_only": True},
    ]
    report = await _create(agent, kernel_id, mounts, SCRIPT)
    assert report["status"] == "RUNNING", report["reason"]

    async def log() -> str:
        response = await agent.client.get(f"/v1/kernels/{kernel_id}/logs")
        return response.text if "ready" in response.text else ""

    text = await eventually(log, what="the kernel's checks")
    assert f"MOUNTS={rw}:/home/work/data:rw,{ro}:/home/work/ro:ro" in text
    assert "rw=ok" in text
    assert "ro=fail" in text
    assert "ro_read=from-host" in text
    assert (rw / "out.txt").read_text() == "made\n"
    assert not (ro / "out.txt").exists()
    await agent.destroy(kernel_id)
    assert (rw / "out.txt").exists()  # the folder outlives the kernel's scratch dir


async def test_bad_mounts_are_failed_reports_naming_the_mount(
    agent_toml: Factory, start_agent: Factory, tmp_path: Path
) -> None:
    agent = await start_agent(agent_toml())
    plain = tmp_path / "plain.txt"
    plain.write_text("x")
    cases = [
        ({"name": "gone", "host_path": str(tmp_path / "nope"), "kernel_path": "gone"}, "exist"),
        ({"name": "file", "host_path": str(plain), "kernel_path": "file"}, "not a directory"),
        ({"name": "sys", "host_path": str(tmp_path), "kernel_path": "/usr/lib/x"}, "/usr"),
        ({"name": "up", "host_path": str(tmp_path), "kernel_path": "../../etc"}, "'..'"),
    ]
    before = await agent.alloc_map()
    for mount, why in cases:
        report = await _create(agent, kid(), [mount], "exec sleep 60")
        assert report["status"] == "FAILED"
        assert f"mount {mount['name']!r}" in report["reason"]
        assert why in report["reason"]
    assert await agent.alloc_map() == before  # nothing left allocated
