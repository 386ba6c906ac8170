"""The ``process`` runtime: kernels as local process groups, no daemon needed.

:class:`ProcessRuntime` implements :class:`~.base.KernelRuntime` by composing its parts:

* :mod:`.process_launch` starts a kernel (scratch dir, cgroups, the launch record, a
  launcher: forked from the fork server, a spare, or a fresh one) and tells how a
  kernel runs and how its limits are enforced;
* :mod:`.process_state` reads the kernels' state from their scratch dirs and ``/proc``
  (what survives an agent restart, exits, orphans);
* :mod:`.process_stop` signals a kernel's process group, its cgroups, an orphan's pids;
* :mod:`.process_ports` relays a sandboxed kernel's published app ports;
* :mod:`.process_join` opens terminals and commands in a running kernel.

Its settings are :class:`~.process_config.ProcessRuntimeConfig`.  A kernel's
operations are serialised per kernel (one :class:`asyncio.Lock` each).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import time
from collections.abc import Sequence
from pathlib import Path

from ..scratch import ScratchDir, read_json
from .base import KernelInfo, KernelSpec
from .cgroups import CgroupLayout, CgroupManager, KernelCgroup
from .errors import (
    KernelConflict,
    KernelNotFound,
    KernelStartFailed,
    RuntimeUnavailable,
    UnknownEnvironment,
)
from .execs import PipeExec
from .process_config import NODE_SHARED_DIR, ProcessRuntimeConfig
from .process_join import KernelJoins
from .process_launch import KernelLauncher
from .process_ports import PortRelays
from .process_state import KernelStates
from .process_stop import destroy_orphan, signal_kernel
from .sandbox import SandboxConfig
from .terminal import ProcessTerminal

__all__ = ["ProcessRuntime", "ProcessRuntimeConfig"]

log = logging.getLogger(__name__)


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
        self._locks: dict[str, asyncio.Lock] = {}
        self._states = KernelStates(
            root=self._root,
            proc_root=proc_root,
            cgroup_ops=self._cgroup_ops,
            runtime_name=self.name,
            poll_interval_s=config.poll_interval_s,
        )
        self._relays = PortRelays(
            self._states,
            proc_root=proc_root,
            publish_host=config.publish_host,
            exec_helper=config.exec_helper
            or (self._sandbox.exec_helper if self._sandbox is not None else None),
        )
        self._joins = KernelJoins(
            self._states, environments=config.environments, proc_root=proc_root
        )
        self._launcher = KernelLauncher(
            config,
            root=self._root,
            proc_root=proc_root,
            cgroups=self._cgroups,
            cgroup_ops=self._cgroup_ops,
            runtime_name=self.name,
        )
        log.info(
            "process runtime: scratch root %s, limits via %s%s, kernel exec: %s",
            self._root,
            limits_via,
            (
                f", sandboxed (uid {self._sandbox.effective_ids()[0]},"
                f" network {self._sandbox.network})"
                if self._sandbox
                else ", not sandboxed"
            ),
            self.kernel_exec,
        )

    def _usable_cgroups(self, cgroups: CgroupManager | None) -> tuple[CgroupManager | None, str]:
        """The cgroup manager to use (None: rlimits) and how limits are enforced, in words.

        Cgroups that exist but cannot be written (a read-only ``/sys/fs/cgroup`` in a
        container, an unprivileged agent) are dropped here, once, with a warning, rather
        than failing every create; hierarchies that are only partly writable are kept
        and the missing limits fall back per kernel (see :mod:`.process_launch`).
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
    def kernel_exec(self) -> str:
        """How kernels start, in words: the exec helper (and, sandboxed as root, its
        ``drop`` or ``setpriv``) or a forked Python process."""
        helper = self.config.exec_helper
        how = f"exec helper {helper}" if helper is not None else "python fork"
        if self._sandbox is not None and os.geteuid() == 0:
            drop = self._sandbox.exec_helper
            how += ", user change by " + ("the exec helper" if drop is not None else "setpriv")
        return how

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
        return self._states.scratch(kernel_id)

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
            with self._states.starting(kernel_id):
                info = await asyncio.to_thread(self._launcher.start, spec, environment, scratch)
        if self._sandbox is not None and spec.published_ports:
            try:
                await self._relays.forward(kernel_id)
            except OSError as e:
                await self.destroy_kernel(kernel_id, grace_s=0)
                raise KernelStartFailed(kernel_id, f"cannot publish its app ports: {e}") from e
        return info

    @property
    def publishes_ports(self) -> bool:
        """Whether app ports are published (relayed) rather than listened on by the kernel
        on the host's network: sandboxed kernels have a network of their own."""
        return self._sandbox is not None

    # -- inspect --------------------------------------------------------------------------
    async def get_kernel(self, kernel_id: str) -> KernelInfo:
        return await self._states.get(kernel_id)

    async def scan_kernels(self) -> list[KernelInfo]:
        """Every kernel of the scratch root; a running sandboxed kernel re-adopted from an
        earlier agent gets its app ports relayed again."""
        infos = await asyncio.to_thread(self._states.scan)
        if self._sandbox is not None:
            for info in infos:
                if info.is_running and info.scratch_dir is not None:
                    try:
                        await self._relays.forward(info.kernel_id)
                    except OSError as e:
                        log.warning("kernel %s: cannot relay its app ports: %s", info.kernel_id, e)
        return infos

    # -- wait / destroy -------------------------------------------------------------------
    async def wait_exit(self, kernel_id: str, *, timeout_s: float | None = None) -> KernelInfo:
        """Return once the kernel has exited (``TimeoutError`` after ``timeout_s``)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            info = await self.get_kernel(kernel_id)
            if not info.is_running:
                await self._relays.stop(kernel_id)
                await self._remove_left_cgroup(kernel_id)
                return info
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise TimeoutError(f"kernel {kernel_id} still running after {timeout_s} s")
            await self._states.wait_supervisor(kernel_id, remaining)

    async def _remove_left_cgroup(self, kernel_id: str) -> None:
        """The cgroup of a kernel that has just exited, once its last processes are gone
        (they may still be exiting when the exit is collected); given up after
        ``kill_timeout_s``, when ``cleanup_kernel`` or the next look tries again."""
        deadline = time.monotonic() + self.config.kill_timeout_s
        while not self._states.remove_left_cgroup(kernel_id):
            if time.monotonic() >= deadline:
                log.warning("kernel %s: its cgroup is still busy; left for later", kernel_id)
                return
            await asyncio.sleep(self.config.poll_interval_s)

    async def destroy_kernel(self, kernel_id: str, *, grace_s: float | None = None) -> KernelInfo:
        grace = self.config.stop_grace_s if grace_s is None else grace_s
        # A terminal's shell (and a command of the execute API) has its own session and
        # process group: without cgroups the kernel's SIGTERM/SIGKILL would not reach it,
        # so it ends with the kernel here.
        await self._joins.end(kernel_id)
        async with self._lock(kernel_id):
            info = await self.get_kernel(kernel_id)
            if not info.is_running:
                log.info("kernel %s: already exited", kernel_id)
                return info
            if info.is_orphan:
                return await destroy_orphan(
                    info,
                    grace,
                    poll_interval_s=self.config.poll_interval_s,
                    proc_root=self._proc_root,
                )
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
        signal_kernel(scratch, info, signum, cgroup_ops=self._cgroup_ops, proc_root=self._proc_root)

    # -- terminal / execute ---------------------------------------------------------------
    async def open_terminal(self, kernel_id: str, *, cols: int, rows: int) -> ProcessTerminal:
        """A shell on a pty with the kernel's environment, cwd and limits (see
        :mod:`.terminal`); ``KernelNotFound`` unless the kernel is running."""
        return await self._joins.open_terminal(kernel_id, cols=cols, rows=rows)

    async def exec_in_kernel(self, kernel_id: str, argv: Sequence[str]) -> PipeExec:
        """``argv`` on pipes with the kernel's environment, cwd and limits, in its
        sandbox as its user (see :mod:`.execs`); ``KernelNotFound`` unless it runs."""
        return await self._joins.exec_in_kernel(kernel_id, argv)

    def interpreter_argv(self, kernel_id: str, code: str) -> list[str]:
        """Run ``code`` with the kernel's environment's interpreter: its command prefix
        and the code (``python -c CODE``; ``sh -c CODE`` for a prefix that ends with
        ``-c`` already)."""
        return self._joins.interpreter_argv(kernel_id, code)

    # -- logs / cleanup -------------------------------------------------------------------
    async def get_logs(self, kernel_id: str, *, tail_bytes: int | None = None) -> str:
        scratch = self._scratch(kernel_id)
        if not scratch.exists():
            raise KernelNotFound(kernel_id)
        return await asyncio.to_thread(scratch.read_log_tail, tail_bytes)

    async def cleanup_kernel(self, kernel_id: str) -> None:
        await self._relays.stop(kernel_id)
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
        await self._relays.close()
        await self._launcher.close()
