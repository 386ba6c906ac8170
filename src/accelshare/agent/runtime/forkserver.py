"""The agent's side of the launcher's fork server (``_launcher.py --fork-server``).

One launcher process per process runtime with its interpreter up; :meth:`ForkServer.launch`
sends it a launch file's path with the status pipe's write end attached, and the server
forks a child that starts the kernel exactly as a freshly started launcher would.  A
create then costs a fork instead of a Python start, which would be most of the agent
host's CPU per session when sessions are created back to back (figures:
docs/performance.md, *Agent*).

Contract: :meth:`launch` is thread-safe (creates run in worker threads) and returns
False only when the message could not be handed to a server, even after one restart:
the caller then starts a launcher of its own.  Once handed over, the outcome arrives on
the status pipe like any launcher's; if the server dies with the message unread, the
pipe's write end is released with the socket and the caller reads EOF (a failed start,
never a kernel started twice).
"""

from __future__ import annotations

import contextlib
import logging
import socket
import subprocess
import threading
from collections.abc import Sequence

__all__ = ["ForkServer"]

log = logging.getLogger(__name__)


class ForkServer:
    def __init__(self, launcher_argv: Sequence[str]) -> None:
        """``launcher_argv``: the command that runs ``_launcher.py`` (python, flags, path);
        ``--fork-server FD`` is appended."""
        self._argv = list(launcher_argv)
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._control: socket.socket | None = None
        self._closed = False

    @property
    def pid(self) -> int | None:
        with self._lock:
            return self._process.pid if self._process is not None else None

    def start(self) -> None:
        """Start the server now (the first :meth:`launch` would otherwise)."""
        with self._lock:
            if self._process is None and not self._closed:
                self._start_locked()

    def _start_locked(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._process = subprocess.Popen(
                [*self._argv, "--fork-server", str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                # stderr: the agent's own (a job's output goes to its launcher.log)
                cwd="/",
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self._control = ours
        log.debug("launcher fork server started (pid %d)", self._process.pid)

    def _stop_locked(self) -> subprocess.Popen[bytes] | None:
        if self._control is not None:
            self._control.close()  # EOF: the server exits
            self._control = None
        process, self._process = self._process, None
        return process

    def launch(self, launch_file: str, status_fd: int) -> bool:
        """Hand one launch to the server (see the module docstring).  ``status_fd`` stays
        the caller's to close."""
        message = launch_file.encode()
        with self._lock:
            for attempt in (1, 2):
                if self._closed:
                    return False
                if self._process is not None and self._process.poll() is not None:
                    log.warning(
                        "launcher fork server exited (status %s); starting another",
                        self._process.returncode,
                    )
                    self._stop_locked()
                try:
                    if self._process is None:
                        self._start_locked()
                    assert self._control is not None
                    socket.send_fds(self._control, [message], [status_fd])
                    return True
                except OSError as e:
                    log.warning("launcher fork server: %s (attempt %d of 2)", e, attempt)
                    dead = self._stop_locked()
                    if dead is not None:
                        with contextlib.suppress(OSError):
                            dead.kill()
                        dead.wait()
            return False

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the server (blocking; kernels it started keep running)."""
        with self._lock:
            self._closed = True
            process = self._stop_locked()
        if process is None:
            return
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
