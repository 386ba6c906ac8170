"""Manager and agents on different hosts (network namespaces joined by veth links).

The server host runs PostgreSQL, etcd, Redis and the manager; one agent host has two
mock GPUs (fractional, 1.0 share each), the other none.  Every sentence of the
production-path issue is checked here: sessions land on the right agents, slot types
of both agents are merged, a ``cuda.shares`` session never lands on the CPU-only agent,
stats and events travel through Redis, and cutting the GPU host's link makes it LOST
while its return reconciles (a session destroyed meanwhile has its kernel destroyed,
and the session waiting for its GPU share then starts).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest

from accelshare.config import open_config_store
from accelshare_testkit.multihost import MultiHostCluster, multihost_unavailable
from accelshare_testkit.waiting import until

REASON = multihost_unavailable()
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(REASON is not None, reason=REASON or ""),
]

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MultiHostCluster]:
    with MultiHostCluster(tmp_path_factory.mktemp("multihost"), agent_timeout_s=3.0) as c:
        c.start_services()
        yield c


async def create(
    http: httpx.AsyncClient, name: str, resources: dict[str, str], **more: Any
) -> dict[str, Any]:
    body = {"image": "python", "name": name, "config": {"resources": resources}, **more}
    reply = await http.post("/session", json=body)
    assert reply.status_code in (200, 201), reply.text
    return dict(reply.json())


async def session(http: httpx.AsyncClient, name: str) -> dict[str, Any]:
    reply = await http.get(f"/session/{name}")
    assert reply.status_code == 200, reply.text
    return dict(reply.json())


def allocated(alloc_map: dict[str, Any], slot: str) -> Decimal:
    """Total allocated of ``slot`` in an agent's full allocation map."""
    return sum(
        (
            Decimal(device["allocated"])
            for view in alloc_map["maps"].values()
            for device in view["devices"]
            if device["slot_name"] == slot
        ),
        Decimal(0),
    )


def holders(alloc_map: dict[str, Any], slot: str) -> set[str]:
    """The kernel ids holding any device of ``slot``."""
    return {
        kernel_id
        for view in alloc_map["maps"].values()
        for device in view["devices"]
        if device["slot_name"] == slot
        for kernel_id in device["kernels"]
    }


async def test_production_path_across_hosts(cluster: MultiHostCluster) -> None:
    await cluster.put_config(
        {"config": {"plugins": {"accelerator": {"cuda": {"allocation_mode": "fractional"}}}}}
    )
    cluster.start_manager()
    cluster.start_agent("gpu", mock_config=REPO / "configs/accelerator/two-fgpu.toml")
    cluster.start_agent("cpu", mock_config=None)
    await cluster.wait_agents_alive("gpu", "cpu")
    gpu_host = cluster.hosts["gpu"]

    async with cluster.client() as http:
        # -- slot types of both agents are merged (and kept in etcd) -----------------------
        assert (await http.get("/config/resource-slots")).json() == {
            "cpu": "count",
            "mem": "bytes",
            "cuda.shares": "count",
        }
        store = await open_config_store(cluster.config_store())
        try:
            assert await store.get("config/resource_slots/cuda.shares") == "count"
        finally:
            await store.close()
        agents = {a["id"]: a for a in (await http.get("/agents")).json()["items"]}
        assert agents["i-gpu"]["availableSlots"]["cuda.shares"] == "2"
        assert "cuda.shares" not in agents["i-cpu"]["availableSlots"]
        assert agents["i-gpu"]["address"] == f"http://{gpu_host.address}:6001"

        # -- sessions land on the right agents ---------------------------------------------
        wait = {"maxWaitSeconds": 30}
        gpu_a = await create(http, "gpu-a", {"cpu": "1", "mem": "1g", "cuda.shares": "0.5"}, **wait)
        cpu_a = await create(http, "cpu-a", {"cpu": "1", "mem": "1g"}, **wait)
        assert gpu_a["status"] == cpu_a["status"] == "RUNNING"
        assert (await session(http, "gpu-a"))["agentId"] == "i-gpu"
        # a session that uses no accelerator prefers the agent without one
        assert (await session(http, "cpu-a"))["agentId"] == "i-cpu"
        full = (await http.get("/agents/i-gpu/alloc-map")).json()
        assert full["source"] == "agent"  # asked of the agent across the network
        gpu_a_kernels = holders(full, "cuda.shares")
        assert len(gpu_a_kernels) == 1

        # -- a cuda.shares session never lands on the CPU-only agent ----------------------
        gpu_b = await create(http, "gpu-b", {"cpu": "1", "mem": "1g", "cuda.shares": "1.5"}, **wait)
        assert gpu_b["status"] == "RUNNING"
        gpu_c = await create(http, "gpu-c", {"cpu": "1", "mem": "1g", "cuda.shares": "0.5"})
        assert gpu_c["status"] == "PENDING"

        async def retried_twice() -> dict[str, Any] | None:
            info = await session(http, "gpu-c")
            scheduler = (info.get("statusData") or {}).get("scheduler") or {}
            return info if scheduler.get("retries", 0) >= 2 else None

        info = await until(retried_twice, "two scheduling passes over gpu-c")
        assert info["status"] == "PENDING"
        assert info["agentId"] is None
        why = str((await http.get("/session/gpu-c/why")).json())
        # both hosts were considered: the CPU host has no cuda.shares at all, the GPU host
        # no room left
        assert "i-cpu: no cuda.shares slot" in why, why
        assert "i-gpu: cuda.shares needs 0.5" in why, why

        # -- stats and events travel through Redis ----------------------------------------
        stats = (await http.get("/agents/i-gpu/stats")).json()
        assert stats["source"] == "redis"
        assert {"cuda_util", "cuda_mem"} <= {m["name"] for m in stats["metrics"]}
        metrics = (await http.get("/metrics")).text
        received = re.search(r"^accelshare_bus_events_received_total (\S+)$", metrics, re.M)
        assert received is not None
        assert float(received.group(1)) >= 3

        # -- cutting the GPU host's link makes it LOST -------------------------------------
        cluster.network.cut(gpu_host)
        cut_at = time.monotonic()

        async def lost() -> bool:
            return (await http.get("/agents/i-gpu")).json()["status"] == "LOST"

        await until(lost, "i-gpu to become LOST", timeout_s=30)
        # not before agent-timeout: on the manager's clock, from the last heartbeat it got
        gpu = (await http.get("/agents/i-gpu")).json()
        silent = datetime.fromisoformat(gpu["lostAt"]) - datetime.fromisoformat(
            gpu["lastHeartbeat"]
        )
        assert silent.total_seconds() >= cluster.agent_timeout_s, gpu
        # and from the cut: that last heartbeat may have landed up to one heartbeat
        # interval (0.5 s) before it (a check of 0.9 x the timeout failed on a slow host)
        assert time.monotonic() - cut_at >= cluster.agent_timeout_s - 0.5
        assert (await http.get("/agents/i-cpu")).json()["status"] == "ALIVE"
        # destroyed while its agent cannot hear it: TERMINATED here, kernel still there
        reply = await http.delete("/session/gpu-a")
        assert reply.status_code in (200, 202, 204), reply.text
        assert (await session(http, "gpu-a"))["status"] == "TERMINATED"
        assert cluster.agent_processes["gpu"].poll() is None  # the agent keeps running
        info = await session(http, "gpu-c")
        assert info["status"] == "PENDING"
        assert info["agentId"] is None  # still not on the CPU-only agent

        # -- its return reconciles ----------------------------------------------------------
        cluster.network.restore(gpu_host)

        async def alive() -> bool:
            return (await http.get("/agents/i-gpu")).json()["status"] == "ALIVE"

        await until(alive, "i-gpu to come back ALIVE", timeout_s=30)

        async def gpu_c_running() -> dict[str, Any] | None:
            info = await session(http, "gpu-c")
            return info if info["status"] == "RUNNING" else None

        info = await until(gpu_c_running, "gpu-c to start on the returned agent", timeout_s=60)
        assert info["agentId"] == "i-gpu"

        async def reconciled() -> dict[str, Any] | None:
            full = (await http.get("/agents/i-gpu/alloc-map")).json()
            return full if allocated(full, "cuda.shares") == Decimal("2.0") else None

        full = await until(reconciled, "the GPU host's map to hold gpu-b and gpu-c only")
        # the kernel of gpu-a (destroyed while its agent was away) is gone from the agent
        assert not gpu_a_kernels & holders(full, "cuda.shares")
        assert len(holders(full, "cuda.shares")) == 2
        occupied = (await http.get("/agents/i-gpu")).json()["occupiedSlots"]
        assert Decimal(occupied["cuda.shares"]) == Decimal("2.0")
        for name in ("gpu-b", "gpu-c", "cpu-a"):
            assert (await http.delete(f"/session/{name}")).status_code in (200, 202, 204)
