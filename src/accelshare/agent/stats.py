"""Node and kernel statistics from the plugins, and the heartbeat payload.

Every plugin's ``node_stats()`` / ``kernel_stats()`` tick becomes :class:`~accelshare.protocol.MetricValue`
rows: one node-wide row (``device_id`` None) plus one per device, amounts as decimal
strings.  A kernel's pids are its main process and all its descendants (psutil), so the
cpu and mem plugins can sum what the whole kernel uses.  A plugin whose stats fail is
logged and left out of that answer; the others still answer.
"""

from __future__ import annotations

import logging
import platform
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from decimal import Decimal

import psutil  # type: ignore[import-untyped,unused-ignore]

import accelshare
from accelshare.accel import (
    ComputePlugin,
    KernelStatTarget,
    Measurement,
    ObservesAllocations,
    PluginInventory,
)
from accelshare.alloc import AllocationByMap
from accelshare.common import canonical_decimal
from accelshare.config.agent_file import AgentConfig
from accelshare.protocol import (
    AllocMapView,
    Heartbeat,
    KernelReport,
    KernelStats,
    MetricValue,
    NodeStats,
    SlotCapacity,
)

__all__ = ["StatsCollector", "build_heartbeat", "kernel_pids", "rpc_url_of"]

log = logging.getLogger(__name__)


def _text(value: Decimal) -> str:
    return canonical_decimal(value) if value.is_finite() else "0"


def _metric(name: str, unit: str, reading: Measurement, device: str | None) -> MetricValue:
    return MetricValue(
        name=name,
        device_id=device,
        value=_text(reading.value),
        capacity=_text(reading.capacity) if reading.capacity is not None else None,
        unit=unit,
    )


def kernel_pids(pids: Sequence[int]) -> frozenset[int]:
    """The kernel's processes and all their descendants that still exist."""
    found: set[int] = set()
    for pid in pids:
        try:
            process = psutil.Process(pid)
            found.add(pid)
            found.update(child.pid for child in process.children(recursive=True))
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return frozenset(found)


class StatsCollector:
    def __init__(self, plugins: Mapping[str, ComputePlugin], agent_id: str) -> None:
        self._plugins = plugins
        self._agent_id = agent_id

    async def node_stats(
        self, allocations: Mapping[str, Mapping[str, Mapping[str, Decimal]]] | None = None
    ) -> NodeStats:
        """One tick of every plugin's node stats.  ``allocations``: what every kernel
        holds (kernel id -> slot -> device -> amount), told first to the plugins whose
        stats follow it (:class:`~accelshare.accel.ObservesAllocations`); None: not told."""
        metrics: list[MetricValue] = []
        for key, plugin in self._plugins.items():
            try:
                if allocations is not None and isinstance(plugin, ObservesAllocations):
                    slots = plugin.inventory.slot_types
                    plugin.observe_allocations(
                        {
                            kernel_id: {
                                slot: dict(per_device)
                                for slot, per_device in held.items()
                                if slot in slots
                            }
                            for kernel_id, held in allocations.items()
                        }
                    )
                ticks = await plugin.node_stats()
            except Exception:
                log.exception("node stats of plugin %r failed", key)
                continue
            for tick in ticks:
                metrics.append(_metric(tick.key, tick.unit, tick.node, None))
                metrics.extend(
                    _metric(tick.key, tick.unit, reading, device)
                    for device, reading in tick.per_device.items()
                )
        return NodeStats(agent_id=self._agent_id, at=datetime.now(UTC), metrics=metrics)

    async def kernel_stats(
        self, kernels: Mapping[str, tuple[AllocationByMap, tuple[int, ...]]]
    ) -> KernelStats:
        pids = {kernel_id: kernel_pids(p) for kernel_id, (_, p) in kernels.items()}
        result: dict[str, list[MetricValue]] = {kernel_id: [] for kernel_id in kernels}
        for key, plugin in self._plugins.items():
            targets = {
                kernel_id: KernelStatTarget(allocation.get(key, {}), pids[kernel_id])
                for kernel_id, (allocation, _) in kernels.items()
            }
            try:
                ticks = await plugin.kernel_stats(targets)
            except Exception:
                log.exception("kernel stats of plugin %r failed", key)
                continue
            for tick in ticks:
                for kernel_id, reading in tick.per_kernel.items():
                    if kernel_id in result:
                        result[kernel_id].append(_metric(tick.key, tick.unit, reading, None))
        return KernelStats(agent_id=self._agent_id, at=datetime.now(UTC), kernels=result)


def rpc_url_of(config: AgentConfig) -> str:
    """What the manager calls: ``rpc-advertise-url``, else ``http://<rpc-listen-addr>``
    (a wildcard listen address is replaced by this host's name)."""
    if config.agent.rpc_advertise_url:
        return config.agent.rpc_advertise_url
    host, _, port = config.agent.rpc_listen_addr.rpartition(":")
    if host in ("0.0.0.0", "::", "[::]"):
        host = platform.node() or "localhost"
    return f"http://{host}:{port}"


def build_heartbeat(
    config: AgentConfig,
    inventories: Mapping[str, PluginInventory],
    alloc_map: AllocMapView,
    kernels: list[KernelReport],
    *,
    images: Sequence[str] = (),
    plugin_status: Mapping[str, Mapping[str, str]] | None = None,
) -> Heartbeat:
    """The heartbeat: identity, slots with types and capacities, per-device maps (with
    quanta), UI metadata per slot, live kernels."""
    slots: dict[str, SlotCapacity] = {}
    metadata: dict[str, dict[str, object]] = {}
    for inventory in inventories.values():
        for slot, capacity in inventory.capacities().items():
            slots[slot] = SlotCapacity(
                type=inventory.slot_types[slot], capacity=canonical_decimal(capacity)
            )
        for slot, meta in inventory.metadata.items():
            metadata[slot] = meta.to_json()
    return Heartbeat(
        agent_id=config.agent.id,
        rpc_url=rpc_url_of(config),
        scaling_group=config.agent.scaling_group,
        region=config.agent.region,
        architecture=platform.machine() or "x86_64",
        version=accelshare.__version__,
        slots=slots,
        alloc_maps=alloc_map.maps,
        slot_metadata=metadata,
        kernels=kernels,
        images=list(images),
        runtime=config.container.runtime,
        sent_at=datetime.now(UTC),
        plugin_status={k: dict(v) for k, v in (plugin_status or {}).items() if v},
    )
