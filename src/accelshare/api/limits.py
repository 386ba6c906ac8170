"""A request body limit: bodies over :data:`MAX_BODY_BYTES` get ``413`` problem+json.

Without it the manager read any body whole into memory (a 64 MiB JSON body was parsed
and answered with a 400; docs/reliability.md, bug 3).  The limit is aiohttp's default
``client_max_size`` (1 MiB), which Backend.AI's manager also runs with; no control-plane
request comes near it.

A declared ``Content-Length`` over the limit is refused before the app runs; a body
without one (chunked) is counted as the app reads it and refused once it goes over.
"""

from __future__ import annotations

from typing import Any

from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .problems import PROBLEM_MEDIA_TYPE, problem_type

__all__ = ["MAX_BODY_BYTES", "BodySizeLimit"]

MAX_BODY_BYTES = 1024 * 1024


def _detail(limit: int) -> str:
    return f"The request body is larger than {limit} bytes"


class BodySizeLimit:
    """ASGI middleware; ``app.add_middleware(BodySizeLimit)``."""

    def __init__(self, app: ASGIApp, max_bytes: int = MAX_BODY_BYTES) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(scope, receive, send)
            return
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    # FastAPI re-raises an HTTPException from the body read; the problem
                    # handlers turn it into problem+json
                    raise HTTPException(413, _detail(self.max_bytes))
            return message

        await self.app(scope, limited, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        body: dict[str, Any] = {
            "type": problem_type("content-too-large"),
            "title": "Content Too Large",
            "status": 413,
            "detail": _detail(self.max_bytes),
            "msg": _detail(self.max_bytes),
            "instance": scope.get("path", ""),
        }
        response = JSONResponse(
            body,
            status_code=413,
            media_type=PROBLEM_MEDIA_TYPE,
            headers={"Connection": "close"},
        )
        await response(scope, receive, send)
