"""A manager restart loses no session and gives nothing twice (in-process and SIGKILL)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from accelshare.manager.bootstrap import AdminCredentials
from accelshare_testkit.hollow_agent import HollowAgent, HollowSpec, serve_on_loopback

from .cluster import SECRET, ManagerProcess, Signer, free_port, running_cluster

OCCUPYING = {
    "SCHEDULED",
    "PREPARING",
    "PULLING",
    "PREPARED",
    "CREATING",
    "RUNNING",
    "TERMINATING",
    "ERROR",
}


async def test_new_manager_binds_what_the_old_one_scheduled(db_url: str, tmp_path: Path) -> None:
    state = tmp_path / "state"
    async with running_cluster(db_url, state, background=False) as old:
        agent = await old.add_agent("i-node01")
        for i in range(5):
            created = await old.create({"cuda.shares": "0.5"}, name=f"s{i}", enqueueOnly=True)
            assert created.status_code == 201
        # the old manager dies right after committing its plan, before binding anything
        old.manager.binder.submit = lambda jobs: None  # type: ignore[method-assign]
        await old.manager.scheduler.run_once()
        statuses = Counter(await old.statuses(*(f"s{i}" for i in range(5))))
        assert statuses == {"SCHEDULED": 4, "PENDING": 1}
        assert agent.created == 0
        hollow = old.hollow
    async with running_cluster(db_url, state, hollow=hollow) as new:
        agent.manager = new.internal
        new.agents[agent.agent_id] = agent

        async def settled() -> Counter[str] | None:
            counts = Counter(await new.statuses(*(f"s{i}" for i in range(5))))
            return counts if counts == {"RUNNING": 4, "PENDING": 1} else None

        await new.until(settled, what="the four scheduled sessions RUNNING")
        assert agent.created == 4
        await agent.heartbeat()
        kernels = set()
        for i in range(5):
            for k in (await new.session(f"s{i}")).get("kernels", []):
                if k["status"] in OCCUPYING:
                    kernels.add(k["kernelId"])
        assert kernels == set(agent.kernels)


async def test_a_live_replica_rescues_binds_a_dead_one_left(db_url: str, tmp_path: Path) -> None:
    """Replica A plans and dies before binding; replica B, already running (so its
    start-up resume saw nothing), binds them once they are stale — and not before."""
    state = tmp_path / "state"
    async with running_cluster(db_url, state, background=False) as a:
        agent = await a.add_agent("i-node01")
        async with running_cluster(db_url, state, background=False, hollow=a.hollow) as b:
            assert await b.manager.scheduler.resume() == 0  # B started before A's plan
            for i in range(3):
                created = await a.create({"cuda.shares": "0.5"}, name=f"r{i}", enqueueOnly=True)
                assert created.status_code == 201
            a.manager.binder.submit = lambda jobs: None  # type: ignore[method-assign]
            await a.manager.scheduler.run_once()  # A commits its plan, then "dies"
            assert Counter(await b.statuses("r0", "r1", "r2")) == {"SCHEDULED": 3}
            assert await b.manager.scheduler.rescue_stale_binds(timedelta(hours=1)) == 0
            assert await b.manager.scheduler.rescue_stale_binds(timedelta(0)) == 3
            agent.manager = b.internal

            async def running() -> Counter[str] | None:
                counts = Counter(await b.statuses("r0", "r1", "r2"))
                return counts if counts == {"RUNNING": 3} else None

            await b.until(running, what="B to bind what A scheduled")
            assert agent.created == 3
            # nothing left to rescue, and nothing bound twice
            assert await b.manager.scheduler.rescue_stale_binds(timedelta(0)) == 0
            assert len(agent.kernels) == 3


# -- SIGKILL ------------------------------------------------------------------------------


async def _heartbeats(agents: list[HollowAgent]) -> None:
    while True:
        for agent in agents:
            with contextlib.suppress(httpx.HTTPError):
                await agent.heartbeat()
        await asyncio.sleep(0.3)


@contextlib.asynccontextmanager
async def _served(agents: list[HollowAgent]) -> AsyncIterator[None]:
    async with contextlib.AsyncExitStack() as stack:
        for agent in agents:
            await stack.enter_async_context(serve_on_loopback(agent))
        yield


@pytest.mark.integration
async def test_sigkill_during_activity_loses_nothing(db_url: str, tmp_path: Path) -> None:
    port = free_port()
    state = tmp_path / "state"
    config = tmp_path / "manager.toml"
    config.write_text(
        f'[manager]\ndata-dir = "{state}"\nservice-addr = "127.0.0.1:{port}"\n'
        f'cluster-secret = "{SECRET}"\nschedule-interval = 0.5\n'
        f'[db]\nurl = "{db_url}"\n'
        f'[config-store]\npath = "{tmp_path / "config-store.db"}"\n'
    )
    manager = ManagerProcess(config, port, tmp_path / "manager.log")
    base = f"http://127.0.0.1:{port}"
    agents = [
        HollowAgent(HollowSpec(f"i-node0{i}", cpus=16), cluster_secret=SECRET) for i in (1, 2)
    ]
    async with httpx.AsyncClient(base_url=base, timeout=30) as internal, _served(agents):
        for agent in agents:
            agent.manager = internal
        try:
            await manager.start()
            beats = asyncio.create_task(_heartbeats(agents))
            creds = AdminCredentials.from_env_file(state / "admin-credentials.env")
            admin = httpx.AsyncClient(
                base_url=base, auth=Signer(creds.access_key, creds.secret_key), timeout=30
            )
            async with admin:
                while not (await admin.get("/agents")).json()["items"][1:]:
                    await asyncio.sleep(0.05)
                body = {"image": "python:3.11", "config": {"resources": {"cuda.shares": "0.4"}}}

                async def create() -> str | None:
                    with contextlib.suppress(httpx.HTTPError):
                        response = await admin.post("/session", json=body)
                        if response.status_code == 201:
                            return str(response.json()["sessionId"])
                    return None

                tasks = [asyncio.create_task(create()) for _ in range(40)]
                acknowledged: set[str] = set()
                for finished in asyncio.as_completed(tasks):
                    sid = await finished
                    if sid:
                        acknowledged.add(sid)
                    if len(acknowledged) >= 12:
                        manager.kill()  # mid-activity: requests and binds in flight
                        break
                results = await asyncio.gather(*tasks, return_exceptions=True)
                acknowledged |= {r for r in results if isinstance(r, str)}
                await manager.start()

                async def settled() -> dict[str, Any] | None:
                    listing = (
                        await admin.get("/sessions", params={"status": "all", "limit": 1000})
                    ).json()
                    items = listing["items"]
                    counts = Counter(s["status"] for s in items)
                    busy = sum(
                        counts[s]
                        for s in ("SCHEDULED", "PREPARING", "PREPARED", "CREATING", "TERMINATING")
                    )
                    if busy == 0 and counts["RUNNING"] == min(10, len(items)):
                        return listing
                    return None

                deadline = time.monotonic() + 40
                listing = None
                while listing is None:
                    listing = await settled()
                    assert time.monotonic() < deadline, (
                        "the cluster did not settle after the restart"
                    )
                    await asyncio.sleep(0.2)
                ids = {s["sessionId"] for s in listing["items"]}
                assert acknowledged <= ids, "an acknowledged session was lost"
                counts = Counter(s["status"] for s in listing["items"])
                assert counts["RUNNING"] == 10
                assert sum(counts[s] for s in OCCUPYING) == 10
                assert not any(
                    "InsufficientResource" in (s["statusInfo"] or "") for s in listing["items"]
                )
                # the agents hold exactly the manager's running kernels (a heartbeat round
                # lets them drop whatever the manager considers gone)
                for agent in agents:
                    await agent.heartbeat()
                running = [s for s in listing["items"] if s["status"] == "RUNNING"]
                held = {k for a in agents for k in a.kernels}
                expected = set()
                for s in running:
                    detail = (await admin.get(f"/session/{s['sessionId']}")).json()
                    expected |= {k["kernelId"] for k in detail["kernels"]}
                assert held == expected
            beats.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beats
            manager.stop()  # SIGTERM: a graceful stop
            assert manager.proc is not None
            assert manager.proc.returncode == 0, manager.log.read_text()[-2000:]
        finally:
            manager.stop()
