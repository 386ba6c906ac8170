"""The console's API: ``GET /events/sessions`` and ``GET /events/agents`` (server-sent
events), ``GET /config/resource-slots/limits``, ``GET /agents/{id}/stats``, and the
static console with the browser redirect at ``/``.

The streams are read from a real HTTP server (uvicorn on a loopback port): httpx's ASGI
transport buffers whole responses, which an endless stream never finishes.  Reading
waits for the next event with a deadline; nothing sleeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import uvicorn

from accelshare.api.stream import StreamSettings, close_streams
from accelshare.devcluster import free_port

from .cluster import Cluster, Signer
from .test_mgr_api import make_user

FAST = StreamSettings(poll_s=0.2, keepalive_s=30.0, recheck_s=0.2)


@asynccontextmanager
async def served(cluster: Cluster) -> AsyncIterator[str]:
    """The cluster's app on a loopback port (its lifespan already runs in the fixture)."""
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            cluster.app, host="127.0.0.1", port=port, lifespan="off", log_level="warning"
        )
    )
    task = asyncio.create_task(server.serve())
    try:
        async with asyncio.timeout(20):
            while not server.started:
                if task.done():
                    task.result()
                await asyncio.sleep(0.01)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, 20)


@dataclass
class Event:
    name: str
    data: Any


class EventReader:
    """Parses a text/event-stream response into events (comments as ``:comment``)."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self._lines = response.aiter_lines()

    async def next(self, timeout_s: float = 20.0) -> Event:
        name, data = "message", []
        async with asyncio.timeout(timeout_s):
            async for line in self._lines:
                if line.startswith(":"):
                    return Event(":comment", line[1:].strip())
                if line.startswith("event:"):
                    name = line.split(":", 1)[1].strip()
                elif line.startswith("data:"):
                    data.append(line.split(":", 1)[1].strip())
                elif line == "" and data:
                    return Event(name, json.loads("\n".join(data)))
        raise AssertionError("the stream ended")

    async def until(self, name: str, check: Any = None, timeout_s: float = 20.0) -> Event:
        """The next ``name`` event for which ``check(data)`` holds."""
        async with asyncio.timeout(timeout_s):
            while True:
                event = await self.next(timeout_s)
                if event.name == name and (check is None or check(event.data)):
                    return event


@asynccontextmanager
async def stream(
    base: str, path: str, auth: httpx.Auth | None = None, cookies: dict[str, str] | None = None
) -> AsyncIterator[EventReader]:
    async with (
        httpx.AsyncClient(base_url=base, auth=auth, cookies=cookies, timeout=30) as client,
        client.stream("GET", path) as response,
    ):
        assert response.status_code == 200, await response.aread()
        assert response.headers["content-type"].startswith("text/event-stream")
        yield EventReader(response)


def names(event: Event) -> set[str]:
    return {item["sessionName"] for item in event.data["items"]}


def signer(cluster: Cluster, keypair: dict[str, Any]) -> Signer:
    return Signer(keypair["access_key"], keypair["secret_key"], cluster.clock)


async def test_streams_need_credentials_and_agents_need_superadmin(cluster: Cluster) -> None:
    anonymous = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=cluster.app), base_url="http://127.0.0.1:8081"
    )
    async with anonymous:
        for path in ("/events/sessions", "/events/agents", "/config/resource-slots/limits"):
            response = await anonymous.get(path)
            assert response.status_code == 401, path
            assert response.json()["reason"] == "missing-credentials"
    for role in ("user",):  # domain admins may read agents (their domain's holders only)
        client, _ = await make_user(cluster, f"{role}@example.com", role)
        async with client:
            for path in ("/events/agents", "/agents/i-node01/stats"):
                response = await client.get(path)
                assert response.status_code == 403, (role, path)
                assert response.json()["reason"] == "insufficient-role"
    bad = await cluster.admin.get("/events/sessions", params={"status": "NOPE"})
    assert bad.status_code == 400
    assert bad.json()["field"] == "status"


async def test_session_stream_is_per_user_and_follows_changes(cluster: Cluster) -> None:
    cluster.app.state.stream_settings = FAST
    await cluster.add_agent("i-node01")
    alice, alice_keys = await make_user(cluster, "alice@example.com")
    bob, _ = await make_user(cluster, "bob@example.com")
    async with alice, bob, served(cluster) as base:
        assert (await cluster.create({"cuda.shares": "0.5"}, client=bob, name="bobs")).is_success
        async with (
            stream(base, "/events/sessions", auth=signer(cluster, alice_keys)) as mine,
            stream(
                base,
                "/events/sessions",
                auth=Signer(cluster.creds.access_key, cluster.creds.secret_key),
            ) as everyone,
        ):
            first = await mine.until("sessions")
            assert first.data["items"] == []
            assert first.data["total"] == 0
            assert names(await everyone.until("sessions")) == {"bobs"}

            created = await cluster.create({"cuda.shares": "0.2"}, client=alice, name="alices")
            assert created.status_code == 201, created.text
            running = await mine.until(
                "sessions", lambda d: [i["status"] for i in d["items"]] == ["RUNNING"]
            )
            assert names(running) == {"alices"}  # never bob's
            assert running.data["items"][0]["occupiedSlots"]["cuda.shares"] == "0.2"
            await everyone.until("sessions", lambda d: len(d["items"]) == 2)

            assert (await alice.delete("/session/alices")).is_success
            await mine.until("sessions", lambda d: d["items"] == [])
            assert names(await everyone.until("sessions", lambda d: len(d["items"]) == 1)) == {
                "bobs"
            }


async def test_session_stream_with_the_login_cookie_and_keepalive(cluster: Cluster) -> None:
    cluster.app.state.stream_settings = StreamSettings(poll_s=0.05, keepalive_s=0.2, recheck_s=60)
    _, _ = await make_user(cluster, "carol@example.com")
    async with served(cluster) as base:
        async with httpx.AsyncClient(base_url=base) as browser:
            login = await browser.post(
                "/auth/login",
                json={"email": "carol@example.com", "password": "long enough password"},
            )
            assert login.status_code == 200
            cookies = dict(browser.cookies)
        async with stream(base, "/events/sessions?status=all", cookies=cookies) as events:
            assert (await events.until("sessions")).data["items"] == []
            # Nothing changes: a comment keeps the connection open.
            assert (await events.next()).name == ":comment"


async def test_stream_ends_when_the_key_is_deactivated(cluster: Cluster) -> None:
    cluster.app.state.stream_settings = FAST
    _, keys = await make_user(cluster, "dave@example.com")
    async with (
        served(cluster) as base,
        stream(base, "/events/sessions", auth=signer(cluster, keys)) as events,
    ):
        await events.until("sessions")
        patched = await cluster.admin.patch(
            f"/admin/keypairs/{keys['access_key']}", json={"is_active": False}
        )
        assert patched.status_code == 200, patched.text
        error = await events.until("error")
        assert error.data["reason"] == "inactive-access-key"
        with pytest.raises(AssertionError, match="the stream ended"):
            await events.next()


async def test_agent_stream_has_live_device_maps_and_holders(cluster: Cluster) -> None:
    cluster.app.state.stream_settings = FAST
    await cluster.add_agent("i-node01")
    admin = Signer(cluster.creds.access_key, cluster.creds.secret_key)
    for name, amount in (("small", "0.2"), ("big", "1.2")):
        created = await cluster.create({"cuda.shares": amount}, name=name)
        assert created.status_code == 201, created.text
        await cluster.wait_status(name, "RUNNING")
    async with served(cluster) as base, stream(base, "/events/agents", auth=admin) as events:
        event = await events.until("agents")
        (view,) = event.data["items"]
        assert view["agent"]["id"] == "i-node01"
        assert view["agent"]["occupiedSlots"]["cuda.shares"] == "1.4"
        assert view["allocMap"]["source"] == "agent"
        devices = view["allocMap"]["maps"]["cuda"]["devices"]
        assert sorted(d["allocated"] for d in devices) == ["0.6", "0.8"]
        held = {
            event.data["kernels"][kernel]["sessionName"]
            for device in devices
            for kernel in device["kernels"]
        }
        assert held == {"small", "big"}
        # Hollow agents serve no stats: the view says so instead of failing.
        assert view["stats"] is None
        assert "statsError" in view

        assert (await cluster.admin.delete("/session/small")).is_success

        def freed(data: dict[str, Any]) -> bool:
            cuda = data["items"][0]["allocMap"]["maps"]["cuda"]["devices"]
            holders = {k["sessionName"] for k in data["kernels"].values()}
            return sorted(x["allocated"] for x in cuda) == ["0.6", "0.6"] and holders == {"big"}

        await events.until("agents", freed)


async def test_slot_limits_for_any_user(cluster: Cluster) -> None:
    await cluster.add_agent("i-node01")
    await cluster.add_agent("i-node02", cpus=16)
    alice, _ = await make_user(cluster, "erin@example.com")
    async with alice:
        response = await alice.get("/config/resource-slots/limits")
    assert response.status_code == 200
    limits = response.json()
    assert limits["cuda.shares"] == {"quantum": "0.1", "max_per_agent": "2"}
    assert limits["cpu"] == {"quantum": None, "max_per_agent": "16"}
    assert limits["mem"]["quantum"] is None


async def test_agent_stats_answers_503_when_the_agent_has_none(cluster: Cluster) -> None:
    await cluster.add_agent("i-node01")
    response = await cluster.admin.get("/agents/i-node01/stats")
    assert response.status_code == 503
    assert "i-node01" in response.json()["detail"]
    assert (await cluster.admin.get("/agents/nope/stats")).status_code == 404


async def test_console_is_served_and_browsers_are_sent_there(cluster: Cluster) -> None:
    client = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=cluster.app), base_url="http://127.0.0.1:8081"
    )
    async with client:
        browser = await client.get("/", headers={"Accept": "text/html,application/xhtml+xml"})
        assert browser.status_code == 307
        assert browser.headers["location"] == "/console/"
        api = await client.get("/", headers={"Accept": "application/json"})
        assert api.status_code == 200
        assert "version" in api.json()
        assert "version" in (await client.get("/")).json()  # no Accept: the API answer
        index = await client.get("/console/")
        assert index.status_code == 200
        assert index.headers["content-type"].startswith("text/html")
        assert '<script type="module" src="app.js">' in index.text
        for name in ("app.js", "api.js", "format.js", "sessions.js", "launch.js", "agents.js"):
            module = await client.get(f"/console/{name}")
            assert module.status_code == 200, name
            assert "javascript" in module.headers["content-type"], name
        css = await client.get("/console/console.css")
        assert css.headers["content-type"].startswith("text/css")


async def test_streams_end_when_the_server_stops(cluster: Cluster) -> None:
    """``accelshare server manager`` calls close_streams on SIGINT/SIGTERM: an endless
    response would otherwise hold uvicorn's graceful shutdown until its timeout."""
    cluster.app.state.stream_settings = StreamSettings(poll_s=30.0, keepalive_s=60, recheck_s=60)
    admin = Signer(cluster.creds.access_key, cluster.creds.secret_key)
    async with served(cluster) as base, stream(base, "/events/sessions", auth=admin) as events:
        await events.until("sessions")
        close_streams(cluster.app)  # wakes the stream through the hub, long before poll_s
        with pytest.raises(AssertionError, match="the stream ended"):
            await events.next(timeout_s=10)


async def test_a_cookie_stream_ends_when_the_login_is_ended(cluster: Cluster) -> None:
    """A logout elsewhere (another copy of the cookie) ends an open cookie stream at the
    next recheck with ``session-ended``; a keypair-signed stream is not affected."""
    cluster.app.state.stream_settings = FAST
    erin, keys = await make_user(cluster, "erin@example.com")
    async with served(cluster) as base, httpx.AsyncClient(base_url=base) as browser:
        login = await browser.post(
            "/auth/login",
            json={"email": "erin@example.com", "password": "long enough password"},
        )
        assert login.status_code == 200
        cookies = dict(browser.cookies)
        async with (
            stream(base, "/events/sessions", cookies=cookies) as events,
            stream(base, "/events/sessions", auth=signer(cluster, keys)) as signed,
        ):
            await events.until("sessions")
            await signed.until("sessions")
            out = await browser.post(
                "/auth/logout", headers={"X-CSRF-Token": login.json()["csrf_token"]}
            )
            assert out.status_code == 200, out.text
            error = await events.until("error")
            assert error.data["reason"] == "session-ended"
            await asyncio.sleep(FAST.recheck_s * 3)
            async with erin:
                created = await cluster.create({"cpu": 1}, client=erin, enqueueOnly=True)
            assert created.status_code == 201, created.text
            update = await signed.until("sessions")
            assert [s["sessionId"] for s in update.data["items"]] == [created.json()["sessionId"]]
