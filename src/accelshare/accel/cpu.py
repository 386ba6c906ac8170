"""The intrinsic ``cpu`` plugin: one device per core, discrete EVENLY.

Which cores (pure :func:`plan_cpu_cores`, fed by :mod:`.hostinfo`)::

    affinity {0..7}, cgroup quota 4.5 cores, reserved-cpu 1  -> cores 0, 1, 2
    (the first floor(4.5) = 4 cores of the affinity set, minus the last reserved one)
    cpu-count = 16 in agent.toml                              -> cores 0..15, nothing detected

Reserved cores are taken from the end of the list so kernels start at core 0.  A fixed
``cpu-count`` is the advertised capacity as is (``reserved-cpu`` does not apply: the
operator stated the capacity).  Device ids are core numbers as strings, so
``resource.txt`` reads ``CPU_SHARES=0:1,1:1``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import ROUND_FLOOR, Decimal

import psutil  # type: ignore[import-untyped,unused-ignore]

from accelshare import __version__
from accelshare.common import Allocation, AllocationMode, SlotTypes

from .errors import PluginConfigError
from .hostinfo import current_cpu_affinity, read_cgroup_limits, read_numa_nodes
from .protocol import PluginContext
from .types import (
    Device,
    KernelMetric,
    KernelResources,
    KernelStatTarget,
    Measurement,
    NodeMetric,
    NumberFormat,
    PluginInventory,
    SlotMetadata,
)

__all__ = ["CPUPlugin", "CpuCore", "create_plugin", "plan_cpu_cores"]

CPU_METADATA = SlotMetadata(
    slot_name="cpu",
    human_readable_name="CPU",
    description="CPU",
    display_unit="Core",
    display_icon="cpu",
    number_format=NumberFormat(binary=False, round_length=0),
)
THREAD_ENV_VARS = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
)


@dataclass(frozen=True, slots=True)
class CpuCore:
    core_id: int
    numa_node: int


def plan_cpu_cores(
    affinity: Iterable[int],
    *,
    numa_nodes: Mapping[int, int],
    cgroup_cores: Decimal | None,
    reserved: int,
    fixed_count: int | None,
    source: str = "agent.toml",
) -> list[CpuCore]:
    """The cores the agent hands out (see the module docstring)."""
    if fixed_count is not None:
        return [CpuCore(i, numa_nodes.get(i, 0)) for i in range(fixed_count)]
    cores = sorted(set(affinity))
    if cgroup_cores is not None:
        limit = max(1, int(cgroup_cores.to_integral_value(rounding=ROUND_FLOOR)))
        cores = cores[:limit]
    if reserved >= len(cores):
        raise PluginConfigError(
            source,
            "resource.reserved-cpu",
            f"fewer than the {len(cores)} core(s) the agent may use "
            f"({','.join(map(str, cores))}), so that kernels get at least one",
            reserved,
        )
    kept = cores[: len(cores) - reserved]
    return [CpuCore(core, numa_nodes.get(core, 0)) for core in kept]


def _allocated_ids(allocation: Allocation, slot: str) -> set[str]:
    return {dev for dev, amount in allocation.get(slot, {}).items() if amount > 0}


class CPUPlugin:
    """See the module docstring.  Pure apart from :meth:`node_stats` / :meth:`kernel_stats`."""

    def __init__(self, cores: Sequence[CpuCore], *, settings: Mapping[str, str] | None = None):
        self._cores = tuple(cores)
        self._core_ids = {str(c.core_id): (i, c.core_id) for i, c in enumerate(self._cores)}
        self._inventory = PluginInventory(
            key="cpu",
            version=__version__,
            slot_types={"cpu": SlotTypes.COUNT},
            devices=tuple(
                Device(
                    device_id=str(core.core_id),
                    slot_name="cpu",
                    capacity=Decimal(1),
                    model_name="CPU core",
                    numa_node=core.numa_node,
                    memory_bytes=0,
                    processors=1,
                    hw_location=f"cpu{core.core_id}",
                )
                for core in self._cores
            ),
            allocation_mode=AllocationMode.DISCRETE,
            strategy="EVENLY",
            quantum_size=None,
            exclusive_slot_types=frozenset(),
            metadata={"cpu": CPU_METADATA},
            extra_info={},
            settings=dict(settings or {}),
        )

    @property
    def inventory(self) -> PluginInventory:
        return self._inventory

    def kernel_resources(self, allocation: Allocation) -> KernelResources:
        chosen = _allocated_ids(allocation, "cpu")
        # the chosen few looked up, not every core's id formatted (512 on a big host)
        found = sorted(self._core_ids[d] for d in chosen if d in self._core_ids)
        cores = tuple(core_id for _, core_id in found)  # in the cores' order, as listed
        if not cores:
            return KernelResources()
        count = str(len(cores))
        return KernelResources(env=dict.fromkeys(THREAD_ENV_VARS, count), cpu_set=cores)

    async def node_stats(self) -> Sequence[NodeMetric]:
        percents = psutil.cpu_percent(percpu=True)
        per_device: dict[str, Measurement] = {}
        for core in self._cores:
            value = percents[core.core_id] if core.core_id < len(percents) else 0.0
            per_device[str(core.core_id)] = Measurement(Decimal(str(round(value, 1))), Decimal(100))
        total = sum((m.value for m in per_device.values()), Decimal(0))
        node = Measurement(total, Decimal(100 * len(self._cores)))
        return [NodeMetric("cpu_util", "percent", node, per_device)]

    async def kernel_stats(self, kernels: Mapping[str, KernelStatTarget]) -> Sequence[KernelMetric]:
        used: dict[str, Measurement] = {}
        for kernel_id, target in kernels.items():
            msec = 0
            for pid in sorted(target.pids):
                try:
                    times = psutil.Process(pid).cpu_times()
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
                msec += int((times.user + times.system) * 1000)
            used[kernel_id] = Measurement(Decimal(msec))
        return [KernelMetric("cpu_used", "msec", used)]

    async def close(self) -> None:
        return None


async def create_plugin(ctx: PluginContext) -> CPUPlugin:
    """Entry point ``cpu``: detect cores honouring affinity, cgroups and agent.toml."""
    resource = ctx.agent_config.resource
    limits = read_cgroup_limits(ctx.host_root)
    affinity = current_cpu_affinity()
    source = str(ctx.agent_config.source_path or "agent.toml")
    cores = plan_cpu_cores(
        affinity,
        numa_nodes=read_numa_nodes(ctx.host_root),
        cgroup_cores=limits.cpu_cores,
        reserved=resource.reserved_cpu,
        fixed_count=resource.cpu_count,
        source=source,
    )
    settings = {
        "affinity": ",".join(map(str, sorted(affinity))),
        "cgroup_cpu_limit": str(limits.cpu_cores) if limits.cpu_cores is not None else "none",
        "reserved_cpu": str(resource.reserved_cpu),
        "cpu_count": str(resource.cpu_count) if resource.cpu_count is not None else "detected",
    }
    return CPUPlugin(cores, settings=settings)
