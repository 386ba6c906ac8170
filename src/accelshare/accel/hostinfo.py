"""Reading the machine: CPU affinity, NUMA nodes, memory, cgroup limits (v2 and v1).

Every reader takes ``root`` (``/`` on a real machine) so tests can feed a fake tree::

    root/proc/self/cgroup        which cgroup the agent process is in, per hierarchy
    root/proc/self/mountinfo     where each cgroup hierarchy is mounted
    root/proc/meminfo            MemTotal
    root/sys/devices/system/node/node<N>/cpulist

Cgroup limits are the minimum over the agent's own cgroup and its ancestors, in every
hierarchy that has the controller: cgroup v2 (``cpu.max``, ``memory.max``), v1
(``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``, ``memory.limit_in_bytes``), both in a
hybrid layout (as on these machines: v1 cpu/memory plus an empty v2 hierarchy), or
neither.  Missing or unreadable files mean "no limit", never an error.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

__all__ = [
    "CgroupLimits",
    "CgroupMount",
    "current_cpu_affinity",
    "parse_cpu_list",
    "read_cgroup_limits",
    "read_cgroup_mounts",
    "read_mem_total",
    "read_numa_nodes",
    "read_proc_cgroups",
]

_V1_UNLIMITED = 2**62  # v1 reports "no limit" as a page-rounded 2^63 - 1


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except OSError:
        return None


def _under(root: Path, absolute: str) -> Path:
    return root / absolute.lstrip("/")


def current_cpu_affinity() -> frozenset[int]:
    """The cores the agent process may run on (all cores where affinity is unsupported)."""
    if hasattr(os, "sched_getaffinity"):
        return frozenset(os.sched_getaffinity(0))
    return frozenset(range(os.cpu_count() or 1))  # pragma: no cover - non-Linux


def parse_cpu_list(text: str) -> list[int]:
    """``"0-3,8,10-11"`` -> ``[0, 1, 2, 3, 8, 10, 11]`` (the kernel's cpulist format)."""
    cores: list[int] = []
    for raw_part in text.strip().split(","):
        part = raw_part.strip()
        if not part:
            continue
        first, _, last = part.partition("-")
        cores.extend(range(int(first), int(last or first) + 1))
    return cores


def read_numa_nodes(root: Path) -> dict[int, int]:
    """Core -> NUMA node from ``/sys/devices/system/node``; empty when not available."""
    base = _under(root, "/sys/devices/system/node")
    nodes: dict[int, int] = {}
    try:
        entries = sorted(base.iterdir())
    except OSError:
        return nodes
    for entry in entries:
        suffix = entry.name.removeprefix("node")
        if not entry.name.startswith("node") or not suffix.isdigit():
            continue
        text = _read(entry / "cpulist")
        if text is None:
            continue
        try:
            cores = parse_cpu_list(text)
        except ValueError:
            continue
        for core in cores:
            nodes[core] = int(suffix)
    return nodes


def read_mem_total(root: Path) -> int | None:
    """``MemTotal`` of ``/proc/meminfo`` in bytes."""
    text = _read(_under(root, "/proc/meminfo"))
    if text is None:
        return None
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name.strip() == "MemTotal":
            fields = rest.split()
            if fields and fields[0].isdigit():
                factor = 1024 if len(fields) > 1 and fields[1].lower() == "kb" else 1
                return int(fields[0]) * factor
    return None


@dataclass(frozen=True, slots=True)
class CgroupMount:
    """One mounted cgroup hierarchy."""

    version: int  # 1 or 2
    mount_point: str  # absolute path on the machine
    root: str  # the cgroup path mounted there ("/" unless inside a namespace)
    controllers: frozenset[str]  # v1 only; empty for v2


def read_cgroup_mounts(root: Path) -> list[CgroupMount]:
    """Cgroup mounts from ``/proc/self/mountinfo``; conventional paths if it is missing."""
    text = _read(_under(root, "/proc/self/mountinfo"))
    if text is None:
        return _conventional_mounts(root)
    mounts: list[CgroupMount] = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 1:
            continue
        fstype, cgroup_root, mount_point = tail[0], fields[3], fields[4]
        if fstype == "cgroup2":
            mounts.append(CgroupMount(2, mount_point, cgroup_root, frozenset()))
        elif fstype == "cgroup" and len(tail) >= 3:
            controllers = frozenset(tail[2].split(",")) - {"rw", "ro"}
            mounts.append(CgroupMount(1, mount_point, cgroup_root, controllers))
    return mounts


def _conventional_mounts(root: Path) -> list[CgroupMount]:
    base = _under(root, "/sys/fs/cgroup")
    if (base / "cgroup.controllers").exists():
        return [CgroupMount(2, "/sys/fs/cgroup", "/", frozenset())]
    mounts = [
        CgroupMount(1, f"/sys/fs/cgroup/{name}", "/", frozenset(name.split(",")))
        for name in ("cpu", "cpu,cpuacct", "memory")
        if (base / name).is_dir()
    ]
    if (base / "unified" / "cgroup.controllers").exists():
        mounts.append(CgroupMount(2, "/sys/fs/cgroup/unified", "/", frozenset()))
    return mounts


def read_proc_cgroups(root: Path) -> dict[str, str]:
    """``/proc/self/cgroup`` as {v1 controller or "" for v2: cgroup path}."""
    text = _read(_under(root, "/proc/self/cgroup")) or ""
    paths: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if hierarchy == "0" and controllers == "":
            paths[""] = path
        else:
            for controller in controllers.split(","):
                paths[controller] = path
    return paths


def _cgroup_dirs(root: Path, mount: CgroupMount, cgroup_path: str | None) -> list[Path]:
    """The agent's cgroup folder in ``mount`` and its ancestors up to the mount point."""
    top = _under(root, mount.mount_point)
    if cgroup_path is None:
        return [top]
    relative = cgroup_path
    if mount.root != "/" and cgroup_path.startswith(mount.root):
        relative = cgroup_path[len(mount.root) :]
    leaf = _under(top, relative) if relative.strip("/") else top
    if not leaf.is_dir():
        return [top]  # a namespaced view: only the mount's own folder is ours
    dirs = [leaf]
    while dirs[-1] != top and top in dirs[-1].parents:
        dirs.append(dirs[-1].parent)
    return dirs


def _v1_cpu(folder: Path) -> Decimal | None:
    quota, period = _read(folder / "cpu.cfs_quota_us"), _read(folder / "cpu.cfs_period_us")
    if quota is None or period is None:
        return None
    try:
        quota_us, period_us = int(quota), int(period)
    except ValueError:
        return None
    if quota_us <= 0 or period_us <= 0:
        return None
    return Decimal(quota_us) / Decimal(period_us)


def _v2_cpu(folder: Path) -> Decimal | None:
    text = _read(folder / "cpu.max")
    if text is None:
        return None
    fields = text.split()
    if len(fields) != 2 or fields[0] == "max" or not fields[0].isdigit() or not fields[1].isdigit():
        return None
    quota_us, period_us = int(fields[0]), int(fields[1])
    return Decimal(quota_us) / Decimal(period_us) if quota_us > 0 and period_us > 0 else None


def _v1_memory(folder: Path) -> int | None:
    text = _read(folder / "memory.limit_in_bytes")
    if text is None or not text.strip().isdigit():
        return None
    value = int(text)
    return None if value >= _V1_UNLIMITED else value


def _v2_memory(folder: Path) -> int | None:
    text = _read(folder / "memory.max")
    if text is None or not text.strip().isdigit():
        return None
    return int(text)


@dataclass(frozen=True, slots=True)
class CgroupLimits:
    """The tightest cgroup limits on the agent process (None: unlimited)."""

    cpu_cores: Decimal | None = None  # quota / period, e.g. 1.5
    memory_bytes: int | None = None
    versions: frozenset[int] = frozenset()  # which hierarchies contributed a limit


def _min(current: Decimal | int | None, new: Decimal | int | None) -> Decimal | int | None:
    if new is None:
        return current
    return new if current is None else min(current, new)


def read_cgroup_limits(root: Path) -> CgroupLimits:
    """Cgroup CPU and memory limits that apply to the agent process (see module docstring)."""
    paths = read_proc_cgroups(root)
    cpu: Decimal | int | None = None
    memory: Decimal | int | None = None
    versions: set[int] = set()
    for mount in read_cgroup_mounts(root):
        if mount.version == 2:
            dirs = _cgroup_dirs(root, mount, paths.get(""))
            readers = [(_v2_cpu, "cpu"), (_v2_memory, "memory")]
        else:
            controller = "memory" if "memory" in mount.controllers else "cpu"
            if controller not in mount.controllers:
                continue
            dirs = _cgroup_dirs(root, mount, paths.get(controller))
            readers = [(_v1_cpu, "cpu"), (_v1_memory, "memory")]
        for folder in dirs:
            for reader, kind in readers:
                value = reader(folder)
                if value is None:
                    continue
                versions.add(mount.version)
                if kind == "cpu":
                    cpu = _min(cpu, value)
                else:
                    memory = _min(memory, value)
    return CgroupLimits(
        cpu_cores=Decimal(cpu) if cpu is not None else None,
        memory_bytes=int(memory) if memory is not None else None,
        versions=frozenset(versions),
    )
