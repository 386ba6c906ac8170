"""Two manager replicas against one PostgreSQL + etcd + Redis, on a server host; an
agent on another host lists both.  Sessions are created through both at once: exactly
the room there is gets used (one scheduler at a time, the advisory lock).  Then the
replica the agent talks to is killed (SIGKILL) right after it freed resources: the
other one takes over — the agent fails over without going LOST, pending sessions are
placed, anything left mid-bind is bound again — and no session is lost or placed twice.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections import Counter
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import httpx
import pytest

from accelshare_testkit.multihost import MultiHostCluster, multihost_unavailable
from accelshare_testkit.waiting import until

REASON = multihost_unavailable()
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(REASON is not None, reason=REASON or ""),
]


REPO = Path(__file__).resolve().parents[3]
OCCUPYING = {"SCHEDULED", "PREPARING", "PULLING", "PREPARED", "CREATING", "RUNNING"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MultiHostCluster]:
    with MultiHostCluster(
        tmp_path_factory.mktemp("replicas"), agent_timeout_s=3.0, stale_bind_timeout_s=5.0
    ) as c:
        c.start_services()
        yield c


async def create(http: httpx.AsyncClient, name: str) -> int:
    body = {
        "image": "python",
        "name": name,
        "enqueueOnly": True,
        "config": {"resources": {"cpu": "1", "mem": "512m", "cuda.shares": "0.5"}},
    }
    return (await http.post("/session", json=body)).status_code


async def statuses(http: httpx.AsyncClient) -> dict[str, str]:
    items = (await http.get("/sessions", params={"status": "all", "limit": 1000})).json()["items"]
    names = [s["sessionName"] for s in items]
    assert len(names) == len(set(names)), f"a session listed twice: {names}"
    return {s["sessionName"]: s["status"] for s in items}


async def test_a_killed_replica_is_taken_over(cluster: MultiHostCluster) -> None:
    await cluster.put_config(
        {"config": {"plugins": {"accelerator": {"cuda": {"allocation_mode": "fractional"}}}}}
    )
    one = cluster.start_manager("manager", 8081)
    cluster.start_manager("manager2", 8082)
    first, second = cluster.endpoint_at(8081), cluster.endpoint_at(8082)
    cluster.start_agent(
        "gpu", mock_config=REPO / "configs/accelerator/two-fgpu.toml", endpoints=[first, second]
    )
    await cluster.wait_agents_alive("gpu")

    async with cluster.client(first) as m1, cluster.client(second) as m2:
        # 12 sessions of 0.5 share for 2.0 shares, created through both replicas at once
        codes = await asyncio.gather(*(create(m1 if i % 2 else m2, f"s{i:02d}") for i in range(12)))
        assert codes == [201] * 12

        async def four_running() -> dict[str, str] | None:
            seen = await statuses(m2)
            counts = Counter(seen.values())
            return seen if counts == {"RUNNING": 4, "PENDING": 8} else None

        seen = await until(four_running, "exactly 4 of 12 sessions running", timeout_s=90)
        running = sorted(n for n, st in seen.items() if st == "RUNNING")

        # free one share through the first replica and kill it straight away: its pass
        # and binds may be cut anywhere
        for name in running[:2]:
            assert (await m1.delete(f"/session/{name}")).status_code in (200, 202, 204)
        one.send_signal(signal.SIGKILL)
        one.wait(10)
        killed_at = time.monotonic()

        async def taken_over() -> dict[str, str] | None:
            now = await statuses(m2)
            counts = Counter(now.values())
            if counts["RUNNING"] == 4 and counts["TERMINATED"] == 2 and counts["PENDING"] == 6:
                return now
            return None

        lost_seen = False

        async def watch_agent() -> None:
            nonlocal lost_seen
            while True:
                agent = (await m2.get("/agents/i-gpu")).json()
                lost_seen |= agent["status"] != "ALIVE"
                await asyncio.sleep(0.2)

        watcher = asyncio.create_task(watch_agent())
        try:
            final = await until(taken_over, "the second replica to take over", timeout_s=90)
            # stay a while past agent-timeout: the agent must never have gone LOST
            while time.monotonic() - killed_at < 3 * 2:
                await asyncio.sleep(0.2)
        finally:
            watcher.cancel()
        assert not lost_seen, "the agent went LOST although a replica was answering"

        # nothing lost, nothing placed twice: the agent holds exactly the RUNNING ones
        assert set(final) == {f"s{i:02d}" for i in range(12)}
        full = (await m2.get("/agents/i-gpu/alloc-map")).json()
        held = Decimal(0)
        kernels: set[str] = set()
        for view in full["maps"].values():
            for device in view["devices"]:
                if device["slot_name"] == "cuda.shares":
                    held += Decimal(device["allocated"])
                    kernels |= set(device["kernels"])
        assert held == Decimal("2.0")
        assert len(kernels) == 4
        occupied = (await m2.get("/agents/i-gpu")).json()["occupiedSlots"]
        assert Decimal(occupied["cuda.shares"]) == Decimal("2.0")
        for name, status in final.items():
            if status in OCCUPYING:
                assert (await m2.delete(f"/session/{name}")).status_code in (200, 202, 204)
