"""The manager's request limits: bodies over :data:`MAX_BODY_BYTES` get ``413``; a path
holding a NUL or another control character gets ``400`` (:class:`PathCheck`).

Without it the manager read any body whole into memory (a 64 MiB JSON body was parsed
and answered with a 400; docs/reliability.md, bug 3).  The limit is aiohttp's default
``client_max_size`` (1 MiB), which Backend.AI's manager also runs with; no control-plane
request comes near it.  The mechanics (declared and chunked bodies) are in
:mod:`accelshare.body_limit`, shared with the agent's RPC.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from accelshare import body_limit
from accelshare.body_limit import BodyTooLarge
from accelshare.common.text_input import find_control

from .problems import InvalidAPIParameters, problem_response, problem_type

__all__ = ["MAX_BODY_BYTES", "BodySizeLimit", "PathCheck", "install_body_limit"]

MAX_BODY_BYTES = 1024 * 1024


def _problem(exc: BodyTooLarge, path: str) -> dict[str, Any]:
    return {
        "type": problem_type("content-too-large"),
        "title": "Content Too Large",
        "status": 413,
        "detail": exc.detail,
        "msg": exc.detail,
        "instance": path,
        "limit_bytes": exc.limit_bytes,
        "received_bytes": exc.received_bytes,
    }


def _is_session_upload(scope: Scope) -> bool:
    """``POST /session/{ref}/upload`` streams its files to the agent, each under the
    agent's own limit (api/session_files.py): not held to the manager's."""
    path = str(scope.get("path", ""))
    parts = path.split("/")
    return (
        scope.get("method") == "POST"
        and len(parts) == 4
        and parts[1] == "session"
        and (parts[3] == "upload")
    )


class BodySizeLimit(body_limit.BodySizeLimit):
    """The shared middleware with the manager's problem shape (session uploads exempt)."""

    def __init__(self, app: ASGIApp, max_bytes: int = MAX_BODY_BYTES) -> None:
        super().__init__(app, max_bytes=max_bytes, problem=_problem, exempt=_is_session_upload)


def install_body_limit(app: FastAPI, max_bytes: int = MAX_BODY_BYTES) -> None:
    """The middleware plus the handler of a chunked body found too large while read."""

    async def _too_large(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, BodyTooLarge)
        return body_limit.problem_response(exc, request.url.path, _problem)

    app.add_exception_handler(BodyTooLarge, _too_large)
    app.add_middleware(BodySizeLimit, max_bytes=max_bytes)


class PathCheck:
    """ASGI middleware: a request whose (decoded) path holds a control character --
    ``%00`` in an app's path, a session reference, anything -- is refused before any
    route sees it: ``400`` problem+json naming the character (a WebSocket is closed with
    4400).  Such a path reached the app proxy's upstream URL (a 500) or the database."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] in ("http", "websocket") else ""
        index = find_control(path)
        if index is None:
            await self.app(scope, receive, send)
            return
        detail = (
            f"The request path holds the control character U+{ord(path[index]):04X} at"
            f" position {index}: expected a path without NUL or control characters"
        )
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 4400, "reason": detail[:120]})
            return
        problem = InvalidAPIParameters(
            detail,
            field="path",
            expected="a path without NUL or control characters",
            received=path,
        )
        await problem_response(problem, path.encode("unicode_escape").decode())(
            scope, receive, send
        )
