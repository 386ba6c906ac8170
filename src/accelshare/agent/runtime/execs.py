"""Commands run inside a running kernel with pipes (the execute API's agent side).

A runtime that can run one implements :class:`ExecSource`; :mod:`accelshare.agent.runs`
drives what it returns::

    proc = await runtime.exec_in_kernel("k-1", ["python", "-c", "print(1)"])
    await proc.write(b"input line\\n")     # its stdin
    stream, chunk = await proc.read()     # ("stdout", b"1\\n"); (None, b"") at the end
    code = await proc.wait()              # its exit code (128 + N when killed by N)
    await proc.kill()                     # the whole process group / exec, idempotent

Process runtime (:class:`PipeExec`): ``_terminal_exec.py`` starts the command as a
terminal's shell is started (the kernel's environment, cwd, cgroups, rlimits, CPU
affinity; in a sandboxed kernel inside its namespaces, as its user, under its syscall
filter), with pipes instead of a pty.  Docker runtime (:class:`DockerExec`): a ``docker
exec`` without a tty, as the kernel's user, in ``/home/work``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

__all__ = ["DOCKER_RUN_SCRIPT", "DockerExec", "ExecSource", "KernelExec", "PipeExec"]

Stream = Literal["stdout", "stderr"]
_EXEC_HELPER = Path(__file__).with_name("_terminal_exec.py")
_READ_CHUNK = 65536


class KernelExec(Protocol):
    async def read(self) -> tuple[Stream | None, bytes]: ...

    async def write(self, data: bytes) -> None: ...

    async def close_stdin(self) -> None: ...

    async def wait(self) -> int: ...

    async def kill(self) -> None: ...


@runtime_checkable
class ExecSource(Protocol):
    """A runtime that can run a command in a running kernel.

    Raises ``KernelNotFound`` for an unknown or exited kernel."""

    async def exec_in_kernel(self, kernel_id: str, argv: Sequence[str]) -> KernelExec: ...


class PipeExec:
    """A command on pipes, in its own session and process group (pid == pgid)."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self._process = process
        self.on_end: Callable[[PipeExec], None] | None = None  # the runtime's registry
        self._queue: asyncio.Queue[tuple[Stream | None, bytes]] = asyncio.Queue(maxsize=16)
        self._open = 2
        self._pumps = [
            asyncio.create_task(self._pump("stdout", process.stdout)),
            asyncio.create_task(self._pump("stderr", process.stderr)),
        ]

    @classmethod
    async def spawn(
        cls, launch_file: Path, argv: Sequence[str], *, namespace_pid: int | None = None
    ) -> PipeExec:
        """``namespace_pid``: the kernel's sandbox (its init's pid); the command runs
        inside it, as the kernel's user."""
        helper = [sys.executable, "-I", "-S", str(_EXEC_HELPER), str(launch_file), "--run"]
        helper.append(str(namespace_pid) if namespace_pid is not None else "-")
        process = await asyncio.create_subprocess_exec(
            *helper,
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
            close_fds=True,
        )
        return cls(process)

    @property
    def pid(self) -> int:
        return self._process.pid

    async def _pump(self, stream: Stream, reader: asyncio.StreamReader | None) -> None:
        """Chunks of one pipe into the queue; a full queue stops reading (the command
        then blocks on its writes: output is never dropped nor buffered without bound)."""
        try:
            while reader is not None:
                chunk = await reader.read(_READ_CHUNK)
                if not chunk:
                    break
                await self._queue.put((stream, chunk))
        finally:
            self._open -= 1
            if self._open == 0:
                await self._queue.put((None, b""))

    async def read(self) -> tuple[Stream | None, bytes]:
        """The next chunk of output and its stream; ``(None, b"")`` once both pipes closed
        (and from then on)."""
        if self._open == 0 and self._queue.empty():
            return None, b""
        item = await self._queue.get()
        if item[0] is None:
            self._queue.put_nowait(item)  # every later read ends too
        return item

    async def write(self, data: bytes) -> None:
        stdin = self._process.stdin
        if stdin is None or stdin.is_closing():
            raise BrokenPipeError("the command's input is closed")
        stdin.write(data)
        await stdin.drain()

    async def close_stdin(self) -> None:
        stdin = self._process.stdin
        if stdin is not None and not stdin.is_closing():
            stdin.close()
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                await stdin.wait_closed()

    async def wait(self) -> int:
        code = await self._process.wait()
        if self.on_end is not None:
            self.on_end(self)
        return 128 - code if code < 0 else code

    def exit_code(self) -> int | None:
        code = self._process.returncode
        return None if code is None else (128 - code if code < 0 else code)

    async def kill(self) -> None:
        """SIGKILL the command's process group (what it started goes with it)."""
        if self.on_end is not None:
            self.on_end(self)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._process.pid, signal.SIGKILL)
        await self._process.wait()
        for pump in self._pumps:
            pump.cancel()
        await asyncio.gather(*self._pumps, return_exceptions=True)


DOCKER_RUN_SCRIPT = (
    # The plugins' tools first on PATH, as in the terminal; the command's words follow.
    '[ -d /home/config/bin ] && PATH="/home/config/bin:$PATH"; export PATH; '
    'cd /home/work 2>/dev/null; exec "$@"'
)


class DockerExec:
    """``docker exec`` without a tty in a kernel container (aiodocker): stdout and
    stderr come apart (the stream is multiplexed), the exec runs in the container's
    cgroup, namespaces and environment."""

    def __init__(self, exec_: Any, stream: Any) -> None:
        self._exec = exec_
        self._stream = stream
        self._ended = False

    @classmethod
    async def start(cls, container: Any, argv: Sequence[str], *, user: str = "") -> DockerExec:
        exec_ = await container.exec(
            cmd=["/bin/sh", "-c", DOCKER_RUN_SCRIPT, "sh", *argv],
            stdin=True,
            tty=False,
            user=user,
        )
        stream = exec_.start(detach=False)
        await stream._init()  # aiodocker opens the hijacked connection lazily
        return cls(exec_, stream)

    async def read(self) -> tuple[Stream | None, bytes]:
        if self._ended:
            return None, b""
        message = await self._stream.read_out()
        if message is None:
            self._ended = True
            return None, b""
        return ("stderr" if message.stream == 2 else "stdout"), bytes(message.data)

    async def write(self, data: bytes) -> None:
        await self._stream.write_in(data)

    async def close_stdin(self) -> None:
        with contextlib.suppress(Exception):
            transport = self._stream._resp.connection.transport  # half-close: EOF on stdin
            if transport is not None and transport.can_write_eof():
                transport.write_eof()

    async def wait(self) -> int:
        while not self._ended:
            stream, _ = await self.read()
            if stream is None:
                break
        for _ in range(50):  # the exit code is set just after the output ends
            info = await self._exec.inspect()
            if not info.get("Running") and info.get("ExitCode") is not None:
                return int(info["ExitCode"])
            await asyncio.sleep(0.05)
        return -1

    async def kill(self) -> None:
        """Close the exec's connection; what it ran gets SIGHUP/EOF.  A docker exec has
        no kill of its own: a command that ignores both ends with its container."""
        self._ended = True
        with contextlib.suppress(Exception):
            await self._stream.close()
