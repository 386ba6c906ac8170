"""A throwaway single-member etcd for tests and benchmarks.

    with EtcdProcess(tmp_path / "etcd") as etcd:
        backend = EtcdBackend(host=etcd.host, port=etcd.port)
        ...
        etcd.restart()  # same ports, same data: clients must reconnect

It listens on free loopback ports and keeps its data in the given directory.  The
binary comes from ``$ACCELSHARE_ETCD_BINARY`` or ``etcd`` on ``PATH`` (Debian:
``apt-get install etcd-server``); ``find_etcd_binary()`` returns ``None`` when there is
none, so callers can skip with a reason.
"""

from __future__ import annotations

import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from accelshare_testkit.servers import ServerProcess, find_binary, free_port, stop_process

__all__ = ["EtcdProcess", "find_etcd_binary"]


def find_etcd_binary() -> str | None:
    return find_binary("ACCELSHARE_ETCD_BINARY", "etcd")


class EtcdProcess(ServerProcess):
    def __init__(
        self,
        data_dir: Path,
        *,
        binary: str | None = None,
        max_txn_ops: int = 128,
        max_request_bytes: int = 1572864,
        extra_args: Sequence[str] = (),
    ) -> None:
        found = binary or find_etcd_binary()
        if found is None:
            raise FileNotFoundError(
                "no etcd binary (install etcd-server or set ACCELSHARE_ETCD_BINARY)"
            )
        self.binary = found
        self.data_dir = Path(data_dir)
        self.host = "127.0.0.1"
        self.port = free_port()
        self.peer_port = free_port()
        self.max_txn_ops = max_txn_ops
        self.max_request_bytes = max_request_bytes
        self.extra_args = tuple(extra_args)  # more etcd flags, e.g. "--grpc-keepalive-min-time=1s"
        self.log_path = self.data_dir.with_name(self.data_dir.name + ".log")
        self._process: subprocess.Popen[bytes] | None = None

    def version(self) -> str:
        """The etcd server version, e.g. "3.4.23"."""
        out = subprocess.run(
            [self.binary, "--version"], capture_output=True, text=True, check=False
        ).stdout
        return next(
            (line.split(":", 1)[1].strip() for line in out.splitlines() if "Version:" in line),
            "unknown",
        )

    @property
    def addr(self) -> str:
        return f"{self.host}:{self.port}"

    def command(self) -> list[str]:
        client = f"http://{self.host}:{self.port}"
        peer = f"http://{self.host}:{self.peer_port}"
        return [
            self.binary,
            "--name=accelshare-test",
            f"--data-dir={self.data_dir}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=accelshare-test={peer}",
            "--initial-cluster-state=new",
            # Short raft timings: a single member elects itself fast after a restart,
            # and lease TTLs down to 1 s are honoured.
            "--heartbeat-interval=50",
            "--election-timeout=500",
            f"--max-txn-ops={self.max_txn_ops}",
            f"--max-request-bytes={self.max_request_bytes}",
            "--logger=zap",
            "--log-level=warn",
            *self.extra_args,
        ]

    def start(self, timeout_s: float = 30.0) -> None:
        if self._process is not None:
            return
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self._process = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                break
            if self._is_healthy():
                return
            time.sleep(0.05)
        tail = self.log_path.read_text(errors="replace")[-2000:]
        self.stop()
        raise RuntimeError(f"etcd did not become healthy on {self.addr}:\n{tail}")

    def _is_healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.addr}/health", timeout=0.5) as reply:
                return b'"true"' in reply.read()
        except (urllib.error.URLError, OSError):
            return False

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            stop_process(process)
