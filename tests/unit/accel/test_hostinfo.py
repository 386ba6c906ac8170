"""Reading cores, NUMA nodes, memory and cgroup limits from fake /proc and /sys trees."""

from __future__ import annotations

import os
from decimal import Decimal
from pathlib import Path

import psutil  # type: ignore[import-untyped,unused-ignore]
import pytest

from accelshare.accel import PluginContext
from accelshare.accel.cpu import create_plugin as create_cpu
from accelshare.accel.hostinfo import (
    CgroupLimits,
    current_cpu_affinity,
    parse_cpu_list,
    read_cgroup_limits,
    read_cgroup_mounts,
    read_mem_total,
    read_numa_nodes,
    read_proc_cgroups,
)
from accelshare.accel.mem import create_plugin as create_mem
from accelshare.config.agent_file import parse_agent_config

GIB = 2**30
V1_UNLIMITED = "9223372036854771712"


def write(root: Path, path: str, text: str) -> None:
    target = root / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)


def mountinfo(*lines: str) -> str:
    return "\n".join(lines) + "\n"


V1_MOUNTS = mountinfo(
    "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755",
    "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct",
    "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory",
    "40 31 0:37 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw",
)


@pytest.mark.parametrize(
    ("text", "cores"),
    [("0-3", [0, 1, 2, 3]), ("0-1,4,6-7\n", [0, 1, 4, 6, 7]), ("", []), ("5", [5])],
)
def test_parse_cpu_list(text: str, cores: list[int]) -> None:
    assert parse_cpu_list(text) == cores


def test_numa_nodes(tmp_path: Path) -> None:
    write(tmp_path, "/sys/devices/system/node/node0/cpulist", "0-1\n")
    write(tmp_path, "/sys/devices/system/node/node1/cpulist", "2-3\n")
    write(tmp_path, "/sys/devices/system/node/online", "0-1\n")
    (tmp_path / "sys/devices/system/node/nodeX").mkdir()
    assert read_numa_nodes(tmp_path) == {0: 0, 1: 0, 2: 1, 3: 1}


def test_numa_nodes_absent(tmp_path: Path) -> None:
    assert read_numa_nodes(tmp_path) == {}


def test_mem_total(tmp_path: Path) -> None:
    assert read_mem_total(tmp_path) is None
    write(tmp_path, "/proc/meminfo", "MemTotal:       16384 kB\nMemFree: 1 kB\n")
    assert read_mem_total(tmp_path) == 16384 * 1024


def test_no_cgroups_at_all(tmp_path: Path) -> None:
    assert read_cgroup_limits(tmp_path) == CgroupLimits()


def test_cgroup_v1_with_limits_on_an_ancestor(tmp_path: Path) -> None:
    """The agent's own v1 cgroup is unlimited; its parent has the limits."""
    write(tmp_path, "/proc/self/mountinfo", V1_MOUNTS)
    write(
        tmp_path,
        "/proc/self/cgroup",
        "4:memory:/agents/a1\n2:cpu,cpuacct:/agents/a1\n1:name=systemd:/\n0::/\n",
    )
    mem = "/sys/fs/cgroup/memory"
    cpu = "/sys/fs/cgroup/cpu,cpuacct"
    write(tmp_path, f"{mem}/memory.limit_in_bytes", V1_UNLIMITED)
    write(tmp_path, f"{mem}/agents/memory.limit_in_bytes", str(4 * GIB))
    write(tmp_path, f"{mem}/agents/a1/memory.limit_in_bytes", V1_UNLIMITED)
    write(tmp_path, f"{cpu}/agents/cpu.cfs_quota_us", "150000")
    write(tmp_path, f"{cpu}/agents/cpu.cfs_period_us", "100000")
    write(tmp_path, f"{cpu}/agents/a1/cpu.cfs_quota_us", "-1")
    write(tmp_path, f"{cpu}/agents/a1/cpu.cfs_period_us", "100000")
    limits = read_cgroup_limits(tmp_path)
    assert limits == CgroupLimits(Decimal("1.5"), 4 * GIB, frozenset({1}))


def test_cgroup_v1_namespaced_view(tmp_path: Path) -> None:
    """Inside a container the path in /proc/self/cgroup does not exist under the mount."""
    write(tmp_path, "/proc/self/mountinfo", V1_MOUNTS)
    write(tmp_path, "/proc/self/cgroup", "4:memory:/docker/abc\n2:cpu,cpuacct:/docker/abc\n")
    write(tmp_path, "/sys/fs/cgroup/memory/memory.limit_in_bytes", str(2 * GIB))
    write(tmp_path, "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us", "200000")
    write(tmp_path, "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us", "100000")
    assert read_cgroup_limits(tmp_path) == CgroupLimits(Decimal(2), 2 * GIB, frozenset({1}))


def test_cgroup_v1_mount_root_inside_a_namespace(tmp_path: Path) -> None:
    write(
        tmp_path,
        "/proc/self/mountinfo",
        "35 31 0:32 /kubepods/pod1 /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n",
    )
    write(tmp_path, "/proc/self/cgroup", "4:memory:/kubepods/pod1/c1\n")
    write(tmp_path, "/sys/fs/cgroup/memory/memory.limit_in_bytes", str(8 * GIB))
    write(tmp_path, "/sys/fs/cgroup/memory/c1/memory.limit_in_bytes", str(3 * GIB))
    assert read_cgroup_limits(tmp_path).memory_bytes == 3 * GIB


def test_cgroup_v2(tmp_path: Path) -> None:
    write(tmp_path, "/proc/self/mountinfo", "30 23 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n")
    write(tmp_path, "/proc/self/cgroup", "0::/system.slice/agent.service\n")
    base = "/sys/fs/cgroup/system.slice"
    write(tmp_path, "/sys/fs/cgroup/cgroup.controllers", "cpu memory pids")
    write(tmp_path, f"{base}/memory.max", "max\n")
    write(tmp_path, f"{base}/cpu.max", "max 100000\n")
    write(tmp_path, f"{base}/agent.service/memory.max", f"{6 * GIB}\n")
    write(tmp_path, f"{base}/agent.service/cpu.max", "250000 100000\n")
    assert read_cgroup_limits(tmp_path) == CgroupLimits(Decimal("2.5"), 6 * GIB, frozenset({2}))


def test_cgroup_v2_unlimited(tmp_path: Path) -> None:
    write(tmp_path, "/proc/self/mountinfo", "30 23 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n")
    write(tmp_path, "/proc/self/cgroup", "0::/\n")
    write(tmp_path, "/sys/fs/cgroup/memory.max", "max\n")
    write(tmp_path, "/sys/fs/cgroup/cpu.max", "max 100000\n")
    assert read_cgroup_limits(tmp_path) == CgroupLimits()


def test_hybrid_layout_takes_the_tightest(tmp_path: Path) -> None:
    """v1 memory plus a v2 hierarchy that also limits (unusual, but both count)."""
    write(tmp_path, "/proc/self/mountinfo", V1_MOUNTS)
    write(tmp_path, "/proc/self/cgroup", "4:memory:/\n2:cpu,cpuacct:/\n0::/a\n")
    write(tmp_path, "/sys/fs/cgroup/memory/memory.limit_in_bytes", str(8 * GIB))
    write(tmp_path, "/sys/fs/cgroup/unified/a/memory.max", str(5 * GIB))
    limits = read_cgroup_limits(tmp_path)
    assert limits.memory_bytes == 5 * GIB
    assert limits.cpu_cores is None
    assert limits.versions == frozenset({1, 2})


def test_conventional_mounts_without_mountinfo(tmp_path: Path) -> None:
    write(tmp_path, "/sys/fs/cgroup/memory/memory.limit_in_bytes", str(GIB))
    write(tmp_path, "/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "50000")
    write(tmp_path, "/sys/fs/cgroup/cpu/cpu.cfs_period_us", "100000")
    write(tmp_path, "/sys/fs/cgroup/unified/cgroup.controllers", "")
    mounts = read_cgroup_mounts(tmp_path)
    assert [m.mount_point for m in mounts] == [
        "/sys/fs/cgroup/cpu",
        "/sys/fs/cgroup/memory",
        "/sys/fs/cgroup/unified",
    ]
    assert read_cgroup_limits(tmp_path) == CgroupLimits(Decimal("0.5"), GIB, frozenset({1}))


def test_conventional_v2_without_mountinfo(tmp_path: Path) -> None:
    write(tmp_path, "/sys/fs/cgroup/cgroup.controllers", "cpu memory")
    write(tmp_path, "/sys/fs/cgroup/memory.max", str(GIB))
    assert read_cgroup_limits(tmp_path).memory_bytes == GIB


def test_garbage_is_no_limit(tmp_path: Path) -> None:
    write(tmp_path, "/proc/self/mountinfo", V1_MOUNTS + "garbage line\n")
    write(tmp_path, "/proc/self/cgroup", "nonsense\n4:memory:/\n")
    write(tmp_path, "/sys/fs/cgroup/memory/memory.limit_in_bytes", "lots\n")
    write(tmp_path, "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us", "x")
    write(tmp_path, "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us", "100000")
    assert read_cgroup_limits(tmp_path) == CgroupLimits()
    assert read_proc_cgroups(tmp_path) == {"memory": "/"}


def _allowed_cpus_from_proc_status() -> frozenset[int]:
    """The kernel's own view of this process's CPUs, read independently of hostinfo."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return frozenset(parse_cpu_list(line.split(":", 1)[1]))
    pytest.fail("/proc/self/status has no Cpus_allowed_list line")


async def test_this_machine_reads_consistently() -> None:
    """On the real machine: cores, cgroup limits and memory agree with the OS's view."""
    root = Path("/")
    allowed = _allowed_cpus_from_proc_status()
    assert current_cpu_affinity() == allowed == frozenset(os.sched_getaffinity(0))
    assert 0 < len(allowed) <= (os.cpu_count() or 0)
    limits = read_cgroup_limits(root)
    assert limits.cpu_cores is None or limits.cpu_cores > 0
    assert limits.memory_bytes is None or limits.memory_bytes > 0
    assert limits.versions <= {1, 2}
    assert bool(limits.versions) == (
        limits.cpu_cores is not None or limits.memory_bytes is not None
    )

    no_reserve = parse_agent_config({"resource": {"reserved-cpu": 0, "reserved-mem": 0}})
    ctx = PluginContext(no_reserve, None, root)
    cores = len(allowed)
    if limits.cpu_cores is not None:
        cores = min(cores, max(1, int(limits.cpu_cores)))
    cpu = await create_cpu(ctx)
    assert cpu.inventory.capacities() == {"cpu": Decimal(cores)}
    assert {int(d.device_id) for d in cpu.inventory.devices} <= allowed

    total = psutil.virtual_memory().total
    assert read_mem_total(root) == total  # both are MemTotal of /proc/meminfo
    mem = await create_mem(ctx)
    (capacity,) = mem.inventory.capacities().values()
    assert 0 < capacity <= total
    assert capacity == min(total, limits.memory_bytes or total)
