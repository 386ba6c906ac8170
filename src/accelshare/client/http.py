"""One signed HTTP call to the manager, with its errors mapped to the client's.

Every SDK method goes through :class:`HttpCaller`: a non-2xx answer becomes
:class:`~accelshare.client.errors.APIError` carrying the RFC 9457 problem (or a
synthetic one when the body is not JSON), a transport failure becomes
:class:`~accelshare.client.errors.ConnectionFailed` naming the endpoint.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from typing import Any

import httpx

from .errors import APIError, ConnectionFailed

__all__ = ["HttpCaller", "ServerSentEvent", "parse_sse_lines"]


def _params(params: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if not params:
        return None
    out: dict[str, Any] = {}
    for key, value in params.items():
        if value is None:
            continue
        out[key] = ("true" if value else "false") if isinstance(value, bool) else value
    return out


def problem_of(response: httpx.Response, body: bytes) -> dict[str, Any]:
    """The problem document of an error answer (synthesised when it is not JSON)."""
    try:
        doc = json.loads(body)
    except ValueError:
        doc = None
    if isinstance(doc, dict):
        return doc
    text = body.decode("utf-8", "replace").strip()
    return {
        "title": response.reason_phrase or f"HTTP {response.status_code}",
        "status": response.status_code,
        "detail": text[:500],
    }


class ServerSentEvent:
    __slots__ = ("data", "event")

    def __init__(self, event: str, data: str) -> None:
        self.event = event
        self.data = data

    def json(self) -> Any:
        return json.loads(self.data)


async def parse_sse_lines(lines: AsyncIterator[str]) -> AsyncIterator[ServerSentEvent]:
    """``text/event-stream`` lines -> events (comments such as keep-alives are skipped).

    Worked example: ``event: status`` / ``data: {"a": 1}`` / ``""`` gives one event
    ``("status", '{"a": 1}')``; ``: keepalive`` / ``""`` gives none.
    """
    event = "message"
    data: list[str] = []
    async for raw in lines:
        line = raw.rstrip("\r")
        if not line:
            if data:
                yield ServerSentEvent(event, "\n".join(data))
            event, data = "message", []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            event = value
        elif name == "data":
            data.append(value)
    if data:
        yield ServerSentEvent(event, "\n".join(data))


class HttpCaller:
    def __init__(self, http: httpx.AsyncClient, endpoint: str) -> None:
        self.http = http
        self.endpoint = endpoint

    def _unreachable(self, e: httpx.TransportError) -> ConnectionFailed:
        what = "timed out" if isinstance(e, httpx.TimeoutException) else str(e) or type(e).__name__
        return ConnectionFailed(
            f"cannot reach the manager at {self.endpoint} ({what}); is it running? "
            "(start a local cluster with `accelshare dev up`, or set ACCELSHARE_ENDPOINT)"
        )

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        json_body: Any = None,
    ) -> Any:
        """The decoded JSON answer (``None`` for an empty one, the text for non-JSON)."""
        try:
            response = await self.http.request(method, path, params=_params(params), json=json_body)
        except httpx.TransportError as e:
            raise self._unreachable(e) from e
        if response.status_code >= 400:
            raise APIError(response.status_code, problem_of(response, response.content))
        if not response.content:
            return None
        if "json" not in response.headers.get("content-type", "json"):
            return response.text
        return response.json()

    async def events(
        self, path: str, *, params: Mapping[str, Any] | None = None
    ) -> AsyncGenerator[ServerSentEvent, None]:
        """A server-sent event stream; ends when the server closes it."""
        try:
            async with self.http.stream(
                "GET", path, params=_params(params), timeout=httpx.Timeout(10.0, read=None)
            ) as response:
                if response.status_code >= 400:
                    body = await response.aread()
                    raise APIError(response.status_code, problem_of(response, body))
                async for event in parse_sse_lines(response.aiter_lines()):
                    yield event
        except httpx.TransportError as e:
            raise self._unreachable(e) from e
