"""Kernels' exits: each live kernel is watched until it ends; then its allocation and
host ports are freed and its exit reported, exactly once (whichever of the watcher and
a destroy gets there first)."""

from __future__ import annotations

import asyncio
import logging
import time

from accelshare.protocol import KernelEventType, KernelStatus

from .kernels import KernelRecord
from .runtime import KernelInfo, KernelNotFound
from .service_parts import AgentParts

__all__ = ["KernelExits", "apply_exit"]

log = logging.getLogger(__name__)


class KernelExits:
    """One watcher task per live kernel, and the one way a kernel is finished."""

    def __init__(self, parts: AgentParts) -> None:
        self._parts = parts
        self._watchers: dict[str, asyncio.Task[None]] = {}

    def watch(self, kernel_id: str) -> None:
        """Watch the kernel until it exits, then :meth:`finalize` it."""
        task = asyncio.create_task(self._watch_exit(kernel_id), name=f"watch-{kernel_id}")
        self._watchers[kernel_id] = task

    def unwatch(self, kernel_id: str) -> None:
        """Stop watching the kernel (its destroy finalizes it)."""
        watcher = self._watchers.pop(kernel_id, None)
        if watcher is not None:
            watcher.cancel()

    def tasks(self) -> list[asyncio.Task[None]]:
        """The watchers running (the agent cancels them when it stops)."""
        return list(self._watchers.values())

    def clear(self) -> None:
        self._watchers.clear()

    async def _watch_exit(self, kernel_id: str) -> None:
        """Await the kernel's exit, then free its allocation and report it (once)."""
        delay = 0.5
        while True:
            try:
                info: KernelInfo | None = await self._parts.runtime.wait_exit(kernel_id)
                break
            except KernelNotFound:
                info = None
                break
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("kernel %s: watching for its exit failed; retrying", kernel_id)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)
        self._watchers.pop(kernel_id, None)
        await self.finalize(kernel_id, info)

    async def finalize(self, kernel_id: str, info: KernelInfo | None) -> None:
        """Finish a live kernel (None: lost): free its allocation and ports, report it."""
        parts = self._parts
        record = parts.registry.get(kernel_id)
        if record is None or not record.is_live:
            return
        apply_exit(record, info)
        # Finished first (synchronously): a concurrent finalize now returns above.
        parts.registry.finish(
            kernel_id,
            KernelStatus.EXITED,
            exit_code=record.exit_code,
            reason=record.reason,
            at=record.finished_at or time.time(),
        )
        async with parts.alloc_lock:
            freed = parts.allocations.release(kernel_id)
            parts.ports.release(kernel_id)
        log.info(
            "kernel %s: exited (%s, exit code %s)%s",
            kernel_id,
            record.reason,
            record.exit_code,
            ", allocation freed" if freed else "",
        )
        parts.emit(record, KernelEventType.EXITED)


def apply_exit(record: KernelRecord, info: KernelInfo | None) -> None:
    """The kernel's exit code, reason and end time on its record (None: lost)."""
    exit_ = info.exit if info is not None else None
    if exit_ is None:
        record.exit_code, record.reason = None, "lost"
        return
    reason = exit_.reason.value
    if exit_.oom_killed and "oom" not in reason:
        reason += " (out of memory)"
    if exit_.error:
        reason += f": {exit_.error}"
    record.exit_code, record.reason = exit_.exit_code, reason
    record.finished_at = exit_.finished_at
