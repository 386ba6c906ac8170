"""App pages on an origin of their own (``[apps] listen-addr``): the hand-off from the
console's origin, the apps origin's cookie, and what each origin refuses.

A browser is played with httpx: ``Cookie``, ``Origin`` and ``Sec-Fetch-Mode`` headers
as Chromium sends them (tests/e2e/test_console.py has the same in a real browser).
"""

from __future__ import annotations

import shlex
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
import websockets
from websockets.exceptions import InvalidStatus

from accelshare_testkit.waiting import until

from .cluster import free_port, free_ports_below_ephemeral
from .test_mgr_real_agent import real_cluster
from .test_mgr_terminal import APP_SCRIPT, close_code, make_user, signed_headers, ws_url

PASSWORD = "long enough password"
# A third app, "jar": answers the Cookie header it got, and sets cookies (one for the
# whole host, one named like the manager's apps cookie).
JAR_APP = """
import http.server, os, threading
class Jar(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = (self.headers.get("Cookie") or "").encode()
        self.send_response(200)
        self.send_header("Set-Cookie", "jar=1; Path=/; Domain=127.0.0.1; HttpOnly")
        self.send_header("Set-Cookie", "deep=2; Path=/x")
        self.send_header("Set-Cookie", "accelshare_app=forged; Path=/")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
jar = http.server.ThreadingHTTPServer(
    ("127.0.0.1", int(os.environ["BACKENDAI_SERVICE_PORT_JAR"])), Jar)
threading.Thread(target=jar.serve_forever, daemon=True).start()
"""
APPS_PORT = free_ports_below_ephemeral()  # listened on long after the import
APPS = f"http://127.0.0.1:{APPS_PORT}"


@pytest.fixture
async def admin(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    db_url = f"sqlite+aiosqlite:///{tmp_path / 'manager.db'}"
    extra = f'[apps]\nlisten-addr = "127.0.0.1:{APPS_PORT}"\ntoken-ttl = 30\n'
    async with real_cluster(db_url, tmp_path, extra_toml=extra) as client:
        yield client


async def login_cookie(admin: httpx.AsyncClient, email: str) -> tuple[str, str]:
    """``(Cookie header, CSRF token)`` of a console login."""
    response = await admin.post("/auth/login", json={"email": email, "password": PASSWORD})
    assert response.status_code == 200, response.text
    cookie = "; ".join(f"{k}={v}" for k, v in response.cookies.items())
    return cookie, response.json()["csrf_token"]


NAVIGATE = {"Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "document"}


async def test_app_pages_only_on_the_apps_origin_with_its_own_cookie(
    admin: httpx.AsyncClient,
) -> None:
    owner = await make_user(admin, "owner@example.com")
    await make_user(admin, "other@example.com")
    port, ws_port = free_port(), free_port()
    body = {
        "image": "python",
        "name": "web",
        "type": "batch",
        "startupCommand": f"python -c {shlex.quote(JAR_APP + APP_SCRIPT)}",
        "maxWaitSeconds": 30,
        "config": {
            "resources": {"cpu": 1, "mem": "256m"},
            "service_ports": [
                {"name": "web", "protocol": "http", "port": port},
                {"name": "echo", "protocol": "http", "port": ws_port},
                {"name": "jar", "protocol": "http", "port": free_port()},
            ],
        },
    }
    created = await owner.post("/session", json=body)
    assert created.json()["status"] == "RUNNING", created.text
    sid = created.json()["sessionId"]
    app_path = f"/session/{sid}/apps/web/"

    # Signed requests (the CLI) still use the API origin.
    async def served() -> httpx.Response | None:
        response = await owner.get(app_path)
        return response if response.status_code == 200 else None

    assert "Directory listing" in (await until(served, "the app", timeout_s=20)).text

    cookie, csrf = await login_cookie(admin, "owner@example.com")
    console = httpx.AsyncClient(base_url=admin.base_url, follow_redirects=False)
    browser = httpx.AsyncClient(follow_redirects=False)

    # 1. The console's link: a navigation with the login cookie is handed off.
    moved = await console.get(f"{app_path}sub/?x=1", headers={"Cookie": cookie, **NAVIGATE})
    assert moved.status_code == 303, moved.text
    handoff = moved.headers["location"]
    assert handoff.startswith(f"{APPS}/_apps/auth?token=")
    assert moved.headers["referrer-policy"] == "no-referrer"
    # A forged Host header does not move the hand-off (and its token) elsewhere: the
    # redirect goes to the configured apps origin.
    for host in ("evil.example", "evil.example:8081", f"127.0.0.2:{APPS_PORT}"):
        forged = await console.get(
            f"{app_path}sub/", headers={"Cookie": cookie, "Host": host, **NAVIGATE}
        )
        assert forged.status_code == 303, (host, forged.text)
        assert forged.headers["location"].startswith(f"{APPS}/_apps/auth?token="), host
    # A script's request (fetch), or another method, with the login cookie: refused.
    for headers in ({"Sec-Fetch-Mode": "cors"}, {"Sec-Fetch-Mode": "no-cors"}):
        refused = await console.get(app_path, headers={"Cookie": cookie, **headers})
        assert refused.status_code == 403, refused.text
        assert refused.json()["reason"] == "apps-origin"
    posted = await console.post(app_path, headers={"Cookie": cookie, "X-CSRF-Token": csrf})
    assert posted.status_code == 403, posted.text
    framed = {"Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "iframe"}
    refused = await console.get(app_path, headers={"Cookie": cookie, **framed})
    assert refused.status_code == 403, refused.text
    # A navigation another origin started (a link on another site, or an app page
    # opening one of the user's other apps) is not handed a token.
    for site in ("same-site", "cross-site"):
        foreign = {**NAVIGATE, "Sec-Fetch-Site": site}
        refused = await console.get(app_path, headers={"Cookie": cookie, **foreign})
        assert refused.status_code == 403, refused.text
        assert refused.json()["reason"] == "apps-origin-foreign-navigation"
    for site in ("same-origin", "none"):  # the console's link; a typed address
        handed = await console.get(
            app_path, headers={"Cookie": cookie, **NAVIGATE, "Sec-Fetch-Site": site}
        )
        assert handed.status_code == 303, handed.text
    # Another user's login gets no token for this session.
    other_cookie, _ = await login_cookie(admin, "other@example.com")
    stranger = await console.get(app_path, headers={"Cookie": other_cookie, **NAVIGATE})
    assert stranger.status_code == 404, stranger.text

    # 2. The apps origin takes the token once and sets its own cookie.
    landed = await browser.get(handoff)
    assert landed.status_code == 303, landed.text
    assert landed.headers["location"] == f"{app_path}sub/?x=1"
    set_cookie = landed.headers["set-cookie"]
    assert set_cookie.startswith("accelshare_app=")
    assert f"Path=/session/{sid}/" in set_cookie
    assert "HttpOnly" in set_cookie
    assert "SameSite=lax" in set_cookie
    app_cookie = f"accelshare_app={landed.cookies['accelshare_app']}"
    browser.cookies.clear()  # each request below says which cookies it carries
    again = await browser.get(handoff)
    assert again.status_code == 401, again.text
    assert "already used" in again.json()["detail"]
    forged = await browser.get(handoff[:-3] + "AAA")
    assert forged.status_code == 401, forged.text

    # 3. The app on the apps origin, with the apps origin's cookie only.
    page = await browser.get(f"{APPS}{app_path}", headers={"Cookie": app_cookie})
    assert page.status_code == 200, page.text
    assert "Directory listing" in page.text
    assert page.headers["x-content-type-options"] == "nosniff"
    assert page.headers["x-frame-options"] == "SAMEORIGIN"
    assert page.headers["cross-origin-opener-policy"] == "same-origin"
    posted = await browser.post(
        f"{APPS}{app_path}", headers={"Cookie": app_cookie}, content=b"hello"
    )
    assert posted.content == b"got: hello"
    assert (await browser.get(f"{APPS}{app_path}")).status_code == 401
    with_login = await browser.get(f"{APPS}{app_path}", headers={"Cookie": cookie})
    assert with_login.status_code == 401, with_login.text
    # The cookie is for this session only.
    elsewhere = await browser.get(
        f"{APPS}/session/00000000-0000-0000-0000-000000000000/apps/web/",
        headers={"Cookie": app_cookie},
    )
    assert elsewhere.status_code == 401, elsewhere.text
    assert "for another session" in elsewhere.json()["detail"]

    # The app's own cookies go both ways on the apps origin, kept under its path; the
    # manager's (the apps cookie, the login cookie) never reach it nor come from it.
    jar_path = f"/session/{sid}/apps/jar/"
    jar = await browser.get(
        f"{APPS}{jar_path}", headers={"Cookie": f"{cookie}; {app_cookie}; mine=0"}
    )
    assert jar.status_code == 200, jar.text
    assert jar.text == "mine=0"
    assert jar.headers.get_list("set-cookie") == [
        f"jar=1; Path={jar_path}; HttpOnly",
        f"deep=2; Path={jar_path}x",
    ]
    browser.cookies.clear()
    # On the API origin (signed clients) no cookie goes either way, as before.
    signed = await owner.get(jar_path, headers={"Cookie": "mine=0"})
    assert signed.text == ""
    assert "set-cookie" not in signed.headers

    # 4. Nothing else is served on the apps origin: an app page's fetch("/sessions")
    # reaches no API, with either cookie.
    for path in ("/sessions", "/whoami", f"/session/{sid}", f"/session/{sid}/apps", "/"):
        for sent in (cookie, app_cookie, f"{cookie}; {app_cookie}"):
            answer = await browser.get(f"{APPS}{path}", headers={"Cookie": sent})
            assert answer.status_code == 404, (path, answer.text)
            assert "serves app pages only" in answer.text
    deleted = await browser.delete(
        f"{APPS}/session/{sid}", headers={"Cookie": cookie, "X-CSRF-Token": csrf}
    )
    assert deleted.status_code == 404

    # 5. WebSockets: the app's on the apps origin (same-origin pages only); the terminal
    # is not served there; the console's origin refuses app WebSockets with the login.
    echo_path = f"/session/{sid}/apps/echo/ws"
    apps_ws = f"ws://127.0.0.1:{APPS_PORT}{echo_path}"
    async with websockets.connect(
        apps_ws, additional_headers={"Cookie": app_cookie, "Origin": APPS}
    ) as ws:
        await ws.send("ping")
        assert await ws.recv() == "echo:ping"
    evil = {"Cookie": app_cookie, "Origin": "http://evil.example"}
    assert await close_code(apps_ws, evil) == 4403
    assert await close_code(apps_ws, {"Origin": APPS}) == 4401
    with pytest.raises(InvalidStatus):
        await websockets.connect(
            f"ws://127.0.0.1:{APPS_PORT}/session/{sid}/terminal",
            additional_headers={"Cookie": f"{cookie}; {app_cookie}", "Origin": APPS},
        )
    console_origin = str(admin.base_url).rstrip("/")
    login_ws = {"Cookie": cookie, "Origin": console_origin}
    assert await close_code(ws_url(owner, echo_path), login_ws) == 4403
    # ... while signed clients keep the API origin's app WebSockets.
    async with websockets.connect(
        ws_url(owner, echo_path), additional_headers=signed_headers(owner, echo_path)
    ) as ws:
        await ws.send("pong")
        assert await ws.recv() == "echo:pong"

    # 6. The session ends: the cookie opens nothing any more.
    assert (await owner.delete(f"/session/{sid}")).json()["status"] == "TERMINATED"
    gone = await browser.get(f"{APPS}{app_path}", headers={"Cookie": app_cookie})
    assert gone.status_code == 404, gone.text

    # 7. The console login the app was opened from ends: so does the app cookie.
    out = await console.post("/auth/logout", headers={"Cookie": cookie, "X-CSRF-Token": csrf})
    assert out.status_code == 200, out.text
    ended = await browser.get(f"{APPS}{app_path}", headers={"Cookie": app_cookie})
    assert ended.status_code == 401, ended.text
    assert ended.json()["reason"] == "session-ended", ended.text
    assert urlsplit(handoff).port == APPS_PORT
    for client in (owner, console, browser):
        await client.aclose()
