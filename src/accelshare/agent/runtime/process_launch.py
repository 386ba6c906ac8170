"""Launching the ``process`` runtime's kernels.

How a kernel runs (see ``_launcher.py`` for the supervisor's side)::

    agent ──Popen──> python -I -S _launcher.py launch.json   (exits at once: detached)
                       └─ supervisor (own session; records pids, waits, records exit)
                            └─ kernel (own session + process group, in its cgroups,
                                       rlimits, cwd = the environment's work dir (work/),
                                       stdout+stderr -> logs/kernel.log)
                                 [└─ sandboxed (the agent's default where the host can):
                                     bwrap -> the command in its own namespaces, as the
                                     kernel's unprivileged user (see :mod:`.sandbox`)]

The launcher is started fresh, or is a spare started ahead (waiting for its launch file
on stdin), or is forked from the fork server (:mod:`.forkserver`); whichever it is, it
reports one JSON status line on a pipe once the supervisor runs the kernel.

The kernel runs the environment's command prefix + the spec's ``command`` (none: the
idle command), or ``/bin/sh -c <startup_command>`` for a batch session in any
environment; the environment's bin dir comes first on its ``PATH``.

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
import dataclasses
import json
import logging
import os
import select
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from ..scratch import ScratchDir, read_json
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
from .cgroups import CgroupError, CgroupManager, KernelCgroup
from .environments import ProcessEnvironment
from .errors import KernelStartFailed
from .folder_mounts import (
    FolderMount,
    MountRefused,
    check_host_folder,
    give_to_kernel_user,
)
from .forkserver import ForkServer
from .process_config import NODE_SHARED_DIR, ProcessRuntimeConfig
from .process_stop import kill_pids
from .procfs import find_marked_processes
from .sandbox import OUTBOUND_RESOLV_CONF, folder_target, sandbox_record

__all__ = ["LAUNCHER", "KernelLauncher"]

log = logging.getLogger(__name__)

LAUNCHER = Path(__file__).with_name("_launcher.py")
#: Left where PATH has them (an environment of /bin/sh changes nothing).
_SYSTEM_BIN_DIRS = frozenset({"/bin", "/sbin", "/usr/bin", "/usr/sbin", "/usr/local/bin"})


class KernelLauncher:
    """Starts kernels: the scratch dir, the cgroups, the launch record, the launcher.

    Keeps the fork server (``fork_server``) or the spare launchers
    (``prespawn_launchers``) up until :meth:`close`.
    """

    def __init__(
        self,
        config: ProcessRuntimeConfig,
        *,
        root: Path,
        proc_root: Path,
        cgroups: CgroupManager | None,
        cgroup_ops: CgroupManager,
        runtime_name: str,
    ) -> None:
        self.config = config
        self._root = root
        self._proc_root = proc_root
        self._cgroups = cgroups
        self._cgroup_ops = cgroup_ops
        self._runtime_name = runtime_name
        self._sandbox = config.sandbox
        # The scratch root with its symlinks resolved (on the first sandboxed start, then
        # kept: resolving costs a lstat per path component)
        self._real_root: Path | None = None
        # Outbound sandboxes' /etc/resolv.conf: one file for all (bound read-only).
        self._resolv_conf = self._root / ".sandbox" / "resolv.conf"
        if self._sandbox is not None and self._sandbox.network == "outbound":
            self._resolv_conf.parent.mkdir(mode=0o700, exist_ok=True)
            self._resolv_conf.write_text(OUTBOUND_RESOLV_CONF, encoding="utf-8")
        self._spare_lock = threading.Lock()
        self._spares: list[tuple[subprocess.Popen[bytes], int]] = []  # (launcher, status fd)
        self._closed = False
        self._fork_server: ForkServer | None = None
        if config.fork_server:
            self._fork_server = ForkServer(self._launcher_argv())
            self._fork_server.start()
        self._ensure_spares()

    @property
    def fork_server(self) -> ForkServer | None:
        """The fork server, if one serves."""
        return self._fork_server

    @property
    def spares(self) -> list[tuple[subprocess.Popen[bytes], int]]:
        """The spare launchers waiting, oldest first: (launcher, status fd)."""
        with self._spare_lock:
            return list(self._spares)

    def start(
        self, spec: KernelSpec, environment: ProcessEnvironment, scratch: ScratchDir
    ) -> KernelInfo:
        """Start the kernel (blocking: run it in a worker thread); ``KernelStartFailed``
        with its exit recorded as failed and its cgroups removed if it cannot."""
        kernel_id = spec.kernel_id
        log.info("kernel %s: preparing scratch dir %s", kernel_id, scratch.root)
        cgroup: KernelCgroup | None = None
        try:
            # A directory made here holds nothing yet: its files are created in place
            # (new=...), no temporary file and rename each (see scratch.py).
            new = scratch.prepare()
            scratch.write_resource_txt(spec.resource_txt, new=new)
            scratch.write_config_files(spec.config_files, new=new)
            if self._cgroups is not None:
                cgroup = self._cgroups.create(kernel_id, spec.limits)
            launch = self._launch_record(spec, environment, scratch, cgroup)
            scratch.write_json(scratch.launch_file, launch, new=new)
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
                kill_pids(tuple(marked.get(kernel_id, ())), signal.SIGKILL)
            self._fail(scratch, cgroup, error)
            raise KernelStartFailed(kernel_id, error)
        kernel_pid = int(status["kernel_pid"])
        scratch.add_container_id(spec.resource_txt, str(kernel_pid))
        log.debug("kernel %s: running as pid %d", kernel_id, kernel_pid)  # (the service logs it)
        return KernelInfo(
            kernel_id=kernel_id,
            runtime=self._runtime_name,
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
        else:
            _link_folders(spec.folder_mounts, scratch.work_dir)
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
            "exec_helper": str(self.config.exec_helper) if self.config.exec_helper else None,
            "published_ports": [list(p) for p in spec.published_ports] if sandbox else [],
            "created_at": time.time(),
            # the agent's record of the kernel (state_files.read_kernel_meta)
            "agent": dict(spec.agent_meta),
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
        if scratch.root.parent != self._root:
            root = scratch.root.resolve()
        else:
            if self._real_root is None:
                self._real_root = self._root.resolve(strict=True)
            root = self._real_root / scratch.kernel_id  # (made by prepare(): no link)
        work = root / scratch.work_dir.name  # (made by prepare(): a folder, no link)
        inside = work if cwd == scratch.work_dir else cwd.resolve()
        if inside.is_relative_to(root) and not inside.is_relative_to(work):
            # the kernel would get its own state/ (launch.json, read by the agent as root)
            raise ValueError(
                f"environment {environment.name!r}: a sandboxed kernel's work-dir must lie in"
                f" {{work}} or outside the scratch dir, not {inside}"
            )
        uid, gid = self._sandbox.effective_ids()
        if os.geteuid() == 0:
            # (a work dir of the environment's outside the scratch dir is the operator's:
            # left as it is)
            for folder in {work, inside}:
                if folder.is_relative_to(root):
                    os.chown(folder, uid, gid)
        folders = _prepare_folders(spec.folder_mounts, scratch.work_dir, uid, gid)
        resolv_conf = self._resolv_conf if self._sandbox.network == "outbound" else None
        return sandbox_record(
            self._sandbox,
            kernel_id=spec.kernel_id,
            work_dir=scratch.work_dir,
            config_dir=scratch.config_dir,
            cwd=cwd,
            program=environment.command_prefix[0],
            image_dir=environment.image_dir,
            shared_ro=(self._root / NODE_SHARED_DIR,),
            mounts=spec.mounts,
            device_nodes=spec.device_nodes,
            nvidia=bool(spec.device_requests),
            ipc_host=spec.ipc_host,
            resolv_conf=resolv_conf,
            scratch_root=self._root,
            folder_mounts=folders,
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

    async def close(self) -> None:
        """Stop the fork server and the spare launchers (kernels keep running)."""
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


def _prepare_folders(
    folders: tuple[FolderMount, ...], work_dir: Path, uid: int, gid: int
) -> list[FolderMount]:
    """Check each storage folder's host folder, give its files to the kernel's user and
    make its mount point (``<work>/<x>``, the kernel's) in the work folder; the folders
    with their host paths resolved."""
    prepared: list[FolderMount] = []
    for folder in folders:
        host = check_host_folder(folder)
        give_to_kernel_user(host, uid, gid)
        target = folder_target(folder, work_dir)
        if folder.work_relative() is not None:
            if target.is_symlink() or (target.exists() and not target.is_dir()):
                raise MountRefused(folder.name, f"{target} is not a folder")
            target.mkdir(parents=True, exist_ok=True)
            if os.geteuid() == 0:
                for made in (target, *target.parents):
                    if made == work_dir or not made.is_relative_to(work_dir):
                        break
                    os.chown(made, uid, gid)
        prepared.append(dataclasses.replace(folder, host_path=str(host)))
    return prepared


def _link_folders(folders: tuple[FolderMount, ...], work_dir: Path) -> None:
    """An unsandboxed kernel has no mount namespace of its own: a read-write folder
    under /home/work becomes a symlink in its work folder; the others are refused."""
    for folder in folders:
        host = check_host_folder(folder)
        if folder.read_only:
            raise MountRefused(
                folder.name, "a read-only mount needs the sandbox ([container] sandbox)"
            )
        relative = folder.work_relative()
        if relative is None:
            raise MountRefused(
                folder.name,
                f"kernel_path {folder.kernel_path!r}: an unsandboxed kernel gets folders"
                " under /home/work only",
            )
        link = work_dir / relative
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(host, target_is_directory=True)


def _kernel_argv(spec: KernelSpec, environment: ProcessEnvironment) -> tuple[str, ...]:
    """A startup command runs through the shell whatever the environment (its
    interpreter is first on the kernel's PATH); a command follows the environment's
    prefix."""
    if spec.startup_command is not None:
        return (*STARTUP_SHELL, spec.startup_command)
    return environment.argv(spec.command)


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
