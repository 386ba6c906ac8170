"""Destroying kernels: on request (idempotent; an unknown id answers EXITED with reason
``not-found`` after its leftovers are removed) and for the manager, which names in its
heartbeat acks the kernels it considers gone."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from accelshare.protocol import HeartbeatAck, KernelReport, KernelStatus

from .runtime import KernelInfo, KernelNotFound, KernelRuntimeError
from .scratch import is_valid_kernel_id
from .service_exits import KernelExits
from .service_parts import AgentParts

__all__ = ["KernelDestroys"]

log = logging.getLogger(__name__)


class KernelDestroys:
    """Destroys, and the kernels being destroyed (their terminals say so)."""

    def __init__(self, parts: AgentParts, exits: KernelExits) -> None:
        self._parts = parts
        self._exits = exits
        self._destroying: set[str] = set()  # destroys the manager's acks started
        self._ending: set[str] = set()  # kernels being destroyed (their terminals say so)
        self.background: set[asyncio.Task[Any]] = set()

    async def destroy(self, kernel_id: str) -> KernelReport:
        """Destroy the kernel, free what it holds, remove its scratch dir; its report."""
        parts = self._parts
        async with parts.kernel_lock(kernel_id):
            record = parts.registry.get(kernel_id)
            if record is None:
                await self._cleanup_unknown(kernel_id)
                return KernelReport(
                    kernel_id=kernel_id, status=KernelStatus.EXITED, reason="not-found"
                )
            if record.is_live:
                log.info("kernel %s: destroying", kernel_id)
                self._ending.add(kernel_id)
                try:
                    try:
                        info: KernelInfo | None = await parts.runtime.destroy_kernel(
                            kernel_id, grace_s=parts.config.container.stop_grace_s
                        )
                    except KernelNotFound:
                        info = None
                    self._exits.unwatch(kernel_id)
                    if parts.runs is not None:
                        await parts.runs.end_kernel(kernel_id)
                    await self._exits.finalize(kernel_id, info)
                finally:
                    self._ending.discard(kernel_id)
            if (
                record.status is KernelStatus.EXITED
                and not record.scratch_removed
                and not parts.config.container.keep_scratch
            ):
                try:
                    await parts.runtime.cleanup_kernel(kernel_id)
                    record.scratch_removed = True
                except KernelNotFound:
                    record.scratch_removed = True
                except KernelRuntimeError as e:
                    log.warning("kernel %s: cleanup failed: %s", kernel_id, e)
            return record.report()

    def ended(self, kernel_id: str) -> bool:
        """Is the kernel being destroyed, or over?  (A terminal whose shell ended tells
        the session's end from a shell that exited by itself.)"""
        record = self._parts.registry.get(kernel_id)
        return kernel_id in self._ending or record is None or not record.is_live

    async def _cleanup_unknown(self, kernel_id: str) -> None:
        """A destroy for a kernel this agent does not track: remove leftovers, if any."""
        if self._parts.config.container.keep_scratch or not is_valid_kernel_id(kernel_id):
            return
        with contextlib.suppress(KernelRuntimeError, OSError):
            await self._parts.runtime.cleanup_kernel(kernel_id)

    async def on_heartbeat_ack(self, ack: HeartbeatAck) -> None:
        """Destroy what the manager considers gone: live kernels, and exited ones whose
        scratch dir is still here.  Kernels this agent does not know are ignored."""
        for kernel_id in ack.destroy_kernels:
            record = self._parts.registry.get(kernel_id)
            if (
                record is None
                or kernel_id in self._destroying
                or record.status is KernelStatus.FAILED
                or (not record.is_live and record.scratch_removed)
            ):
                continue
            self._destroying.add(kernel_id)
            task = asyncio.create_task(self.destroy(kernel_id), name=f"destroy-{kernel_id}")
            self.background.add(task)

            def done(task: asyncio.Task[KernelReport], kernel_id: str = kernel_id) -> None:
                self.background.discard(task)
                self._destroying.discard(kernel_id)

            task.add_done_callback(done)
