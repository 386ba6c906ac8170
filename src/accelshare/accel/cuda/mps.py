"""Enforced fractional GPU shares through NVIDIA MPS (the Multi-Process Service).

In fractional mode a kernel holding ``s`` shares of a GPU may use ``unit_mem × s`` bytes
of its memory and ``unit_proc × s`` of its streaming multiprocessors (SMs).  The driver
enforces both for processes that reach the GPU through an MPS control daemon:

    CUDA_MPS_PIPE_DIRECTORY            where the agent's control daemon listens
    CUDA_MPS_PINNED_DEVICE_MEM_LIMIT   "<GPU uuid>=<MiB>M,..."   floor(unit_mem × s) per GPU
    CUDA_MPS_ACTIVE_THREAD_PERCENTAGE  ceil(100 × s × unit_proc / SMs), in 1..100

A CUDA allocation beyond the memory limit fails with an out-of-memory error in that
process only; kernels run on at most the given share of the SMs.  One value of the
thread percentage covers all of a kernel's GPUs (MPS takes one per client): a kernel
holding different shares of several GPUs gets the largest of their percentages.

On a real GPU a client gets its out-of-memory error a little below its memory limit, and
MPS grants SMs in pairs (the figures: docs/performance.md, *Enforced GPU fractions*).  The
limits are per process and set from its environment: a process that rewrites its own
``CUDA_MPS_*`` variables before it initialises CUDA can ask for more, up to the MPS
server's defaults (the whole GPU).  docs/plugins.md says what this means for isolation.

One control daemon serves an agent (:class:`MpsDaemon`): the agent starts it with
``nvidia-cuda-mps-control -d`` and its own pipe and log directories, checks it every few
seconds and starts it again when it died.  Kernels outlive the agent, so the daemon does
too: a new agent adopts a daemon that is still running in its pipe directory, and an
agent that stops quits the daemon only when no MPS client is connected.

The limit arithmetic is pure; :class:`MpsDaemon` is the I/O.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import shutil
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal
from pathlib import Path

from ..accelerator import Held
from ..options import AcceleratorOptions

__all__ = [
    "CONTROL_PROGRAM",
    "DRIVER_BIN_DIRS",
    "MPS_LOG_ENV",
    "MPS_MEM_ENV",
    "MPS_PIPE_ENV",
    "MPS_THREADS_ENV",
    "PID_FILE",
    "MpsDaemon",
    "MpsShare",
    "MpsUnavailable",
    "active_thread_percentage",
    "describe_status",
    "find_control_program",
    "mps_client_env",
    "mps_directories",
    "mps_shares",
]

log = logging.getLogger(__name__)

MPS_PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"
MPS_LOG_ENV = "CUDA_MPS_LOG_DIRECTORY"
MPS_MEM_ENV = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
MPS_THREADS_ENV = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
CONTROL_PROGRAM = "nvidia-cuda-mps-control"
# Where drivers put their programs when they are not on PATH (the NVIDIA container
# toolkit and many GPU VMs mount the driver at /usr/local/nvidia).
DRIVER_BIN_DIRS = ("/usr/local/nvidia/bin", "/usr/bin")
PID_FILE = "nvidia-cuda-mps-control.pid"
_MIB = 2**20
# A Unix socket path holds at most 107 bytes; the daemon's longest is
# <pipe>/control_privileged.  Longer pipe directories move to a short one under /tmp.
_SOCKET_PATH_MAX = 100
_LONGEST_SOCKET = "/control_privileged"


class MpsUnavailable(RuntimeError):
    """The MPS control daemon cannot be started (missing program, start failure)."""


@dataclass(frozen=True, slots=True)
class MpsShare:
    """What MPS enforces for one GPU a kernel holds shares of."""

    device_id: str
    memory_bytes: int
    thread_percentage: int


def active_thread_percentage(shares: Decimal, unit_proc: int, processors: int) -> int:
    """``ceil(100 × shares × unit_proc / processors)``, at least 1 and at most 100.

    >>> active_thread_percentage(Decimal("0.25"), 132, 132)
    25
    >>> active_thread_percentage(Decimal("0.5"), 8, 132)   # 4 of 132 SMs: 3.03 % -> 4
    4
    """
    if processors <= 0:
        raise ValueError(f"a GPU's SM count must be > 0 to enforce shares, received {processors}")
    if shares <= 0:
        raise ValueError(f"shares must be > 0, received {shares}")
    percent = (Decimal(100) * shares * unit_proc / processors).to_integral_value(ROUND_CEILING)
    return max(1, min(100, int(percent)))


def mps_shares(held: Sequence[Held], options: AcceleratorOptions) -> tuple[MpsShare, ...]:
    """The MPS limits of the fractional shares in ``held`` (whole devices and MIG
    instances are not shared: they get none), in ``held``'s order."""
    result: list[MpsShare] = []
    for h in held:
        if not h.is_shares:
            continue
        memory, _ = options.limits(h.amount)
        result.append(
            MpsShare(
                h.device.device_id,
                memory,
                active_thread_percentage(h.amount, options.unit_proc, h.device.processors),
            )
        )
    return tuple(result)


def mps_client_env(shares: Sequence[MpsShare], pipe_dir: Path) -> dict[str, str]:
    """A kernel's environment for ``shares`` (empty when it holds no shares).

    Memory limits are whole MiB, rounded down so that a kernel never gets more than its
    share; GPUs are named by uuid, which stays right whatever ``CUDA_VISIBLE_DEVICES``
    orders them by.
    """
    if not shares:
        return {}
    return {
        MPS_PIPE_ENV: str(pipe_dir),
        MPS_MEM_ENV: ",".join(f"{s.device_id}={max(1, s.memory_bytes // _MIB)}M" for s in shares),
        MPS_THREADS_ENV: str(max(s.thread_percentage for s in shares)),
    }


def mps_directories(base: Path, *, tmp_root: Path = Path("/tmp")) -> tuple[Path, Path]:
    """``(pipe_dir, log_dir)`` under ``base``; a base too long for the daemon's sockets
    is replaced by ``<tmp_root>/accelshare-mps-<hash of base>`` (same base, same dir)."""
    pipe = base / "pipe"
    if len(os.fsencode(str(pipe) + _LONGEST_SOCKET)) > _SOCKET_PATH_MAX:
        digest = hashlib.sha256(os.fsencode(str(base))).hexdigest()[:16]
        short = tmp_root / f"accelshare-mps-{digest}"
        return short / "pipe", short / "log"
    return pipe, base / "log"


def find_control_program(
    name: str, *, search_dirs: Sequence[str] = DRIVER_BIN_DIRS, path: str | None = None
) -> Path | None:
    """The control program: ``name`` itself when it is a path, else the first match on
    ``PATH`` then in ``search_dirs``; None when there is none (or it is not executable)."""
    if os.sep in name:
        candidate = Path(name)
        return candidate if os.access(candidate, os.X_OK) and candidate.is_file() else None
    found = shutil.which(name, path=path if path is not None else os.environ.get("PATH", ""))
    if found is not None:
        return Path(found)
    found = shutil.which(name, path=os.pathsep.join(search_dirs))
    return Path(found) if found is not None else None


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not; a zombie child of ours is reaped)."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[:1] != ["Z"]


class MpsDaemon:
    """The agent's MPS control daemon: start or adopt, supervise, quit (I/O).

    ``status()`` is what ``agent info`` shows: ``state`` (``running``, ``restarting``,
    ``failed``, ``stopped``), ``pid``, ``restarts``, ``pipe_dir``, ``log_dir``,
    ``program`` and, after a failure, ``error``.
    """

    def __init__(
        self,
        program: Path,
        pipe_dir: Path,
        log_dir: Path,
        *,
        devices: Sequence[str] = (),
        check_interval_s: float = 2.0,
        start_timeout_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.program = program
        self.pipe_dir = pipe_dir
        self.log_dir = log_dir
        self.devices = tuple(devices)
        self.check_interval_s = check_interval_s
        self.start_timeout_s = start_timeout_s
        self._clock = clock
        self.pid: int | None = None
        self.state = "stopped"
        self.restarts = 0
        self.adopted = False
        self.error = ""
        self._task: asyncio.Task[None] | None = None

    # -- what the daemon and its clients see ----------------------------------------------
    def environment(self) -> dict[str, str]:
        """The control program's environment: ours plus the pipe and log directories and
        the agent's GPUs (uuids, so that clients keep naming them by uuid)."""
        env = dict(os.environ)
        env[MPS_PIPE_ENV] = str(self.pipe_dir)
        env[MPS_LOG_ENV] = str(self.log_dir)
        if self.devices:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(self.devices)
        else:
            env.pop("CUDA_VISIBLE_DEVICES", None)
        return env

    def status(self) -> dict[str, str]:
        status = {
            "state": self.state,
            "pid": str(self.pid) if self.pid is not None else "",
            "restarts": str(self.restarts),
            "adopted": "yes" if self.adopted else "no",
            "program": str(self.program),
            "pipe_dir": str(self.pipe_dir),
            "log_dir": str(self.log_dir),
        }
        if self.error:
            status["error"] = self.error
        return status

    # -- start / adopt --------------------------------------------------------------------
    def _pid_from_file(self) -> int | None:
        try:
            return int((self.pipe_dir / PID_FILE).read_text().strip())
        except (OSError, ValueError):
            return None

    async def start(self) -> None:
        """Adopt a daemon already running in the pipe directory, else start one.

        :class:`MpsUnavailable` names why it could not (the daemon's own log lines
        included)."""
        for folder in (self.pipe_dir, self.log_dir):
            folder.mkdir(parents=True, exist_ok=True)
            # Kernels that run as other users must reach the control socket.
            folder.chmod(0o755)
        pid = self._pid_from_file()
        if pid is not None and _alive(pid):
            self.pid, self.adopted, self.state, self.error = pid, True, "running", ""
            log.info("cuda: adopted the MPS control daemon (pid %d) in %s", pid, self.pipe_dir)
            return
        with contextlib.suppress(FileNotFoundError):
            (self.pipe_dir / PID_FILE).unlink()
        await self._launch()

    async def _launch(self) -> None:
        try:
            proc = await asyncio.create_subprocess_exec(
                str(self.program),
                "-d",
                env=self.environment(),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
            )
            output, _ = await asyncio.wait_for(proc.communicate(), self.start_timeout_s)
        except (OSError, TimeoutError) as e:
            raise self._failed(f"{self.program} -d could not run: {e}") from e
        if proc.returncode != 0:
            text = output.decode(errors="replace").strip()
            raise self._failed(f"{self.program} -d exited with {proc.returncode}: {text}")
        deadline = self._clock() + self.start_timeout_s
        while self._clock() < deadline:
            pid = self._pid_from_file()
            if pid is not None and _alive(pid):
                self.pid, self.adopted, self.state, self.error = pid, False, "running", ""
                log.info(
                    "cuda: MPS control daemon started (pid %d, pipe %s, log %s)",
                    pid,
                    self.pipe_dir,
                    self.log_dir,
                )
                return
            await asyncio.sleep(0.05)
        raise self._failed(f"{self.program} -d started no daemon within {self.start_timeout_s} s")

    def _failed(self, reason: str) -> MpsUnavailable:
        tail = self.log_tail()
        self.state, self.pid = "failed", None
        self.error = reason + (f" (control.log: {tail})" if tail else "")
        return MpsUnavailable(self.error)

    def log_tail(self, lines: int = 3) -> str:
        try:
            text = (self.log_dir / "control.log").read_text(errors="replace")
        except OSError:
            return ""
        return " | ".join(line.strip() for line in text.splitlines()[-lines:] if line.strip())

    # -- commands -------------------------------------------------------------------------
    async def command(self, text: str, *, timeout_s: float = 10.0) -> str:
        """Send one command (``get_server_list``...) to the daemon; its answer."""
        proc = await asyncio.create_subprocess_exec(
            str(self.program),
            env=self.environment(),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        try:
            output, _ = await asyncio.wait_for(proc.communicate(text.encode() + b"\n"), timeout_s)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            raise
        answer = output.decode(errors="replace").strip()
        if proc.returncode != 0:
            raise MpsUnavailable(f"{text!r} failed ({proc.returncode}): {answer}")
        return answer

    async def client_count(self) -> int:
        """How many client processes are connected to the daemon's MPS servers."""
        count = 0
        for server in (await self.command("get_server_list")).split():
            if server.isdigit():
                count += len((await self.command(f"get_client_list {server}")).split())
        return count

    # -- supervision ----------------------------------------------------------------------
    def supervise(self) -> None:
        """Check the daemon every ``check_interval_s`` in the background; start it again
        when it died (waiting 1, 2, 4 ... up to 60 s between failed starts)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._watch())

    async def check(self) -> bool:
        """One check: True if the daemon runs (or was started again now)."""
        if self.pid is not None and _alive(self.pid):
            return True
        if self.state == "running":
            log.warning(
                "cuda: the MPS control daemon (pid %s) died; starting it again%s",
                self.pid,
                f" (control.log: {self.log_tail()})" if self.log_tail() else "",
            )
        self.state, self.pid = "restarting", None
        try:
            await self._launch()
        except MpsUnavailable as e:
            log.warning("cuda: the MPS control daemon could not be started again: %s", e)
            return False
        self.restarts += 1
        return True

    async def _watch(self) -> None:
        backoff = 1.0
        while True:
            await asyncio.sleep(self.check_interval_s)
            try:
                running = await self.check()
            except Exception:  # never let supervision end silently
                log.exception("cuda: checking the MPS control daemon failed")
                running = False
            if running:
                backoff = 1.0
                continue
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 60.0)

    async def close(self) -> None:
        """Stop supervising; quit the daemon when no client is connected (running
        kernels keep it, and the next agent adopts it)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self.pid is None or not _alive(self.pid):
            self.state, self.pid = "stopped", None
            return
        try:
            clients = await self.client_count()
        except (MpsUnavailable, OSError, TimeoutError) as e:
            log.warning("cuda: could not ask the MPS control daemon for its clients: %s", e)
            return
        if clients:
            log.info(
                "cuda: the MPS control daemon (pid %d) keeps running for %d client(s)",
                self.pid,
                clients,
            )
            return
        await self.quit()

    async def quit(self, *, timeout_s: float = 10.0) -> None:
        """``quit`` the daemon; SIGTERM it when it has not gone within ``timeout_s``."""
        pid = self.pid
        with contextlib.suppress(MpsUnavailable, OSError, TimeoutError):
            await self.command("quit", timeout_s=timeout_s)
        deadline = self._clock() + timeout_s
        while pid is not None and _alive(pid) and self._clock() < deadline:
            await asyncio.sleep(0.05)
        if pid is not None and _alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        self.state, self.pid = "stopped", None


def describe_status(status: Mapping[str, str]) -> str:
    """One line for logs and ``agent info``: ``running (pid 123, 0 restarts)``."""
    state = status.get("state", "")
    if state == "running":
        return f"running (pid {status.get('pid')}, {status.get('restarts', '0')} restarts)"
    if status.get("error"):
        return f"{state}: {status['error']}"
    return state
