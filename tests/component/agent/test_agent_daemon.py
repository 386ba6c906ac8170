"""The agent as a real daemon process (``python -m accelshare.agent``, i.e. ``accelshare
server agent``): RPC over TCP, SIGKILL and restart, SIGTERM without killing kernels."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import tomllib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest

from accelshare.agent.runtime.procfs import is_same_process

Factory = Callable[..., Any]
Eventually = Callable[..., Awaitable[Any]]
SECRET_HEADER = "X-Accelshare-Cluster-Secret"
SECRET = "component-test-cluster-secret"


class Daemon:
    def __init__(self, path: Path, log: Path) -> None:
        self.path = path
        self.log = log
        data = tomllib.loads(path.read_text())
        self.url = "http://" + data["agent"]["rpc-listen-addr"]
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self, eventually: Eventually) -> None:
        with self.log.open("ab") as log:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "accelshare.agent",
                "--config",
                str(self.path),
                stdout=log,
                stderr=log,
            )

        async def healthy() -> bool:
            assert self.proc is not None
            if self.proc.returncode is not None:
                raise AssertionError(f"agent exited {self.proc.returncode}: {self.output()}")
            try:
                async with httpx.AsyncClient(headers={SECRET_HEADER: SECRET}) as client:
                    return (await client.get(self.url + "/v1/health")).status_code == 200
            except httpx.TransportError:
                return False

        await eventually(healthy, timeout_s=30, what="the agent answering /v1/health")

    async def signal(self, signum: int) -> int:
        assert self.proc is not None
        self.proc.send_signal(signum)
        return await asyncio.wait_for(self.proc.wait(), timeout=20)

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]


@pytest.fixture
async def daemons(
    tmp_path: Path, make_runtime: Callable[..., Any]
) -> AsyncIterator[Callable[[Path], Daemon]]:
    """Agent processes, killed at the end (``make_runtime`` then removes their kernels)."""
    made: list[Daemon] = []

    def make(path: Path) -> Daemon:
        daemon = Daemon(path, tmp_path / "agent.log")
        made.append(daemon)
        return daemon

    yield make
    for daemon in made:
        if daemon.proc is not None and daemon.proc.returncode is None:
            daemon.proc.kill()
            with contextlib.suppress(Exception):
                await daemon.proc.wait()


def holders_sum(view: dict[str, Any]) -> dict[str, Decimal]:
    """Allocated per slot, summed over devices."""
    total: dict[str, Decimal] = {}
    for plugin in view["maps"].values():
        for device in plugin["devices"]:
            slot = device["slot_name"]
            total[slot] = total.get(slot, Decimal(0)) + Decimal(device["allocated"])
    return total


def kernels_sum(kernels: list[dict[str, Any]]) -> dict[str, Decimal]:
    total: dict[str, Decimal] = {}
    for kernel in kernels:
        for slot, per_device in kernel["allocations"].items():
            for amount in per_device.values():
                total[slot] = total.get(slot, Decimal(0)) + Decimal(amount)
    return total


async def test_sigkill_restart_and_sigterm_keep_kernels_and_maps(
    agent_toml: Factory,
    set_mode: Factory,
    daemons: Callable[[Path], Daemon],
    eventually: Eventually,
) -> None:
    path = agent_toml(agent={"heartbeat-interval-s": 3.0})
    await set_mode(path, "fractional")
    daemon = daemons(path)
    await daemon.start(eventually)
    client = httpx.AsyncClient(base_url=daemon.url, headers={SECRET_HEADER: SECRET}, timeout=20)
    try:
        for headers in ({SECRET_HEADER: ""}, {SECRET_HEADER: "not-the-secret"}):
            response = await client.get("/v1/alloc-map", headers=headers)
            assert response.status_code == 401
        ids = [f"d-{uuid.uuid4().hex[:10]}" for _ in range(3)]
        pids = {}
        for kernel_id, shares in zip(ids, ("0.2", "1.2", "0.3"), strict=True):
            body = {
                "kernel_id": kernel_id,
                "session_id": "s1",
                "image": "shell",
                "requested_slots": {"cpu": "1", "mem": "2g", "cuda.shares": shares},
            }
            report = (await client.post("/v1/kernels", json=body)).json()
            assert report["status"] == "RUNNING", report
            pids[kernel_id] = int(report["container_id"])
        view = (await client.get("/v1/alloc-map")).json()
        compat = (await client.get("/v1/alloc-map", params={"form": "compat"})).json()
        assert compat == {  # 0.2 -> GPU2; 1.2 -> 0.6 + 0.6; 0.3 -> best fit GPU1
            "c59395cd-ac91-4cd3-a1b0-3d2568aa2d01": "0.90",
            "c59395cd-ac91-4cd3-a1b0-3d2568aa2d02": "0.80",
        }

        assert await daemon.signal(signal.SIGKILL) == -signal.SIGKILL
        assert all(is_same_process(pid, None, kernel_id=k) for k, pid in pids.items())
        await daemon.start(eventually)
        assert (await client.get("/v1/alloc-map")).json() == view  # identical full view
        kernels = (await client.get("/v1/kernels")).json()["kernels"]
        assert sorted((k["kernel_id"], k["status"]) for k in kernels) == sorted(
            (k, "RUNNING") for k in ids
        )
        assert kernels_sum(kernels) == {  # nothing double-counted
            slot: amount for slot, amount in holders_sum(view).items() if amount
        }

        assert await daemon.signal(signal.SIGTERM) == 0, daemon.output()  # clean stop
        assert all(is_same_process(pid, None, kernel_id=k) for k, pid in pids.items())
        assert "stopped; 3 kernel(s) left running" in daemon.output()
        await daemon.start(eventually)
        assert (await client.get("/v1/alloc-map")).json() == view

        for kernel_id in ids:
            report = (await client.delete(f"/v1/kernels/{kernel_id}")).json()
            assert report["status"] == "EXITED"
        empty = (await client.get("/v1/alloc-map")).json()
        assert set(holders_sum(empty).values()) == {Decimal(0)}
        assert await daemon.signal(signal.SIGINT) == 0
    finally:
        await client.aclose()
    assert "manager at http://127.0.0.1" in daemon.output()  # no manager: logged, kept running


async def test_refuses_to_start_without_a_secret(agent_toml: Factory, tmp_path: Path) -> None:
    path = agent_toml()
    path.write_text(path.read_text().replace('cluster-secret = "', 'unused = "'))
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "accelshare.agent",
        "--config",
        str(path),
        stderr=asyncio.subprocess.PIPE,
        env={"PATH": "/usr/bin:/bin"},
    )
    _, err = await asyncio.wait_for(proc.communicate(), timeout=30)
    assert proc.returncode == 1
    assert "expected a cluster secret" in err.decode()
