"""``accelshare dev up`` and ``accelshare dev demo`` as a user runs them: real processes,
signals, files in the data dir, a re-run that keeps the state."""

from __future__ import annotations

import json
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
            [
                *CLI,
                "dev",
                "up",
                "--no-jupyter",  # no pip download here: the console tests build jupyter:4
                "--data-dir",
                str(data_dir),
                "--port",
                str(port),
                *extra,
            ],
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

    def wait_running(self) -> None:
        """Until the whole banner is out (its last line)."""
        self.wait_for("  accelshare session list\n")

    def stop(self, signum: int = signal.SIGINT, timeout_s: float = 60.0) -> int:
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


def _started_by(data_dir: Path, groups: set[int], kernel_ids: set[str]) -> list[str]:
    """Live processes of this user that `dev up` started, directly or not: in the process
    group of one of its daemons, with the data dir in their command line, working
    directory or environment, or with one of its kernels' ACCELSHARE_KERNEL_ID."""
    root = str(data_dir.resolve())
    found = []
    for proc in psutil.process_iter(["cmdline", "cwd", "environ", "uids", "status"]):
        try:
            info = proc.info
            if proc.pid == os.getpid() or info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if info["uids"] is None or info["uids"].real != os.getuid():
                continue
            command = " ".join(info["cmdline"] or [])
            environ = info["environ"] or {}
            if (
                os.getpgid(proc.pid) in groups
                or root in command
                or (info["cwd"] or "").startswith(root)
                or any(root in value for value in environ.values())
                or environ.get("ACCELSHARE_KERNEL_ID") in kernel_ids
            ):
                found.append(f"{proc.pid}: {command}")
        except (psutil.Error, OSError):
            continue
    return found


def _none_left(data_dir: Path, groups: set[int], kernel_ids: set[str]) -> None:
    deadline = time.monotonic() + 5  # exited processes may take a moment to be reaped
    while (left := _started_by(data_dir, groups, kernel_ids)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert left == [], left


def _kernel_ids(client: SyncAccelshareClient) -> set[str]:
    """The kernels of the live sessions (the list has no kernels: ask each session)."""
    live = client.sessions.list_all()
    return {k.kernel_id for s in live for k in client.sessions.get(s.session_id).kernels}


def test_dev_up_runs_stops_and_keeps_state(data_dir: Path) -> None:
    port = free_port()
    up = DevUp(data_dir, port, "--agents", "2", "--cpus", "4", "--mem", "8g")
    up.wait_running()
    out = up.output
    assert f"http://127.0.0.1:{port}/" in out  # the console URL
    assert "i-dev-01: 4 CPUs, 8 GiB, 2 × cuda (fractional)" in out
    assert "i-dev-02" in out
    assert "source " in out
    assert "client.env also puts `accelshare` on PATH" in out
    daemons = up.pids()
    assert len(daemons) == 4  # manager, storage proxy and 2 agents
    for name in ("client.env", "cluster-secret", "admin-credentials.env"):
        assert _mode(data_dir / name) == 0o600, name
    env_file = data_dir / "client.env"
    # the endpoint and keypair; the config store, the other selector emptied, its namespace
    assert env_file.read_text().count("export ACCELSHARE_") == 6
    config = load_client_config(config_file=env_file, env={})
    assert config.endpoint == f"http://127.0.0.1:{port}"
    # The README: `source .accelshare/client.env`, then `accelshare ...` in a new shell,
    # `mgr etcd` included, from any folder (here `/`, which has no store).
    sourced = subprocess.run(
        [
            "bash",
            "-c",
            f"source '{env_file}' && command -v accelshare && accelshare agent list"
            " && cd / && accelshare mgr etcd get --verbose"
            " config/plugins/accelerator/cuda/allocation_mode",
        ],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "HOME": str(data_dir)},
        timeout=60,
        check=False,
    )
    assert sourced.returncode == 0, sourced.stderr
    assert sourced.stdout.splitlines()[0] == str(Path(sys.executable).parent / "accelshare")
    assert "i-dev-02" in sourced.stdout
    assert sourced.stdout.splitlines()[-1] == "fractional"  # what dev up wrote there
    store = data_dir.resolve() / "config-store.db"
    assert sourced.stderr == (
        f"using the embedded store at {store} (namespace 'local'; from $ACCELSHARE_CONFIG_STORE)\n"
    )

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
        batch = client.sessions.create(
            "python",
            resources={"cuda.shares": "1"},
            name="batch",
            type="batch",
            startup_command="python -c 'import time; time.sleep(300)'",
            max_wait_s=30,
        )
        assert (kept.status, batch.status) == ("RUNNING", "RUNNING")
        later = client.sessions.create("python", name="later", starts_at="2099-01-01T00:00:00Z")
        assert later.status == "PENDING"
        kernels = _kernel_ids(client)
    assert len(kernels) == 2
    groups = set(daemons)
    running = _started_by(data_dir, groups, kernels)
    assert len(running) >= 5, running  # the search finds the daemons and the kernels

    assert up.stop(signal.SIGTERM) == 0
    assert "stopped." in up.output
    assert "2 running session(s) ended with it" in up.output  # not the PENDING one
    assert "1 PENDING session(s) stay queued" in up.output
    for pid in daemons:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"
    _none_left(data_dir, groups, kernels)
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)

    # Re-run on the same data dir: same keys and history; the agents report the kernels
    # they ended, so those sessions are TERMINATED; the PENDING one still waits.
    again = DevUp(data_dir, port, "--agents", "2", "--cpus", "4", "--mem", "8g")
    again.wait_running()
    assert load_client_config(config_file=env_file, env={}).access_key == config.access_key
    with SyncAccelshareClient(config) as client:
        for name in ("kept", "batch"):
            ended = client.sessions.wait(name, ("TERMINATED",), timeout_s=30)
            assert ended.status == "TERMINATED", ended
        assert client.sessions.get("later").status == "PENDING"
        fresh = client.sessions.create("python", name="fresh", max_wait_s=30)
        assert fresh.status == "RUNNING"
        kernels |= _kernel_ids(client)
    groups |= set(again.pids())
    assert again.stop(signal.SIGINT) == 0
    assert "1 running session(s) ended with it" in again.output
    _none_left(data_dir, groups, kernels)

    # A daemon that dies takes the cluster down with a clear message, and nothing stays.
    third = DevUp(data_dir, port, "--agents", "2", "--cpus", "4", "--mem", "8g")
    third.wait_running()
    with SyncAccelshareClient(config) as client:
        assert client.sessions.wait("fresh", ("TERMINATED",), timeout_s=30).status == "TERMINATED"
        for name in ("x1", "x2"):
            made = client.sessions.create(
                "python", resources={"cuda.shares": "1"}, name=name, max_wait_s=30
            )
            assert made.status == "RUNNING"
        kernels |= _kernel_ids(client)
    groups |= set(third.pids())
    os.kill(third.pids()[1], signal.SIGKILL)
    assert third.proc.wait(timeout=60) == 1
    third._reader.join(5)
    assert "exited with status" in third.output
    _none_left(data_dir, groups, kernels)


def test_dev_up_json(data_dir: Path) -> None:
    port = free_port()
    up = DevUp(data_dir, port, "--json")
    up.wait_for('"event": "running"')
    running = json.loads(up.output.splitlines()[-1])
    assert running["endpoint"] == f"http://127.0.0.1:{port}"
    assert running["client_env"] == str((data_dir / "client.env").resolve())
    assert [a["id"] for a in running["agents"]] == ["i-dev-01"]
    pids = {running["manager"]["pid"], running["agents"][0]["pid"]}
    assert up.stop(signal.SIGTERM) == 0
    stopped = json.loads(up.output.splitlines()[-1])
    assert stopped == {
        "event": "stopped",
        "ended_sessions": 0,
        "pending_sessions": 0,
        "killed": [],
        "reaped_processes": 0,
    }
    _none_left(data_dir, pids, set())


def test_dev_demo_passes() -> None:
    result = subprocess.run(
        [*CLI, "dev", "demo"], capture_output=True, text=True, env=_env(), timeout=300, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "demo passed" in result.stdout
    assert "✗" not in result.stdout
    assert "0.60 / 1.00" in result.stdout
    assert "is enqueued (PENDING: " in result.stdout
