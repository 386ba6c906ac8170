"""The manager's request body limit: bodies over :data:`MAX_BODY_BYTES` get ``413``.

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
from starlette.types import ASGIApp

from accelshare import body_limit
from accelshare.body_limit import BodyTooLarge

from .problems import problem_type

__all__ = ["MAX_BODY_BYTES", "BodySizeLimit", "install_body_limit"]

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


class BodySizeLimit(body_limit.BodySizeLimit):
    """The shared middleware with the manager's problem shape."""

    def __init__(self, app: ASGIApp, max_bytes: int = MAX_BODY_BYTES) -> None:
        super().__init__(app, max_bytes=max_bytes, problem=_problem)


def install_body_limit(app: FastAPI, max_bytes: int = MAX_BODY_BYTES) -> None:
    """The middleware plus the handler of a chunked body found too large while read."""

    async def _too_large(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, BodyTooLarge)
        return body_limit.problem_response(exc, request.url.path, _problem)

    app.add_exception_handler(BodyTooLarge, _too_large)
    app.add_middleware(BodySizeLimit, max_bytes=max_bytes)
