"""Session routes (spec 07): create, get, list, destroy, logs, why, events.

``{ref}`` is a session id or the caller's session name (admins may add
``?owner_access_key=`` to name another user's session).  Others' sessions are 404.

| route | answer |
|---|---|
| ``POST /session`` | 201 ``{sessionId, sessionName, status, statusInfo, created, servicePorts, session}`` (200 and ``created: false`` when ``reuseIfExists`` found a live session of that name) |
| ``GET /session/{ref}`` | the session (``statusHistory``, ``kernels`` with per-device allocations) |
| ``PATCH /session/{ref}`` | restart (Backend.AI's ``session restart``): ``{sessionId, sessionName, status, statusInfo}``; the kernels created again with the same allocation, the session id kept; not RUNNING: a 409 naming ``status`` |
| ``DELETE /session/{ref}`` | ``{sessionId, sessionName, status, statusInfo}``; ``?forced=true`` ends it even if the agent does not confirm |
| ``GET /session/{ref}/logs`` | ``{"result": {"logs": "..."}}`` (Backend.AI's shape) |
| ``GET /session/{ref}/why`` | ``{sessionId, status, statusInfo, scheduler, agents, explanation}`` |
| ``GET /session/{ref}/status-history`` | ``{"result": {STATUS: time, ...}}``: when the session last entered each status (Backend.AI's shape), plus ``preparing`` / ``terminated`` as Backend.AI's client reads them |
| ``POST /session/{ref}/rename?name=NEW`` | 204; a name the owner's live sessions use is a 409 naming ``name``; an ended session is a 409 naming ``status`` |
| ``GET /session/{ref}/events`` | ``text/event-stream``: ``event: status`` / ``data: {sessionId, from, status, reason, at}``; history first, ends at a final status |
| ``GET /sessions`` | ``{items, total, limit, offset}`` (each item also has ``ownerEmail``, the owner's e-mail); ``?status=RUNNING,PENDING`` (default: every non-final status; ``all``), ``?access_key=``, ``?order=created`` (oldest first, the default) or ``recent`` (last changed first: the history of ended sessions) |
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator
from decimal import Decimal
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import StreamingResponse

from accelshare.manager.services.folders.names import parse_mount_specs

from . import compat
from .auth import CurrentIdentity
from .deps import UNFROZEN, ManagerDep
from .stream import parse_statuses

__all__ = ["router"]

router = APIRouter(tags=["sessions"])

OwnerQuery = Annotated[
    str | None,
    Query(description="admins: the owner's access key, to name another user's session"),
]


@router.post("/session", status_code=201)
async def create_session(
    body: compat.CreateSessionRequest,
    identity: CurrentIdentity,
    manager: ManagerDep,
    request: Request,
    response: Response,
) -> dict[str, Any]:
    """Enqueue a session (PENDING at once; ``maxWaitSeconds`` waits for RUNNING).

    The official Backend.AI client also waits for a scheduled session to run
    (:func:`.compat.wait_like_backendai`)."""
    spec = compat.normalize_resource_opts(await _exact_amounts(request, body))
    session_request = spec.to_request()
    config = spec.config
    if config.mounts or config.mount_map:
        wanted = parse_mount_specs(config.mounts, config.mount_map, config.mount_options)
        owner = await manager.folders.actor_for(identity, spec.owner_access_key)
        mounts = await manager.folders.resolve_mounts(owner, wanted)
        session_request = dataclasses.replace(session_request, mounts=tuple(mounts))
    result = await manager.sessions.create(identity, session_request)
    if not result.created:
        response.status_code = 200
    if compat.is_backendai_client(request):
        return await compat.wait_like_backendai(manager, identity, spec, result.body)
    return result.body


async def _exact_amounts(
    request: Request, body: compat.CreateSessionRequest
) -> compat.CreateSessionRequest:
    """The body with ``config.resources``' JSON numbers as written (``Decimal``): JSON
    decoding made them floats, and ``0.10000000000000000001`` as a float is ``0.1`` —
    an amount silently changed before the parser could refuse it."""
    resources = body.config.resources
    if not any(isinstance(v, float) for v in resources.values()):
        return body
    raw = json.loads(await request.body(), parse_float=Decimal)  # parsed once already
    written = ((raw.get("config") or {}) if isinstance(raw, dict) else {}).get("resources")
    if not isinstance(written, dict):  # pragma: no cover - the model read it from there
        return body
    exact = {
        k: written[k] if isinstance(v, float) and isinstance(written.get(k), Decimal) else v
        for k, v in resources.items()
    }
    config = body.config.model_copy(update={"resources": exact})
    return body.model_copy(update={"config": config})


@router.get("/sessions")
async def list_sessions(
    identity: CurrentIdentity,
    manager: ManagerDep,
    status: Annotated[
        str | None, Query(description="comma-separated statuses, or 'all' (default: live ones)")
    ] = None,
    access_key: str | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0, le=2**31 - 1)] = 0,  # past SQL's range: a 500
    order: Annotated[
        Literal["created", "recent"],
        Query(description="created: oldest first; recent: most recently changed first"),
    ] = "created",
) -> dict[str, Any]:
    statuses = parse_statuses(status)
    return await manager.sessions.list_sessions(
        identity,
        statuses=statuses,
        access_key=access_key,
        limit=limit,
        offset=offset,
        newest_first=order == "recent",
    )


@router.get("/session/{ref}")
async def get_session(
    ref: str, identity: CurrentIdentity, manager: ManagerDep, owner_access_key: OwnerQuery = None
) -> dict[str, Any]:
    return await manager.sessions.get(identity, ref, owner_access_key)


@router.delete("/session/{ref}")
async def destroy_session(
    ref: str,
    identity: CurrentIdentity,
    manager: ManagerDep,
    forced: bool = False,
    owner_access_key: OwnerQuery = None,
) -> dict[str, Any]:
    """PENDING -> CANCELLED; RUNNING -> TERMINATING -> (agent destroys) -> TERMINATED."""
    return await manager.sessions.destroy(
        identity, ref, forced=forced, owner_access_key=owner_access_key
    )


@router.patch("/session/{ref}")
async def restart_session(
    ref: str, identity: CurrentIdentity, manager: ManagerDep, owner_access_key: OwnerQuery = None
) -> dict[str, Any]:
    """Restart a RUNNING session's kernels on the same devices (Backend.AI's restart)."""
    return await manager.sessions.restart(identity, ref, owner_access_key)


@router.get("/session/{ref}/logs")
async def session_logs(
    ref: str, identity: CurrentIdentity, manager: ManagerDep, owner_access_key: OwnerQuery = None
) -> dict[str, Any]:
    logs = await manager.sessions.logs(identity, ref, owner_access_key)
    return {"result": {"logs": logs}}


@router.get("/session/{ref}/status-history")
async def session_status_history(
    ref: str, identity: CurrentIdentity, manager: ManagerDep, owner_access_key: OwnerQuery = None
) -> dict[str, Any]:
    """When the session last entered each status (the recorded status changes).

    Backend.AI's manager answers its ``status_history`` column (upper-case status
    names); its client 25.5 reads lower-case ``preparing`` and ``terminated`` to print
    the allocation time, so those two are given as well."""
    history: dict[str, str] = await manager.sessions.status_history(identity, ref, owner_access_key)
    for status in ("PREPARING", "TERMINATED"):
        if status in history:
            history[status.lower()] = history[status]
    return {"result": history}


@router.post("/session/{ref}/rename", status_code=204, dependencies=[UNFROZEN])
async def rename_session(
    ref: str,
    identity: CurrentIdentity,
    manager: ManagerDep,
    name: Annotated[str, Query(description="the new name")],
    owner_access_key: OwnerQuery = None,
) -> Response:
    """Rename a live session (Backend.AI's ``session rename``); id and allocation kept."""
    await manager.sessions.rename(identity, ref, name, owner_access_key)
    return Response(status_code=204)


@router.get("/session/{ref}/why")
async def session_why(
    ref: str, identity: CurrentIdentity, manager: ManagerDep, owner_access_key: OwnerQuery = None
) -> dict[str, Any]:
    """Why the session is (still) pending: the last pass's predicates and per-agent reasons."""
    return await manager.sessions.why(identity, ref, owner_access_key)


@router.get("/session/{ref}/events", response_class=StreamingResponse)
async def session_events(
    ref: str, identity: CurrentIdentity, manager: ManagerDep, owner_access_key: OwnerQuery = None
) -> StreamingResponse:
    """Server-sent events of the session's status changes (history first)."""
    events = await manager.sessions.events(identity, ref, owner_access_key)

    async def stream() -> AsyncIterator[bytes]:
        async for event in events:
            if event.get("event") == "keepalive":
                yield b": keepalive\n\n"
                continue
            data = {k: v for k, v in event.items() if k != "event"}
            yield f"event: status\ndata: {json.dumps(data)}\n\n".encode()

    return StreamingResponse(
        stream(),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
