"""The ``process`` runtime: kernels as local process groups, no daemon needed.

How a kernel runs (see ``_launcher.py`` for the supervisor's side)::

    agent ──Popen──> python -I -S _launcher.py launch.json   (exits at once: detached)
                       └─ supervisor (own session; records pids, waits, records exit)
                            └─ kernel (own session + process group, in its cgroups,
                                       rlimits, cwd = the environment's work dir (work/),
                                       stdout+stderr -> logs/kernel.log)
                                 [└─ sandboxed (the agent's default where the host can):
                                     bwrap -> the command in its own namespaces, as the
                                     kernel's unprivileged user (see :mod:`.sandbox`)]

The kernel runs the environment's command prefix + the spec's ``command`` (none: the
idle command), or ``/bin/sh -c <startup_command>`` for a batch session in any
environment; the environment's bin dir comes first on its ``PATH``.

Nothing lives only in the agent's memory: ``state/launch.json`` (written before the
start), ``state/proc.json`` (pids + start times, by the supervisor) and
``state/exit.json`` (by the supervisor, then completed by the runtime with OOM
information) are the kernel's record, so a new :class:`ProcessRuntime` after an agent
restart re-adopts running kernels (pid + start time + ``ACCELSHARE_KERNEL_ID`` in the
process environment, so a recycled pid is never mistaken for a kernel) and learns the
exit code of kernels that ended while no agent was running.

Limits: cgroups (v2, else v1) when a hierarchy is writable, see :mod:`.cgroups`;
otherwise memory through ``RLIMIT_DATA`` (default: private writable memory, close to
what a program really uses) or ``RLIMIT_AS`` (address space: stricter, breaks programs
that reserve large virtual ranges such as JVMs and some CUDA stacks), and a cpuset
through CPU affinity.  CPU time and pids have no per-kernel rlimit: without cgroups
they are reported as not enforced in :attr:`KernelInfo.limits`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from accelshare.accel.types import SESSION_SHARED_DIR

from ..resource_txt import with_container_id
from ..scratch import ScratchDir, list_kernel_ids, read_json
from .base import (
    BACKENDAI_KERNEL_ID_ENV,
    CONFIG_BIN_DIR,
    KERNEL_ID_ENV,
    RESOURCE_TXT_ENV,
    STARTUP_SHELL,
    ExitReason,
    KernelExit,
    KernelInfo,
    KernelSpec,
    KernelState,
)
from .cgroups import CgroupError, CgroupLayout, CgroupManager, KernelCgroup
from .environments import ProcessEnvironment, default_environments
from .errors import (
    KernelConflict,
    KernelNotFound,
    KernelStartFailed,
    RuntimeUnavailable,
    UnknownEnvironment,
)
from .execs import PipeExec
from .forkserver import ForkServer
from .netns_forward import NetnsForwarder
from .procfs import find_marked_processes, is_same_process
from .sandbox import OUTBOUND_RESOLV_CONF, SandboxConfig, sandbox_record
from .terminal import ProcessTerminal, pick_shell

__all__ = ["ProcessRuntime", "ProcessRuntimeConfig"]

log = logging.getLogger(__name__)

LAUNCHER = Path(__file__).with_name("_launcher.py")
#: Agent-wide files every kernel may read (the mock GPUs' statistics), under the scratch
#: root: a sandbox binds this folder read-only, never the scratch root itself.
NODE_SHARED_DIR = SESSION_SHARED_DIR
#: Left where PATH has them (an environment of /bin/sh changes nothing).
_SYSTEM_BIN_DIRS = frozenset({"/bin", "/sbin", "/usr/bin", "/usr/sbin", "/usr/local/bin"})


@dataclass(frozen=True, slots=True)
class ProcessRuntimeConfig:
    """Settings of the process runtime (from ``agent.toml`` ``[container]``).

    * ``use_cgroups``: False forces the rlimit fallback (tests, unprivileged agents).
    * ``cgroup_parent``: relative to the agent's own cgroup unless absolute.
    * ``rlimit_memory``: which rlimit enforces memory when cgroups cannot.
    * ``sandbox``: run each kernel in a bubblewrap sandbox (:mod:`.sandbox`): its own
      namespaces, an unprivileged user, only its own folders; None (the default here;
      the agent turns it on where the host can): the kernel runs as the agent's user on
      the host's filesystem and network.
    * ``publish_host``: where a sandboxed kernel's published app ports listen
      (``KernelSpec.published_ports``: the agent relays each host port to the kernel's
      own port inside its network namespace).  Without a sandbox a kernel listens on
      the host's network itself and publishes nothing.
    * ``passthrough_env``: the agent's own variables a kernel inherits (nothing else
      leaks from the agent's environment).
    """

    scratch_root: Path
    environments: Mapping[str, ProcessEnvironment] = field(default_factory=default_environments)
    use_cgroups: bool = True
    cgroup_parent: str = "accelshare"
    rlimit_memory: Literal["data", "as"] = "data"
    sandbox: SandboxConfig | None = None
    # Sandboxed kernels' app ports are relayed from this host address (the one the app
    # proxy connects to) into their network namespaces (:mod:`.netns_forward`).
    publish_host: str = "127.0.0.1"
    stop_grace_s: float = 5.0
    start_timeout_s: float = 10.0
    kill_timeout_s: float = 10.0
    poll_interval_s: float = 0.02
    passthrough_env: tuple[str, ...] = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TERM")
    launcher_python: str = sys.executable
    # Keep this many launchers started ahead (interpreter up, modules imported), each
    # waiting for a launch file on stdin: a create then skips the ~20 ms Python start.
    # Two cover back-to-back creates (the one used is replaced at once, and needs that
    # long to start).  0 (default) starts a launcher per create; the agent uses 2 and
    # calls close() to stop the spares.
    prespawn_launchers: int = 0
    # One launcher kept up as a fork server (:mod:`.forkserver`): a create forks it
    # instead of starting an interpreter (~1 ms instead of 10-25 ms of CPU).  Spare
    # launchers are not started while it serves; a fresh launcher is the fallback.
    fork_server: bool = False


class ProcessRuntime:
    """Kernels as supervised local process groups.  See the module docstring."""

    def __init__(
        self,
        config: ProcessRuntimeConfig,
        *,
        cgroups: CgroupManager | None = None,
        proc_root: Path = Path("/proc"),
    ) -> None:
        self.config = config
        self._root = Path(config.scratch_root).absolute()
        self._proc_root = proc_root
        if cgroups is None and config.use_cgroups:
            cgroups = CgroupManager(CgroupLayout.detect(proc_root), config.cgroup_parent)
        self._cgroups, limits_via = self._usable_cgroups(cgroups if config.use_cgroups else None)
        # Inspecting/removing a kernel's recorded cgroups needs no layout: kernels made
        # by an earlier agent with cgroups are still collected if this one has none.
        self._cgroup_ops = self._cgroups or CgroupManager(CgroupLayout())
        self._sandbox = config.sandbox
        if self._sandbox is not None and shutil.which(self._sandbox.bwrap) is None:
            raise RuntimeUnavailable(
                f"the sandbox needs bubblewrap ({self._sandbox.bwrap!r}), not found on PATH"
            )
        (self._root / NODE_SHARED_DIR).mkdir(parents=True, exist_ok=True)
        # Outbound sandboxes' /etc/resolv.conf: one file for all (bound read-only).
        self._resolv_conf = self._root / ".sandbox" / "resolv.conf"
        if self._sandbox is not None and self._sandbox.network == "outbound":
            self._resolv_conf.parent.mkdir(mode=0o700, exist_ok=True)
            self._resolv_conf.write_text(OUTBOUND_RESOLV_CONF, encoding="utf-8")
        self._locks: dict[str, asyncio.Lock] = {}
        self._terminals: dict[str, set[ProcessTerminal]] = {}
        self._execs: dict[str, set[PipeExec]] = {}
        self._forwarders: dict[str, NetnsForwarder] = {}
        self._starting: set[str] = set()
        self._collect_lock = threading.Lock()
        self._spare_lock = threading.Lock()
        self._spares: list[tuple[subprocess.Popen[bytes], int]] = []  # (launcher, status fd)
        self._closed = False
        self._fork_server: ForkServer | None = None
        if config.fork_server:
            self._fork_server = ForkServer(self._launcher_argv())
            self._fork_server.start()
        self._ensure_spares()
        log.info(
            "process runtime: scratch root %s, limits via %s%s",
            self._root,
            limits_via,
            (
                f", sandboxed (uid {self._sandbox.effective_ids()[0]},"
                f" network {self._sandbox.network})"
                if self._sandbox
                else ", not sandboxed"
            ),
        )

    def _usable_cgroups(self, cgroups: CgroupManager | None) -> tuple[CgroupManager | None, str]:
        """The cgroup manager to use (None: rlimits) and how limits are enforced, in words.

        Cgroups that exist but cannot be written (a read-only ``/sys/fs/cgroup`` in a
        container, an unprivileged agent) are dropped here, once, with a warning, rather
        than failing every create; hierarchies that are only partly writable are kept
        and the missing limits fall back per kernel (see :meth:`_launch_record`).
        """
        if cgroups is None:
            return None, "rlimits (cgroups disabled: use-cgroups = false)"
        described = cgroups.layout.describe()
        if cgroups.version is None:
            return None, f"rlimits ({described})"
        problems = cgroups.unwritable()
        reasons = "; ".join(f"{c}: {why}" for c, why in sorted(problems.items()))
        if problems and set(problems) >= set(cgroups.parent_dirs()):
            log.warning(
                "process runtime: %s exists but is not writable (%s); kernel limits fall back "
                "to rlimits (memory: RLIMIT_%s, cpuset: CPU affinity; cpu time and pids are "
                "not enforced)",
                described,
                reasons,
                self.config.rlimit_memory.upper(),
            )
            return None, f"rlimits ({described} not writable)"
        if problems:
            log.warning(
                "process runtime: some cgroup hierarchies are not writable (%s); those limits "
                "fall back to rlimits or are not enforced",
                reasons,
            )
        return cgroups, described

    @property
    def name(self) -> str:
        return "process"

    @property
    def scratch_root(self) -> Path:
        return self._root

    @property
    def cgroups(self) -> CgroupManager | None:
        return self._cgroups

    @property
    def sandbox(self) -> SandboxConfig | None:
        return self._sandbox

    @property
    def node_shared_dir(self) -> Path:
        """Where agent-wide files kernels may read go (see ``NODE_SHARED_DIR``)."""
        return self._root / NODE_SHARED_DIR

    async def list_images(self) -> list[str]:
        """The environment names a kernel may ask for (its "images"): those this host
        really has (:meth:`ProcessEnvironment.missing`), re-checked on every call."""
        return sorted(n for n, e in self.config.environments.items() if e.missing() is None)

    def _lock(self, kernel_id: str) -> asyncio.Lock:
        return self._locks.setdefault(kernel_id, asyncio.Lock())

    def _scratch(self, kernel_id: str) -> ScratchDir:
        try:
            return ScratchDir(self._root, kernel_id)
        except ValueError as e:
            raise KernelNotFound(kernel_id) from e

    # -- create ---------------------------------------------------------------------------
    async def create_kernel(self, spec: KernelSpec) -> KernelInfo:
        kernel_id = spec.kernel_id
        try:
            scratch = ScratchDir(self._root, kernel_id)
        except ValueError as e:
            raise KernelStartFailed(kernel_id, str(e)) from e
        environment = self.config.environments.get(spec.image)
        if environment is None:
            raise UnknownEnvironment(spec.image, list(self.config.environments), kernel_id)
        async with self._lock(kernel_id):
            if scratch.exists():
                info = await self.get_kernel(kernel_id)
                if info.is_running:
                    log.info("kernel %s: already running (pid %s)", kernel_id, info.cid)
                    return info
                raise KernelConflict(kernel_id, "has exited and its scratch dir was not cleaned up")
            self._starting.add(kernel_id)
            try:
                info = await asyncio.to_thread(self._start, spec, environment, scratch)
            finally:
                self._starting.discard(kernel_id)
        if self._sandbox is not None and spec.published_ports:
            try:
                await self._forward(kernel_id)
            except OSError as e:
                await self.destroy_kernel(kernel_id, grace_s=0)
                raise KernelStartFailed(kernel_id, f"cannot publish its app ports: {e}") from e
        return info

    @property
    def publishes_ports(self) -> bool:
        """Whether app ports are published (relayed) rather than listened on by the kernel
        on the host's network: sandboxed kernels have a network of their own."""
        return self._sandbox is not None

    async def _forward(self, kernel_id: str) -> None:
        """Relay a running sandboxed kernel's published ports (its ``launch.json``) into
        its network namespace, unless already relayed."""
        if kernel_id in self._forwarders:
            return
        scratch = self._scratch(kernel_id)
        launch = read_json(scratch.launch_file) or {}
        ports = [tuple(p) for p in launch.get("published_ports") or ()]
        proc = read_json(scratch.proc_file) or {}
        pid, start = proc.get("sandbox_pid"), proc.get("sandbox_start")
        if not ports or not isinstance(pid, int):
            return
        if not is_same_process(
            pid, start if isinstance(start, int) else None, proc_root=self._proc_root
        ):
            raise OSError(f"the sandbox of kernel {kernel_id} (pid {pid}) is gone")
        forwarder = await NetnsForwarder.start(
            netns_path=str(self._proc_root / str(pid) / "ns" / "net"),
            listen_host=self.config.publish_host,
            ports=[(int(c), int(h)) for c, h in ports],
        )
        if kernel_id in self._forwarders:  # started meanwhile by another caller
            await forwarder.close()
            return
        self._forwarders[kernel_id] = forwarder
        log.info(
            "kernel %s: app ports relayed %s",
            kernel_id,
            ", ".join(f"{self.config.publish_host}:{h} -> {c}" for c, h in forwarder.ports),
        )

    async def _stop_forwarding(self, kernel_id: str) -> None:
        forwarder = self._forwarders.pop(kernel_id, None)
        if forwarder is not None:
            await forwarder.close()

    def _start(
        self, spec: KernelSpec, environment: ProcessEnvironment, scratch: ScratchDir
    ) -> KernelInfo:
        kernel_id = spec.kernel_id
        log.info("kernel %s: preparing scratch dir %s", kernel_id, scratch.root)
        cgroup: KernelCgroup | None = None
        try:
            scratch.prepare()
            scratch.write_resource_txt(spec.resource_txt)
            scratch.write_config_files(spec.config_files)
            if self._cgroups is not None:
                cgroup = self._cgroups.create(kernel_id, spec.limits)
            launch = self._launch_record(spec, environment, scratch, cgroup)
            scratch.write_json(scratch.launch_file, launch)
            log.info(
                "kernel %s: starting %s (limits: %s)",
                kernel_id,
                launch["argv"],
                launch["limits_applied"] or "none",
            )
            status = self._spawn(scratch)
        except (CgroupError, OSError, ValueError) as e:
            self._fail(scratch, cgroup, f"{type(e).__name__}: {e}")
            raise KernelStartFailed(kernel_id, str(e)) from e
        if not status.get("ok"):
            error = str(status.get("error") or "the launcher did not report")
            if "supervisor_pid" not in status:  # no report at all: it may still start
                marked = find_marked_processes(self._root, self._proc_root)
                _kill_pids(tuple(marked.get(kernel_id, ())), signal.SIGKILL)
            self._fail(scratch, cgroup, error)
            raise KernelStartFailed(kernel_id, error)
        kernel_pid = int(status["kernel_pid"])
        scratch.write_resource_txt(with_container_id(scratch.read_resource_txt(), str(kernel_pid)))
        log.debug("kernel %s: running as pid %d", kernel_id, kernel_pid)  # (the service logs it)
        return KernelInfo(
            kernel_id=kernel_id,
            runtime=self.name,
            state=KernelState.RUNNING,
            cid=str(kernel_pid),
            scratch_dir=scratch.root,
            pids=(kernel_pid,),
            limits=dict(launch["limits_applied"]),
        )

    def _launch_record(
        self,
        spec: KernelSpec,
        environment: ProcessEnvironment,
        scratch: ScratchDir,
        cgroup: KernelCgroup | None,
    ) -> dict[str, Any]:
        limits = spec.limits
        applied = dict(cgroup.applied) if cgroup else {}
        rlimits: list[list[Any]] = []
        if limits.mem_bytes is not None and "memory" not in applied:
            name = "RLIMIT_AS" if self.config.rlimit_memory == "as" else "RLIMIT_DATA"
            rlimits.append([name, limits.mem_bytes, limits.mem_bytes])
            applied["memory"] = f"rlimit {name}={limits.mem_bytes}"
        affinity: list[int] | None = None
        if limits.cpuset_cpus and "cpuset" not in applied:
            affinity = sorted(set(limits.cpuset_cpus))
            applied["cpuset"] = f"sched_setaffinity {affinity}"
        if limits.cpu_count is not None and "cpu" not in applied:
            applied["cpu"] = "not enforced (no writable cgroup cpu controller)"
        if limits.pids_max is not None and "pids" not in applied:
            applied["pids"] = "not enforced (no writable cgroup pids controller)"
        for limit, how in applied.items():
            if how.startswith("not enforced"):
                log.warning("kernel %s: %s limit %s", spec.kernel_id, limit, how)
        argv = _kernel_argv(spec, environment)
        cwd = environment.work_dir_for(
            work=scratch.work_dir, scratch=scratch.root, kernel_id=spec.kernel_id
        )
        sandbox = None
        if self._sandbox is not None:
            sandbox = self._sandbox_record(spec, environment, scratch, cwd)
        return {
            "kernel_id": spec.kernel_id,
            "image": spec.image,
            "argv": list(argv),
            "env": self._kernel_env(spec, environment, scratch),
            "cwd": str(cwd),
            "log_file": str(scratch.log_file),
            "proc_file": str(scratch.proc_file),
            "exit_file": str(scratch.exit_file),
            "procs_files": [str(p) for p in cgroup.procs_files] if cgroup else [],
            "rlimits": rlimits,
            "cpu_affinity": affinity,
            "cgroup": cgroup.to_json() if cgroup else None,
            "limits_applied": applied,
            "sandbox": sandbox,
            "published_ports": [list(p) for p in spec.published_ports] if sandbox else [],
            "created_at": time.time(),
        }

    def _sandbox_record(
        self,
        spec: KernelSpec,
        environment: ProcessEnvironment,
        scratch: ScratchDir,
        cwd: Path,
    ) -> dict[str, Any]:
        """The kernel's sandbox (:func:`.sandbox.sandbox_record`); its work folder (and the
        environment's work dir when it lies in the scratch dir) is given to the kernel's
        user."""
        assert self._sandbox is not None
        inside = cwd.resolve()
        work = scratch.work_dir.resolve()
        if inside.is_relative_to(scratch.root.resolve()) and not inside.is_relative_to(work):
            # the kernel would get its own state/ (launch.json, read by the agent as root)
            raise ValueError(
                f"environment {environment.name!r}: a sandboxed kernel's work-dir must lie in"
                f" {{work}} or outside the scratch dir, not {inside}"
            )
        uid, gid = self._sandbox.effective_ids()
        if os.geteuid() == 0:
            # (a work dir of the environment's outside the scratch dir is the operator's:
            # left as it is)
            for folder in {scratch.work_dir, cwd}:
                if folder.resolve().is_relative_to(scratch.root.resolve()):
                    os.chown(folder, uid, gid)
        resolv_conf = self._resolv_conf if self._sandbox.network == "outbound" else None
        return sandbox_record(
            self._sandbox,
            kernel_id=spec.kernel_id,
            work_dir=scratch.work_dir,
            config_dir=scratch.config_dir,
            cwd=cwd,
            program=environment.command_prefix[0],
            image_dir=environment.image_dir,
            shared_ro=(self.node_shared_dir,),
            mounts=spec.mounts,
            device_nodes=spec.device_nodes,
            nvidia=bool(spec.device_requests),
            ipc_host=spec.ipc_host,
            resolv_conf=resolv_conf,
            scratch_root=self._root,
        )

    def _kernel_env(
        self, spec: KernelSpec, environment: ProcessEnvironment, scratch: ScratchDir
    ) -> dict[str, str]:
        env = {k: os.environ[k] for k in self.config.passthrough_env if k in os.environ}
        env.setdefault("PATH", os.defpath)
        env["HOME"] = str(scratch.work_dir)
        if environment.image_dir is not None:
            env["PATH"] = f"{environment.image_dir / 'bin'}:{env['PATH']}"
        else:
            # The environment's interpreter first: `python` in the session (its terminal,
            # its scripts) is the one the environment names, not the host's default.
            program = Path(environment.command_prefix[0])
            if program.is_absolute() and str(program.parent) not in _SYSTEM_BIN_DIRS:
                env["PATH"] = f"{program.parent}:{env['PATH']}"
        env.update(environment.env)
        env.update(spec.env)
        env[KERNEL_ID_ENV] = spec.kernel_id
        env[BACKENDAI_KERNEL_ID_ENV] = spec.kernel_id
        env[RESOURCE_TXT_ENV] = str(scratch.resource_txt)
        if self._sandbox is not None and spec.published_ports:
            # what an agent restarting without this kernel's scratch dir reads back
            env["ACCELSHARE_PUBLISHED_PORTS"] = ",".join(str(h) for _, h in spec.published_ports)
        if any(f.path.startswith(f"{CONFIG_BIN_DIR}/") for f in spec.config_files):
            # The plugins' tools (the mock nvidia-smi) win over the host's same-named ones.
            env["PATH"] = f"{scratch.config_dir / CONFIG_BIN_DIR}:{env['PATH']}"
        return env

    def _spawn(self, scratch: ScratchDir) -> dict[str, Any]:
        """Start the launcher (or hand the launch file to the spare) and wait for its
        one-line status report."""
        if self._fork_server is not None:
            read_fd, write_fd = os.pipe()
            try:
                handed = self._fork_server.launch(str(scratch.launch_file), write_fd)
            finally:
                os.close(write_fd)
            if handed:
                try:
                    return _read_status(read_fd, self.config.start_timeout_s)
                finally:
                    os.close(read_fd)
            os.close(read_fd)
        spare = self._take_spare()
        launcher: subprocess.Popen[bytes] | None = None
        read_fd = -1
        if spare is not None:
            launcher, read_fd = spare
            try:
                assert launcher.stdin is not None
                launcher.stdin.write(f"{scratch.launch_file}\n".encode())
                launcher.stdin.close()
            except OSError:  # the spare died: start a fresh launcher instead
                os.close(read_fd)
                launcher.kill()
                launcher.wait()
                launcher = None
        if launcher is None:
            read_fd, write_fd = os.pipe()
            try:
                with (scratch.log_dir / "launcher.log").open("ab") as launcher_log:
                    launcher = subprocess.Popen(
                        [*self._launcher_argv(), str(scratch.launch_file), str(write_fd)],
                        pass_fds=(write_fd,),
                        stdin=subprocess.DEVNULL,
                        stdout=launcher_log,
                        stderr=launcher_log,
                        cwd=scratch.root,
                    )
            except BaseException:
                os.close(read_fd)
                raise
            finally:
                os.close(write_fd)
        try:
            # The status first: poll() wakes as soon as it arrives, while Popen.wait
            # with a timeout polls with growing sleeps (1, 2, 4, ... ms) and would add up
            # to ~10 ms to every start.  The launcher has exited by then (it exits right
            # after forking the supervisor, which sends the status).
            status = _read_status(read_fd, self.config.start_timeout_s)
            try:
                launcher.wait(timeout=self.config.start_timeout_s)
            except subprocess.TimeoutExpired:
                launcher.kill()
                launcher.wait()
                return {"ok": False, "error": "the launcher did not exit"}
            return status
        finally:
            os.close(read_fd)
            self._ensure_spares()

    def _launcher_argv(self) -> list[str]:
        return [self.config.launcher_python, "-I", "-S", str(LAUNCHER)]

    def _ensure_spares(self) -> None:
        """Top the spare launchers up to ``prespawn_launchers`` (thread-safe, never raises)."""
        with self._spare_lock:
            wanted = 0 if self._fork_server is not None else self.config.prespawn_launchers
            while len(self._spares) < wanted and not self._closed:
                read_fd, write_fd = os.pipe()
                try:
                    process = subprocess.Popen(
                        # "-": the launch file comes on stdin
                        [*self._launcher_argv(), "-", str(write_fd)],
                        pass_fds=(write_fd,),
                        stdin=subprocess.PIPE,
                        stdout=subprocess.DEVNULL,  # until it knows its kernel's launcher.log
                        stderr=subprocess.DEVNULL,
                        cwd="/",
                    )
                except OSError as e:
                    os.close(read_fd)
                    log.warning("cannot start a spare launcher: %s", e)
                    return
                finally:
                    os.close(write_fd)
                self._spares.append((process, read_fd))

    def _take_spare(self) -> tuple[subprocess.Popen[bytes], int] | None:
        """The oldest spare still waiting (the most likely to be ready), if any."""
        while True:
            with self._spare_lock:
                if not self._spares:
                    return None
                spare = self._spares.pop(0)
            if spare[0].poll() is None:
                return spare
            os.close(spare[1])  # it died waiting

    def _fail(self, scratch: ScratchDir, cgroup: KernelCgroup | None, error: str) -> None:
        log.error("kernel %s: failed to start: %s", scratch.kernel_id, error)
        if read_json(scratch.exit_file) is None:
            exit_ = KernelExit(ExitReason.FAILED, error=error, finished_at=time.time())
            with contextlib.suppress(OSError):
                scratch.write_json(scratch.exit_file, {**exit_.to_json(), "collected": True})
        if cgroup is not None:
            self._cgroup_ops.kill_all(cgroup)
            self._cgroup_ops.remove(cgroup)

    # -- inspect --------------------------------------------------------------------------
    async def get_kernel(self, kernel_id: str) -> KernelInfo:
        scratch = self._scratch(kernel_id)
        if scratch.exists():
            return self._evaluate(scratch)
        marked = await asyncio.to_thread(find_marked_processes, self._root, self._proc_root)
        if kernel_id in marked:
            return self._orphan(kernel_id, marked[kernel_id])
        raise KernelNotFound(kernel_id)

    async def scan_kernels(self) -> list[KernelInfo]:
        """Every kernel of the scratch root; a running sandboxed kernel re-adopted from an
        earlier agent gets its app ports relayed again."""
        infos = await asyncio.to_thread(self._scan)
        if self._sandbox is not None:
            for info in infos:
                if info.is_running and info.scratch_dir is not None:
                    try:
                        await self._forward(info.kernel_id)
                    except OSError as e:
                        log.warning("kernel %s: cannot relay its app ports: %s", info.kernel_id, e)
        return infos

    def _scan(self) -> list[KernelInfo]:
        marked = find_marked_processes(self._root, self._proc_root)
        infos = []
        kernel_ids = list_kernel_ids(self._root)
        for kernel_id in kernel_ids:
            scratch = ScratchDir(self._root, kernel_id)
            info = self._evaluate(scratch, marked=marked)
            if info.is_running and info.cid is not None:
                self._ensure_cid(scratch, info.cid)
            infos.append(info)
        for kernel_id in sorted(set(marked) - set(kernel_ids)):
            log.warning(
                "kernel %s: live processes %s without a scratch dir (orphan)",
                kernel_id,
                marked[kernel_id],
            )
            infos.append(self._orphan(kernel_id, marked[kernel_id]))
        return infos

    def _ensure_cid(self, scratch: ScratchDir, cid: str) -> None:
        """Add ``CID`` if the agent died between start and writing it (never twice).

        An unreadable ``resource.txt`` (garbage bytes too) is left as it is: recovery
        reports the kernel as having an unknown allocation rather than the scan failing.
        """
        with contextlib.suppress(OSError, UnicodeDecodeError):
            text = scratch.read_resource_txt()
            updated = with_container_id(text, cid)
            if updated != text:
                log.info("kernel %s: adding CID=%s to resource.txt", scratch.kernel_id, cid)
                scratch.write_resource_txt(updated)

    def _orphan(self, kernel_id: str, pids: list[int]) -> KernelInfo:
        return KernelInfo(
            kernel_id=kernel_id,
            runtime=self.name,
            state=KernelState.RUNNING,
            pids=tuple(sorted(pids)),
        )

    def _evaluate(
        self, scratch: ScratchDir, *, marked: Mapping[str, list[int]] | None = None
    ) -> KernelInfo:
        """The kernel's state from its files and ``/proc``; collects a fresh exit."""
        kernel_id = scratch.kernel_id
        launch = read_json(scratch.launch_file) or {}
        limits = launch.get("limits_applied")
        base = KernelInfo(
            kernel_id=kernel_id,
            runtime=self.name,
            state=KernelState.RUNNING,
            scratch_dir=scratch.root,
            limits=dict(limits) if isinstance(limits, dict) else {},
        )
        exit_data = read_json(scratch.exit_file)
        proc = read_json(scratch.proc_file)
        if exit_data is None and proc is not None:
            if self._proc_alive(kernel_id, proc):
                pid = int(proc["kernel_pid"])
                return replace(base, cid=str(pid), pids=(pid,))
            exit_data = read_json(scratch.exit_file)  # the supervisor may have just written it
            if exit_data is None:
                exit_data = self._record_lost(scratch, "the supervisor ended without a record")
        if exit_data is None:
            if kernel_id in self._starting:
                return base
            if marked is None:
                marked = find_marked_processes(self._root, self._proc_root)
            if kernel_id in marked:  # an agent died while starting it; the launcher goes on
                return replace(base, pids=tuple(sorted(marked[kernel_id])))
            exit_data = self._record_lost(scratch, "it never reported a start", failed=True)
        exit_ = self._collect(scratch, launch, exit_data)
        cid = str(proc["kernel_pid"]) if proc and "kernel_pid" in proc else None
        return replace(base, state=KernelState.EXITED, cid=cid, exit=exit_)

    def _proc_alive(self, kernel_id: str, proc: Mapping[str, Any]) -> bool:
        try:
            kernel_pid, supervisor_pid = int(proc["kernel_pid"]), int(proc["supervisor_pid"])
        except (KeyError, TypeError, ValueError):
            return False
        kernel_start, supervisor_start = proc.get("kernel_start"), proc.get("supervisor_start")
        return is_same_process(
            kernel_pid,
            kernel_start if isinstance(kernel_start, int) else None,
            kernel_id=kernel_id,
            proc_root=self._proc_root,
        ) or is_same_process(
            supervisor_pid,
            supervisor_start if isinstance(supervisor_start, int) else None,
            proc_root=self._proc_root,
        )

    def _record_lost(
        self, scratch: ScratchDir, why: str, *, failed: bool = False
    ) -> dict[str, Any]:
        reason = ExitReason.FAILED if failed else ExitReason.LOST
        log.warning("kernel %s: %s (%s)", scratch.kernel_id, reason.value, why)
        data = KernelExit(reason, error=why, finished_at=time.time()).to_json()
        with contextlib.suppress(OSError):
            scratch.write_json(scratch.exit_file, data)
        return data

    def _collect(
        self, scratch: ScratchDir, launch: Mapping[str, Any], exit_data: dict[str, Any]
    ) -> KernelExit:
        """Complete a fresh exit record once: destroyed or OOM-killed?  Then drop the cgroup.

        Serialised (scans run in a worker thread) and re-read under the lock: the OOM
        counters vanish with the cgroup, so only the first collector may judge them.
        """
        cgroup = KernelCgroup.from_json(launch["cgroup"]) if launch.get("cgroup") else None
        with self._collect_lock:
            exit_data = read_json(scratch.exit_file) or exit_data
            if exit_data.get("collected"):
                if exit_data.get("cgroup_left") and cgroup is not None:
                    self._remove_cgroup(scratch, cgroup, exit_data)
                return KernelExit.from_json(exit_data)
            exit_ = KernelExit.from_json(exit_data)
            oom_kills = 0
            if cgroup is not None:
                oom_kills = self._cgroup_ops.oom_status(cgroup).oom_kills
            reason = exit_.reason
            if scratch.state_dir.joinpath("destroy.json").exists():
                reason = ExitReason.DESTROYED
            elif oom_kills and exit_.signal == signal.SIGKILL:
                reason = ExitReason.OOM_KILLED
            exit_ = replace(exit_, reason=reason, oom_killed=exit_.oom_killed or oom_kills > 0)
            log.info(
                "kernel %s: %s (exit code %s%s)",
                scratch.kernel_id,
                exit_.reason.value,
                exit_.exit_code,
                ", out of memory" if exit_.oom_killed else "",
            )
            record = {**exit_.to_json(), "collected": True, "cgroup_left": cgroup is not None}
            with contextlib.suppress(OSError):
                scratch.write_json(scratch.exit_file, record)
            if cgroup is not None:
                self._remove_cgroup(scratch, cgroup, record)
            return exit_

    def _remove_cgroup(
        self, scratch: ScratchDir, cgroup: KernelCgroup, record: dict[str, Any]
    ) -> None:
        """Kill strays that left the process group, then remove the cgroup; a busy one is
        retried at the next look (``cgroup_left`` stays set) or by ``cleanup_kernel``."""
        self._cgroup_ops.kill_all(cgroup)
        if self._cgroup_ops.remove(cgroup):
            with contextlib.suppress(OSError):
                scratch.write_json(scratch.exit_file, {**record, "cgroup_left": False})

    # -- wait / destroy -------------------------------------------------------------------
    async def wait_exit(self, kernel_id: str, *, timeout_s: float | None = None) -> KernelInfo:
        """Return once the kernel has exited (``TimeoutError`` after ``timeout_s``)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            info = await self.get_kernel(kernel_id)
            if not info.is_running:
                await self._stop_forwarding(kernel_id)
                return info
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise TimeoutError(f"kernel {kernel_id} still running after {timeout_s} s")
            await self._wait_supervisor(kernel_id, remaining)

    async def _wait_supervisor(self, kernel_id: str, timeout_s: float | None) -> None:
        """Sleep until the supervisor (or, if it is gone, the kernel process) ends, or timeout.

        Uses a pidfd (readable when the process exits; works for non-children) so that a
        long wait costs nothing; falls back to one poll tick.
        """
        proc = read_json(self._scratch(kernel_id).proc_file) or {}
        for pid_key, start_key, marked_id in (
            ("supervisor_pid", "supervisor_start", None),
            ("kernel_pid", "kernel_start", kernel_id),
        ):
            pid, start = proc.get(pid_key), proc.get(start_key)
            if not isinstance(pid, int) or not hasattr(os, "pidfd_open"):
                continue
            try:
                pidfd = os.pidfd_open(pid)
            except OSError:
                continue
            try:
                # Checked after opening: the pidfd now pins this very process.
                if is_same_process(
                    pid,
                    start if isinstance(start, int) else None,
                    kernel_id=marked_id,
                    proc_root=self._proc_root,
                ):
                    await _wait_readable(pidfd, timeout_s)
                    return
            finally:
                os.close(pidfd)
        poll = self.config.poll_interval_s
        await asyncio.sleep(poll if timeout_s is None else min(poll, timeout_s))

    async def destroy_kernel(self, kernel_id: str, *, grace_s: float | None = None) -> KernelInfo:
        grace = self.config.stop_grace_s if grace_s is None else grace_s
        # A terminal's shell has its own session and process group: without cgroups the
        # kernel's SIGTERM/SIGKILL would not reach it, so it ends with the kernel here.
        for terminal in list(self._terminals.pop(kernel_id, ())):
            await terminal.close()
        for command in list(self._execs.pop(kernel_id, ())):  # the same for the execute API's
            await command.kill()
        async with self._lock(kernel_id):
            info = await self.get_kernel(kernel_id)
            if not info.is_running:
                log.info("kernel %s: already exited", kernel_id)
                return info
            if info.is_orphan:
                return await self._destroy_orphan(info, grace)
            scratch = self._scratch(kernel_id)
            scratch.write_json(scratch.state_dir / "destroy.json", {"requested_at": time.time()})
            log.info("kernel %s: SIGTERM (grace %.1f s)", kernel_id, grace)
            self._signal(scratch, info, signal.SIGTERM)
            with contextlib.suppress(TimeoutError):
                return await self.wait_exit(kernel_id, timeout_s=grace)
            log.info("kernel %s: still running after %.1f s, SIGKILL", kernel_id, grace)
            self._signal(scratch, info, signal.SIGKILL)
            return await self.wait_exit(kernel_id, timeout_s=self.config.kill_timeout_s)

    def _signal(self, scratch: ScratchDir, info: KernelInfo, signum: int) -> None:
        proc = read_json(scratch.proc_file)
        if proc is not None and "kernel_pid" in proc:
            kernel_pid = int(proc["kernel_pid"])
            start = proc.get("kernel_start")
            if is_same_process(
                kernel_pid,
                start if isinstance(start, int) else None,
                kernel_id=scratch.kernel_id,
                proc_root=self._proc_root,
            ):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(kernel_pid, signum)
        else:
            _kill_pids(info.pids, signum)
        if signum == signal.SIGKILL:
            launch = read_json(scratch.launch_file) or {}
            cgroup = KernelCgroup.from_json(launch["cgroup"]) if launch.get("cgroup") else None
            if cgroup is not None:
                self._cgroup_ops.kill_all(cgroup)

    async def _destroy_orphan(self, info: KernelInfo, grace_s: float) -> KernelInfo:
        log.info("kernel %s: destroying orphan processes %s", info.kernel_id, info.pids)
        _kill_pids(info.pids, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        pids = info.pids
        while pids and time.monotonic() < deadline:
            await asyncio.sleep(self.config.poll_interval_s)
            pids = tuple(p for p in pids if is_same_process(p, None, proc_root=self._proc_root))
        _kill_pids(pids, signal.SIGKILL)
        return replace(
            info,
            state=KernelState.EXITED,
            exit=KernelExit(ExitReason.DESTROYED, finished_at=time.time()),
        )

    # -- terminal -------------------------------------------------------------------------
    async def _exec_target(self, kernel_id: str) -> tuple[Path, int | None]:
        """Where a terminal or a command joins a running kernel: its ``launch.json``
        and its sandbox's init (None: not sandboxed); ``KernelNotFound`` unless the
        kernel is running."""
        info = await self.get_kernel(kernel_id)
        scratch = self._scratch(kernel_id)
        if info.state is not KernelState.RUNNING or not scratch.launch_file.exists():
            raise KernelNotFound(kernel_id)
        launch = read_json(scratch.launch_file) or {}
        if not launch.get("sandbox"):
            return scratch.launch_file, None
        # the sandbox's init: what joins it enters its namespaces, as the kernel's user
        proc = read_json(scratch.proc_file) or {}
        pid, start = proc.get("sandbox_pid"), proc.get("sandbox_start")
        if not isinstance(pid, int) or not is_same_process(
            pid, start if isinstance(start, int) else None, proc_root=self._proc_root
        ):
            raise KernelNotFound(kernel_id)
        return scratch.launch_file, pid

    async def open_terminal(self, kernel_id: str, *, cols: int, rows: int) -> ProcessTerminal:
        """A shell on a pty with the kernel's environment, cwd and limits (see
        :mod:`.terminal`); ``KernelNotFound`` unless the kernel is running."""
        launch_file, namespace_pid = await self._exec_target(kernel_id)
        terminal = await asyncio.to_thread(
            ProcessTerminal.spawn,
            launch_file,
            cols=cols,
            rows=rows,
            shell=pick_shell(),
            namespace_pid=namespace_pid,
        )
        open_ = self._terminals.setdefault(kernel_id, set())
        open_.add(terminal)
        terminal.on_close = open_.discard
        return terminal

    async def exec_in_kernel(self, kernel_id: str, argv: Sequence[str]) -> PipeExec:
        """``argv`` on pipes with the kernel's environment, cwd and limits, in its
        sandbox as its user (see :mod:`.execs`); ``KernelNotFound`` unless it runs."""
        launch_file, namespace_pid = await self._exec_target(kernel_id)
        command = await PipeExec.spawn(launch_file, argv, namespace_pid=namespace_pid)
        running = self._execs.setdefault(kernel_id, set())
        running.add(command)
        command.on_end = running.discard
        return command

    def interpreter_argv(self, kernel_id: str, code: str) -> list[str]:
        """Run ``code`` with the kernel's environment's interpreter: its command prefix
        and the code (``python -c CODE``; ``sh -c CODE`` for a prefix that ends with
        ``-c`` already)."""
        launch = read_json(self._scratch(kernel_id).launch_file) or {}
        environment = self.config.environments.get(str(launch.get("image", "")))
        prefix = list(environment.command_prefix) if environment else [sys.executable]
        return [*prefix, code] if prefix[-1] == "-c" else [*prefix, "-c", code]

    # -- logs / cleanup -------------------------------------------------------------------
    async def get_logs(self, kernel_id: str, *, tail_bytes: int | None = None) -> str:
        scratch = self._scratch(kernel_id)
        if not scratch.exists():
            raise KernelNotFound(kernel_id)
        return await asyncio.to_thread(scratch.read_log_tail, tail_bytes)

    async def cleanup_kernel(self, kernel_id: str) -> None:
        await self._stop_forwarding(kernel_id)
        async with self._lock(kernel_id):
            info = await self.get_kernel(kernel_id)
            if info.is_running:
                raise KernelConflict(kernel_id, "is still running; destroy it first")
            scratch = self._scratch(kernel_id)
            launch = read_json(scratch.launch_file) or {}
            cgroup = KernelCgroup.from_json(launch["cgroup"]) if launch.get("cgroup") else None
            if cgroup is not None:
                deadline = time.monotonic() + self.config.kill_timeout_s
                while not self._cgroup_ops.remove(cgroup) and time.monotonic() < deadline:
                    self._cgroup_ops.kill_all(cgroup)
                    await asyncio.sleep(self.config.poll_interval_s)
            await asyncio.to_thread(scratch.remove)
            log.info("kernel %s: scratch dir removed", kernel_id)
        self._locks.pop(kernel_id, None)

    async def close(self) -> None:
        """Stop the fork server and the spare launchers, if any; kernels keep running
        without the agent (their app ports are relayed again by the next agent's
        :meth:`scan_kernels`)."""
        for kernel_id in list(self._forwarders):
            await self._stop_forwarding(kernel_id)
        if self._fork_server is not None:
            await asyncio.to_thread(self._fork_server.close)
        with self._spare_lock:
            self._closed = True
            spares, self._spares = self._spares, []
        for process, read_fd in spares:
            if process.stdin is not None:
                with contextlib.suppress(OSError):
                    process.stdin.close()  # EOF: the spare exits without launching
            try:
                await asyncio.to_thread(process.wait, 5)
            except subprocess.TimeoutExpired:
                process.kill()
                await asyncio.to_thread(process.wait)
            os.close(read_fd)


def _kernel_argv(spec: KernelSpec, environment: ProcessEnvironment) -> tuple[str, ...]:
    """A startup command runs through the shell whatever the environment (its
    interpreter is first on the kernel's PATH); a command follows the environment's
    prefix."""
    if spec.startup_command is not None:
        return (*STARTUP_SHELL, spec.startup_command)
    return environment.argv(spec.command)


def _kill_pids(pids: tuple[int, ...], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)


async def _wait_readable(fd: int, timeout_s: float | None) -> None:
    loop = asyncio.get_running_loop()
    ready = loop.create_future()

    def on_ready() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(fd, on_ready)
    try:
        await asyncio.wait_for(ready, timeout_s)
    except TimeoutError:
        pass
    finally:
        loop.remove_reader(fd)


def _read_status(fd: int, timeout_s: float) -> dict[str, Any]:
    """One JSON line from the launcher; ``{"ok": False, ...}`` on EOF, junk or timeout."""
    deadline = time.monotonic() + timeout_s
    data = b""
    # poll(), not select(): an agent watching many kernels holds more than 1024 fds
    # (a pidfd per kernel), and select() refuses any fd above FD_SETSIZE.
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    while b"\n" not in data:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return {"ok": False, "error": f"the launcher did not report within {timeout_s} s"}
        if not poller.poll(remaining * 1000):
            continue
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        data += chunk
    try:
        status = json.loads(data.decode(errors="replace").split("\n", 1)[0])
    except ValueError:
        status = None
    if not isinstance(status, dict):
        return {"ok": False, "error": "the launcher exited without reporting (see launcher.log)"}
    return status
