"""App services on the agent's host ports (``[container] port-range``), through the proxy.

Two sessions on one agent declare the same port (as two Jupyter sessions would, 8888):
each gets its own host port from the range and the proxy reaches each one's own app; a
session beyond the range's size fails with a reason naming the range; a destroyed
session's port goes back to the range.
"""

from __future__ import annotations

import contextlib
import json
import shlex
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import websockets
from websockets.exceptions import ConnectionClosed

from accelshare.agent.runtime.sandbox import SandboxConfig
from accelshare.agent.runtime.sandbox import probe as probe_sandbox
from accelshare_testkit.waiting import until

from .cluster import free_ports_below_ephemeral
from .test_mgr_real_agent import real_cluster
from .test_mgr_terminal import close_code, make_user, signed_headers, ws_url

# Serves its work dir on $BACKENDAI_SERVICE_PORT_WEB, with who.txt naming its session.
WHO_APP = """
import http.server, os
with open("who.txt", "w") as f:
    f.write(os.environ["ACCELSHARE_SESSION_ID"] + " " + os.environ["BACKENDAI_SERVICE_PORT_WEB"])
port = int(os.environ["BACKENDAI_SERVICE_PORT_WEB"])
http.server.ThreadingHTTPServer(("127.0.0.1", port), http.server.SimpleHTTPRequestHandler
    ).serve_forever()
"""


#: Whether the cluster's agent (``[container] sandbox = "auto"``) sandboxes its kernels here.
SANDBOXED = probe_sandbox(SandboxConfig()) is None


@pytest.fixture
def low() -> int:
    """The agent's port range is ``[low, low + 1]``."""
    return free_ports_below_ephemeral(2)


@pytest.fixture
async def admin(tmp_path: Path, low: int) -> AsyncIterator[httpx.AsyncClient]:
    db_url = f"sqlite+aiosqlite:///{tmp_path / 'manager.db'}"
    async with real_cluster(
        db_url, tmp_path, agent_container_toml=f"port-range = [{low}, {low + 1}]"
    ) as client:
        yield client


def _body(name: str) -> dict[str, object]:
    return {
        "image": "python",
        "name": name,
        "type": "batch",
        "startupCommand": f"python -c {shlex.quote(WHO_APP)}",
        "maxWaitSeconds": 30,
        "config": {
            "resources": {"cpu": 1, "mem": "256m"},
            "service_ports": [{"name": "web", "protocol": "http", "port": 8888}],
        },
    }


async def test_two_sessions_same_declared_port_each_served(
    admin: httpx.AsyncClient, low: int
) -> None:
    owner = await make_user(admin, "owner@example.com")
    sids: list[str] = []
    for name in ("nb1", "nb2"):
        created = await owner.post("/session", json=_body(name))
        assert created.status_code == 201, created.text
        assert created.json()["status"] == "RUNNING", created.text
        sids.append(created.json()["sessionId"])

    host_ports = []
    for sid in sids:
        apps = (await owner.get(f"/session/{sid}/apps")).json()["apps"]
        assert [(a["name"], a["port"]) for a in apps] == [("web", 8888)]
        host_ports.append(apps[0]["hostPort"])
    assert sorted(host_ports) == [low, low + 1]
    for sid, host_port in zip(sids, host_ports, strict=True):
        # The session itself shows the same host port (REST and GraphQL).
        shown = (await owner.get(f"/session/{sid}")).json()["servicePorts"]
        assert shown == [{"name": "web", "protocol": "http", "port": 8888, "hostPort": host_port}]
        gql = await admin.post(
            "/admin/gql",
            json={
                "query": "query($id: UUID!) { compute_session(id: $id) { service_ports } }",
                "variables": {"id": sid},
            },
        )
        assert json.loads(gql.json()["data"]["compute_session"]["service_ports"]) == shown
    listed = {
        s["sessionId"]: s["servicePorts"] for s in (await owner.get("/sessions")).json()["items"]
    }
    assert [listed[sid][0]["hostPort"] for sid in sids] == host_ports  # lists too

    for sid, host_port in zip(sids, host_ports, strict=True):

        async def who(sid: str = sid) -> httpx.Response | None:
            response = await owner.get(f"/session/{sid}/apps/web/who.txt")
            return response if response.status_code == 200 else None

        response = await until(who, f"the app of session {sid}", timeout_s=20)
        # Its own app: sandboxed, it listens on its declared port in its own network
        # namespace (the agent relays the host port); otherwise on its host port.
        assert response.text == f"{sid} {8888 if SANDBOXED else host_port}"

    # The range holds two: a third session cannot start, and says why.
    third = await owner.post("/session", json=_body("nb3"))
    assert third.status_code == 201, third.text
    info = (await owner.get(f"/session/{third.json()['sessionId']}")).json()
    assert info["status"] == "CANCELLED", info
    assert f"port range [{low}, {low + 1}]" in info["statusInfo"], info

    # A destroyed session's port goes back: a new session gets it.
    assert (await owner.delete(f"/session/{sids[0]}")).json()["status"] == "TERMINATED"

    async def fourth_running() -> httpx.Response | None:
        created = await owner.post("/session", json=_body("nb4"))
        if created.json().get("status") == "RUNNING":
            return created
        await owner.delete(f"/session/{created.json()['sessionId']}")
        return None

    created = await until(fourth_running, "a session on the freed port", timeout_s=20)
    sid4 = created.json()["sessionId"]
    apps = (await owner.get(f"/session/{sid4}/apps")).json()["apps"]
    assert apps[0]["hostPort"] == host_ports[0]
    await owner.aclose()


async def test_an_app_path_with_a_control_character_is_refused(admin: httpx.AsyncClient) -> None:
    """``%00`` in an app's path reached the upstream URL (a 500): now 400 naming it, and
    the app goes on answering."""
    owner = await make_user(admin, "nul@example.com")
    created = await owner.post("/session", json=_body("nul"))
    assert created.json()["status"] == "RUNNING", created.text
    sid = created.json()["sessionId"]

    async def who() -> httpx.Response | None:
        response = await owner.get(f"/session/{sid}/apps/web/who.txt")
        return response if response.status_code == 200 else None

    await until(who, "the app", timeout_s=20)
    for path in ("who%00.txt", "%00", "a%0Ab", "x%7F"):
        response = await owner.get(f"/session/{sid}/apps/web/{path}")
        assert response.status_code == 400, (path, response.text)
        assert response.headers["content-type"] == "application/problem+json"
        problem = response.json()
        assert problem["field"] == "path"
        assert "control character U+00" in problem["detail"]
    for path in (f"/session/{sid}%00", "/session/%00/apps/web/who.txt"):
        assert (await owner.get(path)).status_code == 400, path
    assert (await owner.get(f"/session/{sid}/apps/web/who.txt")).status_code == 200
    await owner.aclose()


async def test_the_stream_proxy_relays_tcp_to_the_owners_service(admin: httpx.AsyncClient) -> None:
    """Backend.AI's ``/stream/session/{id}/tcpproxy`` (what ``backend.ai app`` opens):
    bytes both ways to the session's service; refusals close with the reason."""
    owner = await make_user(admin, "streamer@example.com")
    other = await make_user(admin, "other@example.com")
    created = await owner.post("/session", json=_body("tcp"))
    assert created.json()["status"] == "RUNNING", created.text
    sid = created.json()["sessionId"]
    listed = await owner.get(f"/stream/session/{sid}/apps")
    assert listed.json() == [{"name": "web", "protocol": "http", "ports": [8888]}]

    path = f"/stream/session/{sid}/tcpproxy?app=web"

    async def fetch() -> bytes | None:
        async with websockets.connect(
            ws_url(owner, path), additional_headers=signed_headers(owner, path)
        ) as ws:
            await ws.send(b"GET /who.txt HTTP/1.0\r\nHost: x\r\n\r\n")
            answer = b""
            with contextlib.suppress(ConnectionClosed):
                while True:
                    frame = await ws.recv()
                    answer += frame if isinstance(frame, bytes) else frame.encode()
        return answer if b" 200 " in answer.split(b"\r\n", 1)[0] else None

    answer = await until(fetch, "the service through the tcpproxy", timeout_s=20)
    assert answer.split(b"\r\n\r\n", 1)[1].startswith(sid.encode())  # its own who.txt

    for client, query, code in (
        (owner, "app=nosuch", 4404),
        (owner, "app=web&envs=%7B%22A%22%3A%221%22%7D", 4400),
        (owner, "", 4400),
        (other, "app=web", 4404),  # another user's session: not found
    ):
        refused = f"/stream/session/{sid}/tcpproxy" + (f"?{query}" if query else "")
        assert await close_code(ws_url(client, refused), signed_headers(client, refused)) == code
    await owner.aclose()
    await other.aclose()
