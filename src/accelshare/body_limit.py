"""A request body limit for the HTTP servers (the manager's API, the agent's RPC).

Who uses it: :mod:`accelshare.api.limits` (the manager, 1 MiB) and
:mod:`accelshare.agent.rpc` (the agent, ``[agent] rpc-max-body-bytes``).  Each passes
``problem``, which shapes the ``413`` body in its own style; both bodies name the limit
and what was received (``limit_bytes``, ``received_bytes``).

Two paths, because a client need not declare the size::

    Content-Length: 67108864      -> 413 before the app runs, nothing read
                                     ("received 67108864 bytes (declared Content-Length)")
    Transfer-Encoding: chunked    -> counted as the app reads it; once over the limit the
                                     read raises BodyTooLarge (an HTTPException, which
                                     FastAPI lets through its body parsing) and the app's
                                     handler answers 413 ("received at least N bytes")

A route that never reads its body is not charged for it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["PROBLEM_MEDIA_TYPE", "BodySizeLimit", "BodyTooLarge", "ProblemBuilder"]

PROBLEM_MEDIA_TYPE = "application/problem+json"


class BodyTooLarge(HTTPException):
    """A body over the limit.  ``is_declared``: the size came from Content-Length (exact);
    otherwise reading stopped after ``received_bytes`` (a lower bound)."""

    def __init__(self, limit_bytes: int, received_bytes: int, *, is_declared: bool) -> None:
        self.limit_bytes = limit_bytes
        self.received_bytes = received_bytes
        self.is_declared = is_declared
        if is_declared:
            received = f"{received_bytes} bytes (declared Content-Length)"
        else:
            received = f"at least {received_bytes} bytes (reading stopped)"
        super().__init__(
            413,
            f"request body too large: the limit is {limit_bytes} bytes, received {received}",
        )


# (the refusal, the request path) -> the problem+json body
ProblemBuilder = Callable[[BodyTooLarge, str], dict[str, Any]]


def problem_response(exc: BodyTooLarge, path: str, problem: ProblemBuilder) -> JSONResponse:
    # Connection: close: the rest of the body is never read, the connection cannot be reused
    return JSONResponse(
        problem(exc, path),
        status_code=413,
        media_type=PROBLEM_MEDIA_TYPE,
        headers={"Connection": "close"},
    )


class BodySizeLimit:
    """ASGI middleware: ``app.add_middleware(BodySizeLimit, max_bytes=..., problem=...)``.
    The app must also answer :class:`BodyTooLarge` (raised while a chunked body is read)
    with ``problem_response``."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        max_bytes: int,
        problem: ProblemBuilder,
        exempt: Callable[[Scope], bool] | None = None,
    ) -> None:
        if max_bytes <= 0:
            raise ValueError(f"max_bytes: expected a byte count > 0, received {max_bytes!r}")
        self.app, self.max_bytes, self.problem = app, max_bytes, problem
        # requests that stream their body and hold their own limit (file uploads)
        self.exempt = exempt

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or (self.exempt is not None and self.exempt(scope)):
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_bytes:
            exc = BodyTooLarge(self.max_bytes, int(declared), is_declared=True)
            response = problem_response(exc, scope.get("path", ""), self.problem)
            await response(scope, receive, send)
            return
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes, seen, is_declared=False)
            return message

        await self.app(scope, limited, send)
