"""Cgroup layout detection and limit files, on fake trees (the real v1 path is tested in
tests/component/agent with real kernels)."""

from __future__ import annotations

import errno
import logging
from decimal import Decimal
from pathlib import Path

import pytest

from accelshare.agent.runtime import cgroups
from accelshare.agent.runtime.base import ResourceLimits
from accelshare.agent.runtime.cgroups import (
    CgroupError,
    CgroupLayout,
    CgroupManager,
    CgroupVersion,
    KernelCgroup,
    OomStatus,
)

HYBRID_MOUNTINFO = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
41 31 0:38 / {unified} rw,relatime - cgroup2 cgroup2 rw
"""
HYBRID_CGROUP = """\
8:pids:/
4:memory:/process_api/abc
3:cpuset:/
1:cpu:/
0::/
"""


def fake_proc(tmp_path: Path, mountinfo: str, cgroup: str) -> Path:
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "mountinfo").write_text(mountinfo)
    (proc / "self" / "cgroup").write_text(cgroup)
    return proc


def test_detect_hybrid_host_with_empty_v2_is_v1(tmp_path: Path) -> None:
    unified = tmp_path / "unified"
    unified.mkdir()
    (unified / "cgroup.controllers").write_text("\n")
    proc = fake_proc(tmp_path, HYBRID_MOUNTINFO.format(unified=unified), HYBRID_CGROUP)
    layout = CgroupLayout.detect(proc)
    assert layout.version is CgroupVersion.V1
    assert layout.v1_mounts == {
        "cpu": Path("/sys/fs/cgroup/cpu"),
        "cpuset": Path("/sys/fs/cgroup/cpuset"),
        "memory": Path("/sys/fs/cgroup/memory"),
        "pids": Path("/sys/fs/cgroup/pids"),
    }
    assert layout.v1_self["memory"] == "/process_api/abc"
    assert layout.v1_self["cpu"] == "/"
    assert "cgroup v1" in layout.describe()


def test_detect_pure_v2(tmp_path: Path) -> None:
    root = tmp_path / "cg2"
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    mountinfo = f"30 23 0:26 / {root} rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
    proc = fake_proc(tmp_path, mountinfo, "0::/system.slice/agent.service\n")
    layout = CgroupLayout.detect(proc)
    assert layout.version is CgroupVersion.V2
    assert layout.v2_mount == root
    assert layout.v2_self == "/system.slice/agent.service"
    assert layout.v2_controllers >= {"memory", "cpu", "pids"}


def test_detect_nothing(tmp_path: Path) -> None:
    assert CgroupLayout.detect(tmp_path / "nowhere").version is None
    proc = fake_proc(tmp_path, "1 0 0:1 / / rw - ext4 /dev/root rw\n", "")
    layout = CgroupLayout.detect(proc)
    assert layout.version is None
    assert CgroupManager(layout).create("k", ResourceLimits(mem_bytes=1)) is None


def test_mount_root_and_escapes(tmp_path: Path) -> None:
    mountinfo = "35 31 0:32 /docker/ctr /sys/fs/cgroup/mem\\040ory rw - cgroup cgroup rw,memory\n"
    proc = fake_proc(tmp_path, mountinfo, "4:memory:/docker/ctr/inner\n")
    layout = CgroupLayout.detect(proc)
    assert layout.v1_mounts["memory"] == Path("/sys/fs/cgroup/mem ory")
    assert layout.v1_self["memory"] == "/inner"


def v1_tree(tmp_path: Path) -> CgroupLayout:
    mounts = {}
    for controller in ("memory", "cpu", "cpuset", "pids"):
        own = tmp_path / controller / "agent"
        own.mkdir(parents=True)
        mounts[controller] = tmp_path / controller
    (tmp_path / "cpu" / "agent" / "cpu.cfs_period_us").write_text("100000\n")
    (tmp_path / "cpuset" / "agent" / "cpuset.cpus").write_text("0-3\n")
    (tmp_path / "cpuset" / "agent" / "cpuset.mems").write_text("0\n")
    return CgroupLayout(v1_mounts=mounts, v1_self=dict.fromkeys(mounts, "/agent"))


def test_v1_limits_are_written_under_the_agents_own_cgroup(tmp_path: Path) -> None:
    manager = CgroupManager(v1_tree(tmp_path))
    limits = ResourceLimits(
        cpu_count=Decimal("1.5"), cpuset_cpus=(2, 1), mem_bytes=64 << 20, pids_max=32
    )
    cgroup = manager.create("k1", limits)
    assert cgroup is not None
    assert cgroup.version is CgroupVersion.V1
    memory = tmp_path / "memory" / "agent" / "accelshare" / "k1"
    assert cgroup.dirs["memory"] == memory
    assert (memory / "memory.limit_in_bytes").read_text() == str(64 << 20)
    cpu = tmp_path / "cpu" / "agent" / "accelshare" / "k1"
    assert (cpu / "cpu.cfs_quota_us").read_text() == "150000"
    assert (cpu / "cpu.shares").read_text() == "1536"
    cpuset = tmp_path / "cpuset" / "agent" / "accelshare"
    assert (cpuset / "cpuset.cpus").read_text() == "0-3"  # parent prepared from above
    assert (cpuset / "k1" / "cpuset.cpus").read_text() == "1,2"
    assert (cpuset / "k1" / "cpuset.mems").read_text() == "0"
    assert (tmp_path / "pids" / "agent" / "accelshare" / "k1" / "pids.max").read_text() == "32"
    assert set(cgroup.applied) == {"memory", "cpu", "cpuset", "pids"}
    assert len(cgroup.procs_files) == 4
    assert KernelCgroup.from_json(cgroup.to_json()) == cgroup


def test_v1_values_a_new_group_has_anyway_are_not_written(tmp_path: Path) -> None:
    """One core: cpu.shares stays the new group's 1024 (not written); the quota is for the
    100 ms period every new group starts with; memsw is looked for once per manager."""
    manager = CgroupManager(v1_tree(tmp_path))
    memory = tmp_path / "memory" / "agent" / "accelshare"
    memory.mkdir()
    first = manager.create("k1", ResourceLimits(cpu_count=Decimal(1), mem_bytes=1 << 30))
    assert first is not None
    cpu = tmp_path / "cpu" / "agent" / "accelshare" / "k1"
    assert (cpu / "cpu.cfs_quota_us").read_text() == "100000"
    assert not (cpu / "cpu.shares").exists()
    assert first.applied["cpu"] == "cgroup-v1 cpu.cfs_quota_us=100000/100000"
    assert not (memory / "k1" / "memory.memsw.limit_in_bytes").exists()  # no swap accounting
    # (a real host's memsw file comes with every group or with none: the first one decides)
    (memory / "k2").mkdir()
    (memory / "k2" / "memory.memsw.limit_in_bytes").write_text("")
    second = manager.create("k2", ResourceLimits(cpu_count=Decimal(2), mem_bytes=1 << 30))
    assert second is not None
    assert (memory / "k2" / "memory.memsw.limit_in_bytes").read_text() == ""
    cpu2 = tmp_path / "cpu" / "agent" / "accelshare" / "k2"
    assert (cpu2 / "cpu.shares").read_text() == "2048"
    with_swap = CgroupManager(manager.layout)
    (memory / "k3").mkdir()
    (memory / "k3" / "memory.memsw.limit_in_bytes").write_text("")
    assert with_swap.create("k3", ResourceLimits(mem_bytes=1 << 20)) is not None
    assert (memory / "k3" / "memory.memsw.limit_in_bytes").read_text() == str(1 << 20)


def test_v1_absolute_parent_and_missing_controllers(tmp_path: Path) -> None:
    layout = v1_tree(tmp_path)
    layout = CgroupLayout(
        v1_mounts={"memory": layout.v1_mounts["memory"]}, v1_self={"memory": "/agent"}
    )
    cgroup = CgroupManager(layout, "/accelshare").create(
        "k1", ResourceLimits(cpu_count=Decimal(1), mem_bytes=1 << 20)
    )
    assert cgroup is not None
    assert cgroup.dirs == {"memory": tmp_path / "memory" / "accelshare" / "k1"}
    assert set(cgroup.applied) == {"memory"}  # the runtime reports cpu as not enforced


def test_v1_tiny_cpu_quota_is_clamped(tmp_path: Path) -> None:
    cgroup = CgroupManager(v1_tree(tmp_path)).create(
        "k1", ResourceLimits(cpu_count=Decimal("0.001"))
    )
    assert cgroup is not None
    assert (cgroup.dirs["cpu"] / "cpu.cfs_quota_us").read_text() == "1000"


def v2_tree(tmp_path: Path) -> CgroupLayout:
    root = tmp_path / "cg2"
    (root / "agent.service").mkdir(parents=True)
    (root / "cgroup.subtree_control").write_text("")
    return CgroupLayout(
        v2_mount=root,
        v2_self="/agent.service",
        v2_controllers=frozenset({"cpu", "cpuset", "memory", "pids", "io"}),
    )


def test_v2_limits_and_controller_delegation(tmp_path: Path) -> None:
    layout = v2_tree(tmp_path)
    manager = CgroupManager(layout, "/accelshare.slice")
    limits = ResourceLimits(cpu_count=Decimal(2), cpuset_cpus=(0,), mem_bytes=1 << 30, pids_max=9)
    cgroup = manager.create("k1", limits)
    assert cgroup is not None
    assert cgroup.version is CgroupVersion.V2
    directory = tmp_path / "cg2" / "accelshare.slice" / "k1"
    assert set(cgroup.dirs.values()) == {directory}
    assert cgroup.procs_files == (directory / "cgroup.procs",)
    assert (directory / "memory.max").read_text() == str(1 << 30)
    assert (directory / "cpu.max").read_text() == "200000 100000"
    assert (directory / "cpu.weight").read_text() == "200"
    assert (directory / "cpuset.cpus").read_text() == "0"
    assert (directory / "pids.max").read_text() == "9"
    # every level from the root to the parent enabled the controllers for its children
    # (a fake file keeps only the last write; on cgroupfs each "+x" adds one)
    assert (tmp_path / "cg2" / "cgroup.subtree_control").read_text().startswith("+")
    assert (tmp_path / "cg2" / "accelshare.slice" / "cgroup.subtree_control").exists()
    assert set(cgroup.applied) == {"memory", "cpu", "cpuset", "pids"}


def test_oom_status_v1_and_v2(tmp_path: Path) -> None:
    v1 = KernelCgroup(CgroupVersion.V1, {"memory": tmp_path / "m1"})
    (tmp_path / "m1").mkdir()
    assert CgroupManager.oom_status(v1) == OomStatus(0, 0)
    (tmp_path / "m1" / "memory.oom_control").write_text(
        "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n"
    )
    (tmp_path / "m1" / "memory.failcnt").write_text("17\n")
    assert CgroupManager.oom_status(v1) == OomStatus(oom_kills=2, limit_hits=17)
    v2 = KernelCgroup(CgroupVersion.V2, {"memory": tmp_path / "m2", "pids": tmp_path / "m2"})
    (tmp_path / "m2").mkdir()
    (tmp_path / "m2" / "memory.events").write_text("low 0\nhigh 0\nmax 5\noom 1\noom_kill 1\n")
    assert CgroupManager.oom_status(v2) == OomStatus(oom_kills=1, limit_hits=5)
    assert CgroupManager.oom_status(KernelCgroup(CgroupVersion.V1, {})) == OomStatus(0, 0)


def test_write_failure_removes_what_was_created(tmp_path: Path) -> None:
    layout = v1_tree(tmp_path)
    blocker = tmp_path / "pids" / "agent" / "accelshare" / "k1" / "pids.max"
    blocker.mkdir(parents=True)  # a directory where a file is written: the write fails
    manager = CgroupManager(layout)
    with pytest.raises(CgroupError, match=r"pids\.max"):
        manager.create("k1", ResourceLimits(pids_max=3))


@pytest.mark.parametrize("parent", ["", "..", "a/../b", "/"])
def test_invalid_parent(parent: str) -> None:
    with pytest.raises(ValueError, match="Invalid cgroup parent"):
        CgroupManager(CgroupLayout(), parent)


def test_kernel_cgroup_from_junk_json() -> None:
    assert KernelCgroup.from_json({}) is None
    assert KernelCgroup.from_json({"version": "v3", "dirs": {}}) is None


# -- where kernel cgroups go, and whether they can be made there ------------------------------
def test_parent_dirs_v1_relative_and_absolute(tmp_path: Path) -> None:
    layout = v1_tree(tmp_path)
    assert CgroupManager(layout, "accelshare").parent_dirs() == {
        c: tmp_path / c / "agent" / "accelshare" for c in ("cpu", "cpuset", "memory", "pids")
    }
    assert CgroupManager(layout, "/k/accelshare").parent_dirs()["memory"] == (
        tmp_path / "memory" / "k" / "accelshare"
    )


def test_parent_dirs_v2_one_directory_for_our_controllers(tmp_path: Path) -> None:
    parent = tmp_path / "cg2" / "agent.service" / "accelshare"
    assert CgroupManager(v2_tree(tmp_path)).parent_dirs() == dict.fromkeys(
        ("cpu", "cpuset", "memory", "pids"), parent
    )  # "io" is not one of ours
    assert CgroupManager(CgroupLayout()).parent_dirs() == {}


def test_unwritable_checks_without_creating_anything(tmp_path: Path) -> None:
    layout = v1_tree(tmp_path)
    manager = CgroupManager(layout, "/deep/accelshare")  # nothing of it exists yet
    assert manager.unwritable() == {}  # the nearest existing ancestor (the mount) is writable
    assert not (tmp_path / "memory" / "deep").exists()


def test_unwritable_names_a_missing_mount_point(tmp_path: Path) -> None:
    layout = v1_tree(tmp_path)
    gone = tmp_path / "gone"
    manager = CgroupManager(
        CgroupLayout(v1_mounts={**layout.v1_mounts, "pids": gone}, v1_self=layout.v1_self)
    )
    assert manager.unwritable() == {"pids": f"the mount point {gone} does not exist"}


def test_v2_a_refused_delegation_is_warned_once_and_not_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Seen on a GPU machine (a Firecracker VM, cgroup v2): every ``+controller`` write to
    the agent's own cgroup failed with EOPNOTSUPP, and each kernel start logged it again
    for every controller.  Now: one warning per controller, no second write."""
    real_write = cgroups._write
    tried: list[str] = []

    def refusing_write(path: Path, value: str) -> None:
        if path.name == "cgroup.subtree_control":
            tried.append(value)
            raise CgroupError(errno.EOPNOTSUPP, f"cannot write {value!r} to {path}")
        real_write(path, value)

    monkeypatch.setattr(cgroups, "_write", refusing_write)
    manager = CgroupManager(v2_tree(tmp_path), "/accelshare.slice")
    limits = ResourceLimits(mem_bytes=1 << 30)
    with caplog.at_level(logging.WARNING, logger=cgroups.__name__):
        assert manager.create("k1", limits) is None  # nothing enabled: the rlimit fallback
        first = list(tried)
        assert manager.create("k2", limits) is None
    assert sorted(first) == ["+cpu", "+cpuset", "+memory", "+pids"]
    assert tried == first  # k2 wrote nothing
    warnings = [r.getMessage() for r in caplog.records if "cannot enable" in r.getMessage()]
    assert len(warnings) == len(first)
    assert all("not tried again" in w for w in warnings)
