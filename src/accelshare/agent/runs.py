"""Runs: code executed in a running kernel (the execute API, agent side).

A run is one execution (:mod:`accelshare.protocol.execute`): a ``query`` runs its code
with the kernel's interpreter (the environment's, ``python -c CODE``), a ``batch`` runs
its ``clean``, ``build`` and ``exec`` shell commands one after the other (``/bin/sh
-c``; ``"*"``, Backend.AI's "the default", for clean or build means nothing to do: an
environment declares no such command, and an ``exec`` of ``"*"`` is refused).  Every command is started by the runtime inside the kernel (:mod:`.runtime.execs`:
the kernel's sandbox, user, cgroups, environment and working folder): a run is isolated
from the kernel's own processes and from other runs, and shares their limits.

Each step (:meth:`Runs.step`) returns the output since the previous step, after at most
the request's ``flushTimeout`` or as soon as the run's command ends, and at most
:data:`MAX_CONSOLE_BYTES` of it (the rest waits for the next step: a command that writes
faster than it is read blocks on its pipe; nothing is dropped).  A run whose client
stopped stepping it is killed after :data:`IDLE_TIMEOUT_S`; one kernel holds at most
:data:`MAX_RUNS_PER_KERNEL` runs at a time.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import logging
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from accelshare.protocol import BatchOptions, ExecuteRequest, ExecuteResult

from .runtime.execs import ExecSource, KernelExec

__all__ = [
    "IDLE_TIMEOUT_S",
    "MAX_CONSOLE_BYTES",
    "MAX_RUNS_PER_KERNEL",
    "ExecUnsupported",
    "RunConflict",
    "RunNotFound",
    "Runs",
]

log = logging.getLogger(__name__)

MAX_CONSOLE_BYTES = 1 << 20
MAX_RUNS_PER_KERNEL = 8
IDLE_TIMEOUT_S = 600.0
SHELL = "/bin/sh"

Phase = Literal["clean-finished", "build-finished", "finished"]


class ExecUnsupported(Exception):
    """The agent's runtime cannot run commands in its kernels."""


class RunNotFound(LookupError):
    """``continue``/``input`` for a run id the kernel does not have (never started, or
    finished and answered already)."""

    def __init__(self, kernel_id: str, run_id: str | None) -> None:
        self.kernel_id, self.run_id = kernel_id, run_id
        super().__init__(f"kernel {kernel_id} has no run {run_id!r}")


class RunConflict(ValueError):
    """A run that cannot start (its id is in use, too many runs, a bad batch)."""

    def __init__(self, message: str, *, field: str, received: object) -> None:
        self.field, self.received = field, received
        super().__init__(message)


class InterpreterSource(Protocol):
    def interpreter_argv(self, kernel_id: str, code: str) -> list[str]: ...


class Source(ExecSource, InterpreterSource, Protocol): ...


@dataclass(slots=True)
class _Run:
    run_id: str
    kernel_id: str
    phases: list[tuple[Phase, list[str]]]
    clock: Callable[[], float]
    command: KernelExec | None = None
    used_at: float = 0.0
    pending: list[tuple[Literal["stdout", "stderr"], bytes]] = field(default_factory=list)
    decoders: dict[str, codecs.IncrementalDecoder] = field(default_factory=dict)
    reader: asyncio.Task[tuple[Literal["stdout", "stderr"] | None, bytes]] | None = None

    def decode(self, stream: str, data: bytes, *, final: bool = False) -> str:
        decoder = self.decoders.get(stream)
        if decoder is None:
            decoder = self.decoders[stream] = codecs.getincrementaldecoder("utf-8")("replace")
        return decoder.decode(data, final)


class Runs:
    """The runs of one agent's kernels."""

    def __init__(self, runtime: Source, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.runtime = runtime
        self.clock = clock
        self._runs: dict[tuple[str, str], _Run] = {}
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}

    def count(self, kernel_id: str) -> int:
        return sum(1 for k, _ in self._runs if k == kernel_id)

    async def step(self, kernel_id: str, request: ExecuteRequest) -> ExecuteResult:
        """Start or step a run; ``KernelNotFound`` (from the runtime) unless the kernel
        runs, :class:`RunNotFound`, :class:`RunConflict`."""
        await self.expire_idle()
        if request.mode in ("query", "batch"):
            run = self._start(kernel_id, request)
        else:
            found = self._runs.get((kernel_id, request.runId or ""))
            if found is None:
                raise RunNotFound(kernel_id, request.runId)
            run = found
        key = (kernel_id, run.run_id)
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:  # one step of a run at a time
            run.used_at = self.clock()
            try:
                if request.mode == "input" and run.command is not None:
                    await run.command.write(request.code.encode() + b"\n")
                return await self._advance(run, request.flushTimeout)
            except BaseException:
                await self._end(run)
                raise

    def _start(self, kernel_id: str, request: ExecuteRequest) -> _Run:
        run_id = request.runId or secrets.token_hex(8)
        if (kernel_id, run_id) in self._runs:
            raise RunConflict(
                f"run {run_id!r} is still running: continue it, or start another runId",
                field="runId",
                received=run_id,
            )
        if self.count(kernel_id) >= MAX_RUNS_PER_KERNEL:
            raise RunConflict(
                f"kernel {kernel_id} runs {MAX_RUNS_PER_KERNEL} executions already"
                " (finish or continue one first)",
                field="runId",
                received=run_id,
            )
        if request.mode == "query":
            phases: list[tuple[Phase, list[str]]] = [
                ("finished", self.runtime.interpreter_argv(kernel_id, request.code))
            ]
        else:
            phases = _batch_phases(request.options or BatchOptions())
        run = _Run(run_id, kernel_id, phases, self.clock, used_at=self.clock())
        self._runs[(kernel_id, run_id)] = run
        return run

    async def _advance(self, run: _Run, flush_timeout: float) -> ExecuteResult:
        if run.command is None:
            run.command = await self.runtime.exec_in_kernel(run.kernel_id, run.phases[0][1])
        deadline = self.clock() + flush_timeout
        size = 0
        ended = False
        while size < MAX_CONSOLE_BYTES:
            if run.reader is None:
                run.reader = asyncio.ensure_future(run.command.read())
            left = deadline - self.clock()
            done, _ = await asyncio.wait({run.reader}, timeout=max(0.0, left))
            if not done:
                break  # the output so far; the read goes on for the next step
            stream, chunk = run.reader.result()
            run.reader = None
            if stream is None:
                ended = True
                break
            run.pending.append((stream, chunk))
            size += len(chunk)
        console = _console(run, final=ended)
        if not ended:
            return ExecuteResult(runId=run.run_id, status="continued", console=console)
        code = await run.command.wait()
        phase = run.phases.pop(0)[0]
        run.command = None
        run.decoders.clear()
        if phase == "finished" or code != 0 or not run.phases:
            # a failed clean or build ends the run with its exit code
            await self._end(run)
            return ExecuteResult(
                runId=run.run_id, status="finished", console=console, exitCode=code
            )
        return ExecuteResult(runId=run.run_id, status=phase, console=console, exitCode=code)

    async def _end(self, run: _Run) -> None:
        key = (run.kernel_id, run.run_id)
        self._runs.pop(key, None)
        self._locks.pop(key, None)
        if run.reader is not None:
            run.reader.cancel()
            with contextlib.suppress(BaseException):
                await run.reader
        if run.command is not None:
            with contextlib.suppress(Exception):
                await run.command.kill()

    async def cancel(self, kernel_id: str, run_id: str) -> None:
        """Kill a run (its client went away); :class:`RunNotFound` for an unknown one."""
        run = self._runs.get((kernel_id, run_id))
        if run is None:
            raise RunNotFound(kernel_id, run_id)
        await self._end(run)

    async def expire_idle(self) -> None:
        """Kill the runs nobody stepped for :data:`IDLE_TIMEOUT_S`."""
        now = self.clock()
        for run in [r for r in self._runs.values() if now - r.used_at > IDLE_TIMEOUT_S]:
            if not self._locks.get((run.kernel_id, run.run_id), asyncio.Lock()).locked():
                log.info("kernel %s: run %s idle, killed", run.kernel_id, run.run_id)
                await self._end(run)

    async def end_kernel(self, kernel_id: str) -> None:
        """The kernel ended: its runs go with it."""
        for run in [r for (k, _), r in self._runs.items() if k == kernel_id]:
            await self._end(run)

    async def close(self) -> None:
        for run in list(self._runs.values()):
            await self._end(run)


def _batch_phases(options: BatchOptions) -> list[tuple[Phase, list[str]]]:
    phases: list[tuple[Phase, list[str]]] = []
    named: Sequence[tuple[Phase, str, str | None]] = (
        ("clean-finished", "clean", options.clean),
        ("build-finished", "build", options.build),
        ("finished", "exec", options.exec),
    )
    for phase, name, command in named:
        if command is None or not command.strip():
            continue
        if command.strip() == "*" and name != "exec":
            # Backend.AI's "the environment's default": the official client's `run FILES
            # --exec CMD` sends it for clean and build.  accelshare's environments declare
            # no clean or build command, so the default is to do nothing.
            continue
        if command.strip() == "*":
            raise RunConflict(
                f"options.{name}: accelshare does not guess a {name} command ('*'):"
                " give the command line",
                field=f"options.{name}",
                received=command,
            )
        phases.append((phase, [SHELL, "-c", command]))
    if not phases or phases[-1][0] != "finished":
        raise RunConflict(
            "options.exec: a batch run needs the command to execute",
            field="options.exec",
            received=options.exec,
        )
    return phases


def _console(run: _Run, *, final: bool) -> list[tuple[Literal["stdout", "stderr"], str]]:
    """The pending output as console records, a stream's consecutive chunks joined."""
    records: list[tuple[Literal["stdout", "stderr"], str]] = []
    for stream, chunk in run.pending:
        text = run.decode(stream, chunk)
        if not text:
            continue
        if records and records[-1][0] == stream:
            records[-1] = (stream, records[-1][1] + text)
        else:
            records.append((stream, text))
    run.pending.clear()
    if final:
        for stream in ("stdout", "stderr"):
            rest = run.decode(stream, b"", final=True)
            if rest:
                records.append((stream, rest))
    return records
