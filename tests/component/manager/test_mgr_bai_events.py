"""Backend.AI's ``GET /events/session`` (and ``/events/background-task``) on the manager."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from accelshare.api.auth import AuthMethod

from .cluster import Cluster
from .test_mgr_api import make_user


def parse_sse(text: str) -> list[tuple[str, dict[str, Any]]]:
    events = []
    for block in text.split("\n\n"):
        lines = [line for line in block.splitlines() if not line.startswith(":")]
        if not lines:
            continue
        fields = dict(line.split(": ", 1) for line in lines)
        events.append((fields["event"], json.loads(fields["data"])))
    return events


async def test_one_sessions_events_history_first_then_server_close(cluster: Cluster) -> None:
    agent = await cluster.add_agent("i-node01")
    created = await cluster.create({"cuda.shares": "0.5"}, name="ev", type="batch",
                                   startupCommand="exit 5")  # fmt: skip
    assert created.status_code == 201, created.text
    await cluster.wait_status("ev", "RUNNING")
    (kernel_id,) = agent.kernels
    await agent.exit_kernel(kernel_id, exit_code=5)
    await cluster.wait_status("ev", "TERMINATED")
    response = await cluster.admin.get("/events/session", params={"sessionName": "ev"})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    events = parse_sse(response.text)
    names = [name for name, _ in events]
    assert names == [
        "session_enqueued",
        "session_scheduled",
        "kernel_preparing",
        "kernel_creating",
        "kernel_started",
        "session_started",
        "kernel_terminated",
        "session_failure",
        "session_terminated",
        "server_close",
    ]
    failure = dict(events)["session_failure"]
    assert failure["exitCode"] == 5
    assert failure["sessionName"] == "ev"
    assert failure["sessionId"] == created.json()["sessionId"]
    assert dict(events)["kernel_started"]["kernelId"] == kernel_id
    assert dict(events)["kernel_started"]["exitCode"] is None

    by_id = await cluster.admin.get(
        "/events/session", params={"sessionId": created.json()["sessionId"], "scope": "kernel"}
    )
    assert all(n.startswith("kernel_") or n == "server_close" for n, _ in parse_sse(by_id.text))


async def test_refusals_before_the_stream_starts(cluster: Cluster) -> None:
    await cluster.add_agent("i-node01")
    bad_scope = await cluster.admin.get("/events/session", params={"scope": "agent"})
    assert (bad_scope.status_code, bad_scope.json()["field"]) == (400, "scope")
    missing = await cluster.admin.get("/events/session", params={"sessionName": "nosuch"})
    assert missing.status_code == 404
    task = await cluster.admin.get("/events/background-task", params={"taskId": "t-1"})
    assert (task.status_code, task.json()["field"]) == (404, "taskId")
    alice, _ = await make_user(cluster, "alice@example.com")
    async with alice:
        other = await alice.get(
            "/events/session",
            params={"sessionName": "*", "ownerAccessKey": cluster.creds.access_key},
        )
        assert (other.status_code, other.json()["field"]) == (403, "ownerAccessKey")
        created = await cluster.create({"cuda.shares": "0.1"}, name="admins-own")
        assert created.status_code == 201
        hidden = await alice.get("/events/session", params={"sessionName": "admins-own"})
        assert hidden.status_code == 404  # another user's session, by name or id


async def test_all_of_a_users_sessions_from_now_on(cluster: Cluster) -> None:
    await cluster.add_agent("i-node01")
    await cluster.create({"cuda.shares": "0.1"}, name="before")
    await cluster.wait_status("before", "RUNNING")
    alice, keypair = await make_user(cluster, "alice2@example.com")
    async with alice:
        identity = await _identity(cluster, keypair["access_key"])
        stream = await cluster.manager.bai_events.open(
            identity, session_name="*", session_id=None, owner_access_key=None, scope="session"
        )
        seen: list[tuple[str, str]] = []

        async def collect() -> None:
            async for event in stream:
                if event is not None:
                    seen.append((event[0], event[1]["sessionName"]))

        task = asyncio.create_task(collect())
        try:
            mine = await cluster.create({"cuda.shares": "0.1"}, client=alice, name="mine")
            assert mine.status_code == 201
            await cluster.create({"cuda.shares": "0.1"}, name="not-mine")
            await cluster.wait_status("not-mine", "RUNNING")
            await cluster.wait_status(mine.json()["sessionId"], "RUNNING")

            async def started() -> bool:
                return ("session_started", "mine") in seen

            await cluster.until(started, what="alice's session_started")
        finally:
            task.cancel()
        assert {name for _, name in seen} == {"mine"}  # nothing of before, nor of others
        assert seen[0] == ("session_enqueued", "mine")


async def _identity(cluster: Cluster, access_key: str) -> Any:
    authenticator = cluster.app.state.authenticator
    credential = await authenticator.store.get_credential(access_key)
    return await authenticator.identity_of(access_key, str(credential.user_id), AuthMethod.KEYPAIR)
