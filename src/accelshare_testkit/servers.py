"""What the throwaway servers for tests and benchmarks share (etcd in
:mod:`accelshare_testkit.etcd_server`, Redis in :mod:`accelshare_testkit.redis_server`):
finding the binary, a free loopback port, stopping the process politely then firmly, and
the ``with`` protocol.  Standard library only.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
from pathlib import Path
from types import TracebackType
from typing import Self

__all__ = ["ServerProcess", "find_binary", "free_port", "stop_process"]


def find_binary(env_var: str, name: str) -> str | None:
    """``$env_var`` if set (None when it names no file), else ``name`` on PATH, else
    Debian's or a local install's ``/usr/bin``/``/usr/local/bin``; None when absent."""
    explicit = os.environ.get(env_var)
    if explicit:
        return explicit if Path(explicit).is_file() else None
    return shutil.which(name) or next(
        (p for p in (f"/usr/bin/{name}", f"/usr/local/bin/{name}") if Path(p).is_file()), None
    )


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def stop_process(process: subprocess.Popen[bytes], *, grace_s: float = 10.0) -> None:
    """SIGTERM, then SIGKILL after ``grace_s``; returns once the process is reaped."""
    with contextlib.suppress(ProcessLookupError):
        process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


class ServerProcess:
    """A server the caller starts and stops; subclasses implement ``start``/``stop``."""

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def restart(self) -> None:
        self.stop()
        self.start()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
