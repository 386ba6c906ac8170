"""A throwaway Redis server for tests and benchmarks (Debian's ``redis-server``).

    with RedisProcess(tmp_path / "redis") as server:
        settings = RedisSettings(addr=server.addr)
        ...
        server.restart()   # same port, nothing kept (like the machines' Redis): clients reconnect

It listens on a free loopback port (or ``host``/``port`` given, e.g. inside a network
namespace), persists nothing, and logs to ``<dir>/redis.log``.  ``find_redis_binary()``
returns None when there is no binary, so callers can skip with a reason.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from pathlib import Path

from accelshare_testkit.servers import ServerProcess, find_binary, free_port, stop_process

__all__ = ["RedisProcess", "find_redis_binary"]


def find_redis_binary() -> str | None:
    return find_binary("ACCELSHARE_REDIS_BINARY", "redis-server")


class RedisProcess(ServerProcess):
    def __init__(
        self,
        work_dir: Path,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        binary: str | None = None,
        wrapper: tuple[str, ...] = (),
    ) -> None:
        found = binary or find_redis_binary()
        if found is None:
            raise FileNotFoundError("no redis-server binary (apt-get install redis-server)")
        self.binary = found
        self.work_dir = Path(work_dir)
        self.host = host
        self.port = port if port is not None else free_port()
        self.wrapper = wrapper  # e.g. ("ip", "netns", "exec", "ns1")
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def addr(self) -> str:
        return f"{self.host}:{self.port}"

    def command(self) -> list[str]:
        return [
            *self.wrapper,
            self.binary,
            "--bind",
            self.host,
            "--port",
            str(self.port),
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(self.work_dir),
            "--logfile",
            str(self.work_dir / "redis.log"),
            "--protected-mode",
            "no",
        ]

    def start(self, timeout_s: float = 15.0) -> None:
        if self._process is not None:
            return
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self._process = subprocess.Popen(
            self.command(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                break
            if self._answers():
                return
            time.sleep(0.02)
        log = self.work_dir / "redis.log"
        tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
        self.stop()
        raise RuntimeError(f"redis-server did not start on {self.addr}:\n{tail}")

    def _answers(self) -> bool:
        if self.wrapper:  # another network namespace: ask through redis-cli there
            cli = shutil.which("redis-cli") or "redis-cli"
            probe = [*self.wrapper, cli, "-h", self.host, "-p", str(self.port), "ping"]
            done = subprocess.run(probe, capture_output=True, check=False, timeout=5)
            return done.stdout.strip() == b"PONG"
        try:
            with socket.create_connection((self.host, self.port), timeout=0.5) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            stop_process(process)

    def kill(self) -> None:
        """SIGKILL (a crash, not a shutdown)."""
        process, self._process = self._process, None
        if process is not None:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            process.wait()
