"""Backend.AI's execute API: code run in a session (``backend.ai run``, the SDK's
``ComputeSession.execute()`` and ``stream_execute()``).

| route | what |
|---|---|
| ``POST /session/{ref}`` | one step of a run: ``{"mode": "query"\\|"batch"\\|"continue"\\|"input", "code", "runId", "options"}`` -> ``{"result": {runId, status, console, exitCode, options, files}}`` |
| ``WS /stream/session/{ref}/execute`` | a whole run: the client sends ``{"code", "mode": "query"\\|"batch", "options"}``, the server sends each step's ``{status, console, exitCode, options, files}`` until ``finished`` |

The code runs in the session's kernel, in its sandbox, as its user (agent/runs.py): a
``query`` with the kernel's interpreter, a ``batch`` as shell commands (``clean``,
``build``, ``exec``).  Only the session's owner (or a superadmin) may run code in it, and
only while it is RUNNING (a PENDING session: 409 naming its status).  A WebSocket whose
client goes away ends its run.  ``mode: "complete"`` (code completion) answers a 501.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from typing import Any

from fastapi import APIRouter, WebSocket
from pydantic import BaseModel, ConfigDict, ValidationError
from starlette.websockets import WebSocketDisconnect

from accelshare.manager.errors import InvalidRequest, ManagerError
from accelshare.protocol import BatchOptions, ExecuteRequest, ExecuteResult

from .app_proxy import WsRefusal, refuse_ws, ws_lease, ws_target
from .auth import CurrentIdentity
from .compat import NotSupported
from .conn_limits import ConnectionKind
from .deps import ManagerDep, get_manager

__all__ = ["REST_FLUSH_S", "STREAM_FLUSH_S", "router"]

log = logging.getLogger(__name__)

router = APIRouter(tags=["execute"])

REST_FLUSH_S = 2.0
"""A REST step waits up to this long for the run's output (then answers ``continued``)."""
STREAM_FLUSH_S = 0.5
"""A WebSocket run sends what came at least this often."""

MODES = ("query", "batch", "continue", "input")


class ExecuteBody(BaseModel):
    """Backend.AI's execute body, read loosely (its SDK sends ``null`` for what is left
    out) and checked field by field into an :class:`ExecuteRequest`."""

    model_config = ConfigDict(extra="ignore")

    mode: str | None = None
    code: str | None = None
    runId: str | None = None
    options: dict[str, Any] | None = None


def execute_request(
    mode: str | None,
    code: str | None,
    run_id: str | None,
    options: dict[str, Any] | None,
    flush_timeout: float,
    *,
    modes: tuple[str, ...] = MODES,
) -> ExecuteRequest:
    """The checked request, or a 400 naming the field (501 for code completion)."""
    if mode is None or mode == "complete":
        raise NotSupported(
            "Code completion (the execute API's 'complete' mode) is not supported by"
            " accelshare; run code with mode 'query' or 'batch'"
        )
    if mode not in modes:
        raise InvalidRequest(
            f"mode: expected one of {', '.join(modes)}, received {mode!r}",
            field="mode",
            expected=" | ".join(modes),
            received=mode,
        )
    try:
        batch = BatchOptions.model_validate(options or {}) if mode == "batch" else None
        return ExecuteRequest(
            runId=run_id,
            mode=mode,
            code=code or "",
            options=batch,
            flushTimeout=flush_timeout,
        )
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        if mode == "batch" and where in ("clean", "build", "exec", "buildLog"):
            where = f"options.{where}"
        raise InvalidRequest(
            f"{where}: {first['msg']}", field=where, received=first.get("input")
        ) from None


@router.post("/session/{ref}")
async def execute(
    ref: str, body: ExecuteBody, identity: CurrentIdentity, manager: ManagerDep
) -> dict[str, Any]:
    target = await manager.execute.target(identity, ref)  # a session one cannot see: 404
    request = execute_request(body.mode, body.code, body.runId, body.options, REST_FLUSH_S)
    result = await manager.execute.step(identity, ref, request, target)
    return {"result": _result_json(result)}


def _result_json(result: ExecuteResult) -> dict[str, Any]:
    return {
        "runId": result.runId,
        "status": result.status,
        "console": [list(record) for record in result.console],
        "exitCode": result.exitCode,
        "options": result.options,
        "files": result.files,
    }


@router.websocket("/stream/session/{ref}/execute")
async def stream_execute(websocket: WebSocket, ref: str) -> None:
    try:
        identity, target = await ws_target(websocket, ref)
    except WsRefusal as e:  # the handshake's authentication, visibility, status
        await refuse_ws(websocket, e.code, e.reason)
        return
    lease = await ws_lease(websocket, ConnectionKind.TERMINAL, identity)
    if lease is None:
        return
    manager = get_manager(websocket)  # type: ignore[arg-type]
    with lease:
        await websocket.accept()
        run_id = secrets.token_hex(8)
        started = False
        try:
            params = await websocket.receive_json()
            if not isinstance(params, dict):
                raise InvalidRequest("the first message: expected a JSON object")
            request = execute_request(
                params.get("mode"),
                params.get("code"),
                run_id,
                params.get("options"),
                STREAM_FLUSH_S,
                modes=("query", "batch"),
            )
            while True:
                result = await manager.execute.step(identity, ref, request, target)
                started = True
                await websocket.send_json(_result_json(result))
                if result.status == "finished":
                    started = False
                    break
                request = ExecuteRequest(runId=run_id, mode="continue", flushTimeout=STREAM_FLUSH_S)
        except (WebSocketDisconnect, asyncio.CancelledError):
            pass
        except (ManagerError, NotSupported, ValueError) as e:
            detail = getattr(e, "detail", None) or str(e)
            with contextlib.suppress(Exception):
                await websocket.send_json({"status": "error", "msg": detail})
        finally:
            if started:  # the client went away mid-run: the run goes with it
                await manager.execute.cancel(target, run_id)
            with contextlib.suppress(Exception):
                await websocket.close()
