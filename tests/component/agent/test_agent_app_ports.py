"""Host ports for the kernels' app services (``[container] port-range``), in the agent."""

from __future__ import annotations

import asyncio
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from accelshare.agent.ports import port_is_free

Factory = Callable[..., Any]


def _low() -> int:
    """The first of three free ports in a row."""
    for low in range(41000, 60000, 7):
        if all(port_is_free(p) for p in range(low, low + 3)):
            return low
    raise AssertionError("no three free ports in a row")


async def _create(agent: Any, kernel_id: str, environ: dict[str, str]) -> dict[str, Any]:
    body = {
        "kernel_id": kernel_id,
        "session_id": f"s-{kernel_id}",
        "image": "shell",
        "requested_slots": {"cpu": "1", "mem": "1g"},
        "environ": environ,
    }
    response = await agent.client.post("/v1/kernels", json=body)
    assert response.status_code == 200, response.text
    return dict(response.json())


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:  # (gone meanwhile)
        return {}
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rpartition(")")[2].split()[1]) == pid:
                found.append(int(entry.name))
    return found


async def _kernel_environ(pid: int) -> dict[str, str]:
    """The environment of the kernel's command: the kernel process ``pid`` or, in a
    sandbox, a process under it (bwrap and the sandbox's init carry only a fixed one and
    the agent's marks: nothing of the session's)."""
    for _ in range(500):
        level = [pid]
        while level:
            for candidate in level:
                env = _environ(candidate)
                if "HOME" in env:
                    return env
            level = [child for parent in level for child in _children(parent)]
        await asyncio.sleep(0.02)
    raise AssertionError(f"no process under {pid} has the kernel's environment")


def _assert_told(
    env: dict[str, str], relayed: bool, declared: dict[str, str], ports: list[int]
) -> None:
    """A sandboxed kernel keeps its declared ports (the agent relays the host ports into
    its network namespace, listed in ACCELSHARE_PUBLISHED_PORTS); an unsandboxed one
    listens on the host ports itself: its variables say so."""
    if relayed:
        for name, port in declared.items():
            assert env[name] == port
        assert env["ACCELSHARE_PUBLISHED_PORTS"] == ",".join(map(str, ports))
        assert not any(port_is_free(p) for p in ports)  # the agent's relay listens
    else:
        for name, port in zip(sorted(declared), ports, strict=True):
            assert env[name] == str(port)


@pytest.mark.parametrize("sandbox", ["auto", "off"])
async def test_ports_from_the_range_kept_over_a_restart_freed_on_destroy(
    agent_toml: Factory, start_agent: Factory, sandbox: str
) -> None:
    low = _low()
    path = agent_toml(container={"port-range": [low, low + 2], "sandbox": sandbox})
    first = await start_agent(path)
    k1, k2, k3, k4 = (f"p-{uuid.uuid4().hex[:8]}" for _ in range(4))
    declared = {"BACKENDAI_SERVICE_PORT_WEB": "8888", "BACKENDAI_SERVICE_PORT_LAB": "8889"}
    report = await _create(first, k1, declared)
    assert report["status"] == "RUNNING", report
    assert report["service_ports"] == [
        {"name": "lab", "protocol": "http", "container_port": 8889, "host_port": low},
        {"name": "web", "protocol": "http", "container_port": 8888, "host_port": low + 1},
    ]
    env = await _kernel_environ(int(report["container_id"]))
    relayed = first.service.runtime.publishes_ports
    assert relayed is (sandbox == "auto" and first.service.runtime.sandbox is not None)
    _assert_told(env, relayed, declared, [low, low + 1])
    await first.service.stop()

    second = await start_agent(path)
    listed = {k["kernel_id"]: k for k in (await second.client.get("/v1/kernels")).json()["kernels"]}
    assert listed[k1]["service_ports"] == report["service_ports"]
    assert second.service.ports.ports_of(k1) == [low, low + 1]
    if relayed:  # the restarted agent relays them again
        assert not port_is_free(low)
        assert not port_is_free(low + 1)
    # One port left in the range: a kernel with two services cannot have them.
    failed = await _create(second, k2, declared)
    assert failed["status"] == "FAILED"
    assert f"port range [{low}, {low + 2}]" in failed["reason"]
    assert second.service.ports.ports_of(k2) == []
    assert failed["allocations"] == {}
    one = await _create(second, k3, {"BACKENDAI_SERVICE_PORT_WEB": "8888"})
    assert [m["host_port"] for m in one["service_ports"]] == [low + 2]
    # No services declared: no ports taken.
    assert (await _create(second, k4, {}))["service_ports"] == []

    await second.client.delete(f"/v1/kernels/{k1}")
    assert second.service.ports.ports_of(k1) == []
    assert set(second.service.ports.held) == {low + 2}


async def test_a_create_answered_before_the_start_reports_the_host_ports(
    agent_toml: Factory, start_agent: Factory
) -> None:
    """With ``start-in-background`` the answer (PREPARING) is all the manager keeps
    the ports from: they are allocated before it, and the kernel gets the same ones."""
    low = _low()
    path = agent_toml(container={"port-range": [low, low + 2], "start-in-background": True})
    agent = await start_agent(path)
    kernel_id = f"p-{uuid.uuid4().hex[:8]}"
    report = await _create(agent, kernel_id, {"BACKENDAI_SERVICE_PORT_WEB": "8888"})
    assert report["status"] == "PREPARING", report
    assert report["service_ports"] == [
        {"name": "web", "protocol": "http", "container_port": 8888, "host_port": low},
    ]
    for _ in range(200):
        kernels = (await agent.client.get("/v1/kernels")).json()["kernels"]
        listed = next(k for k in kernels if k["kernel_id"] == kernel_id)
        if listed["status"] == "RUNNING":
            break
        await asyncio.sleep(0.05)
    assert listed["status"] == "RUNNING", listed
    env = await _kernel_environ(int(listed["container_id"]))
    _assert_told(
        env, agent.service.runtime.publishes_ports, {"BACKENDAI_SERVICE_PORT_WEB": "8888"}, [low]
    )
    # the "started" event carries them too (it may reach the manager before the answer)
    for _ in range(200):
        started = [e for e in agent.manager.events_of(kernel_id) if e["event"] == "started"]
        if started:
            break
        await asyncio.sleep(0.05)
    assert [e["service_ports"] for e in started] == [
        [{"name": "web", "protocol": "http", "container_port": 8888, "host_port": low}]
    ]
    await agent.client.delete(f"/v1/kernels/{kernel_id}")
    assert agent.service.ports.ports_of(kernel_id) == []


@pytest.mark.parametrize("sandbox", ["auto", "off"])
async def test_kernels_with_an_unknown_allocation_keep_their_ports_over_a_restart(
    agent_toml: Factory, start_agent: Factory, scratch_root: Path, sandbox: str
) -> None:
    """A re-adopted kernel whose allocation is unknown still uses its app ports: a new
    kernel must never be given one (its app may just not be listening right now)."""
    low = _low()
    path = agent_toml(container={"port-range": [low, low + 2], "sandbox": sandbox})
    first = await start_agent(path)
    k1, k2, k3 = (f"p-{uuid.uuid4().hex[:8]}" for _ in range(3))
    two = {"BACKENDAI_SERVICE_PORT_WEB": "8888", "BACKENDAI_SERVICE_PORT_LAB": "8889"}
    r1 = await _create(first, k1, two)
    r2 = await _create(first, k2, {"BACKENDAI_SERVICE_PORT_WEB": "8888"})
    assert [m["host_port"] for m in r1["service_ports"]] == [low, low + 1]
    assert [m["host_port"] for m in r2["service_ports"]] == [low + 2]
    await first.service.stop()
    # k1: its resource.txt unreadable (its meta file is left); k2: an orphan, its
    # scratch dir gone (only its process's environment tells its port).
    (scratch_root / k1 / "config" / "resource.txt").write_bytes(b"\xff\xfe not text")
    shutil.rmtree(scratch_root / k2)

    second = await start_agent(path)
    listed = {k["kernel_id"]: k for k in (await second.client.get("/v1/kernels")).json()["kernels"]}
    assert "allocation unknown" in listed[k1]["reason"], listed[k1]
    assert "allocation unknown" in listed[k2]["reason"], listed[k2]
    assert listed[k1]["service_ports"] == r1["service_ports"]
    assert second.service.ports.ports_of(k1) == [low, low + 1]
    assert second.service.ports.ports_of(k2) == [low + 2]
    # Nothing listens on them (the kernels are shells), yet no new kernel gets one.
    failed = await _create(second, k3, {"BACKENDAI_SERVICE_PORT_WEB": "8888"})
    assert failed["status"] == "FAILED", failed
    assert f"port range [{low}, {low + 2}]" in failed["reason"]

    for kernel_id in (k1, k2):
        await second.client.delete(f"/v1/kernels/{kernel_id}")
        assert second.service.ports.ports_of(kernel_id) == []
    assert second.service.ports.held == {}
