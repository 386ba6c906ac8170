"""The app proxy (Backend.AI's WSProxy role, inside the manager): web terminal and app services.

| route | what |
|---|---|
| ``WS /session/{ref}/terminal?cols=&rows=`` | a shell in the session's kernel, relayed to the agent's ``/v1/kernels/{id}/terminal`` (protocol: ``accelshare.agent.terminal_ws``) |
| ``GET /session/{ref}/apps`` | ``{"sessionId", "terminal": "ws://...", "apps": [{name, protocol, port, hostPort, url}]}`` |
| ``GET /_apps/auth?token=`` | the apps origin only: a hand-off token for its cookie, then ``303`` to the app |
| ``* /session/{ref}/apps/{name}/{path}`` | HTTP to the service's port on the agent host (streamed both ways) |
| ``WS /session/{ref}/apps/{name}/{path}`` | WebSocket to the same |

Who: the session's owner, or a superadmin (a domain admin gets 403; anyone else 404, so
ids of others do not leak); the session must be RUNNING (409 otherwise; ended: 404, so a
closed session's routes disappear).  Authentication is the API's: a request signature or
the console's login cookie.  A WebSocket with the cookie must come from the manager's own
origin (``Origin`` host = ``Host``), or any page could open a terminal in the user's name.
WebSockets are refused after the handshake with a close code: 4401 not authenticated,
4403 not allowed (or foreign origin), 4404 no such session (or ended), 4409 not running,
4502 the agent cannot be reached; the reason says which.  Terminals and app WebSockets
count against ``[api.connections]``'s per-user limits (:mod:`.conn_limits`): beyond one,
the handshake is answered with 429 problem+json (close code 4429 where the server cannot
send an HTTP answer to a WebSocket); the slot is given back when the WebSocket ends.

The app's requests never carry the caller's ``Authorization`` or login cookie on to the
service.  On the apps origin an app's own cookies go both ways (its ``Set-Cookie`` kept
under its session's path); on the API origin no cookie does.  The proxy connects to the agent host's port of the service (``hostPort``, from
the agent's ``[container] port-range``).  With ``[apps]`` in manager.toml, browsers get
app pages only on an origin of their own, through a token hand-off
(:mod:`.app_origin`); without it they are served on the console's origin (development
and trusted apps only; docs/manager.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import httpx
import websockets
from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response, StreamingResponse
from starlette.background import BackgroundTask
from starlette.websockets import WebSocket, WebSocketDisconnect
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from accelshare.manager.errors import ManagerError
from accelshare.manager.services.sessions import ProxyTarget
from accelshare.protocol import CLUSTER_SECRET_HEADER

from .app_origin import APP_COOKIE, AUTH_PATH, AppOrigin, AppTokenError, HandOff, is_apps_request
from .auth import Authenticator, AuthMethod, CurrentIdentity, Identity, current_identity
from .conn_limits import ConnectionKind, ConnectionLimits, Lease, TooManyConnections
from .deps import ManagerDep, get_manager
from .problems import (
    Forbidden,
    NotFound,
    Problem,
    ServiceUnavailable,
    Unauthorized,
    problem_response,
)

__all__ = ["WsRefusal", "refuse_ws", "router", "ws_lease", "ws_target"]

log = logging.getLogger(__name__)

router = APIRouter(tags=["apps"])

_HOP_HEADERS = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        "authorization",
        "cookie",
        "x-csrf-token",
    }
)
_WS_CODES = {401: 4401, 403: 4403, 404: 4404, 409: 4409}


def _agent_host(target: ProxyTarget) -> str:
    return urlsplit(target.agent_url).hostname or "127.0.0.1"


def _service_base(target: ProxyTarget, name: str, ref: str) -> str:
    service = target.service(name)
    if service is None:
        raise NotFound(
            f"Session {ref!r} has no app service {name!r}",
            field="name",
            expected=", ".join(s["name"] for s in target.service_ports) or "(none declared)",
            received=name,
        )
    return f"http://{_agent_host(target)}:{target.host_port(name)}"


# -- WebSocket authentication ----------------------------------------------------------------
async def _ws_identity(websocket: WebSocket, ref: str, *, app: bool) -> Identity:
    """The API's authentication for a WebSocket handshake (a GET request); ``app``: to an
    app service (else the terminal)."""
    scope = dict(websocket.scope, type="http", method="GET")
    request = Request(scope)
    origin = websocket.headers.get("origin")
    cross_origin = origin is not None and urlsplit(origin).netloc != websocket.headers.get("host")
    if is_apps_request(websocket.scope):
        if cross_origin:  # a page of another site with the browser's app cookie
            raise WsRefusal(4403, f"cross-origin WebSocket from {origin} refused")
        return await _app_cookie_identity(request, ref)
    identity: Identity = await websocket.app.state.authenticator.authenticate(request)
    if identity.method is AuthMethod.COOKIE:
        if cross_origin:
            raise WsRefusal(4403, f"cross-origin WebSocket from {origin} refused")
        if app and _apps(websocket) is not None:
            raise WsRefusal(4403, "app services are served on the apps origin, not here")
    return identity


class WsRefusal(Exception):
    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


async def ws_target(
    websocket: WebSocket, ref: str, *, app: bool = False
) -> tuple[Identity, ProxyTarget]:
    try:
        identity = await _ws_identity(websocket, ref, app=app)
        manager = get_manager(websocket)  # type: ignore[arg-type]
        return identity, await manager.sessions.proxy_target(identity, ref)
    except (Problem, ManagerError) as e:
        raise WsRefusal(_WS_CODES.get(e.status, 4500), str(e)) from None


async def refuse_ws(websocket: WebSocket, code: int, reason: str) -> None:
    await websocket.accept()
    # A close reason is at most 123 bytes.
    await websocket.close(code=code, reason=reason.encode()[:120].decode(errors="ignore"))


async def ws_lease(websocket: WebSocket, kind: ConnectionKind, identity: Identity) -> Lease | None:
    """A connection slot, or None once the handshake got its 429."""
    limits: ConnectionLimits = websocket.app.state.connection_limits
    try:
        return limits.acquire(kind, str(identity.user_id))
    except TooManyConnections as e:
        if "websocket.http.response" in websocket.scope.get("extensions", {}):
            await websocket.send_denial_response(problem_response(e, websocket.url.path))
        else:
            await refuse_ws(websocket, 4429, e.detail)
        return None


async def _relay(websocket: WebSocket, upstream_url: str, headers: dict[str, str]) -> None:
    """Accept ``websocket`` once the upstream answered, then copy frames both ways."""
    try:
        upstream = await websockets.connect(
            upstream_url, additional_headers=headers, max_size=None, open_timeout=10
        )
    except (OSError, InvalidHandshake, TimeoutError) as e:
        await refuse_ws(websocket, 4502, f"cannot reach the session: {type(e).__name__}")
        return
    await websocket.accept()

    async def down() -> None:
        async for frame in upstream:
            if isinstance(frame, bytes):
                await websocket.send_bytes(frame)
            else:
                await websocket.send_text(frame)

    async def up() -> None:
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                return
            if message.get("bytes") is not None:
                await upstream.send(message["bytes"])
            elif message.get("text") is not None:
                await upstream.send(message["text"])

    tasks = {asyncio.create_task(down()), asyncio.create_task(up())}
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(
                asyncio.CancelledError, ConnectionClosed, WebSocketDisconnect, RuntimeError
            ):
                await task
        await upstream.close()
        code = upstream.close_code or 1000
        reason = (upstream.close_reason or "").encode()[:120].decode(errors="ignore")
        with contextlib.suppress(RuntimeError, WebSocketDisconnect):
            await websocket.close(code=code if code != 1006 else 1011, reason=reason)


@router.websocket("/session/{ref}/terminal")
async def session_terminal(websocket: WebSocket, ref: str) -> None:
    try:
        identity, target = await ws_target(websocket, ref)
    except WsRefusal as e:
        await refuse_ws(websocket, e.code, e.reason)
        return
    manager = get_manager(websocket)  # type: ignore[arg-type]
    base = target.agent_url.rstrip("/").replace("http://", "ws://", 1)
    base = base.replace("https://", "wss://", 1)
    query = websocket.url.query
    url = f"{base}/v1/kernels/{target.kernel_id}/terminal" + (f"?{query}" if query else "")
    lease = await ws_lease(websocket, ConnectionKind.TERMINAL, identity)
    if lease is None:
        return
    with lease:
        await _relay(
            websocket, url, {CLUSTER_SECRET_HEADER: manager.sessions.client.cluster_secret}
        )


# -- the apps origin (api/app_origin.py) --------------------------------------------------------
def _apps(connection: Request | WebSocket) -> AppOrigin | None:
    apps: AppOrigin | None = connection.app.state.apps
    return apps


async def _app_cookie_identity(request: Request, ref: str) -> Identity:
    """On the apps origin: the caller named by the app cookie for session ``ref``."""
    apps = _apps(request)
    value = request.cookies.get(APP_COOKIE)
    if apps is None or not value:
        raise Unauthorized(
            "Open this app from the console (its link hands this origin a token), or "
            "call the app route on the API origin with a signed request",
            reason="missing-credentials",
        )
    try:
        access_key, user_id, generation = apps.read_cookie(value, ref)
    except AppTokenError as e:
        raise Unauthorized(
            f"The app access cookie is not valid here ({e}); open the app from the console again",
            reason="invalid-app-cookie",
        ) from None
    authenticator: Authenticator = request.app.state.authenticator
    return await authenticator.identity_of(
        access_key, user_id, AuthMethod.APP_COOKIE, login_generation=generation
    )


async def _app_identity(request: Request, ref: str) -> Identity:
    if is_apps_request(request.scope):
        return await _app_cookie_identity(request, ref)
    return await current_identity(request)


@router.get(AUTH_PATH, include_in_schema=False)
async def apps_auth(request: Request, token: str = "") -> Response:
    """The apps origin's side of the hand-off: the token for its cookie, then the app."""
    apps = _apps(request)
    if apps is None or not is_apps_request(request.scope):
        raise NotFound("Not found: the apps origin's hand-off is served there only")
    try:
        handoff = await apps.redeem(token)
    except AppTokenError as e:
        raise Unauthorized(
            f"The app token is not valid ({e}); open the app from the console again",
            reason="invalid-app-token",
        ) from None
    response = RedirectResponse(handoff.path, status_code=303)
    response.set_cookie(
        APP_COOKIE,
        apps.cookie_value(handoff),
        max_age=apps.cookie_max_age_s,
        path=f"/session/{handoff.session_id}/",
        httponly=True,
        secure=apps.secure_cookie,
        samesite="lax",
    )
    response.headers["cache-control"] = "no-store"
    return response


def _reserved_cookie(request: Request, name: str) -> bool:
    """The manager's own cookies: never shown to an app, never set by one."""
    authenticator: Authenticator = request.app.state.authenticator
    return name in (APP_COOKIE, authenticator.settings.cookie_name)


def _app_own_cookies(request: Request) -> str:
    """On the apps origin, the app's own cookies go on (Jupyter's ``_xsrf``...), the
    manager's (the apps cookie, a login cookie the browser sends to this host) do not."""
    return "; ".join(
        f"{name}={value}"
        for name, value in request.cookies.items()
        if not _reserved_cookie(request, name)
    )


def _scoped_set_cookie(request: Request, header: str, session_root: str, prefix: str) -> str | None:
    """An app's ``Set-Cookie`` on the apps origin, kept under its session's path (an app
    may not set a cookie for the other sessions' apps of this origin, nor for another
    host, nor one of the manager's); None: dropped.

    ``"sid=1; Path=/; Domain=x"`` for the app ``/session/S/apps/web`` ->
    ``"sid=1; Path=/session/S/apps/web/"``."""
    pair, *attributes = (part.strip() for part in header.split(";"))
    name = pair.partition("=")[0].strip()
    if not name or _reserved_cookie(request, name):
        return None
    kept = [pair]
    path = None
    for attribute in attributes:
        key, _, value = attribute.partition("=")
        if key.strip().lower() == "domain":
            continue
        if key.strip().lower() == "path":
            path = value.strip()
            continue
        kept.append(attribute)
    if path is None or not path.startswith(session_root):
        path = prefix + "/" + (path or "/").lstrip("/")
    kept.insert(1, f"Path={path}")
    return "; ".join(kept)


def _hand_off(
    request: Request, apps: AppOrigin, identity: Identity, target: ProxyTarget, rest: str
) -> RedirectResponse:
    """Send a browser (login cookie, console's origin) to the app on the apps origin.

    Only a top-level navigation started on the console's origin, or by the user (a typed
    or bookmarked address: ``Sec-Fetch-Site: none``), is handed off: a page of another
    origin (an app page on the apps origin included) cannot have the browser fetch,
    frame or open a token for one of the user's sessions."""
    headers = request.headers
    if (
        request.method not in ("GET", "HEAD")
        or headers.get("sec-fetch-mode", "navigate") != "navigate"
        or headers.get("sec-fetch-dest", "document") != "document"
    ):
        raise Forbidden(
            "App services are served on the apps origin: open the app's link (a "
            "navigation), not a script request or a frame, with the login cookie",
            reason="apps-origin",
        )
    if headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
        raise Forbidden(
            "Open the app from the console (or type its address): a link from another "
            "site or from an app page does not hand the app's access out",
            reason="apps-origin-foreign-navigation",
        )
    path = f"/session/{target.session_id}/apps/{rest}"
    if request.url.query:
        path += f"?{request.url.query}"
    handoff = HandOff(
        str(target.session_id),
        identity.access_key,
        str(identity.user_id),
        path,
        identity.login_generation,
    )
    origin = apps.origin  # configured ([apps] origin or listen-addr), never the Host header
    if origin is None:
        raise ServiceUnavailable(
            "The apps origin is not configured: set [apps] origin in manager.toml",
            reason="apps-origin-unconfigured",
        )
    response = RedirectResponse(
        f"{origin}{AUTH_PATH}?token={apps.hand_off(handoff)}", status_code=303
    )
    response.headers["cache-control"] = "no-store"
    response.headers["referrer-policy"] = "no-referrer"
    return response


# -- app services ------------------------------------------------------------------------------
def _needs_prefix(location: str, *prefixes: str) -> bool:
    """Whether an app's redirect to ``location`` (a path of its own) must be put under
    the proxy's prefix: an absolute path, unless the app already wrote one of
    ``prefixes`` (an app that knows its base URL, such as Jupyter's
    ``/session/<id>/apps/jupyter/``).

    >>> _needs_prefix("/lab", "/session/s/apps/j")
    True
    >>> _needs_prefix("/session/s/apps/j/lab", "/session/s/apps/j")
    False
    >>> _needs_prefix("//other.example/x", "/p"), _needs_prefix("https://a/x", "/p")
    (False, False)
    """
    if not location.startswith("/") or location.startswith("//"):
        return False
    return not any(location == p or location.startswith(p + "/") for p in prefixes)


@router.get("/session/{ref}/apps")
async def session_apps(
    ref: str, identity: CurrentIdentity, manager: ManagerDep, request: Request
) -> dict[str, Any]:
    target = await manager.sessions.proxy_target(identity, ref)
    root = str(request.base_url).rstrip("/")
    ws_root = root.replace("http://", "ws://", 1).replace("https://", "wss://", 1)
    return {
        "sessionId": str(target.session_id),
        "terminal": f"{ws_root}/session/{target.session_id}/terminal",
        "apps": [
            {**s, "url": f"{root}/session/{target.session_id}/apps/{s['name']}/"}
            for s in target.service_ports
        ],
    }


@router.get("/session/{ref}/apps/{name}", include_in_schema=False)
async def session_app_root(ref: str, name: str) -> RedirectResponse:
    # Relative links of the app resolve against the trailing slash.
    return RedirectResponse(f"./{name}/", status_code=307)


async def session_app(
    ref: str, name: str, path: str, manager: ManagerDep, request: Request
) -> Response:
    identity = await _app_identity(request, ref)
    target = await manager.sessions.proxy_target(identity, ref)
    base = _service_base(target, name, ref)
    apps = _apps(request)
    if apps is not None and identity.method is AuthMethod.COOKIE:
        return _hand_off(request, apps, identity, target, f"{name}/{path}")
    # Content-Length goes on (httpx then streams the body without chunking it).
    headers = {
        k: v
        for k, v in request.headers.items()
        if k.lower() not in _HOP_HEADERS or k.lower() == "content-length"
    }
    prefix = f"/session/{ref}/apps/{name}"
    headers["x-forwarded-prefix"] = prefix
    on_apps_origin = is_apps_request(request.scope)
    if on_apps_origin:
        app_cookies = _app_own_cookies(request)
        if app_cookies:
            headers["cookie"] = app_cookies
    has_body = "content-length" in request.headers or "transfer-encoding" in request.headers
    client = httpx.AsyncClient(timeout=httpx.Timeout(60.0, connect=5.0))
    upstream_request = client.build_request(
        request.method,
        f"{base}/{path}",
        params=request.url.query,
        headers=headers,
        content=request.stream() if has_body else None,
    )
    try:
        upstream = await client.send(upstream_request, stream=True)
    except httpx.HTTPError as e:
        await client.aclose()
        raise ServiceUnavailable(
            f"App service {name!r} of session {ref!r} does not answer "
            f"({type(e).__name__}); is it listening on its port?"
        ) from None

    async def body() -> AsyncIterator[bytes]:
        async for chunk in upstream.aiter_raw():
            yield chunk

    async def close() -> None:
        await upstream.aclose()
        await client.aclose()

    response_headers = {
        k: v
        for k, v in upstream.headers.items()
        if k.lower() not in _HOP_HEADERS and k.lower() != "set-cookie"
    }
    location = upstream.headers.get("location")
    if location and _needs_prefix(location, prefix, f"/session/{target.session_id}/apps/{name}"):
        # The app redirects within itself: keep the browser under the proxy's prefix.
        response_headers["location"] = prefix + location
    response = StreamingResponse(
        body(),
        status_code=upstream.status_code,
        headers=response_headers,
        background=BackgroundTask(close),
    )
    if on_apps_origin:
        for set_cookie in upstream.headers.get_list("set-cookie"):
            kept = _scoped_set_cookie(request, set_cookie, f"/session/{target.session_id}/", prefix)
            if kept is not None:
                response.raw_headers.append((b"set-cookie", kept.encode("latin-1")))
    return response


# One route per method: one route with several methods gives duplicate OpenAPI operation ids.
for _method in ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"):
    router.add_api_route(
        "/session/{ref}/apps/{name}/{path:path}",
        session_app,
        methods=[_method],
        name=f"session_app_{_method.lower()}",
        response_class=StreamingResponse,
    )


@router.websocket("/session/{ref}/apps/{name}/{path:path}")
async def session_app_ws(websocket: WebSocket, ref: str, name: str, path: str) -> None:
    try:
        identity, target = await ws_target(websocket, ref, app=True)
        base = _service_base(target, name, ref).replace("http://", "ws://", 1)
    except WsRefusal as e:
        await refuse_ws(websocket, e.code, e.reason)
        return
    except Problem as e:
        await refuse_ws(websocket, _WS_CODES.get(e.status, 4500), str(e))
        return
    query = websocket.url.query
    lease = await ws_lease(websocket, ConnectionKind.APP_WEBSOCKET, identity)
    if lease is None:
        return
    with lease:
        await _relay(websocket, f"{base}/{path}" + (f"?{query}" if query else ""), {})
