"""Backend.AI's event streams: ``GET /events/session`` and ``GET /events/background-task``.

| route | answer |
|---|---|
| ``GET /events/session?sessionId=ID`` (or ``sessionName=NAME``, ``ownerAccessKey``) | ``text/event-stream`` of the session's life in Backend.AI's events (``event: session_started`` / ``data: {"sessionId", "sessionName", "ownerAccessKey", "reason", "exitCode"}``; see :mod:`accelshare.manager.bai_events`): its history first, then ``event: server_close`` after its final event, and the stream ends |
| ``GET /events/session?sessionName=*`` | the events of all the caller's sessions (an admin: of ``ownerAccessKey``'s) from now on; stays open |
| ``?scope=session`` / ``kernel`` / ``*`` | only ``session_*`` events, only ``kernel_*`` ones, or both (the default) |
| ``GET /events/background-task?taskId=ID`` | 404: accelshare runs no background tasks, so no id names one |

What cannot be streamed is refused before the stream starts: an unknown session (404),
a bad ``scope`` (400 naming it), a user following another user's key (403).  A
keep-alive comment goes every 15 s; each stream holds one of the caller's event-stream
slots (``[api.connections]``).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse

from accelshare.manager.errors import NotFound

from .auth import CurrentIdentity
from .conn_limits import ConnectionKind, ConnectionLimits
from .deps import ManagerDep
from .stream import LeasedStream

__all__ = ["router"]

router = APIRouter(prefix="/events", tags=["events"])


@router.get("/session", response_class=StreamingResponse)
async def session_events(
    request: Request,
    identity: CurrentIdentity,
    manager: ManagerDep,
    session_name: Annotated[str | None, Query(alias="sessionName")] = None,
    session_id: Annotated[str | None, Query(alias="sessionId")] = None,
    owner_access_key: Annotated[str | None, Query(alias="ownerAccessKey")] = None,
    owner_access_key_legacy: Annotated[str | None, Query(alias="owner_access_key")] = None,
    scope: str = "*",
) -> StreamingResponse:
    events = await manager.bai_events.open(
        identity,
        session_name=session_name,
        session_id=session_id,
        owner_access_key=owner_access_key or owner_access_key_legacy,
        scope=scope,
    )
    limits: ConnectionLimits = request.app.state.connection_limits
    lease = limits.acquire(ConnectionKind.EVENT_STREAM, str(identity.user_id))

    async def stream() -> AsyncIterator[bytes]:
        async for event in events:
            if event is None:
                yield b": keepalive\n\n"
                continue
            name, data = event
            yield f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()

    return LeasedStream(
        stream(),
        lease,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


@router.get("/background-task")
async def background_task_events(
    identity: CurrentIdentity,
    task_id: Annotated[str | None, Query(alias="taskId")] = None,
) -> None:
    raise NotFound(
        f"No background task {task_id!r}: accelshare runs no background tasks (image"
        " rescans and folder operations finish within their own request)",
        field="taskId",
        received=task_id,
    )
