"""Kernel events waiting for the manager's acknowledgement (pure, no I/O).

Every event has an id derived from the kernel and what happened
(``<kernel_id>:started``, ``<kernel_id>:exited``, ``<kernel_id>:failed``): a kernel starts,
fails or exits at most once, so the id is unique, and an event re-emitted after an
agent restart (a kernel found exited by recovery) carries the same id, which the manager
already knows how to ignore.  Events stay here until the manager acknowledges them::

    outbox = EventOutbox()
    outbox.emit("k1", "s1", KernelEventType.STARTED, at=now)
    batch = outbox.peek(100)           # send these...
    outbox.ack(e.event_id for e in batch)   # ...and drop them once the manager said 2xx
"""

from __future__ import annotations

import hashlib
import logging
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from datetime import datetime

from accelshare.protocol import KernelEvent, KernelEventType, ServicePortMapping

__all__ = ["EventOutbox", "event_id"]

log = logging.getLogger(__name__)


MAX_EVENT_ID_LENGTH = 128  # what the manager stores


def event_id(kernel_id: str, event: KernelEventType) -> str:
    """``<kernel_id>:<event>``; a kernel id too long for that is replaced by its digest."""
    eid = f"{kernel_id}:{event.value}"
    if len(eid) <= MAX_EVENT_ID_LENGTH:
        return eid
    return f"sha256-{hashlib.sha256(kernel_id.encode()).hexdigest()}:{event.value}"


class EventOutbox:
    """Pending events, oldest first; bounded (the oldest are dropped, with a warning)."""

    def __init__(self, *, max_pending: int = 100_000, remember_acked: int = 100_000) -> None:
        self._pending: OrderedDict[str, KernelEvent] = OrderedDict()
        self._acked: OrderedDict[str, None] = OrderedDict()
        self._max_pending = max_pending
        self._remember_acked = remember_acked
        self.dropped = 0

    def emit(
        self,
        kernel_id: str,
        session_id: str,
        event: KernelEventType,
        *,
        at: datetime,
        exit_code: int | None = None,
        reason: str = "",
        service_ports: Sequence[ServicePortMapping] = (),
    ) -> KernelEvent | None:
        """Queue an event; None when the same event is already queued or acknowledged."""
        eid = event_id(kernel_id, event)
        if eid in self._pending or eid in self._acked:
            return None
        item = KernelEvent(
            event_id=eid,
            kernel_id=kernel_id,
            session_id=session_id,
            event=event,
            exit_code=exit_code,
            reason=reason,
            at=at,
            service_ports=list(service_ports),
        )
        self._pending[eid] = item
        if len(self._pending) > self._max_pending:
            self._pending.popitem(last=False)
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 1000 == 0:
                log.warning(
                    "event outbox full (%d pending): dropped %d oldest event(s)",
                    self._max_pending,
                    self.dropped,
                )
        return item

    def requeue(self, event: KernelEvent) -> None:
        """Put back an event saved by a previous agent (same id, same content)."""
        if event.event_id not in self._pending and event.event_id not in self._acked:
            self._pending[event.event_id] = event

    def peek(self, limit: int) -> list[KernelEvent]:
        """Up to ``limit`` oldest pending events (they stay pending until :meth:`ack`)."""
        batch: list[KernelEvent] = []
        for item in self._pending.values():
            if len(batch) >= limit:
                break
            batch.append(item)
        return batch

    def ack(self, event_ids: Iterable[str]) -> int:
        done = 0
        for eid in event_ids:
            if self._pending.pop(eid, None) is not None:
                done += 1
                self._acked[eid] = None
        while len(self._acked) > self._remember_acked:
            self._acked.popitem(last=False)
        return done

    def __len__(self) -> int:
        return len(self._pending)
