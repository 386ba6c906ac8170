"""The app proxy (web terminal and app services) with a real agent and manager process.

One cluster per test (about 5 s to start); every check of the owner's, another user's
and an anonymous caller's access runs against it, then again after the session ended.
"""

from __future__ import annotations

import asyncio
import json
import shlex
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import websockets
from websockets.exceptions import ConnectionClosed, InvalidStatus

from accelshare.agent.terminal_ws import SESSION_ENDED
from accelshare_testkit.terminal import TerminalScreen

from .cluster import Signer
from .test_mgr_real_agent import real_cluster

# The kernel's app: http.server on $BACKENDAI_SERVICE_PORT_WEB and a WebSocket echo server
# (the agent's interpreter runs the python environment, so websockets is importable).
APP_SCRIPT = """
import asyncio, functools, http.server, os, threading, websockets
web = int(os.environ["BACKENDAI_SERVICE_PORT_WEB"])
echo = int(os.environ["BACKENDAI_SERVICE_PORT_ECHO"])
os.makedirs("sub", exist_ok=True)
class Handler(http.server.SimpleHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Length", str(len(body) + 5))
        self.end_headers()
        self.wfile.write(b"got: " + body)
handler = functools.partial(Handler, directory=".")
server = http.server.ThreadingHTTPServer(("127.0.0.1", web), handler)
threading.Thread(target=server.serve_forever, daemon=True).start()
async def reply(ws):
    async for message in ws:
        await ws.send(("echo:" + message) if isinstance(message, str) else b"echo:" + message)
async def main():
    async with websockets.serve(reply, "127.0.0.1", echo):
        await asyncio.Future()
asyncio.run(main())
"""


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite+aiosqlite:///{tmp_path / 'manager.db'}"


@pytest.fixture
async def admin(sqlite_url: str, tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    async with real_cluster(sqlite_url, tmp_path) as client:
        yield client


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def ws_url(client: httpx.AsyncClient, path: str) -> str:
    return str(client.base_url).replace("http://", "ws://").rstrip("/") + path


def signed_headers(client: httpx.AsyncClient, path: str) -> dict[str, str]:
    """The signature headers of a GET of ``path`` (the WebSocket handshake)."""
    auth = client.auth
    assert isinstance(auth, Signer)
    request = httpx.Request("GET", str(client.base_url).rstrip("/") + path)
    next(auth.auth_flow(request))
    return {k: v for k, v in request.headers.items() if k.lower() != "host"}


async def close_code(url: str, headers: dict[str, str]) -> int:
    async with websockets.connect(url, additional_headers=headers) as ws:
        with pytest.raises(ConnectionClosed) as closed:
            await ws.recv()
    assert closed.value.rcvd is not None
    return closed.value.rcvd.code


async def make_user(admin: httpx.AsyncClient, email: str, role: str = "user") -> httpx.AsyncClient:
    body = {"email": email, "password": "long enough password", "role": role}
    response = await admin.post("/admin/users", json=body)
    assert response.status_code == 201, response.text
    keypair = response.json()["keypair"]
    return httpx.AsyncClient(
        base_url=admin.base_url,
        auth=Signer(keypair["access_key"], keypair["secret_key"]),
        timeout=30,
    )


async def test_terminal_owner_only_and_gone_after_destroy(
    admin: httpx.AsyncClient, tmp_path: Path
) -> None:
    owner = await make_user(admin, "owner@example.com")
    other = await make_user(admin, "other@example.com")
    body = {
        "image": "shell",
        "name": "t1",
        "maxWaitSeconds": 30,
        "config": {"resources": {"cpu": 1, "mem": "256m", "cuda.shares": "0.5"}},
    }
    created = await owner.post("/session", json=body)
    assert created.json()["status"] == "RUNNING", created.text
    sid = created.json()["sessionId"]
    path = f"/session/{sid}/terminal"

    async with websockets.connect(
        ws_url(owner, path), additional_headers=signed_headers(owner, path)
    ) as ws:
        screen = TerminalScreen(ws)
        await ws.send(b"nvidia-smi\r")
        await screen.until("1024MiB", timeout_s=15)  # 0.5 share of a 2 GiB GPU

    # The console's way: the login cookie, from the manager's own origin only.
    login = await admin.post(
        "/auth/login", json={"email": "owner@example.com", "password": "long enough password"}
    )
    assert login.status_code == 200, login.text
    cookie = "; ".join(f"{k}={v}" for k, v in login.cookies.items())
    origin = str(admin.base_url).rstrip("/")
    async with websockets.connect(
        ws_url(owner, path), additional_headers={"Cookie": cookie, "Origin": origin}
    ) as ws:
        screen = TerminalScreen(ws)
        await ws.send(json.dumps({"type": "data", "data": "echo via-cookie\r"}))
        await screen.until("via-cookie")
    evil = {"Cookie": cookie, "Origin": "http://evil.example"}
    assert await close_code(ws_url(owner, path), evil) == 4403

    assert await close_code(ws_url(owner, path), {}) == 4401
    assert await close_code(ws_url(other, path), signed_headers(other, path)) == 4404
    # A domain admin sees the session (list, logs, destroy) but does not enter it.
    domain_admin = await make_user(admin, "dadmin@example.com", role="admin")
    assert (await domain_admin.get(f"/session/{sid}")).status_code == 200
    assert await close_code(ws_url(domain_admin, path), signed_headers(domain_admin, path)) == 4403
    await domain_admin.aclose()
    superadmin_path = ws_url(admin, path)
    async with websockets.connect(
        superadmin_path, additional_headers=signed_headers(admin, path)
    ) as ws:
        screen = TerminalScreen(ws)
        await ws.send(b"echo superadmin-ok\r")
        await screen.until("superadmin-ok")

    # Destroyed under an open terminal: the relay passes on the session's end (not a
    # shell exit), with its close code.
    async with websockets.connect(
        ws_url(owner, path), additional_headers=signed_headers(owner, path)
    ) as ws:
        screen = TerminalScreen(ws)
        await ws.send(b"echo before-the-end\r")
        await screen.until("before-the-end")
        assert (await owner.delete(f"/session/{sid}")).json()["status"] == "TERMINATED"
        await screen.until_closed()
    assert screen.controls[-1]["type"] == "ended", screen.controls
    assert ws.close_code == SESSION_ENDED
    assert await close_code(ws_url(owner, path), signed_headers(owner, path)) == 4404
    await owner.aclose()
    await other.aclose()


async def test_app_service_proxied_for_its_owner_only(admin: httpx.AsyncClient) -> None:
    owner = await make_user(admin, "owner@example.com")
    other = await make_user(admin, "other@example.com")
    port, ws_port = _free_port(), _free_port()
    body = {
        "image": "python",
        "name": "web",
        "type": "batch",
        "startupCommand": f"python -c {shlex.quote(APP_SCRIPT)}",
        "maxWaitSeconds": 30,
        "config": {
            "resources": {"cpu": 1, "mem": "256m"},
            "service_ports": [
                {"name": "web", "protocol": "http", "port": port},
                {"name": "echo", "protocol": "http", "port": ws_port},
                {"name": "deaf", "protocol": "http", "port": _free_port()},
            ],
        },
    }
    created = await owner.post("/session", json=body)
    assert created.status_code == 201, created.text
    sid = created.json()["sessionId"]
    apps = (await owner.get(f"/session/{sid}/apps")).json()
    assert apps["apps"][2]["url"].endswith(f"/session/{sid}/apps/web/")
    # The create answer (RUNNING) shows the host port the apps list does.
    assert created.json()["servicePorts"][2] == {
        "name": "web",
        "protocol": "http",
        "port": port,
        "hostPort": apps["apps"][2]["hostPort"],
    }

    async def page() -> httpx.Response:
        return await owner.get(f"/session/{sid}/apps/web/")

    from accelshare_testkit.waiting import until

    async def listing() -> httpx.Response | None:
        response = await page()
        return response if response.status_code == 200 else None

    response = await until(listing, "the app to answer", timeout_s=15)
    assert "Directory listing" in response.text
    assert "set-cookie" not in response.headers
    # The app's own redirects stay under the proxy's prefix.
    moved = await owner.get(f"/session/{sid}/apps/web/sub")
    assert moved.status_code == 301, moved.text
    assert moved.headers["location"] == f"/session/{sid}/apps/web/sub/"
    # Other methods and their bodies reach the app.
    posted = await owner.post(f"/session/{sid}/apps/web/", content=b"x" * 100_000)
    assert posted.status_code == 200, posted.text
    assert posted.content == b"got: " + b"x" * 100_000

    # A WebSocket app (an echo server in the kernel), through the proxy.
    echo_path = f"/session/{sid}/apps/echo/ws"
    async with websockets.connect(
        ws_url(owner, echo_path), additional_headers=signed_headers(owner, echo_path)
    ) as ws:
        await ws.send("ping")
        assert await ws.recv() == "echo:ping"
        await ws.send(b"\x00\x01")
        assert await ws.recv() == b"echo:\x00\x01"
    assert await close_code(ws_url(other, echo_path), signed_headers(other, echo_path)) == 4404
    assert await close_code(ws_url(owner, echo_path), {}) == 4401

    # Declared but nobody listens: 503 with a reason, not a hang.
    deaf = await owner.get(f"/session/{sid}/apps/deaf/")
    assert deaf.status_code == 503, deaf.text
    assert "is it listening on its port?" in deaf.json()["detail"]

    anonymous = httpx.AsyncClient(base_url=admin.base_url)
    assert (await anonymous.get(f"/session/{sid}/apps/web/")).status_code == 401
    assert (await other.get(f"/session/{sid}/apps/web/")).status_code == 404
    assert (await owner.get(f"/session/{sid}/apps/nope/")).status_code == 404
    bad = dict(body, name="bad")
    bad["config"] = {"service_ports": [{"name": "Web!", "port": 80}]}
    refused = await owner.post("/session", json=bad)
    assert refused.status_code == 400, refused.text

    assert (await owner.delete(f"/session/{sid}")).json()["status"] == "TERMINATED"
    assert (await owner.get(f"/session/{sid}/apps/web/")).status_code == 404
    assert (await owner.get(f"/session/{sid}/apps")).status_code == 404
    assert await close_code(ws_url(owner, echo_path), signed_headers(owner, echo_path)) == 4404
    await anonymous.aclose()
    await owner.aclose()
    await other.aclose()


async def ws_refusal(url: str, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    """The HTTP answer to a WebSocket handshake the server refused."""
    with pytest.raises(InvalidStatus) as refused:
        async with websockets.connect(url, additional_headers=headers):
            pass
    response = refused.value.response
    return response.status_code, dict(response.headers), response.body or b""


async def drain(ws: websockets.ClientConnection) -> None:
    """Read until the server closes ``ws`` (ConnectionClosed), for at most 15 s."""
    async with asyncio.timeout(15):
        while True:
            await ws.recv()


async def test_terminals_and_app_websockets_beyond_the_per_user_limit_get_429(
    sqlite_url: str, tmp_path: Path
) -> None:
    limits = "[api.connections]\nmax-terminals-per-user = 2\nmax-app-websockets-per-user = 1\n"
    async with real_cluster(sqlite_url, tmp_path, manager_toml=limits) as admin:
        owner = await make_user(admin, "owner@example.com")
        ws_port = _free_port()
        body = {
            "image": "python",
            "name": "web",
            "type": "batch",
            "startupCommand": f"python -c {shlex.quote(APP_SCRIPT)}",
            "maxWaitSeconds": 30,
            "config": {
                "resources": {"cpu": 1, "mem": "256m"},
                "service_ports": [
                    {"name": "web", "protocol": "http", "port": _free_port()},
                    {"name": "echo", "protocol": "http", "port": ws_port},
                ],
            },
        }
        created = await owner.post("/session", json=body)
        assert created.status_code == 201, created.text
        sid = created.json()["sessionId"]
        term, echo = f"/session/{sid}/terminal", f"/session/{sid}/apps/echo/ws"

        async def terminal() -> websockets.ClientConnection:
            ws = await websockets.connect(
                ws_url(owner, term), additional_headers=signed_headers(owner, term)
            )
            await ws.send(b"echo up\r")
            await TerminalScreen(ws).until("up")
            return ws

        first, second = await terminal(), await terminal()
        status, headers, raw = await ws_refusal(ws_url(owner, term), signed_headers(owner, term))
        assert status == 429
        assert headers["content-type"] == "application/problem+json"
        problem = json.loads(raw)
        assert (problem["limit"], problem["limit_value"], problem["held"]) == (
            "max-terminals-per-user",
            2,
            2,
        )
        assert problem["kind"] == "terminal"
        # The apps' count is its own: one echo WebSocket while two terminals are open.
        from accelshare_testkit.waiting import until

        async def echo_ws() -> websockets.ClientConnection | None:
            try:
                ws = await websockets.connect(
                    ws_url(owner, echo), additional_headers=signed_headers(owner, echo)
                )
            except InvalidStatus as e:
                if e.response.status_code != 429:
                    raise
                return None
            try:
                await ws.send("ping")
                if await ws.recv() == "echo:ping":
                    return ws
            except ConnectionClosed:
                pass  # the app is not listening yet (4502 / closed)
            await ws.close()
            return None

        app_ws = await until(echo_ws, "the echo app", timeout_s=15, interval_s=0.2)
        status, _, raw = await ws_refusal(ws_url(owner, echo), signed_headers(owner, echo))
        assert status == 429
        assert json.loads(raw)["limit"] == "max-app-websockets-per-user"
        # Closing gives the slots back: by the client, and by the kernel's side ending.
        await first.close()
        await app_ws.close()

        async def opens() -> websockets.ClientConnection | None:
            try:
                return await terminal()
            except InvalidStatus:
                return None

        third = await until(opens, "a terminal slot given back", timeout_s=10, interval_s=0.1)
        await until(echo_ws, "an app slot given back", timeout_s=10, interval_s=0.1)
        assert (await owner.delete(f"/session/{sid}")).json()["status"] == "TERMINATED"
        for ws in (second, third):  # the session ended: the manager closes the relays
            with pytest.raises(ConnectionClosed):
                await drain(ws)
        created = await owner.post("/session", json={**body, "name": "web2"})
        assert created.status_code == 201, created.text
        term2 = f"/session/{created.json()['sessionId']}/terminal"
        for _ in range(2):  # both slots are free again
            ws = await websockets.connect(
                ws_url(owner, term2), additional_headers=signed_headers(owner, term2)
            )
            await ws.send(b"echo again\r")
            await TerminalScreen(ws).until("again")
        await owner.aclose()
