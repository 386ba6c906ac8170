"""Restart recovery, the agent's side: what :func:`.recovery.discover_kernels` found is
put back into the agent.

Live kernels get their allocations back in the maps (:meth:`AgentAllocations.restore`), their
host ports reserved and a watcher; kernels that ended while no agent ran are reported
exited; kernels whose allocation cannot be read are tracked (their host ports kept) and
logged.  Events left undelivered at the last clean stop are queued again first.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from accelshare.protocol import KernelEventType, KernelStatus, ServicePortMapping

from .kernels import KernelRecord
from .ports import HostPortPool, mappings_from_json, ports_in_environ
from .recovery import discover_kernels
from .service_exits import KernelExits, apply_exit
from .service_parts import AgentParts
from .state_files import (
    load_pending_events,
    read_device_history,
    read_kernel_meta,
    write_device_history,
)

__all__ = ["record_from_meta", "recover"]

log = logging.getLogger(__name__)


async def recover(parts: AgentParts, exits: KernelExits, scratch_root: Path) -> None:
    """Re-adopt what the last agent left: see the module docstring."""
    allocations, runtime = parts.allocations, parts.runtime
    for event in await asyncio.to_thread(load_pending_events, scratch_root):
        parts.outbox.requeue(event)  # undelivered at the last clean stop
    report = await discover_kernels(runtime, allocations.slot_types)
    history = await asyncio.to_thread(read_device_history, scratch_root)
    async with parts.alloc_lock:
        restored = allocations.restore(
            [(k.kernel_id, k.allocations) for k in report.live], old_capacities=history
        )
    await asyncio.to_thread(write_device_history, scratch_root, allocations.maps, history)
    for message in restored.messages:
        log.warning("restart recovery: %s", message)
    metas = await asyncio.to_thread(
        lambda: {
            info.kernel_id: read_kernel_meta(info.scratch_dir)
            for info in [
                *(k.info for k in report.live),
                *report.exited,
                *(u.info for u in report.unrecoverable),
            ]
        }
    )
    for kernel in report.live:
        meta = metas.get(kernel.kernel_id, {})
        record = record_from_meta(kernel.kernel_id, meta, KernelStatus.RUNNING)
        record.allocations = allocations.recorded(kernel.kernel_id)
        record.requested_slots = dict(kernel.resources.slots.to_json())
        record.mark_running(cid=kernel.info.cid, pids=kernel.info.pids, at=time.time())
        _reserve_ports(parts.ports, kernel.kernel_id, record.service_ports)
        parts.registry.add(record)
        exits.watch(kernel.kernel_id)
    for info in report.exited:
        record = record_from_meta(
            info.kernel_id, metas.get(info.kernel_id, {}), KernelStatus.EXITED
        )
        record.container_id = info.cid
        apply_exit(record, info)
        parts.registry.add(record)
        parts.emit(record, KernelEventType.EXITED)
    for bad in report.unrecoverable:
        # Its allocation is unknown, but its app ports must stay its own: from its
        # meta file where its scratch dir is left, else (an orphan) from what its
        # processes were told to listen on.
        meta = metas.get(bad.info.kernel_id, {})
        record = record_from_meta(bad.info.kernel_id, meta, KernelStatus.RUNNING)
        record.reason = f"allocation unknown: {bad.reason}"
        record.mark_running(cid=bad.info.cid, pids=bad.info.pids, at=time.time())
        ports = [m.host_port for m in record.service_ports]
        if not ports:
            ports = await asyncio.to_thread(ports_in_environ, bad.info.pids, parts.ports.port_range)
        _reserve_ports(parts.ports, bad.info.kernel_id, record.service_ports, ports)
        parts.registry.add(record)
        exits.watch(bad.info.kernel_id)
    log.info(
        "restart recovery: %d kernel(s) re-adopted (%d with legacy holdings), %d exited "
        "while the agent was away, %d with an unknown allocation",
        len(report.live),
        len(restored.legacy),
        len(report.exited),
        len(report.unrecoverable),
    )


def _reserve_ports(
    pool: HostPortPool,
    kernel_id: str,
    mapped: Sequence[ServicePortMapping],
    ports: Sequence[int] | None = None,
) -> None:
    """Hold a re-adopted kernel's host ports, so no new kernel is given one."""
    held = [m.host_port for m in mapped] if ports is None else list(ports)
    clashes = pool.reserve(kernel_id, held)
    if held:
        log.info("restart recovery: kernel %s keeps host port(s) %s", kernel_id, held)
    if clashes:
        log.warning(
            "restart recovery: kernel %s: host port(s) %s also held by another kernel",
            kernel_id,
            clashes,
        )


def record_from_meta(kernel_id: str, meta: Mapping[str, Any], status: KernelStatus) -> KernelRecord:
    """A re-adopted kernel's record from its meta file (what the agent wrote at its
    start: session, image, owner, labels, app ports); blanks where it says nothing."""

    def text(key: str) -> str:
        value = meta.get(key)
        return value if isinstance(value, str) else ""

    labels = meta.get("labels")
    created = meta.get("created_at")
    return KernelRecord(
        kernel_id,
        session_id=text("session_id"),
        image=text("image"),
        status=status,
        owner_access_key=text("owner_access_key"),
        labels={str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {},
        created_at=float(created) if isinstance(created, int | float) else None,
        service_ports=mappings_from_json(meta.get("service_ports")),
    )
