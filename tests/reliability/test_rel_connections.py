"""Long-lived connections under load (issue #26): one user's event streams, up to its
limit, plus a stream of concurrent requests, must not starve another user's
``POST /session`` nor the agents' heartbeats.

A manager process on PostgreSQL and a real agent process, on 127.0.0.1 only; the flood
is bounded in count (``FLOOD_STREAMS`` streams, ``SAMPLES`` timed requests) and time.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import sys
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from component.manager.cluster import SECRET, Signer
from component.manager.conftest import temporary_pg_database
from component.manager.test_mgr_real_agent import real_cluster

from .conftest import scaled

FLOOD_STREAMS = 150  # the number that slowed POST /session to seconds
BUSY_LOOPS = 4  # the flooder's concurrent request loops besides its streams (20/s each at most)
SAMPLES = scaled(20, 60)
HEARTBEAT_INTERVAL_S = 3.0  # the agent's default heartbeat-interval-s
SESSION = {"image": "shell", "config": {"resources": {"cpu": 1, "mem": "64m"}}}


async def make_user(admin: httpx.AsyncClient, email: str) -> dict[str, str]:
    body = {"email": email, "password": "long enough password", "role": "user"}
    response = await admin.post("/admin/users", json=body)
    assert response.status_code == 201, response.text
    keypair: dict[str, str] = response.json()["keypair"]
    return keypair


def client_of(admin: httpx.AsyncClient, keypair: dict[str, str]) -> httpx.AsyncClient:
    auth = Signer(keypair["access_key"], keypair["secret_key"])
    return httpx.AsyncClient(base_url=admin.base_url, auth=auth, timeout=60)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


# The flooding user, in a process of its own (its 150 readers and request loops must not
# share the measuring client's event loop): opens ``streams`` event streams, prints
# "ready" once each got its first bytes, then runs ``busy`` request loops until stdin closes.
FLOODER = """
import asyncio, sys
from datetime import UTC, datetime
import httpx
from accelshare.api.signing import sign_request

base, access_key, secret_key, streams, busy = sys.argv[1:6]

class Signer(httpx.Auth):
    def auth_flow(self, request):
        request.headers.update(sign_request(
            access_key=access_key, secret_key=secret_key, method=request.method,
            path_query=request.url.raw_path.decode("ascii"), host=request.headers["host"],
            now=datetime.now(UTC)))
        yield request

async def hold(client, opened):
    async with client.stream("GET", "/events/sessions") as response:
        assert response.status_code == 200, await response.aread()
        async for _ in response.aiter_bytes():
            opened.set()

async def requests(client):
    while True:
        assert (await client.get("/sessions")).status_code == 200
        await asyncio.sleep(0.05)

async def main():
    limits = httpx.Limits(max_connections=int(streams) + 20, max_keepalive_connections=20)
    async with httpx.AsyncClient(base_url=base, auth=Signer(), timeout=60, limits=limits) as client:
        events = [asyncio.Event() for _ in range(int(streams))]
        tasks = [asyncio.create_task(hold(client, e)) for e in events]
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in events)), 60)
        print("ready", flush=True)
        tasks += [asyncio.create_task(requests(client)) for _ in range(int(busy))]
        stdin = asyncio.create_task(asyncio.to_thread(sys.stdin.read))
        done, _ = await asyncio.wait([stdin, *tasks], return_when=asyncio.FIRST_COMPLETED)
        for task in done - {stdin}:
            task.result()  # a stream or a request failed
        print("held", sum(not t.done() for t in tasks[: int(streams)]), flush=True)

asyncio.run(main())
"""


@contextlib.asynccontextmanager
async def flooder(
    base: str, keypair: dict[str, str], streams: int, busy: int
) -> AsyncIterator[asyncio.subprocess.Process]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        FLOODER,
        base,
        keypair["access_key"],
        keypair["secret_key"],
        str(streams),
        str(busy),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert proc.stdin is not None
    assert proc.stdout is not None
    try:
        async with asyncio.timeout(90):
            assert await proc.stdout.readline() == b"ready\n"
        yield proc
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def probe_heartbeat(port: int) -> dict[str, Any]:
    return {
        "agent_id": "i-probe",
        "rpc_url": f"http://127.0.0.1:{port}",
        "slots": {
            "cpu": {"type": "count", "capacity": "1"},
            "mem": {"type": "bytes", "capacity": "1073741824"},
        },
        "alloc_maps": {},
        "sent_at": datetime.now(UTC).isoformat(),
    }


async def test_stream_flood_starves_neither_sessions_nor_heartbeats(tmp_path: Path) -> None:
    manager_toml = f"[api.connections]\nmax-event-streams-per-user = {FLOOD_STREAMS}\n"
    async with (
        temporary_pg_database() as url,
        real_cluster(url, tmp_path, manager_toml=manager_toml) as admin,
    ):
        flooding = await make_user(admin, "flooder@example.com")
        other = client_of(admin, await make_user(admin, "other@example.com"))
        internal = httpx.AsyncClient(
            base_url=admin.base_url, headers={"X-Accelshare-Cluster-Secret": SECRET}, timeout=60
        )
        port = admin.base_url.port
        assert port is not None
        create_ms: list[float] = []
        heartbeat_ms: list[float] = []
        stop = asyncio.Event()

        async def heartbeats() -> None:
            while not stop.is_set():
                started = time.perf_counter()
                response = await internal.post(
                    "/internal/agents/heartbeat", json=probe_heartbeat(port)
                )
                heartbeat_ms.append((time.perf_counter() - started) * 1000)
                assert response.status_code == 200, response.text
                await asyncio.sleep(0.25)

        base = str(admin.base_url).rstrip("/")
        async with (
            asyncio.timeout(300),
            flooder(base, flooding, FLOOD_STREAMS, BUSY_LOOPS) as flood,
        ):
            beating = asyncio.create_task(heartbeats())
            try:
                for i in range(SAMPLES):
                    started = time.perf_counter()
                    created = await other.post("/session", json={**SESSION, "name": f"s{i}"})
                    create_ms.append((time.perf_counter() - started) * 1000)
                    assert created.status_code == 201, created.text
                    deleted = await other.delete(f"/session/{created.json()['sessionId']}")
                    assert deleted.status_code == 200, deleted.text
            finally:
                stop.set()
                await beating
            # The flooder is at its limit: one more stream is refused.
            async with client_of(admin, flooding) as one_more:
                refused = await one_more.get("/events/sessions")
            assert refused.status_code == 429, refused.text
            assert refused.json()["held"] == FLOOD_STREAMS
            assert flood.stdin is not None
            assert flood.stdout is not None
            flood.stdin.close()  # every stream still open, no request failed
            assert await flood.stdout.readline() == f"held {FLOOD_STREAMS}\n".encode()
        p50, p99 = percentile(create_ms, 0.5), percentile(create_ms, 0.99)
        hb50, hbmax = percentile(heartbeat_ms, 0.5), max(heartbeat_ms)
        print(
            f"\nPOST /session under {FLOOD_STREAMS} streams and {BUSY_LOOPS} request loops:"
            f" p50 {p50:.0f} ms, p99 {p99:.0f} ms (mean {statistics.mean(create_ms):.0f});"
            f" heartbeat p50 {hb50:.0f} ms, max {hbmax:.0f} ms ({len(heartbeat_ms)} beats)"
        )
        agents = (await admin.get("/agents")).json()["items"]
        assert {a["id"]: a["status"] for a in agents} == {"i-node01": "ALIVE", "i-probe": "ALIVE"}
        assert p50 < 500, create_ms
        assert p99 < 1000, create_ms
        assert hbmax < HEARTBEAT_INTERVAL_S * 1000, heartbeat_ms
        for client in (other, internal):
            await client.aclose()
