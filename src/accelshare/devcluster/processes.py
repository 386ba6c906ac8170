"""The daemons of a local cluster as child processes, and how they are stopped.

Each child runs ``python -m accelshare.client.cli server manager|agent --config FILE``
in its own session (a Ctrl-C in the terminal reaches only ``dev up``, which then stops
the children in order), with stdout and stderr appended to its log file.  On Linux a
child started from the main thread also gets SIGTERM if ``dev up`` itself dies
(``PR_SET_PDEATHSIG``), so a killed ``dev up`` leaves no daemons behind.  (The signal
follows the *thread* that forked: from another thread, which may end before the
process does, it is not set.)
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import psutil  # type: ignore[import-untyped,unused-ignore]

from accelshare.agent.runtime.procfs import find_marked_processes

__all__ = [
    "CLEARED_ENV",
    "Daemon",
    "child_env",
    "reap_kernels",
    "reap_processes_under",
    "stop_daemons",
]

# The environment must not point the daemons at another store or secret than the
# generated configuration does.
CLEARED_ENV = (
    "ACCELSHARE_CLUSTER_SECRET",
    "ACCELSHARE_CONFIG_STORE",
    "ACCELSHARE_CONFIG_NAMESPACE",
    "ACCELSHARE_ETCD_ADDR",
    "ACCELSHARE_ETCD_USER",
    "ACCELSHARE_ETCD_PASSWORD",
)
_PR_SET_PDEATHSIG = 1


def child_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in (os.environ if base is None else base).items() if k not in CLEARED_ENV}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _may_die_with_parent() -> bool:
    return sys.platform == "linux" and threading.current_thread() is threading.main_thread()


class Daemon:
    """One child process (``name`` is also its log file's name)."""

    def __init__(
        self, name: str, args: Sequence[str], *, log: Path, cwd: Path, env: Mapping[str, str]
    ) -> None:
        self.name = name
        self.argv = [sys.executable, "-m", "accelshare.client.cli", *args]
        self.log = log
        self.cwd = cwd
        self.env = dict(env)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            out.write(f"\n--- {time.strftime('%Y-%m-%d %H:%M:%S')} starting {self.name}\n".encode())
            out.flush()
            self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.cwd,
                env=self.env,
                start_new_session=True,
                preexec_fn=_die_with_parent if _may_die_with_parent() else None,  # noqa: PLW1509
            )

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def exit_code(self) -> int | None:
        """None while running (or never started)."""
        return self.proc.poll() if self.proc is not None else None

    def is_running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, signum: int) -> None:
        if self.is_running():
            assert self.proc is not None
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signum)

    def wait(self, timeout_s: float) -> bool:
        """True once it exited (within ``timeout_s``)."""
        if self.proc is None:
            return True
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return False
        return True

    def tail(self, lines: int = 15) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.rstrip().splitlines()[-lines:])


def stop_daemons(daemons: Sequence[Daemon], *, grace_s: float) -> list[str]:
    """SIGTERM all, wait up to ``grace_s``, SIGKILL stragglers; returns their names."""
    for daemon in daemons:
        daemon.signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    killed = []
    for daemon in daemons:
        if not daemon.wait(max(0.0, deadline - time.monotonic())):
            daemon.signal(signal.SIGKILL)
            daemon.wait(5.0)
            killed.append(daemon.name)
    return killed


def reap_kernels(data_dir: Path) -> int:
    """SIGKILL what is left of the kernels of a local cluster's agents (each supervisor,
    each kernel and what it spawned, found by ``ACCELSHARE_KERNEL_ID`` in their
    environment or their launch file, under ``DIR/agents/*/scratch``); returns the count.

    Normally nothing: the agents end their kernels when they stop.  This catches those
    of an agent that had to be SIGKILLed."""
    me = os.getpid()
    victims: list[psutil.Process] = []
    for scratch in sorted(data_dir.resolve().glob("agents/*/scratch")):
        for pids in find_marked_processes(scratch).values():
            for pid in pids:
                if pid == me:
                    continue
                with contextlib.suppress(psutil.Error):
                    victims.append(psutil.Process(pid))
    for proc in victims:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(victims, timeout=5)
    return len(victims)


def reap_processes_under(root: Path) -> int:
    """SIGKILL every process of this user whose working directory is inside ``root``
    (kernels of a throwaway cluster: their scratch dirs live there); returns the count."""
    root = root.resolve()
    me = os.getpid()
    victims = []
    for proc in psutil.process_iter(["pid", "cwd", "uids"]):
        try:
            cwd = proc.info.get("cwd")
            if not cwd or proc.pid == me:
                continue
            if Path(cwd).is_relative_to(root) and proc.info["uids"].real == os.getuid():
                victims.append(proc)
        except (psutil.Error, OSError, KeyError, AttributeError):
            continue
    for proc in victims:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(victims, timeout=5)
    return len(victims)
