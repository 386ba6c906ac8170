"""Backing services failing under activity: PostgreSQL connections dropped, etcd
restarted.  Real servers (marked ``integration``; they skip with the reason when the
server cannot run here).

Contract: requests in flight either succeed or fail with a problem (never a hung
request); the scheduler survives; afterwards every acknowledged session is accounted
for, the counters match a recount, and pending sessions still start.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from accelshare.api.app import create_manager_app
from accelshare.config import ConfigStore
from accelshare.config.etcd import EtcdBackend
from accelshare.manager.bootstrap import AdminCredentials
from accelshare.manager.clock import utcnow
from accelshare_testkit.etcd_server import EtcdProcess, find_etcd_binary
from accelshare_testkit.hollow_agent import HollowCluster
from component.manager.cluster import Cluster, Signer, manager_config, running_cluster
from component.manager.conftest import PG_ADMIN_URL, temporary_pg_database

from .invariants import all_sessions, assert_accounted, assert_allocations_agree

pytestmark = pytest.mark.integration
SHARE = {"cpu": 1, "mem": "256m", "cuda.shares": "0.5"}  # one agent, 2 GPUs: room for 4


async def _creates(cluster: Cluster, count: int) -> tuple[set[str], list[int]]:
    """``count`` parallel creations; a request the outage breaks must still get a
    problem+json answer (a 5xx while the database is gone), never hang or crash."""
    client = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=cluster.app, raise_app_exceptions=False),
        base_url="http://127.0.0.1:8081",
        auth=Signer(cluster.creds.access_key, cluster.creds.secret_key),
        timeout=60,
    )

    async def one() -> tuple[str | None, int]:
        response = await cluster.create(SHARE, client=client)
        if response.status_code == 201:
            return str(response.json()["sessionId"]), 201
        assert response.headers["content-type"] == "application/problem+json", response.text
        return None, response.status_code

    async with client:
        results = await asyncio.gather(*(one() for _ in range(count)))
    return {sid for sid, _ in results if sid}, [code for _, code in results]


async def _settle_and_check(cluster: Cluster, acknowledged: set[str]) -> dict[str, int]:
    async def quiet() -> list[dict[str, Any]] | None:
        try:
            listed = await all_sessions(cluster.admin)
        except AssertionError:
            return None
        moving = {"SCHEDULED", "PREPARING", "PREPARED", "CREATING", "TERMINATING"}
        return None if any(s["status"] in moving for s in listed) else listed

    await cluster.manager.scheduler.run_once()
    listed = await cluster.until(quiet, timeout_s=60, what="no session in transit")
    counts = assert_accounted(acknowledged, listed)
    agents = list(cluster.agents.values())
    for agent in agents:
        await agent.heartbeat()
    await assert_allocations_agree(cluster.manager, agents)
    return dict(counts)


async def _pending_still_start(cluster: Cluster) -> None:
    listed = await all_sessions(cluster.admin)
    for s in listed:
        if s["status"] == "RUNNING":
            assert (await cluster.admin.delete(f"/session/{s['sessionId']}")).status_code == 200
    pending = [s["sessionId"] for s in listed if s["status"] == "PENDING"]
    assert pending, "the test needs waiting sessions"

    async def started() -> bool:
        now = {s["sessionId"]: s["status"] for s in await all_sessions(cluster.admin)}
        return sum(now[sid] == "RUNNING" for sid in pending) == min(4, len(pending))

    await cluster.until(started, timeout_s=60, what="pending sessions to start")
    await assert_allocations_agree(cluster.manager, list(cluster.agents.values()))


async def test_postgresql_connections_dropped_mid_activity(tmp_path: Path) -> None:
    async with (
        temporary_pg_database() as url,
        running_cluster(url, tmp_path / "state", **{"schedule-interval": 0.2}) as cluster,
    ):
        await cluster.add_agent("i-node01", cpus=16)
        name = url.rsplit("/", 1)[1]
        admin = await asyncpg.connect(PG_ADMIN_URL, timeout=5)
        acknowledged: set[str] = set()
        codes: list[int] = []
        dropped = 0
        try:
            for _ in range(5):
                burst = asyncio.create_task(_creates(cluster, 10))
                await asyncio.sleep(0)  # let the burst begin before the connections go
                killed = await admin.fetchval(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                    " WHERE datname = $1 AND pid <> pg_backend_pid()",
                    name,
                )
                assert killed is not None
                dropped += killed
                ids, burst_codes = await burst
                acknowledged |= ids
                codes += burst_codes
        finally:
            await admin.close()
        # the pool replaces dead connections: the API answers again
        assert (await cluster.admin.get("/health")).status_code == 200
        more, more_codes = await _creates(cluster, 4)
        assert more_codes == [201] * 4
        acknowledged |= more
        counts = await _settle_and_check(cluster, acknowledged)
        assert counts.get("RUNNING") == 4, counts
        await _pending_still_start(cluster)
        print(
            f"pg drop: {dropped} connections dropped, acknowledged {len(acknowledged)},"
            f" codes {sorted(Counter(codes).items())}, {counts}"
        )


@asynccontextmanager
async def _cluster_on(store: ConfigStore, state: Path) -> AsyncIterator[Cluster]:
    """``running_cluster`` with a given config store (here: etcd)."""
    config = manager_config(f"sqlite+aiosqlite:///{state.parent / 'manager.db'}", state)
    hollow = HollowCluster()
    app = await create_manager_app(config, config_store=store, agent_transport=hollow.transport)
    creds = AdminCredentials.from_env_file(config.credentials_file)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with (
            httpx.AsyncClient(
                transport=transport,
                base_url="http://127.0.0.1:8081",
                auth=Signer(creds.access_key, creds.secret_key),
                timeout=60,
            ) as admin,
            httpx.AsyncClient(
                transport=transport, base_url="http://manager", timeout=60
            ) as internal,
        ):
            yield Cluster(app, config, hollow, admin, internal, creds, utcnow)


async def test_etcd_restarted_mid_activity(tmp_path: Path) -> None:
    if find_etcd_binary() is None:
        pytest.skip("no etcd binary: apt-get install etcd-server (or set ACCELSHARE_ETCD_BINARY)")
    with EtcdProcess(tmp_path / "etcd") as etcd:
        backend = EtcdBackend(host=etcd.host, port=etcd.port, timeout_s=10)
        store = ConfigStore(backend, namespace=f"rel{uuid.uuid4().hex[:8]}")
        try:
            async with _cluster_on(store, tmp_path / "state") as cluster:
                await cluster.add_agent("i-node01", cpus=16)
                acknowledged, _ = await _creates(cluster, 6)
                burst = asyncio.create_task(_creates(cluster, 10))
                await asyncio.to_thread(etcd.restart)
                ids, codes = await burst
                acknowledged |= ids
                # after the restart the config tree answers and sessions are created
                put = await cluster.admin.put(
                    "/admin/etcd", json={"key": "config/rel/probe", "value": "1"}
                )
                assert put.status_code == 200, put.text
                more, more_codes = await _creates(cluster, 4)
                assert more_codes == [201] * 4
                acknowledged |= more
                counts = await _settle_and_check(cluster, acknowledged)
                assert counts.get("RUNNING") == 4, counts
                await _pending_still_start(cluster)
                print(f"etcd restart: codes {sorted(set(codes))}, {counts}")
        finally:
            with contextlib.suppress(Exception):
                await store.close()
