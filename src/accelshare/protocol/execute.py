"""Code execution in a running kernel: the agent's ``POST /v1/kernels/{id}/execute``.

The manager relays Backend.AI's execute API (``POST /session/{ref}`` and the WebSocket
``/stream/session/{ref}/execute``) to the agent of the session's kernel with these.  A
*run* is one execution: started by a ``query`` (code for the kernel's interpreter) or a
``batch`` (shell commands: ``clean``, ``build``, ``exec``), then stepped with
``continue`` (more output) and ``input`` (a line for its standard input) until its
status is ``finished``::

    ExecuteRequest(runId=None, mode="query", code="print(1)")
      -> ExecuteResult(runId="3f2a...", status="finished", exitCode=0,
                       console=[["stdout", "1\\n"]])

Each step answers with the output since the previous one, after at most
``flushTimeout`` seconds or as soon as the run's command ends.  Status values are
Backend.AI's: ``continued`` (still running), ``clean-finished``, ``build-finished``
(a batch phase ended; continue for the next) and ``finished`` (``exitCode`` is the
command's: 128 + N when killed by signal N).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator

from .fields import WireModel

__all__ = [
    "EXECUTE_MODES",
    "MAX_CODE_BYTES",
    "MAX_FLUSH_TIMEOUT_S",
    "RUN_ID_PATTERN",
    "BatchOptions",
    "ExecuteRequest",
    "ExecuteResult",
]

EXECUTE_MODES = ("query", "batch", "continue", "input")
RUN_ID_PATTERN = r"^[A-Za-z0-9_.-]{1,64}$"
MAX_CODE_BYTES = 1 << 20
"""The code of a query, a batch command or an input line: at most 1 MiB."""
MAX_FLUSH_TIMEOUT_S = 10.0


def _checked_text(value: str | None, field: str) -> str | None:
    if value is None:
        return None
    if "\x00" in value:
        raise ValueError(f"{field} holds a NUL character")
    if len(value.encode()) > MAX_CODE_BYTES:
        raise ValueError(f"{field} is larger than {MAX_CODE_BYTES} bytes")
    return value


class BatchOptions(WireModel):
    """A batch run's shell commands, run in this order; each may be left out (``exec``
    alone is the usual)."""

    clean: str | None = None
    build: str | None = None
    exec: str | None = None
    buildLog: bool = False

    @field_validator("clean", "build", "exec")
    @classmethod
    def _text(cls, value: str | None) -> str | None:
        return _checked_text(value, "options")


class ExecuteRequest(WireModel):
    runId: Annotated[str, Field(pattern=RUN_ID_PATTERN)] | None = None
    mode: Literal["query", "batch", "continue", "input"]
    code: str = ""
    options: BatchOptions | None = None
    flushTimeout: Annotated[float, Field(ge=0, le=MAX_FLUSH_TIMEOUT_S)] = 2.0

    @field_validator("code")
    @classmethod
    def _code(cls, value: str) -> str:
        checked = _checked_text(value, "code")
        assert checked is not None
        return checked


class ExecuteResult(WireModel):
    runId: str
    status: Literal["continued", "clean-finished", "build-finished", "finished"]
    console: list[tuple[Literal["stdout", "stderr"], str]] = Field(default_factory=list)
    exitCode: int | None = None
    options: dict[str, object] = Field(default_factory=dict)
    files: list[dict[str, str]] = Field(default_factory=list)
