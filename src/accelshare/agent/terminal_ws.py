"""The terminal WebSocket protocol, agent side (also spoken by the manager's relay).

Frames:

* **binary** both ways: terminal bytes (keyboard input in, screen output out);
* **text** from the client: one JSON control message --
  ``{"type": "resize", "cols": 120, "rows": 40}`` or ``{"type": "data", "data": "ls\\r"}``
  (text input, e.g. a paste, for clients that find binary frames awkward);
* **text** from the agent: ``{"type": "exit", "code": N}`` once the shell exited by
  itself, then the agent closes with code 1000; when the shell ended because the kernel
  did (the session was destroyed, or its kernel is over), ``{"type": "ended", "code": N,
  "detail": "the session ended"}`` instead, then close code 4410;
* a malformed control message is answered with ``{"type": "error", "detail": "..."}``
  naming the field, the expected and the received value; the terminal stays open.

Close codes: 4401 no or wrong cluster secret, 4404 no running kernel of that id,
4400 bad ``cols``/``rows`` query, 4501 the runtime cannot open terminals, 4410 the
session (its kernel) ended under the terminal.
The query's ``cols``/``rows`` (default 80x24) set the initial window size.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect

from .runtime import KernelNotFound
from .runtime.terminal import Terminal, TerminalSource, check_size

__all__ = ["SESSION_ENDED", "control_error", "parse_control", "relay_terminal"]

log = logging.getLogger(__name__)

SESSION_ENDED = 4410  # the close code when the kernel ended under the terminal


def control_error(message: str) -> str:
    return json.dumps({"type": "error", "detail": message})


def parse_control(text: str) -> dict[str, Any]:
    """Parse and check one text frame; ``ValueError`` says field, expected and received."""
    try:
        message = json.loads(text)
    except json.JSONDecodeError:
        raise ValueError(
            f"message: expected a JSON object such as "
            f'{{"type": "resize", "cols": 80, "rows": 24}}, received {text[:80]!r}'
        ) from None
    if not isinstance(message, dict):
        raise ValueError(f"message: expected a JSON object, received {text[:80]!r}")
    kind = message.get("type")
    if kind == "resize":
        for name in ("cols", "rows"):
            value = message.get(name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"{name}: expected an integer, received {value!r}")
        check_size(message["cols"], message["rows"])
        return message
    if kind == "data":
        if not isinstance(message.get("data"), str):
            raise ValueError(f"data: expected a string, received {message.get('data')!r}")
        return message
    raise ValueError(f"type: expected 'resize' or 'data', received {kind!r}")


def _size(websocket: WebSocket) -> tuple[int, int]:
    values = []
    for name, default in (("cols", 80), ("rows", 24)):
        raw = websocket.query_params.get(name, str(default))
        try:
            values.append(int(raw))
        except ValueError:
            raise ValueError(f"{name}: expected an integer, received {raw!r}") from None
    check_size(values[0], values[1])
    return values[0], values[1]


async def relay_terminal(
    websocket: WebSocket,
    runtime: object,
    kernel_id: str,
    *,
    kernel_ended: Callable[[], bool] = lambda: False,
) -> None:
    """Accept the WebSocket and pump bytes between it and a new terminal until either ends.

    ``kernel_ended`` tells, once the shell is gone, whether the kernel went with it (the
    session was destroyed) rather than the shell exiting by itself."""
    if not isinstance(runtime, TerminalSource):
        await websocket.accept()
        await websocket.close(code=4501, reason="this runtime cannot open terminals")
        return
    try:
        cols, rows = _size(websocket)
    except ValueError as e:
        await websocket.accept()
        await websocket.close(code=4400, reason=str(e)[:120])
        return
    try:
        terminal = await runtime.open_terminal(kernel_id, cols=cols, rows=rows)
    except KernelNotFound:
        await websocket.accept()
        await websocket.close(code=4404, reason=f"no running kernel {kernel_id}"[:120])
        return
    await websocket.accept()
    log.info("kernel %s: terminal opened", kernel_id)
    try:
        await _pump(websocket, terminal, kernel_ended)
    finally:
        await terminal.close()
        log.info("kernel %s: terminal closed", kernel_id)


async def _pump(websocket: WebSocket, terminal: Terminal, kernel_ended: Callable[[], bool]) -> None:
    async def output() -> None:
        while chunk := await terminal.read():
            await websocket.send_bytes(chunk)

    async def input_() -> None:
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                return
            if message.get("bytes") is not None:
                await terminal.write(message["bytes"])
                continue
            try:
                control = parse_control(message.get("text") or "")
            except ValueError as e:
                await websocket.send_text(control_error(str(e)))
                continue
            if control["type"] == "resize":
                await terminal.resize(control["cols"], control["rows"])
            else:
                await terminal.write(control["data"].encode())

    out_task = asyncio.create_task(output())
    in_task = asyncio.create_task(input_())
    done, pending = await asyncio.wait({out_task, in_task}, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()
    for task in pending:
        with contextlib.suppress(asyncio.CancelledError, WebSocketDisconnect, RuntimeError):
            await task
    for task in done:
        with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError):
            task.result()
    if out_task in done:  # the shell ended: say how, then close
        code = getattr(terminal, "exit_code", lambda: None)()
        with contextlib.suppress(WebSocketDisconnect, RuntimeError):
            await terminal.close()
            code = getattr(terminal, "exit_code", lambda: None)()
            if kernel_ended():
                ended = {"type": "ended", "code": code, "detail": "the session ended"}
                await websocket.send_text(json.dumps(ended))
                await websocket.close(code=SESSION_ENDED, reason="the session ended")
            else:
                await websocket.send_text(json.dumps({"type": "exit", "code": code}))
                await websocket.close(code=1000)
