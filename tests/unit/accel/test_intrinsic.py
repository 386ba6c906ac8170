"""The cpu and mem plugins: capacity planning (pure), kernel resources, detection."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest

from accelshare.accel import PluginConfigError, PluginContext, PluginUnavailable
from accelshare.accel.cpu import CpuCore, CPUPlugin, plan_cpu_cores
from accelshare.accel.cpu import create_plugin as create_cpu
from accelshare.accel.hostinfo import current_cpu_affinity
from accelshare.accel.maps import build_alloc_map
from accelshare.accel.mem import MemoryPlugin, plan_memory_bytes
from accelshare.accel.mem import create_plugin as create_mem
from accelshare.accel.types import KernelStatTarget
from accelshare.alloc import AllocationStrategy, DiscreteAllocMap
from accelshare.common import SlotTypes
from accelshare.config.agent_file import load_agent_config, parse_agent_config

from .builders import GIB

D = Decimal
NUMA = {0: 0, 1: 0, 2: 1, 3: 1, 4: 0, 5: 0, 6: 1, 7: 1}


@pytest.mark.parametrize(
    ("affinity", "quota", "reserved", "fixed", "cores"),
    [
        pytest.param(range(8), None, 1, None, [0, 1, 2, 3, 4, 5, 6], id="reserve-last"),
        pytest.param(range(8), D("4.5"), 1, None, [0, 1, 2], id="quota-floor-then-reserve"),
        pytest.param({1, 3, 5}, None, 0, None, [1, 3, 5], id="affinity"),
        pytest.param({2, 3}, D("0.5"), 0, None, [2], id="quota-below-one-is-one-core"),
        pytest.param({0, 1}, None, 1, 16, list(range(16)), id="fixed-count-ignores-reserve"),
    ],
)
def test_plan_cpu_cores(
    affinity: list[int], quota: Decimal | None, reserved: int, fixed: int | None, cores: list[int]
) -> None:
    planned = plan_cpu_cores(
        affinity, numa_nodes=NUMA, cgroup_cores=quota, reserved=reserved, fixed_count=fixed
    )
    assert [c.core_id for c in planned] == cores
    assert [c.numa_node for c in planned] == [NUMA.get(c, 0) for c in cores]


def test_reserving_every_core_is_an_error() -> None:
    with pytest.raises(PluginConfigError) as info:
        plan_cpu_cores(
            {0, 1}, numa_nodes={}, cgroup_cores=None, reserved=2, fixed_count=None, source="a.toml"
        )
    assert info.value.key == "resource.reserved-cpu"
    assert str(info.value).startswith("a.toml: key 'resource.reserved-cpu'")


@pytest.mark.parametrize(
    ("total", "cgroup", "reserved", "fixed", "size"),
    [
        (16 * GIB, 8 * GIB, GIB, None, 7 * GIB),
        (16 * GIB, None, GIB, None, 15 * GIB),
        (None, 4 * GIB, 0, None, 4 * GIB),
        (16 * GIB, 8 * GIB, GIB, 32 * GIB, 32 * GIB),
    ],
)
def test_plan_memory(
    total: int | None, cgroup: int | None, reserved: int, fixed: int | None, size: int
) -> None:
    got = plan_memory_bytes(
        mem_total=total, cgroup_limit=cgroup, reserved=reserved, fixed_size=fixed
    )
    assert got == size


def test_plan_memory_errors() -> None:
    with pytest.raises(PluginConfigError, match=r"resource\.reserved-mem"):
        plan_memory_bytes(mem_total=GIB, cgroup_limit=None, reserved=GIB, fixed_size=None)
    with pytest.raises(PluginUnavailable, match="memory-size"):
        plan_memory_bytes(mem_total=None, cgroup_limit=None, reserved=0, fixed_size=None)


def test_cpu_inventory_and_map() -> None:
    plugin = CPUPlugin([CpuCore(0, 0), CpuCore(1, 0), CpuCore(2, 1), CpuCore(3, 1)])
    inv = plugin.inventory
    assert dict(inv.slot_types) == {"cpu": SlotTypes.COUNT}
    assert [d.device_id for d in inv.devices] == ["0", "1", "2", "3"]
    assert inv.capacities() == {"cpu": D(4)}
    alloc_map = build_alloc_map(inv)
    assert isinstance(alloc_map, DiscreteAllocMap)
    assert alloc_map.allocation_strategy is AllocationStrategy.EVENLY
    got = alloc_map.allocate({"cpu": D(2)})
    res = plugin.kernel_resources(got)
    assert res.cpu_set == tuple(sorted(int(d) for d in got["cpu"]))
    assert res.env["OMP_NUM_THREADS"] == "2"
    assert plugin.kernel_resources({}).env == {}


def test_mem_inventory_and_map() -> None:
    plugin = MemoryPlugin(8 * GIB)
    inv = plugin.inventory
    assert dict(inv.slot_types) == {"mem": SlotTypes.BYTES}
    assert [(d.device_id, d.capacity) for d in inv.devices] == [("root", D(8 * GIB))]
    alloc_map = build_alloc_map(inv)
    assert alloc_map.allocation_strategy is AllocationStrategy.FILL
    got = alloc_map.allocate({"mem": D(2 * GIB)})
    assert got == {"mem": {"root": D(2 * GIB)}}
    assert plugin.kernel_resources(got).memory_limit_bytes == 2 * GIB
    assert plugin.kernel_resources({}).memory_limit_bytes is None


async def test_intrinsic_stats_of_this_process() -> None:
    import os

    cpu, mem = CPUPlugin([CpuCore(0, 0)]), MemoryPlugin(8 * GIB)
    kernels = {"k1": KernelStatTarget({"mem": {"root": D(8 * GIB)}}, frozenset({os.getpid()}))}
    (cpu_used,) = await cpu.kernel_stats(kernels)
    assert cpu_used.key == "cpu_used"
    assert cpu_used.per_kernel["k1"].value > 0
    (mem_used,) = await mem.kernel_stats(kernels)
    assert 0 < mem_used.per_kernel["k1"].value <= 8 * GIB
    gone = {"k2": KernelStatTarget({}, frozenset({2**22 + 12345}))}
    assert (await mem.kernel_stats(gone))[0].per_kernel["k2"].value == 0
    (util,) = await cpu.node_stats()
    assert util.key == "cpu_util"
    assert util.node.capacity == 100
    (node_mem,) = await mem.node_stats()
    assert 0 < node_mem.node.value <= (node_mem.node.capacity or 0)


def fake_host(root: Path, *, mem_limit: int | None = None) -> Path:
    (root / "proc/self").mkdir(parents=True)
    (root / "proc/meminfo").write_text(f"MemTotal: {16 * 1024 * 1024} kB\n")
    (root / "proc/self/cgroup").write_text("4:memory:/\n")
    (root / "proc/self/mountinfo").write_text(
        "35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
    )
    node = root / "sys/devices/system/node/node0"
    node.mkdir(parents=True)
    node.joinpath("cpulist").write_text("0-255\n")
    memory = root / "sys/fs/cgroup/memory"
    memory.mkdir(parents=True)
    if mem_limit is not None:
        memory.joinpath("memory.limit_in_bytes").write_text(str(mem_limit))
    return root


async def test_factories_read_the_host_tree_and_agent_toml(tmp_path: Path) -> None:
    root = fake_host(tmp_path, mem_limit=6 * GIB)
    config = parse_agent_config({"resource": {"reserved-cpu": 0, "reserved-mem": "1g"}})
    ctx = PluginContext(config, None, root)
    mem = await create_mem(ctx)
    assert mem.inventory.capacities() == {"mem": D(5 * GIB)}
    cpu = await create_cpu(ctx)
    assert {d.device_id for d in cpu.inventory.devices} == {str(c) for c in current_cpu_affinity()}
    fixed = parse_agent_config({"resource": {"cpu-count": 16, "memory-size": "32g"}})
    ctx = PluginContext(fixed, None, root)
    assert (await create_cpu(ctx)).inventory.capacities() == {"cpu": D(16)}
    assert (await create_mem(ctx)).inventory.capacities() == {"mem": D(32 * GIB)}


def fake_cpu_host(root: Path, version: int, quota: str) -> Path:
    """A host tree whose only limit is a CPU quota, in a v1 or v2 cgroup."""
    files: dict[str, str] = {"sys/devices/system/node/node0/cpulist": "0-1023\n"}
    if version == 1:
        files["proc/self/cgroup"] = "2:cpu,cpuacct:/agent\n"
        files["proc/self/mountinfo"] = (
            "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n"
        )
        us, period = quota.split()
        files["sys/fs/cgroup/cpu,cpuacct/agent/cpu.cfs_quota_us"] = us
        files["sys/fs/cgroup/cpu,cpuacct/agent/cpu.cfs_period_us"] = period
    else:
        files["proc/self/cgroup"] = "0::/agent\n"
        files["proc/self/mountinfo"] = "30 23 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"
        files["sys/fs/cgroup/agent/cpu.max"] = quota + "\n"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


@pytest.mark.parametrize(
    ("version", "quota", "limit", "cores"),
    [
        pytest.param(1, "150000 100000", "1.5", 1, id="v1-1.5-cores"),
        pytest.param(2, "250000 100000", "2.5", 2, id="v2-2.5-cores"),
        pytest.param(2, "50000 100000", "0.5", 1, id="v2-half-a-core-is-one"),
    ],
)
async def test_cpu_factory_honours_a_cgroup_quota_from_the_host_tree(
    tmp_path: Path, version: int, quota: str, limit: str, cores: int
) -> None:
    root = fake_cpu_host(tmp_path, version, quota)
    config = parse_agent_config({"resource": {"reserved-cpu": 0}})
    cpu = await create_cpu(PluginContext(config, None, root))
    affinity = sorted(current_cpu_affinity())
    expected = affinity[: min(len(affinity), cores)]  # the first cores of the affinity set
    assert [int(d.device_id) for d in cpu.inventory.devices] == expected
    assert cpu.inventory.settings["cgroup_cpu_limit"] == limit


async def test_cpu_factory_refuses_to_reserve_every_core_under_a_quota(tmp_path: Path) -> None:
    root = fake_cpu_host(tmp_path, 1, "150000 100000")  # 1.5 -> 1 core
    agent_toml = tmp_path / "agent.toml"
    agent_toml.write_text("[resource]\nreserved-cpu = 1\n")
    with pytest.raises(PluginConfigError) as info:
        await create_cpu(PluginContext(load_agent_config(agent_toml), None, root))
    assert info.value.source == str(agent_toml)
    assert info.value.key == "resource.reserved-cpu"
    assert "fewer than the 1 core(s)" in str(info.value)
