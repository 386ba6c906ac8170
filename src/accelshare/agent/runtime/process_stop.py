"""Stopping the ``process`` runtime's kernels: signals to a kernel's process group, its
cgroups, and loose pids.

A destroy (:meth:`.process.ProcessRuntime.destroy_kernel`) writes
``state/destroy.json``, sends SIGTERM to the kernel's process group (after checking its
identity: pid, start time and ``ACCELSHARE_KERNEL_ID``; a sandboxed kernel's command is
in the group of the sandbox's init), then SIGKILL to the group and to every pid of its
cgroups after the grace period.  An orphan (live marked processes
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
    else to its known pids; a SIGKILL also reaches every pid of its cgroups.

    A sandbox whose init has a session of its own (``sandbox_group`` in ``proc.json``)
    holds the command's process group, led by the init: ``signum`` goes there, and the
    kernel process's group (bwrap outside, which does not ignore SIGTERM) gets only a
    SIGKILL.  While that sandbox is still being set up (its init not yet a group leader)
    the kernel process's group gets ``signum``: bwrap and the sandbox end with it."""
    proc = read_json(scratch.proc_file)
    if proc is not None and "kernel_pid" in proc:
        kernel_pid = int(proc["kernel_pid"])
        if proc.get("sandbox_group") and "sandbox_pid" in proc:
            sandbox_pid = int(proc["sandbox_pid"])
            reached = _signal_group(proc, sandbox_pid, "sandbox_start", scratch, signum, proc_root)
            if reached and signum != signal.SIGKILL:
                return
        _signal_group(proc, kernel_pid, "kernel_start", scratch, signum, proc_root)
    else:
        kill_pids(info.pids, signum)
    if signum == signal.SIGKILL:
        launch = read_json(scratch.launch_file) or {}
        cgroup = KernelCgroup.from_json(launch["cgroup"]) if launch.get("cgroup") else None
        if cgroup is not None:
            cgroup_ops.kill_all(cgroup)


def _signal_group(
    proc: dict[str, object],
    pgid: int,
    start_key: str,
    scratch: ScratchDir,
    signum: int,
    proc_root: Path,
) -> bool:
    """``signum`` to the process group ``pgid`` when its leader is still the recorded
    process of this kernel; False when it is not, or leads no group."""
    start = proc.get(start_key)
    if not is_same_process(
        pgid,
        start if isinstance(start, int) else None,
        kernel_id=scratch.kernel_id,
        proc_root=proc_root,
    ):
        return False
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


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
