"""The counts behind ``[api.connections]`` (accelshare.api.conn_limits) and the shared
reads of the event streams (accelshare.api.stream.SharedSnapshots)."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

import pytest
from starlette.websockets import WebSocket

from accelshare.api.app_proxy import ws_lease
from accelshare.api.conn_limits import (
    ConnectionKind,
    ConnectionLimits,
    ConnectionSettings,
    TooManyConnections,
)
from accelshare.api.stream import SharedSnapshots

STREAM, TERMINAL = ConnectionKind.EVENT_STREAM, ConnectionKind.TERMINAL


def test_each_kind_is_counted_per_user_and_released_once() -> None:
    limits = ConnectionLimits(ConnectionSettings(max_event_streams_per_user=2, max_total=10))
    a1, a2 = limits.acquire(STREAM, "alice"), limits.acquire(STREAM, "alice")
    with pytest.raises(TooManyConnections) as refused:
        limits.acquire(STREAM, "alice")
    body = refused.value.to_body()
    assert body["status"] == 429
    assert (body["limit"], body["limit_value"], body["held"], body["kind"]) == (
        "max-event-streams-per-user",
        2,
        2,
        "event-stream",
    )
    assert "Retry-After" not in refused.value.headers
    terminal = limits.acquire(TERMINAL, "alice")  # another kind, its own count
    bob = limits.acquire(STREAM, "bob")
    assert limits.snapshot() == {"event-stream": {"alice": 2, "bob": 1}, "terminal": {"alice": 1}}
    a1.release()
    a1.release()  # idempotent: the second release gives nothing back twice
    assert limits.held(STREAM, "alice") == 1
    limits.acquire(STREAM, "alice").release()
    for lease in (a2, terminal, bob):
        with lease:
            pass
        assert lease.released
    assert limits.total == 0
    assert limits.snapshot() == {}


def test_the_total_limit_comes_with_retry_after() -> None:
    limits = ConnectionLimits(ConnectionSettings(max_total=2, retry_after_s=9))
    held = [limits.acquire(STREAM, "alice"), limits.acquire(TERMINAL, "bob")]
    with pytest.raises(TooManyConnections) as refused:
        limits.acquire(ConnectionKind.APP_WEBSOCKET, "carol")
    assert refused.value.headers["Retry-After"] == "9"
    assert refused.value.to_body()["limit"] == "max-total"
    assert refused.value.to_body()["held"] == 2
    for lease in held:
        lease.release()
    limits.acquire(ConnectionKind.APP_WEBSOCKET, "carol").release()
    assert limits.total == 0


async def test_shared_snapshots_run_one_read_per_question_and_version() -> None:
    shared = SharedSnapshots(max_concurrent=1)
    started = asyncio.Event()
    release = asyncio.Event()
    calls = 0

    async def read() -> dict[str, int]:
        nonlocal calls
        calls += 1
        started.set()
        await release.wait()
        return {"n": calls}

    waiters = [asyncio.create_task(shared.get("q", 1, 10.0, read)) for _ in range(5)]
    await started.wait()
    waiters[0].cancel()  # a stream that leaves does not cancel the others' read
    release.set()
    answers = await asyncio.gather(*waiters[1:])
    assert answers == [{"n": 1}] * 4
    assert calls == 1
    assert await shared.get("q", 1, 10.0, read) == {"n": 1}  # same version, still fresh
    assert await shared.get("q", 2, 10.0, read) == {"n": 2}  # a publish since: read again
    assert await shared.get("other", 2, 10.0, read) == {"n": 3}  # another question
    assert await shared.get("q", 2, 0.0, read) == {"n": 4}  # too old to share
    assert shared.reads == 4


async def test_a_failed_read_reaches_its_waiters_and_the_next_read_runs() -> None:
    shared = SharedSnapshots()

    async def broken() -> dict[str, int]:
        raise RuntimeError("database gone")

    async def fine() -> dict[str, int]:
        return {"ok": 1}

    with pytest.raises(RuntimeError, match="database gone"):
        await shared.get("q", 1, 10.0, broken)
    assert await shared.get("q", 2, 10.0, fine) == {"ok": 1}


async def test_at_most_max_concurrent_reads_run_at_once() -> None:
    shared = SharedSnapshots(max_concurrent=2)
    running = peak = 0

    async def read() -> dict[str, int]:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.01)
        running -= 1
        return {}

    await asyncio.gather(*(shared.get(f"q{i}", 1, 10.0, read) for i in range(8)))
    assert peak == 2
    assert shared.reads == 8


async def _handshake(extensions: dict[str, Any]) -> list[dict[str, Any]]:
    """The ASGI messages the app proxy sends to a WebSocket handshake over its limit."""
    limits = ConnectionLimits(ConnectionSettings(max_terminals_per_user=1))
    held = limits.acquire(TERMINAL, "alice")
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "websocket.connect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    app = SimpleNamespace(state=SimpleNamespace(connection_limits=limits))
    scope = {"type": "websocket", "path": "/session/s/terminal", "headers": [], "app": app}
    socket = WebSocket({**scope, "extensions": extensions}, receive, send)
    identity = SimpleNamespace(user_id="alice")
    assert await ws_lease(socket, TERMINAL, identity) is None  # type: ignore[arg-type]
    assert limits.total == 1  # the refused handshake took nothing
    held.release()
    return sent


async def test_a_websocket_over_its_limit_gets_an_http_429_or_close_code_4429() -> None:
    denial = await _handshake({"websocket.http.response": {}})
    assert denial[0]["type"] == "websocket.http.response.start"
    assert denial[0]["status"] == 429
    body = json.loads(b"".join(m.get("body", b"") for m in denial[1:]))
    assert (body["limit"], body["limit_value"], body["held"]) == ("max-terminals-per-user", 1, 1)
    # A server without the denial-response extension: accepted, then closed with 4429.
    closed = await _handshake({})
    assert [m["type"] for m in closed] == ["websocket.accept", "websocket.close"]
    assert closed[1]["code"] == 4429
    assert "max-terminals-per-user is 1" in closed[1]["reason"]
