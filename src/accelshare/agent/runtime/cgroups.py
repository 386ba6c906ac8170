"""Per-kernel cgroups for the process runtime: v2, v1, or none.

Where the controllers are is read from ``/proc/self/mountinfo`` and ``/proc/self/cgroup``
(:meth:`CgroupLayout.detect`).  cgroup v2 is used when its hierarchy has controllers;
otherwise the v1 hierarchies of ``memory``, ``cpu``, ``cpuset`` and ``pids``; otherwise
nothing, and the runtime falls back to rlimits.  (A hybrid host such as this project's
build machines mounts an empty v2 hierarchy next to v1 controllers: that is v1.)

Each kernel gets ``<parent>/<kernel_id>`` in every hierarchy it uses.  ``parent`` is
``accelshare`` by default, *relative to the agent's own cgroup* (so kernels stay inside
whatever budget the agent runs in); an absolute parent such as ``/accelshare`` is taken
from the hierarchy root (use that under systemd, where the service's own cgroup is torn
down with the service, and on cgroup v2, where a cgroup holding the agent itself cannot
enable controllers for children — the "no internal processes" rule).

Limits written (v1 / v2)::

    memory  memory.limit_in_bytes (+ memory.memsw.limit_in_bytes: no swap) / memory.max,
            memory.swap.max = 0, memory.oom.group = 1
    cpu     cpu.cfs_quota_us = cores x cpu.cfs_period_us, cpu.shares = 1024 x cores /
            cpu.max = "<quota> <period>", cpu.weight = 100 x cores
    cpuset  cpuset.cpus (+ cpuset.mems copied from the parent) / cpuset.cpus
    pids    pids.max

The process joins its cgroup *before* it execs the kernel command: the launcher writes
its own pid into every ``cgroup.procs`` of :attr:`KernelCgroup.procs_files`.

A hierarchy that cannot be written (read-only cgroupfs, no permission) just drops out:
:attr:`KernelCgroup.applied` says which limits the cgroups enforce and the runtime
enforces the others another way (or reports them as not enforced).
"""

from __future__ import annotations

import contextlib
import enum
import errno
import logging
import os
import signal
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import ROUND_FLOOR, Decimal
from pathlib import Path
from typing import Any

from .base import ResourceLimits

__all__ = [
    "CONTROLLERS",
    "CgroupError",
    "CgroupLayout",
    "CgroupManager",
    "CgroupVersion",
    "KernelCgroup",
    "OomStatus",
]

log = logging.getLogger(__name__)

CONTROLLERS = ("memory", "cpu", "cpuset", "pids")
_CPU_PERIOD_US = 100_000  # also the kernel's default cfs period of a new group
_DEFAULT_CPU_SHARES = 1024  # cpu.shares of a new v1 group
_MIN_CPU_QUOTA_US = 1_000


class CgroupVersion(enum.StrEnum):
    V1 = "v1"
    V2 = "v2"


class CgroupError(OSError):
    """A limit could not be written into a cgroup that exists (a bad value, not a permission)."""


def _unescape_mount_path(text: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as ``\\ooo``."""
    return (text.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n")).replace(
        "\\134", "\\"
    )


def _relative(own_path: str, mount_root: str) -> str:
    """Our cgroup path as seen under a mount whose root is ``mount_root``."""
    if mount_root in ("", "/"):
        return own_path
    if own_path == mount_root or own_path.startswith(mount_root.rstrip("/") + "/"):
        return own_path[len(mount_root.rstrip("/")) :] or "/"
    return "/"  # a cgroup namespace already rooted us at the mount


@dataclass(frozen=True, slots=True)
class CgroupLayout:
    """Which cgroup hierarchy holds which controller on this host, and where we sit in it.

    ``v2_mount`` + ``v2_self``: the unified hierarchy and our path in it (``v2_controllers``
    are those its root offers).  ``v1_mounts`` / ``v1_self``: controller -> mount point /
    our path.  Build it with :meth:`detect`, or by hand in tests (a fake tree in a
    temporary directory works the same way, minus the kernel enforcing anything).
    """

    v2_mount: Path | None = None
    v2_self: str = "/"
    v2_controllers: frozenset[str] = frozenset()
    v1_mounts: Mapping[str, Path] = field(default_factory=dict)
    v1_self: Mapping[str, str] = field(default_factory=dict)

    @property
    def version(self) -> CgroupVersion | None:
        if self.v2_mount is not None and self.v2_controllers & set(CONTROLLERS):
            return CgroupVersion.V2
        if self.v1_mounts:
            return CgroupVersion.V1
        return None

    def describe(self) -> str:
        version = self.version
        if version is CgroupVersion.V2:
            return f"cgroup v2 at {self.v2_mount} ({', '.join(sorted(self.v2_controllers))})"
        if version is CgroupVersion.V1:
            return "cgroup v1 (" + ", ".join(sorted(self.v1_mounts)) + ")"
        return "no usable cgroup hierarchy"

    @classmethod
    def detect(cls, proc_root: Path = Path("/proc")) -> CgroupLayout:
        """Read mountinfo and our own cgroup membership; never raises (empty layout)."""
        try:
            mountinfo = (proc_root / "self" / "mountinfo").read_text()
            membership = (proc_root / "self" / "cgroup").read_text()
        except OSError:
            return cls()
        own_v1: dict[str, str] = {}
        own_v2 = "/"
        for line in membership.splitlines():
            parts = line.split(":", 2)
            if len(parts) != 3:
                continue
            _, controllers, path = parts
            if controllers == "":
                own_v2 = path
            for controller in controllers.split(","):
                own_v1[controller] = path
        v2_mount: Path | None = None
        v2_root = "/"
        v1_mounts: dict[str, Path] = {}
        v1_roots: dict[str, str] = {}
        for line in mountinfo.splitlines():
            left, sep, right = line.partition(" - ")
            fields, tail = left.split(), right.split()
            if not sep or len(fields) < 5 or len(tail) < 3:
                continue
            fstype, super_options = tail[0], tail[2].split(",")
            root, mount_point = fields[3], Path(_unescape_mount_path(fields[4]))
            if fstype == "cgroup2" and v2_mount is None:
                v2_mount, v2_root = mount_point, root
            elif fstype == "cgroup":
                for controller in CONTROLLERS:
                    if controller in super_options and controller not in v1_mounts:
                        v1_mounts[controller] = mount_point
                        v1_roots[controller] = root
        v2_controllers: frozenset[str] = frozenset()
        if v2_mount is not None:
            with contextlib.suppress(OSError):
                v2_controllers = frozenset((v2_mount / "cgroup.controllers").read_text().split())
        return cls(
            v2_mount=v2_mount,
            v2_self=_relative(own_v2, v2_root),
            v2_controllers=v2_controllers,
            v1_mounts=v1_mounts,
            v1_self={c: _relative(own_v1.get(c, "/"), v1_roots[c]) for c in v1_mounts},
        )


@dataclass(frozen=True, slots=True)
class OomStatus:
    """Memory-limit events of a kernel's cgroup: OOM kills and times the limit was hit."""

    oom_kills: int
    limit_hits: int


@dataclass(frozen=True, slots=True)
class KernelCgroup:
    """One kernel's cgroups: controller -> directory, and what each enforces.

    Stored in ``state/launch.json`` so that a restarted agent finds the same cgroups.
    ``applied`` maps a limit (``memory``, ``cpu``, ``cpuset``, ``pids``) to a short
    description such as ``"cgroup-v1 memory.limit_in_bytes=67108864"``.
    """

    version: CgroupVersion
    dirs: Mapping[str, Path]
    applied: Mapping[str, str] = field(default_factory=dict)

    @property
    def procs_files(self) -> tuple[Path, ...]:
        """Where a process writes its pid to join (one per distinct directory)."""
        unique = dict.fromkeys(self.dirs.values())
        return tuple(directory / "cgroup.procs" for directory in unique)

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version.value,
            "dirs": {c: str(d) for c, d in self.dirs.items()},
            "applied": dict(self.applied),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> KernelCgroup | None:
        try:
            return cls(
                version=CgroupVersion(data["version"]),
                dirs={str(c): Path(str(d)) for c, d in dict(data["dirs"]).items()},
                applied={str(k): str(v) for k, v in dict(data.get("applied", {})).items()},
            )
        except (KeyError, TypeError, ValueError):
            return None


def _write(path: Path, value: str) -> None:
    """One write of ``value`` (cgroupfs takes a value per write; no buffered file object:
    three syscalls, not seven)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, value.encode())
        finally:
            os.close(fd)
    except OSError as e:
        raise CgroupError(e.errno, f"cannot write {value!r} to {path}: {e.strerror}") from e


def _read(path: Path) -> str:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            chunks = []
            while chunk := os.read(fd, 65536):
                chunks.append(chunk)
        finally:
            os.close(fd)
        return b"".join(chunks).decode(errors="replace")
    except OSError:
        return ""


def _key_value(text: str, key: str) -> int:
    """``oom_kill 3`` style files: the number after ``key`` (0 when absent)."""
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == key and parts[1].isdigit():
            return int(parts[1])
    return 0


def _cpu_list(cpus: Iterable[int]) -> str:
    return ",".join(str(c) for c in sorted(set(cpus)))


class CgroupManager:
    """Creates, inspects and removes per-kernel cgroups (synchronous, a few syscalls each).

    ``parent``: see the module docstring (relative to the agent's cgroup unless absolute).
    """

    def __init__(self, layout: CgroupLayout, parent: str = "accelshare") -> None:
        if not parent or any(part in ("", ".", "..") for part in parent.strip("/").split("/")):
            raise ValueError(f"Invalid cgroup parent {parent!r}")
        self.layout = layout
        self.parent = parent
        # (level, controller) a cgroup.subtree_control write refused: not asked again,
        # so a host that refuses delegation (seen: EOPNOTSUPP in a Firecracker VM's
        # cgroup v2) logs its warning once, not on every kernel start
        self._refused_v2: set[tuple[Path, str]] = set()
        # v1: whether memory cgroups have memory.memsw.limit_in_bytes (swap accounting is
        # a boot-time setting: looked up once)
        self._memsw: bool | None = None

    @property
    def version(self) -> CgroupVersion | None:
        return self.layout.version

    def _parent_dir(self, mount: Path, own: str) -> Path:
        base = "" if self.parent.startswith("/") else own.strip("/")
        return mount.joinpath(*(p for p in (base, self.parent.strip("/")) if p))

    def parent_dirs(self) -> dict[str, Path]:
        """Controller -> the directory kernel cgroups are made in (one per hierarchy)."""
        layout = self.layout
        version = layout.version
        if version is CgroupVersion.V2:
            assert layout.v2_mount is not None
            parent = self._parent_dir(layout.v2_mount, layout.v2_self)
            return dict.fromkeys(sorted(layout.v2_controllers & set(CONTROLLERS)), parent)
        if version is CgroupVersion.V1:
            return {
                controller: self._parent_dir(mount, layout.v1_self.get(controller, "/"))
                for controller, mount in sorted(layout.v1_mounts.items())
            }
        return {}

    def unwritable(self) -> dict[str, str]:
        """Controller -> why no kernel cgroup can be made in its hierarchy (nothing is
        created: the parent, or its nearest existing ancestor inside the mount, is checked
        with ``access(W_OK)``, which reports a read-only mount even to root).

        Empty when every hierarchy is usable.  Example, ``/sys/fs/cgroup`` mounted
        read-only in a container: ``{"cpu": "read-only file system (/sys/fs/cgroup/cpu)",
        "memory": ..., "pids": ...}``.
        """
        layout = self.layout
        mounts: dict[str, Path] = dict(layout.v1_mounts)
        if layout.version is CgroupVersion.V2 and layout.v2_mount is not None:
            mounts = dict.fromkeys(CONTROLLERS, layout.v2_mount)
        problems: dict[str, str] = {}
        for controller, parent in self.parent_dirs().items():
            why = _why_not_writable(parent, mounts[controller])
            if why is not None:
                problems[controller] = why
        return problems

    # -- creation -------------------------------------------------------------------------
    def create(self, kernel_id: str, limits: ResourceLimits) -> KernelCgroup | None:
        """Make the kernel's cgroups and write its limits; None when no hierarchy is usable.

        Raises :class:`CgroupError` when a limit cannot be written (after removing what
        was created), e.g. a cpuset outside the agent's own cpuset.
        """
        version = self.version
        if version is None:
            return None
        if version is CgroupVersion.V2:
            cgroup = self._create_v2(kernel_id, limits)
        else:
            cgroup = self._create_v1(kernel_id, limits)
        if cgroup is not None:
            log.debug("kernel %s: cgroups %s", kernel_id, cgroup.to_json())
        return cgroup

    def _make_dir(self, directory: Path) -> bool:
        for _ in range(3):  # a concurrent remove() may delete the shared parent in between
            try:
                directory.mkdir(parents=True, exist_ok=False)
                return True
            except FileExistsError:
                return True
            except FileNotFoundError:
                continue
            except OSError as e:
                log.warning("cannot create cgroup %s (%s); not using it", directory, e.strerror)
                return False
        return False

    def _create_v1(self, kernel_id: str, limits: ResourceLimits) -> KernelCgroup | None:
        layout = self.layout
        wanted = ["memory", "cpu", "pids"] + (["cpuset"] if limits.cpuset_cpus else [])
        dirs: dict[str, Path] = {}
        mems = ""
        for controller in wanted:
            mount = layout.v1_mounts.get(controller)
            if mount is None:
                continue
            parent = self._parent_dir(mount, layout.v1_self.get(controller, "/"))
            if controller == "cpuset":
                parent_mems = self._prepare_v1_cpuset_parent(parent)
                if parent_mems is None:
                    continue
                mems = parent_mems
            directory = parent / kernel_id
            if self._make_dir(directory):
                dirs[controller] = directory
        if not dirs:
            return None
        cgroup = KernelCgroup(CgroupVersion.V1, dirs)
        try:
            applied = self._apply_v1(cgroup, limits, mems)
        except CgroupError:
            self.remove(cgroup)
            raise
        return KernelCgroup(CgroupVersion.V1, dirs, applied)

    def _prepare_v1_cpuset_parent(self, parent: Path) -> str | None:
        """A v1 cpuset group starts with empty cpus/mems: copy them from the level above.

        The parent's ``cpuset.mems`` (what each kernel's group gets), None when the parent
        cannot be used.
        """
        if not self._make_dir(parent):
            return None
        values: dict[str, str] = {}
        try:
            for name in ("cpuset.cpus", "cpuset.mems"):
                values[name] = _read(parent / name).strip()
                if not values[name]:
                    values[name] = _read(parent.parent / name).strip()
                    _write(parent / name, values[name])
        except CgroupError as e:
            log.warning("cannot prepare cpuset parent %s (%s); not using it", parent, e)
            return None
        return values["cpuset.mems"]

    def _apply_v1(self, cgroup: KernelCgroup, limits: ResourceLimits, mems: str) -> dict[str, str]:
        """Write the limits (``mems``: the cpuset parent's ``cpuset.mems``).  A value a new
        group has anyway is not written: ``cpu.shares`` 1024 (one core), and the CFS
        period, 100 ms in every new group (only the quota is written)."""
        applied: dict[str, str] = {}
        dirs = cgroup.dirs
        if limits.mem_bytes is not None and "memory" in dirs:
            memory = dirs["memory"]
            _write(memory / "memory.limit_in_bytes", str(limits.mem_bytes))
            if self._memsw is None:
                self._memsw = (memory / "memory.memsw.limit_in_bytes").exists()
            if self._memsw:
                _write(memory / "memory.memsw.limit_in_bytes", str(limits.mem_bytes))
            applied["memory"] = f"cgroup-v1 memory.limit_in_bytes={limits.mem_bytes}"
        if limits.cpu_count is not None and "cpu" in dirs:
            cpu = dirs["cpu"]
            quota = _cpu_quota_us(limits.cpu_count, _CPU_PERIOD_US)
            _write(cpu / "cpu.cfs_quota_us", str(quota))
            shares = max(2, int(limits.cpu_count * 1024))
            if shares != _DEFAULT_CPU_SHARES:
                _write(cpu / "cpu.shares", str(shares))
            applied["cpu"] = f"cgroup-v1 cpu.cfs_quota_us={quota}/{_CPU_PERIOD_US}"
        if limits.cpuset_cpus and "cpuset" in dirs:
            cpuset = dirs["cpuset"]
            cpus = _cpu_list(limits.cpuset_cpus)
            _write(cpuset / "cpuset.cpus", cpus)
            _write(cpuset / "cpuset.mems", mems)
            applied["cpuset"] = f"cgroup-v1 cpuset.cpus={cpus}"
        if limits.pids_max is not None and "pids" in dirs:
            _write(dirs["pids"] / "pids.max", str(limits.pids_max))
            applied["pids"] = f"cgroup-v1 pids.max={limits.pids_max}"
        return applied

    def _create_v2(self, kernel_id: str, limits: ResourceLimits) -> KernelCgroup | None:
        layout = self.layout
        assert layout.v2_mount is not None
        parent = self._parent_dir(layout.v2_mount, layout.v2_self)
        if not self._make_dir(parent):
            return None
        enabled = self._enable_v2_controllers(layout.v2_mount, parent)
        directory = parent / kernel_id
        if not enabled or not self._make_dir(directory):
            return None
        cgroup = KernelCgroup(CgroupVersion.V2, dict.fromkeys(sorted(enabled), directory))
        try:
            applied = self._apply_v2(directory, enabled, limits)
        except CgroupError:
            self.remove(cgroup)
            raise
        return KernelCgroup(CgroupVersion.V2, cgroup.dirs, applied)

    def _enable_v2_controllers(self, mount: Path, parent: Path) -> set[str]:
        """Enable our controllers in every ``cgroup.subtree_control`` from the root to ``parent``.

        Returns the controllers available to children of ``parent``.
        """
        wanted = set(CONTROLLERS) & self.layout.v2_controllers
        chain = [mount, *(mount / p for p in _prefixes(parent.relative_to(mount)))]
        refused = self._refused_v2
        for level in chain:
            present = set(_read(level / "cgroup.subtree_control").split())
            missing = sorted(wanted - present)
            if not missing:
                continue
            for controller in missing:
                if (level, controller) in refused:
                    wanted.discard(controller)
                    continue
                try:
                    _write(level / "cgroup.subtree_control", f"+{controller}")
                except CgroupError as e:
                    if e.errno not in (errno.EBUSY, errno.EACCES, errno.EPERM, errno.EROFS):
                        log.warning(
                            "cgroup v2: cannot enable %s in %s: %s (not tried again until the"
                            " agent restarts; kernels get the rlimit fallback for it)",
                            controller,
                            level,
                            e,
                        )
                        refused.add((level, controller))
                    wanted.discard(controller)
        return wanted

    def _apply_v2(
        self, directory: Path, enabled: set[str], limits: ResourceLimits
    ) -> dict[str, str]:
        applied: dict[str, str] = {}
        if limits.mem_bytes is not None and "memory" in enabled:
            _write(directory / "memory.max", str(limits.mem_bytes))
            if (directory / "memory.swap.max").exists():
                _write(directory / "memory.swap.max", "0")
            if (directory / "memory.oom.group").exists():
                _write(directory / "memory.oom.group", "1")
            applied["memory"] = f"cgroup-v2 memory.max={limits.mem_bytes}"
        if limits.cpu_count is not None and "cpu" in enabled:
            quota = _cpu_quota_us(limits.cpu_count, _CPU_PERIOD_US)
            _write(directory / "cpu.max", f"{quota} {_CPU_PERIOD_US}")
            weight = min(10_000, max(1, int(limits.cpu_count * 100)))
            _write(directory / "cpu.weight", str(weight))
            applied["cpu"] = f"cgroup-v2 cpu.max={quota} {_CPU_PERIOD_US}"
        if limits.cpuset_cpus and "cpuset" in enabled:
            cpus = _cpu_list(limits.cpuset_cpus)
            _write(directory / "cpuset.cpus", cpus)
            applied["cpuset"] = f"cgroup-v2 cpuset.cpus={cpus}"
        if limits.pids_max is not None and "pids" in enabled:
            _write(directory / "pids.max", str(limits.pids_max))
            applied["pids"] = f"cgroup-v2 pids.max={limits.pids_max}"
        return applied

    # -- inspection -------------------------------------------------------------------------
    @staticmethod
    def oom_status(cgroup: KernelCgroup) -> OomStatus:
        """OOM kills and limit hits recorded by the memory controller (0/0 without one)."""
        memory = cgroup.dirs.get("memory")
        if memory is None:
            return OomStatus(0, 0)
        if cgroup.version is CgroupVersion.V2:
            events = _read(memory / "memory.events")
            return OomStatus(_key_value(events, "oom_kill"), _key_value(events, "max"))
        failcnt = _read(memory / "memory.failcnt").strip()
        return OomStatus(
            _key_value(_read(memory / "memory.oom_control"), "oom_kill"),
            int(failcnt) if failcnt.isdigit() else 0,
        )

    @staticmethod
    def memory_usage_bytes(cgroup: KernelCgroup) -> int | None:
        memory = cgroup.dirs.get("memory")
        if memory is None:
            return None
        name = "memory.current" if cgroup.version is CgroupVersion.V2 else "memory.usage_in_bytes"
        text = _read(memory / name).strip()
        return int(text) if text.isdigit() else None

    @staticmethod
    def pids(cgroup: KernelCgroup) -> set[int]:
        found: set[int] = set()
        for procs in cgroup.procs_files:
            found.update(int(p) for p in _read(procs).split() if p.isdigit())
        return found

    def kill_all(self, cgroup: KernelCgroup) -> None:
        """SIGKILL every process in the kernel's cgroups (``cgroup.kill`` on v2 when present)."""
        if cgroup.version is CgroupVersion.V2:
            for directory in dict.fromkeys(cgroup.dirs.values()):
                kill_file = directory / "cgroup.kill"
                if kill_file.exists():
                    with contextlib.suppress(CgroupError):
                        _write(kill_file, "1")
        for pid in self.pids(cgroup):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)

    def remove(self, cgroup: KernelCgroup) -> bool:
        """Remove the kernel's cgroup directories; False while processes are still inside.

        The shared parent is removed too when it became empty (best effort; a concurrent
        :meth:`create` recreates it).
        """
        done = True
        for directory in dict.fromkeys(cgroup.dirs.values()):
            try:
                directory.rmdir()
            except FileNotFoundError:
                pass
            except OSError as e:
                if e.errno not in (errno.EBUSY, errno.ENOTEMPTY):
                    log.warning("cannot remove cgroup %s: %s", directory, e.strerror)
                done = False
                continue
            with contextlib.suppress(OSError):
                directory.parent.rmdir()
        return done


def _why_not_writable(directory: Path, mount: Path) -> str | None:
    """None when a child of ``directory`` can be created (see :meth:`CgroupManager.unwritable`)."""
    if not mount.is_dir():
        return f"the mount point {mount} does not exist"
    existing = directory
    while not existing.exists() and existing not in (mount, existing.parent):
        existing = existing.parent
    if os.access(existing, os.W_OK):
        return None
    try:
        read_only = bool(os.statvfs(existing).f_flag & os.ST_RDONLY)
    except OSError:
        read_only = False
    return f"{'read-only file system' if read_only else 'permission denied'} ({existing})"


def _prefixes(relative: Path) -> list[str]:
    """``a/b/c`` -> ``["a", "a/b", "a/b/c"]``."""
    parts = relative.parts
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


def _cpu_quota_us(cpu_count: Decimal, period_us: int) -> int:
    quota = (cpu_count * period_us).to_integral_value(rounding=ROUND_FLOOR)
    return max(_MIN_CPU_QUOTA_US, int(quota))
