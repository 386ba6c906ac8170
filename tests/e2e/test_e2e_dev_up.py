"""``accelshare dev up`` and ``accelshare dev demo`` as a user runs them: real processes,
signals, files in the data dir, a re-run that keeps the state."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil  # type: ignore[import-untyped,unused-ignore]
import pytest

from accelshare.client import SyncAccelshareClient
from accelshare.client.config import load_client_config
from accelshare.devcluster import free_port
from accelshare.devcluster.processes import reap_processes_under

CLI = [sys.executable, "-m", "accelshare.client.cli"]


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("ACCELSHARE_", "BACKEND_"))}


class DevUp:
    """A ``dev up`` process whose output is collected by a thread."""

    def __init__(self, data_dir: Path, port: int, *extra: str) -> None:
        self.proc = subprocess.Popen(
            [*CLI, "dev", "up", "--data-dir", str(data_dir), "--port", str(port), *extra],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=_env(),
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait_for(self, text: str, timeout_s: float = 90.0) -> None:
        deadline = time.monotonic() + timeout_s
        while text not in self.output:
            if self.proc.poll() is not None:
                self._reader.join(5)
                raise AssertionError(f"dev up exited {self.proc.returncode}:\n{self.output}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no {text!r} after {timeout_s} s:\n{self.output}")
            time.sleep(0.05)

    def stop(self, signum: int = signal.SIGINT, timeout_s: float = 30.0) -> int:
        self.proc.send_signal(signum)
        code = self.proc.wait(timeout=timeout_s)
        self._reader.join(5)
        return code

    def pids(self) -> list[int]:
        """The daemons' pids from the banner."""
        found = []
        for line in self.output.splitlines():
            if "(pid " in line:
                found.append(int(line.split("(pid ", 1)[1].split(")")[0].split(",")[0]))
        return found


@pytest.fixture
def data_dir(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "state"
    yield path
    reap_processes_under(path)  # kernels of a failed test


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_dev_up_runs_stops_and_keeps_state(data_dir: Path) -> None:
    port = free_port()
    up = DevUp(data_dir, port, "--agents", "2", "--cpus", "4", "--mem", "8g")
    up.wait_for("accelshare local cluster is running")
    out = up.output
    assert f"http://127.0.0.1:{port}/" in out  # the console URL
    assert "i-dev-01: 4 CPUs, 8 GiB, 2 × cuda (fractional)" in out
    assert "i-dev-02" in out
    assert "source " in out
    assert "client.env" in out
    daemons = up.pids()
    assert len(daemons) == 3  # manager + 2 agents
    for name in ("client.env", "cluster-secret", "admin-credentials.env"):
        assert _mode(data_dir / name) == 0o600, name
    env_file = data_dir / "client.env"
    assert env_file.read_text().count("export ACCELSHARE_") == 3
    config = load_client_config(config_file=env_file, env={})
    assert config.endpoint == f"http://127.0.0.1:{port}"

    second = subprocess.run(
        [*CLI, "dev", "up", "--data-dir", str(data_dir), "--port", str(free_port())],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=60,
        check=False,
    )
    assert second.returncode == 1
    assert "another `accelshare dev up`" in second.stderr

    with SyncAccelshareClient(config) as client:
        agents = client.agents.list()
        assert sorted(a.id for a in agents) == ["i-dev-01", "i-dev-02"]
        assert all(a.available_slots["cpu"] == 4 for a in agents)
        kept = client.sessions.create(
            "python", resources={"cuda.shares": "0.5"}, name="kept", max_wait_s=30
        )
        assert kept.status == "RUNNING"

    assert up.stop(signal.SIGTERM) == 0
    assert "stopped." in up.output
    assert "1 session(s) keep running" in up.output
    for pid in daemons:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)

    # Re-run on the same data dir: same keys, the session and its kernel are still there.
    again = DevUp(data_dir, port, "--agents", "2", "--cpus", "4", "--mem", "8g")
    again.wait_for("accelshare local cluster is running")
    assert load_client_config(config_file=env_file, env={}).access_key == config.access_key
    with SyncAccelshareClient(config) as client:
        session = client.sessions.get("kept")
        assert session.status == "RUNNING"
        assert client.sessions.destroy("kept").status == "TERMINATED"
    # A daemon that dies takes the cluster down with a clear message.
    os.kill(again.pids()[1], signal.SIGKILL)
    assert again.proc.wait(timeout=30) == 1
    again._reader.join(5)
    assert "exited with status" in again.output


def test_dev_demo_passes() -> None:
    result = subprocess.run(
        [*CLI, "dev", "demo"], capture_output=True, text=True, env=_env(), timeout=300, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "demo passed" in result.stdout
    assert "✗" not in result.stdout
    assert "0.60 / 1.00" in result.stdout
    assert "is enqueued (PENDING: " in result.stdout
