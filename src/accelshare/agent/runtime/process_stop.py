"""Stopping the ``process`` runtime's kernels: signals to a kernel's process group, its
cgroups, and loose pids.

A destroy (:meth:`.process.ProcessRuntime.destroy_kernel`) writes
``state/destroy.json``, sends SIGTERM to the kernel's process group (after checking its
identity: pid, start time and ``ACCELSHARE_KERNEL_ID``), then SIGKILL to the group and to
every pid of its cgroups after the grace period.  An orphan (live marked processes
without a scratch dir) has no group to signal: its pids are signalled one by one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from dataclasses import replace
from pathlib import Path

from ..scratch import ScratchDir, read_json
from .base import ExitReason, KernelExit, KernelInfo, KernelState
from .cgroups import CgroupManager, KernelCgroup
from .procfs import is_same_process

__all__ = ["destroy_orphan", "kill_pids", "signal_kernel"]

log = logging.getLogger(__name__)


def signal_kernel(
    scratch: ScratchDir,
    info: KernelInfo,
    signum: int,
    *,
    cgroup_ops: CgroupManager,
    proc_root: Path,
) -> None:
    """``signum`` to the kernel's process group (its recorded pid, if still the kernel),
    else to its known pids; a SIGKILL also reaches every pid of its cgroups."""
    proc = read_json(scratch.proc_file)
    if proc is not None and "kernel_pid" in proc:
        kernel_pid = int(proc["kernel_pid"])
        start = proc.get("kernel_start")
        if is_same_process(
            kernel_pid,
            start if isinstance(start, int) else None,
            kernel_id=scratch.kernel_id,
            proc_root=proc_root,
        ):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(kernel_pid, signum)
    else:
        kill_pids(info.pids, signum)
    if signum == signal.SIGKILL:
        launch = read_json(scratch.launch_file) or {}
        cgroup = KernelCgroup.from_json(launch["cgroup"]) if launch.get("cgroup") else None
        if cgroup is not None:
            cgroup_ops.kill_all(cgroup)


async def destroy_orphan(
    info: KernelInfo, grace_s: float, *, poll_interval_s: float, proc_root: Path
) -> KernelInfo:
    """SIGTERM to an orphan's pids, SIGKILL to those left after ``grace_s``."""
    log.info("kernel %s: destroying orphan processes %s", info.kernel_id, info.pids)
    kill_pids(info.pids, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    pids = info.pids
    while pids and time.monotonic() < deadline:
        await asyncio.sleep(poll_interval_s)
        pids = tuple(p for p in pids if is_same_process(p, None, proc_root=proc_root))
    kill_pids(pids, signal.SIGKILL)
    return replace(
        info,
        state=KernelState.EXITED,
        exit=KernelExit(ExitReason.DESTROYED, finished_at=time.time()),
    )


def kill_pids(pids: tuple[int, ...], signum: int) -> None:
    """``signum`` to each pid; one already gone (or not ours) is skipped."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)
