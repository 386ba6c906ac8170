"""``[api.connections]``: per-user limits on event streams, through a real HTTP server
(uvicorn on a loopback port), and the slots given back however a stream ends.  The
terminal's and app WebSockets' limits are in test_mgr_terminal.py (they need a real
agent).  Reading waits for events with deadlines; nothing sleeps as an assertion.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from accelshare.api.conn_limits import ConnectionLimits, ConnectionSettings
from accelshare.api.stream import SharedSnapshots, StreamSettings, close_streams
from accelshare_testkit.waiting import until

from .cluster import Cluster, Signer
from .test_mgr_api import make_user
from .test_mgr_stream import FAST, EventReader, served


def limits_of(cluster: Cluster, **settings: Any) -> ConnectionLimits:
    limits = ConnectionLimits(ConnectionSettings(**settings))
    cluster.app.state.connection_limits = limits
    cluster.app.state.stream_settings = FAST
    return limits


@contextlib.asynccontextmanager
async def opened(
    base: str, auth: httpx.Auth | None, path: str = "/events/sessions"
) -> AsyncIterator[EventReader]:
    async with (
        httpx.AsyncClient(base_url=base, auth=auth, timeout=30) as client,
        client.stream("GET", path) as response,
    ):
        assert response.status_code == 200, await response.aread()
        reader = EventReader(response)
        await reader.until("sessions" if "sessions" in path else "agents")
        yield reader


async def refused(base: str, auth: httpx.Auth, path: str = "/events/sessions") -> httpx.Response:
    async with httpx.AsyncClient(base_url=base, auth=auth, timeout=30) as client:
        response = await client.get(path)
    assert response.status_code == 429, response.text
    assert response.headers["content-type"] == "application/problem+json"
    return response


async def released(limits: ConnectionLimits) -> None:
    async def empty() -> bool:
        return limits.total == 0 and limits.snapshot() == {}

    await until(empty, "every connection slot given back", timeout_s=10, interval_s=0.02)


def signer(cluster: Cluster, keypair: dict[str, Any]) -> Signer:
    return Signer(keypair["access_key"], keypair["secret_key"], cluster.clock)


async def test_streams_beyond_the_per_user_limit_get_429(cluster: Cluster) -> None:
    limits = limits_of(cluster, max_event_streams_per_user=2)
    _, alice_keys = await make_user(cluster, "alice@example.com")
    _, bob_keys = await make_user(cluster, "bob@example.com")
    a, b = signer(cluster, alice_keys), signer(cluster, bob_keys)
    admin = Signer(cluster.creds.access_key, cluster.creds.secret_key)
    async with served(cluster) as base:
        async with opened(base, a), opened(base, a, "/events/sessions?status=all"):
            assert list(limits.snapshot()["event-stream"].values()) == [2]
            body = (response := await refused(base, a)).json()
            assert body["type"] == "/problems/too-many-connections"
            assert body["status"] == 429
            assert body["limit"] == "max-event-streams-per-user"
            assert body["limit_value"] == 2
            assert body["held"] == 2
            assert body["kind"] == "event-stream"
            assert "limit max-event-streams-per-user is 2" in body["detail"]
            # The user has to close one of its own: no Retry-After.
            assert "retry-after" not in response.headers
            # Counted per user: bob, and the admin's agents stream, are not affected.
            async with opened(base, b), opened(base, admin, "/events/agents"):
                assert sorted(limits.snapshot()["event-stream"].values()) == [1, 1, 2]
                assert limits.total == 4
        await released(limits)
        # Closed streams gave their slots back: alice may open two again.
        async with opened(base, a), opened(base, a):
            await refused(base, a)
    await released(limits)


async def test_the_total_limit_answers_429_with_retry_after(cluster: Cluster) -> None:
    limits = limits_of(cluster, max_event_streams_per_user=5, max_total=2, retry_after_s=7)
    _, alice_keys = await make_user(cluster, "alice@example.com")
    _, bob_keys = await make_user(cluster, "bob@example.com")
    a, b = signer(cluster, alice_keys), signer(cluster, bob_keys)
    async with served(cluster) as base:
        async with opened(base, a), opened(base, a):
            response = await refused(base, b)
            assert response.headers["retry-after"] == "7"
            body = response.json()
            assert (body["limit"], body["limit_value"], body["held"]) == ("max-total", 2, 2)
            assert body["retry_after_s"] == 7
        await released(limits)
        async with opened(base, b):
            assert limits.total == 1
    await released(limits)


async def test_slots_are_given_back_however_a_stream_ends(cluster: Cluster) -> None:
    """Client disconnects (also before the first byte was read), a stream ended by the
    server (a deactivated key), and the server stopping: the count goes back to zero."""
    limits = limits_of(cluster, max_event_streams_per_user=3)
    _, keys = await make_user(cluster, "carol@example.com")
    carol = signer(cluster, keys)
    async with served(cluster) as base:
        # Clients that leave: after reading, and right after the response headers.
        for _ in range(3):
            async with opened(base, carol):
                pass
            async with (
                httpx.AsyncClient(base_url=base, auth=carol, timeout=30) as client,
                client.stream("GET", "/events/sessions") as response,
            ):
                assert response.status_code == 200
        await released(limits)
        # A client task cancelled while it reads.
        reading = asyncio.create_task(_read_forever(base, carol))
        await until(lambda: _async(limits.total == 1), "the stream to open", timeout_s=10)
        reading.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reading
        await released(limits)
        # The server ends the stream: the key was deactivated.
        async with opened(base, carol) as events:
            patched = await cluster.admin.patch(
                f"/admin/keypairs/{keys['access_key']}", json={"is_active": False}
            )
            assert patched.status_code == 200, patched.text
            assert (await events.until("error")).data["reason"] == "inactive-access-key"
        await released(limits)
        assert (
            await cluster.admin.patch(
                f"/admin/keypairs/{keys['access_key']}", json={"is_active": True}
            )
        ).status_code == 200
        # The server stops (close_streams, as on SIGTERM).
        async with opened(base, carol) as events:
            close_streams(cluster.app)
            with pytest.raises(AssertionError, match="the stream ended"):
                await events.next(timeout_s=10)
        await released(limits)
    cluster.app.state.streams_closing = False


async def _async(value: bool) -> bool:
    return value


async def _read_forever(base: str, auth: httpx.Auth) -> None:
    async with (
        httpx.AsyncClient(base_url=base, auth=auth, timeout=30) as client,
        client.stream("GET", "/events/sessions") as response,
    ):
        async for _ in response.aiter_bytes():
            pass


async def test_streams_asking_the_same_question_share_one_read(cluster: Cluster) -> None:
    """Ten streams of one user: a change costs about one database read, not ten (each
    stream ran its own query after every change, and 150 of them took the whole pool)."""
    limits_of(cluster, max_event_streams_per_user=10)
    cluster.app.state.stream_settings = StreamSettings(poll_s=30.0, keepalive_s=60, recheck_s=60)
    dave, keys = await make_user(cluster, "dave@example.com")
    auth = signer(cluster, keys)
    async with dave, served(cluster) as base, contextlib.AsyncExitStack() as stack:
        readers = [await stack.enter_async_context(opened(base, auth)) for _ in range(10)]
        shared = cluster.app.state.stream_snapshots
        assert isinstance(shared, SharedSnapshots)
        before = shared.reads
        created = await cluster.create({"cpu": 1}, client=dave, enqueueOnly=True)
        assert created.status_code == 201, created.text
        for reader in readers:
            await reader.until("sessions", lambda d: d["total"] == 1)
        # A read per publish (the enqueue, the scheduler's pass); never one per stream.
        assert 1 <= shared.reads - before <= 4, shared.reads - before
