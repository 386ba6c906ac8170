"""Backend.AI's stream proxy: a session's app services through the official client
(``backend.ai app SESSION SERVICE -b HOST:PORT``, ``backend.ai apps SESSION``).

| route | what |
|---|---|
| ``GET /stream/session/{ref}/apps`` | the session's app services: ``[{"name", "protocol", "ports": [port]}]`` |
| ``WS /stream/session/{ref}/tcpproxy?app=NAME`` | the service's TCP stream in binary frames, both ways (``httpproxy`` is the same relay) |

The client listens on its own address and opens one WebSocket per local connection; the
manager connects to the service's port on the agent's host (the port the agent published
for it, reaching into the kernel's sandbox) and copies bytes until either side closes.
The same rules as the console's app proxy apply: the session's owner or a superadmin,
while the session is RUNNING; a browser's cookie from another origin is refused.  An app
the session does not declare closes with 4404 naming the declared ones; service
``arguments``/``envs`` (Backend.AI starts some services on demand with them) close with
4400: accelshare's services are started by the session itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any
from urllib.parse import urlsplit

from fastapi import APIRouter, WebSocket
from starlette.websockets import WebSocketDisconnect

from accelshare.manager.services.sessions import ProxyTarget

from .app_proxy import WsRefusal, refuse_ws, ws_lease, ws_target
from .auth import CurrentIdentity
from .conn_limits import ConnectionKind
from .deps import ManagerDep

__all__ = ["router"]

log = logging.getLogger(__name__)

router = APIRouter(prefix="/stream/session", tags=["apps"])

_CHUNK = 65536


@router.get("/{ref}/apps")
async def app_services(
    ref: str, identity: CurrentIdentity, manager: ManagerDep
) -> list[dict[str, Any]]:
    target = await manager.sessions.proxy_target(identity, ref)
    return [
        {"name": s["name"], "protocol": s.get("protocol", "http"), "ports": [s["port"]]}
        for s in target.service_ports
    ]


def _service_address(target: ProxyTarget, name: str) -> tuple[str, int]:
    port = target.host_port(name)
    if port is None:
        declared = ", ".join(s["name"] for s in target.service_ports) or "none"
        raise WsRefusal(4404, f"no app service {name!r} in this session (declared: {declared})")
    return urlsplit(target.agent_url).hostname or "127.0.0.1", port


async def _tcp_relay(websocket: WebSocket, ref: str) -> None:
    try:
        identity, target = await ws_target(websocket, ref, app=True)
        name = websocket.query_params.get("app") or ""
        if not name:
            raise WsRefusal(4400, "app: name the service to reach (?app=NAME)")
        if websocket.query_params.get("arguments") or websocket.query_params.get("envs"):
            raise WsRefusal(
                4400,
                "arguments/envs: accelshare starts no service on demand; the session's"
                " own process serves it",
            )
        host, port = _service_address(target, name)
    except WsRefusal as e:
        await refuse_ws(websocket, e.code, e.reason)
        return
    lease = await ws_lease(websocket, ConnectionKind.APP_WEBSOCKET, identity)
    if lease is None:
        return
    with lease:
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 10)
        except (OSError, TimeoutError) as e:
            await refuse_ws(websocket, 4502, f"cannot reach app {name!r}: {type(e).__name__}")
            return
        await websocket.accept()

        async def down() -> None:
            while chunk := await reader.read(_CHUNK):
                await websocket.send_bytes(chunk)

        async def up() -> None:
            while True:
                message = await websocket.receive()
                if message["type"] == "websocket.disconnect":
                    return
                data = message.get("bytes")
                if data is None and message.get("text") is not None:
                    data = message["text"].encode()
                if data:
                    writer.write(data)
                    await writer.drain()

        tasks = {asyncio.create_task(down()), asyncio.create_task(up())}
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(
                    asyncio.CancelledError, WebSocketDisconnect, ConnectionError, RuntimeError
                ):
                    await task
            writer.close()
            with contextlib.suppress(ConnectionError, OSError):
                await writer.wait_closed()
            with contextlib.suppress(RuntimeError, WebSocketDisconnect):
                await websocket.close(code=1000)


@router.websocket("/{ref}/tcpproxy")
async def tcp_proxy(websocket: WebSocket, ref: str) -> None:
    await _tcp_relay(websocket, ref)


@router.websocket("/{ref}/httpproxy")
async def http_proxy(websocket: WebSocket, ref: str) -> None:
    await _tcp_relay(websocket, ref)
