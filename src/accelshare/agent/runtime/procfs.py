"""Reading ``/proc``: is a recorded process still the one we started, and who carries our marks.

A pid alone is not an identity (pids are recycled), so the process runtime records
``(pid, start time in clock ticks since boot)`` and, for the kernel process, checks its
environment for ``ACCELSHARE_KERNEL_ID=<kernel id>`` too.  ``proc_root`` is a parameter
so tests can point it at a fake tree.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

from .base import KERNEL_ID_ENV, RESOURCE_TXT_ENV

__all__ = ["ProcStat", "find_marked_processes", "is_same_process", "read_environ", "read_stat"]


@dataclass(frozen=True, slots=True)
class ProcStat:
    pid: int
    state: str  # R, S, D, Z (zombie), X (dead), ...
    pgid: int
    start_ticks: int

    @property
    def is_alive(self) -> bool:
        return self.state not in ("Z", "X", "x")


def read_stat(pid: int, proc_root: Path = Path("/proc")) -> ProcStat | None:
    """``/proc/<pid>/stat`` parsed; None when the process does not exist."""
    try:
        text = (proc_root / str(pid) / "stat").read_text()
    except (OSError, ValueError):
        return None
    # The command name (field 2) is in parentheses and may contain spaces and ')'.
    _, sep, rest = text.rpartition(")")
    fields = rest.split()
    if not sep or len(fields) < 20:
        return None
    try:
        return ProcStat(pid=pid, state=fields[0], pgid=int(fields[2]), start_ticks=int(fields[19]))
    except ValueError:
        return None


def read_environ(pid: int, proc_root: Path = Path("/proc")) -> dict[str, str] | None:
    """The process's initial environment; None when unreadable (gone, or not ours to read)."""
    try:
        raw = (proc_root / str(pid) / "environ").read_bytes()
    except OSError:
        return None
    env: dict[str, str] = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            env[key.decode(errors="replace")] = value.decode(errors="replace")
    return env


def is_same_process(
    pid: int,
    start_ticks: int | None,
    *,
    kernel_id: str | None = None,
    proc_root: Path = Path("/proc"),
) -> bool:
    """True when ``pid`` is alive, started at ``start_ticks`` and (if given) carries ``kernel_id``.

    The environment check is skipped when the environment cannot be read (another user's
    process without privileges); the start time alone already rules out a recycled pid.
    """
    stat = read_stat(pid, proc_root)
    if stat is None or not stat.is_alive:
        return False
    if start_ticks is not None and stat.start_ticks != start_ticks:
        return False
    if kernel_id is not None:
        env = read_environ(pid, proc_root)
        if env is not None and env.get(KERNEL_ID_ENV) != kernel_id:
            return False
    return True


def find_marked_processes(
    scratch_root: Path, proc_root: Path = Path("/proc")
) -> dict[str, list[int]]:
    """Live processes of kernels under ``scratch_root``: ``{kernel_id: [pid, ...]}`` (sorted).

    A process belongs to a kernel when its environment has ``ACCELSHARE_KERNEL_ID`` and
    an ``ACCELSHARE_RESOURCE_TXT`` below ``scratch_root`` (the kernel and everything it
    spawned), or when its command line names ``<scratch_root>/<id>/state/launch.json``
    (the kernel's supervisor).  One pass over ``/proc``; unreadable entries are skipped.
    """
    root_prefix = str(scratch_root.absolute()).rstrip("/") + "/"
    marker = (KERNEL_ID_ENV + "=").encode()
    found: dict[str, list[int]] = {}
    try:
        entries = os.listdir(proc_root)
    except OSError:
        return found
    for entry in entries:
        if not entry.isdigit():
            continue
        pid = int(entry)
        kernel_id = _kernel_of_supervisor(proc_root / entry, root_prefix)
        if kernel_id is None:
            with contextlib.suppress(OSError):
                raw = (proc_root / entry / "environ").read_bytes()
                if marker in raw:
                    kernel_id = _kernel_of_environ(raw, root_prefix)
        if kernel_id is not None:
            stat = read_stat(pid, proc_root)
            if stat is not None and stat.is_alive:
                found.setdefault(kernel_id, []).append(pid)
    return {kernel_id: sorted(pids) for kernel_id, pids in found.items()}


def _kernel_of_supervisor(proc_dir: Path, root_prefix: str) -> str | None:
    try:
        args = (proc_dir / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    for arg in args:
        text = arg.decode(errors="replace")
        if text.startswith(root_prefix) and text.endswith("/state/launch.json"):
            relative = text[len(root_prefix) :].split("/")
            if len(relative) == 3:
                return relative[0]
    return None


def _kernel_of_environ(raw: bytes, root_prefix: str) -> str | None:
    kernel_id = resource_txt = None
    for item in raw.split(b"\0"):
        key, _, value = item.partition(b"=")
        if key == KERNEL_ID_ENV.encode():
            kernel_id = value.decode(errors="replace")
        elif key == RESOURCE_TXT_ENV.encode():
            resource_txt = value.decode(errors="replace")
    if kernel_id and resource_txt and resource_txt.startswith(root_prefix + kernel_id + "/"):
        return kernel_id
    return None
