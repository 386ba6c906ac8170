"""Reading the ``process`` runtime's kernels from their scratch dirs and ``/proc``.

Nothing lives only in the agent's memory: ``state/launch.json`` (written before the
start), ``state/proc.json`` (pids + start times, by the supervisor) and
``state/exit.json`` (by the supervisor, then completed here with OOM information) are
the kernel's record, so a new :class:`~.process.ProcessRuntime` after an agent restart
re-adopts running kernels (pid + start time + ``ACCELSHARE_KERNEL_ID`` in the process
environment, so a recycled pid is never mistaken for a kernel) and learns the exit code
of kernels that ended while no agent was running.  Live marked processes without a
scratch dir are *orphans* (:meth:`KernelStates.orphan`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..resource_txt import with_container_id
from ..scratch import ScratchDir, list_kernel_ids, read_json
from .base import ExitReason, KernelExit, KernelInfo, KernelState
from .cgroups import CgroupManager, KernelCgroup
from .errors import KernelNotFound
from .procfs import find_marked_processes, is_same_process

__all__ = ["KernelStates"]

log = logging.getLogger(__name__)


class KernelStates:
    """The kernels' state as their scratch dirs and ``/proc`` tell it.

    Judging a kernel also collects a fresh exit once (destroyed or OOM-killed? then its
    cgroup is removed) and records a kernel whose supervisor vanished as lost.
    """

    def __init__(
        self,
        *,
        root: Path,
        proc_root: Path,
        cgroup_ops: CgroupManager,
        runtime_name: str,
        poll_interval_s: float,
    ) -> None:
        self._root = root
        self._proc_root = proc_root
        self._cgroup_ops = cgroup_ops
        self._runtime_name = runtime_name
        self._poll_interval_s = poll_interval_s
        self._starting: set[str] = set()
        self._collect_lock = threading.Lock()
        # kernels whose cgroup was still busy at a removal (``cgroup_left``): the only
        # ones ``remove_left_cgroup`` has to read the records of
        self._cgroups_left: set[str] = set()

    def scratch(self, kernel_id: str) -> ScratchDir:
        """The kernel's scratch dir (``KernelNotFound`` for an id that cannot have one)."""
        try:
            return ScratchDir(self._root, kernel_id)
        except ValueError as e:
            raise KernelNotFound(kernel_id) from e

    @contextlib.contextmanager
    def starting(self, kernel_id: str) -> Iterator[None]:
        """While the kernel starts: no record yet is not a failed start."""
        self._starting.add(kernel_id)
        try:
            yield
        finally:
            self._starting.discard(kernel_id)

    async def get(self, kernel_id: str) -> KernelInfo:
        """One kernel, from its scratch dir, else as an orphan (``KernelNotFound``)."""
        scratch = self.scratch(kernel_id)
        if scratch.exists():
            return self.evaluate(scratch)
        marked = await asyncio.to_thread(find_marked_processes, self._root, self._proc_root)
        if kernel_id in marked:
            return self.orphan(kernel_id, marked[kernel_id])
        raise KernelNotFound(kernel_id)

    def scan(self) -> list[KernelInfo]:
        """Every kernel of the scratch root, then the orphans."""
        marked = find_marked_processes(self._root, self._proc_root)
        infos = []
        kernel_ids = list_kernel_ids(self._root)
        for kernel_id in kernel_ids:
            scratch = ScratchDir(self._root, kernel_id)
            info = self.evaluate(scratch, marked=marked)
            if info.is_running and info.cid is not None:
                self._ensure_cid(scratch, info.cid)
            infos.append(info)
        for kernel_id in sorted(set(marked) - set(kernel_ids)):
            log.warning(
                "kernel %s: live processes %s without a scratch dir (orphan)",
                kernel_id,
                marked[kernel_id],
            )
            infos.append(self.orphan(kernel_id, marked[kernel_id]))
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

    def orphan(self, kernel_id: str, pids: list[int]) -> KernelInfo:
        """Live marked processes without a scratch dir: running, no record, no limits."""
        return KernelInfo(
            kernel_id=kernel_id,
            runtime=self._runtime_name,
            state=KernelState.RUNNING,
            pids=tuple(sorted(pids)),
        )

    def evaluate(
        self, scratch: ScratchDir, *, marked: Mapping[str, list[int]] | None = None
    ) -> KernelInfo:
        """The kernel's state from its files and ``/proc``; collects a fresh exit."""
        kernel_id = scratch.kernel_id
        launch = read_json(scratch.launch_file) or {}
        limits = launch.get("limits_applied")
        base = KernelInfo(
            kernel_id=kernel_id,
            runtime=self._runtime_name,
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

    def remove_left_cgroup(self, kernel_id: str) -> bool:
        """One more try at the cgroup of an exited, collected kernel that was still busy
        at its collection (``cgroup_left``: its last processes were still exiting); True
        when none is left.  The caller retries while it is False (``wait_exit``), so that
        a kernel whose scratch dir is kept (``keep-scratch``) leaves no cgroup behind.
        Only a kernel whose removal failed in this agent has records to read: any other
        returns at once."""
        if kernel_id not in self._cgroups_left:
            return True
        scratch = self.scratch(kernel_id)
        record = read_json(scratch.exit_file)
        launch = read_json(scratch.launch_file) or {}
        cgroup = KernelCgroup.from_json(launch["cgroup"]) if launch.get("cgroup") else None
        if not record or not record.get("cgroup_left") or cgroup is None:
            self._cgroups_left.discard(kernel_id)
            return True
        with self._collect_lock:
            return self._remove_cgroup(scratch, cgroup, record)

    def _remove_cgroup(
        self, scratch: ScratchDir, cgroup: KernelCgroup, record: dict[str, Any]
    ) -> bool:
        """Kill strays that left the process group, then remove the cgroup; a busy one is
        retried at the next look (``cgroup_left`` stays set) or by ``cleanup_kernel``."""
        self._cgroup_ops.kill_all(cgroup)
        if not self._cgroup_ops.remove(cgroup):
            self._cgroups_left.add(scratch.kernel_id)
            return False
        self._cgroups_left.discard(scratch.kernel_id)
        with contextlib.suppress(OSError):
            scratch.write_json(scratch.exit_file, {**record, "cgroup_left": False})
        return True

    async def wait_supervisor(self, kernel_id: str, timeout_s: float | None) -> None:
        """Sleep until the supervisor (or, if it is gone, the kernel process) ends, or timeout.

        Uses a pidfd (readable when the process exits; works for non-children) so that a
        long wait costs nothing; falls back to one poll tick.
        """
        proc = read_json(self.scratch(kernel_id).proc_file) or {}
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
        poll = self._poll_interval_s
        await asyncio.sleep(poll if timeout_s is None else min(poll, timeout_s))


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
