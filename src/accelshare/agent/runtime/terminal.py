"""Interactive terminals inside running kernels (the web terminal's agent side).

A runtime that can open one implements :class:`TerminalSource`; the agent RPC's
``/v1/kernels/{id}/terminal`` WebSocket relays bytes between the client and the
:class:`Terminal` it gets::

    term = await runtime.open_terminal("k-1", cols=80, rows=24)
    await term.write(b"nvidia-smi\\r")
    chunk = await term.read()          # b"" once the shell (and all its children) ended
    await term.resize(120, 40)
    await term.close()                 # SIGHUP, then SIGKILL to the shell's process group

Process runtime (:class:`ProcessTerminal`): the user's shell (``/bin/bash``, else
``/bin/sh``) on a fresh pty, started by ``_terminal_exec.py`` with the kernel's
``state/launch.json``: the kernel's environment, cwd, cgroups, rlimits and CPU affinity,
so what runs in the terminal counts against the session's limits exactly like the
kernel's own processes.  Docker runtime (:class:`DockerTerminal`): ``exec`` with a tty in
the kernel's container (its cgroup, namespaces and environment), ``/home/config/bin``
first on PATH, cwd ``/home/work``, bash when the image has it.  A process kernel started
in a sandbox gets its terminal inside the sandbox: the helper execs ``nsenter`` into all
its namespaces and its root, as the kernel's user, so the shell sees the kernel's files
and processes only and can signal nothing else.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
import signal
import struct
import subprocess
import sys
import termios
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "MAX_TERMINAL_SIZE",
    "DockerTerminal",
    "ProcessTerminal",
    "Terminal",
    "TerminalSource",
    "check_size",
    "pick_shell",
]

_EXEC_HELPER = Path(__file__).with_name("_terminal_exec.py")
_READ_CHUNK = 65536
MAX_TERMINAL_SIZE = 1000
"""Columns and rows are 1..1000 (a window larger than that is a client's mistake)."""


def check_size(cols: int, rows: int) -> None:
    """Raise ``ValueError`` naming the field when a terminal size is out of range."""
    for name, value in (("cols", cols), ("rows", rows)):
        if not 1 <= value <= MAX_TERMINAL_SIZE:
            raise ValueError(f"{name}: expected 1..{MAX_TERMINAL_SIZE}, received {value}")


class Terminal(Protocol):
    async def read(self) -> bytes: ...

    async def write(self, data: bytes) -> None: ...

    async def resize(self, cols: int, rows: int) -> None: ...

    async def close(self) -> None: ...


@runtime_checkable
class TerminalSource(Protocol):
    """A runtime that can open a terminal in a running kernel.

    Raises ``KernelNotFound`` for an unknown or exited kernel."""

    async def open_terminal(self, kernel_id: str, *, cols: int, rows: int) -> Terminal: ...


def pick_shell(candidates: tuple[str, ...] = ("/bin/bash", "/bin/sh")) -> str:
    for shell in candidates:
        if os.access(shell, os.X_OK):
            return shell
    raise FileNotFoundError(f"no shell found (tried {', '.join(candidates)})")


def _set_size(fd: int, cols: int, rows: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


class ProcessTerminal:
    """A shell on a pty, in its own session and process group (pid == pgid)."""

    def __init__(self, master_fd: int, process: subprocess.Popen[bytes]) -> None:
        self._fd = master_fd
        self._process = process
        self._closed = False
        self.on_close: Callable[[ProcessTerminal], None] | None = None  # the runtime's registry
        self._waiters: set[asyncio.Future[None]] = set()

    @classmethod
    def spawn(
        cls,
        launch_file: Path,
        *,
        cols: int,
        rows: int,
        shell: str,
        namespace_pid: int | None = None,
    ) -> ProcessTerminal:
        """``namespace_pid``: the kernel's sandbox (its init's pid); the shell is started
        inside it, as the kernel's user."""
        check_size(cols, rows)
        argv = [sys.executable, "-I", "-S", str(_EXEC_HELPER), str(launch_file), shell]
        if namespace_pid is not None:
            argv.append(str(namespace_pid))
        master, slave = os.openpty()
        try:
            _set_size(slave, cols, rows)
            process = subprocess.Popen(
                argv,
                stdin=slave,
                stdout=slave,
                stderr=slave,
                start_new_session=True,
                close_fds=True,
            )
        except BaseException:
            os.close(master)
            raise
        finally:
            os.close(slave)
        os.set_blocking(master, False)
        return cls(master, process)

    @property
    def pid(self) -> int:
        return self._process.pid

    async def _wait_fd(self, *, writable: bool) -> None:
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[None] = loop.create_future()

        def wake() -> None:
            if not ready.done():
                ready.set_result(None)

        if writable:
            loop.add_writer(self._fd, wake)
        else:
            loop.add_reader(self._fd, wake)
        self._waiters.add(ready)
        try:
            await ready
        finally:
            self._waiters.discard(ready)
            if not self._closed:  # close() unregistered the fd before closing it
                if writable:
                    loop.remove_writer(self._fd)
                else:
                    loop.remove_reader(self._fd)

    async def read(self) -> bytes:
        while not self._closed:
            try:
                return os.read(self._fd, _READ_CHUNK)
            except BlockingIOError:
                await self._wait_fd(writable=False)
            except OSError as e:
                if e.errno == errno.EIO:  # every holder of the slave side is gone
                    return b""
                raise
        return b""

    async def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view and not self._closed:
            try:
                written = os.write(self._fd, view)
            except BlockingIOError:
                await self._wait_fd(writable=True)
                continue
            view = view[written:]

    async def resize(self, cols: int, rows: int) -> None:
        check_size(cols, rows)
        if not self._closed:
            _set_size(self._fd, cols, rows)  # the kernel sends SIGWINCH to the foreground group

    def exit_code(self) -> int | None:
        return self._process.poll()

    async def close(self, *, grace_s: float = 1.0) -> None:
        """Hang up the shell's process group, SIGKILL it after ``grace_s``; idempotent."""
        if self._closed:
            return
        self._closed = True
        if self.on_close is not None:
            self.on_close(self)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._process.pid, signal.SIGHUP)
        # Unregister the fd before closing it (its number may be reused at once) and wake
        # a pending read or write: it returns b"" / stops.
        loop = asyncio.get_running_loop()
        loop.remove_reader(self._fd)
        loop.remove_writer(self._fd)
        for waiter in list(self._waiters):
            if not waiter.done():
                waiter.set_result(None)
        os.close(self._fd)
        try:
            await asyncio.wait_for(asyncio.to_thread(self._process.wait), grace_s)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._process.pid, signal.SIGKILL)
            await asyncio.to_thread(self._process.wait)
        # What the shell started in the background of the same group goes with it.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._process.pid, signal.SIGKILL)


DOCKER_SHELL_SCRIPT = (
    # The plugins' tools (the mock nvidia-smi) first on PATH, as in the process runtime;
    # bash when the image has it.
    '[ -d /home/config/bin ] && PATH="/home/config/bin:$PATH"; export PATH; '
    "cd /home/work 2>/dev/null; [ -x /bin/bash ] && exec /bin/bash; exec /bin/sh"
)


class DockerTerminal:
    """``docker exec -it`` into a kernel container (aiodocker): the exec runs in the
    container's cgroup, namespaces and environment, so the session's limits hold."""

    def __init__(self, exec_: Any, stream: Any) -> None:
        self._exec = exec_
        self._stream = stream
        self._closed = False
        self._exit_code: int | None = None

    @classmethod
    async def start(cls, container: Any, *, cols: int, rows: int, user: str = "") -> DockerTerminal:
        """``user``: ``"uid:gid"`` the shell runs as (the kernel's user); "" = the
        container's ``User``."""
        check_size(cols, rows)
        exec_ = await container.exec(
            cmd=["/bin/sh", "-c", DOCKER_SHELL_SCRIPT],
            stdin=True,
            tty=True,
            user=user,
            environment={"TERM": "xterm-256color"},
        )
        stream = exec_.start(detach=False)
        await stream._init()  # aiodocker opens the hijacked connection lazily
        terminal = cls(exec_, stream)
        await terminal._resize(cols, rows)
        return terminal

    async def read(self) -> bytes:
        if self._closed:
            return b""
        message = await self._stream.read_out()
        if message is None:
            with contextlib.suppress(Exception):
                self._exit_code = (await self._exec.inspect()).get("ExitCode")
            return b""
        return bytes(message.data)

    async def write(self, data: bytes) -> None:
        if not self._closed:
            await self._stream.write_in(data)

    async def _resize(self, cols: int, rows: int) -> None:
        with contextlib.suppress(Exception):  # the exec may have ended meanwhile
            await self._exec.resize(h=rows, w=cols)

    async def resize(self, cols: int, rows: int) -> None:
        check_size(cols, rows)
        if not self._closed:
            await self._resize(cols, rows)

    def exit_code(self) -> int | None:
        return self._exit_code

    async def close(self) -> None:
        """Close the exec's stdin and connection: the shell gets EOF/SIGHUP and ends."""
        if self._closed:
            return
        self._closed = True
        await self._stream.close()
