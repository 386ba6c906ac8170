"""The intrinsic ``mem`` plugin: one device ``root`` of type bytes, discrete FILL.

Capacity (pure :func:`plan_memory_bytes`)::

    min(MemTotal, cgroup memory limit) - reserved-mem
    16 GiB machine, cgroup limit 8 GiB, reserved-mem 1g   -> 7 GiB
    memory-size = "32g" in agent.toml                      -> 32 GiB, nothing detected

A fixed ``memory-size`` is advertised as is (``reserved-mem`` does not apply).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from decimal import Decimal

import psutil  # type: ignore[import-untyped,unused-ignore]

from accelshare import __version__
from accelshare.common import Allocation, AllocationMode, SlotTypes

from .errors import PluginConfigError, PluginUnavailable
from .hostinfo import read_cgroup_limits, read_mem_total
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

__all__ = ["MEM_DEVICE_ID", "MemoryPlugin", "create_plugin", "plan_memory_bytes"]

MEM_DEVICE_ID = "root"
MEM_METADATA = SlotMetadata(
    slot_name="mem",
    human_readable_name="RAM",
    description="Memory",
    display_unit="GiB",
    display_icon="cpu",
    number_format=NumberFormat(binary=True, round_length=0),
)


def plan_memory_bytes(
    *,
    mem_total: int | None,
    cgroup_limit: int | None,
    reserved: int,
    fixed_size: int | None,
    source: str = "agent.toml",
) -> int:
    """The bytes the agent hands out (see the module docstring)."""
    if fixed_size is not None:
        return fixed_size
    candidates = [v for v in (mem_total, cgroup_limit) if v is not None]
    if not candidates:
        raise PluginUnavailable(
            "mem: cannot read the machine's memory size (/proc/meminfo); "
            "set [resource] memory-size in agent.toml"
        )
    available = min(candidates)
    if reserved >= available:
        raise PluginConfigError(
            source,
            "resource.reserved-mem",
            f"less than the {available} bytes the agent may use, so that kernels get some",
            reserved,
        )
    return available - reserved


class MemoryPlugin:
    """See the module docstring.  Pure apart from :meth:`node_stats` / :meth:`kernel_stats`."""

    def __init__(
        self, size_bytes: int, *, numa_node: int = 0, settings: Mapping[str, str] | None = None
    ):
        self._size = size_bytes
        self._inventory = PluginInventory(
            key="mem",
            version=__version__,
            slot_types={"mem": SlotTypes.BYTES},
            devices=(
                Device(
                    device_id=MEM_DEVICE_ID,
                    slot_name="mem",
                    capacity=Decimal(size_bytes),
                    model_name="RAM",
                    numa_node=numa_node,
                    memory_bytes=size_bytes,
                    processors=0,
                    hw_location="root",
                ),
            ),
            allocation_mode=AllocationMode.DISCRETE,
            strategy="FILL",
            quantum_size=None,
            exclusive_slot_types=frozenset(),
            metadata={"mem": MEM_METADATA},
            extra_info={},
            settings=dict(settings or {}),
        )

    @property
    def inventory(self) -> PluginInventory:
        return self._inventory

    def kernel_resources(self, allocation: Allocation) -> KernelResources:
        amount = sum(allocation.get("mem", {}).values(), Decimal(0))
        if amount <= 0:
            return KernelResources()
        return KernelResources(memory_limit_bytes=int(amount))

    async def node_stats(self) -> Sequence[NodeMetric]:
        vm = psutil.virtual_memory()
        used = Decimal(max(0, vm.total - vm.available))
        reading = Measurement(used, Decimal(vm.total))
        return [NodeMetric("mem", "bytes", reading, {MEM_DEVICE_ID: reading})]

    async def kernel_stats(self, kernels: Mapping[str, KernelStatTarget]) -> Sequence[KernelMetric]:
        per_kernel: dict[str, Measurement] = {}
        for kernel_id, target in kernels.items():
            rss = 0
            for pid in sorted(target.pids):
                try:
                    rss += psutil.Process(pid).memory_info().rss
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
            limit = sum(target.allocation.get("mem", {}).values(), Decimal(0))
            per_kernel[kernel_id] = Measurement(Decimal(rss), limit if limit > 0 else None)
        return [KernelMetric("mem", "bytes", per_kernel)]

    async def close(self) -> None:
        return None


async def create_plugin(ctx: PluginContext) -> MemoryPlugin:
    """Entry point ``mem``: detect memory honouring cgroups and agent.toml."""
    resource = ctx.agent_config.resource
    mem_total = read_mem_total(ctx.host_root)
    limits = read_cgroup_limits(ctx.host_root)
    size = plan_memory_bytes(
        mem_total=mem_total,
        cgroup_limit=limits.memory_bytes,
        reserved=resource.reserved_mem,
        fixed_size=resource.memory_size,
        source=str(ctx.agent_config.source_path or "agent.toml"),
    )
    settings = {
        "mem_total": str(mem_total) if mem_total is not None else "unknown",
        "cgroup_memory_limit": str(limits.memory_bytes)
        if limits.memory_bytes is not None
        else "none",
        "reserved_mem": str(resource.reserved_mem),
        "memory_size": str(resource.memory_size)
        if resource.memory_size is not None
        else "detected",
    }
    return MemoryPlugin(size, settings=settings)
