"""The manager's side of the Redis bus (only when ``[redis]`` is configured).

* **Kernel events**: a loop reads the ``events`` stream as one consumer of the group
  ``managers`` (each entry reaches one replica), applies each batch through the agent
  registry (which ignores an event id it already applied — the agents also deliver
  every event over HTTP) and acknowledges it.  How long an event took from the agent to
  being applied, per path, is the histogram ``accelshare_event_delivery_seconds{path}``.
* **Live stats**: :meth:`ManagerBusLink.stats` reads the agents' latest reports (one
  MGET), so the console's agents view costs one Redis round trip instead of one RPC per
  agent, on every replica.
* **Change notices**: a local :class:`~.hub.ChangeHub` publish is forwarded to the other
  replicas (coalesced, at most one notice per ``notice_interval_s``), and their notices
  wake this replica's waiters (SSE streams, ``maxWaitSeconds``) at once instead of at
  their next poll.

Redis going away is never fatal: each loop logs the outage once, retries with a
growing pause (0.2 s .. 5 s), and logs when Redis answers again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence

from accelshare.aio import cancel_and_wait
from accelshare.bus import BusUnavailable, RedisBus
from accelshare.protocol import KernelEventBatch, StatsReport

from .hub import ChangeHub

__all__ = ["ManagerBusLink"]

log = logging.getLogger(__name__)

ApplyEvents = Callable[[KernelEventBatch], Awaitable[int]]


class _Outage:
    """Log an outage once, its end once; a growing pause between retries."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.down = False
        self.pause_s = 0.2

    def failed(self, error: BusUnavailable) -> float:
        if not self.down:
            log.warning("%s: %s; retrying", self.what, error)
        self.down = True
        pause, self.pause_s = self.pause_s, min(self.pause_s * 2, 5.0)
        return pause

    def succeeded(self) -> None:
        if self.down:
            log.info("%s: Redis answers again", self.what)
        self.down = False
        self.pause_s = 0.2


class ManagerBusLink:
    def __init__(
        self,
        bus: RedisBus,
        *,
        hub: ChangeHub,
        apply_events: ApplyEvents,
        instance_id: str | None = None,
        notice_interval_s: float = 0.05,
        on_received: Callable[[int], None] | None = None,
    ) -> None:
        self.bus = bus
        self.hub = hub
        self._apply_events = apply_events
        self._on_received = on_received  # how many events each read brought
        self.instance_id = instance_id or f"manager-{uuid.uuid4().hex[:12]}"
        self._notice_interval_s = notice_interval_s
        self._notice_wanted = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.events_applied = 0
        self.notices_received = 0

    def start(self) -> None:
        self.hub.add_listener(self._local_change)
        self._tasks = [
            asyncio.create_task(self._events_loop(), name="manager-bus-events"),
            asyncio.create_task(self._notices_out(), name="manager-bus-notices-out"),
            asyncio.create_task(self._notices_in(), name="manager-bus-notices-in"),
        ]

    async def stop(self) -> None:
        self.hub.remove_listener(self._local_change)
        await cancel_and_wait(self._tasks)
        self._tasks = []
        await self.bus.close()

    async def stats(self, agent_ids: Sequence[str]) -> dict[str, StatsReport | None]:
        """The agents' latest stats reports (raises BusUnavailable)."""
        return await self.bus.read_stats(agent_ids)

    # -- events -----------------------------------------------------------------------
    async def _events_loop(self) -> None:
        outage = _Outage("kernel events from Redis")
        while True:
            try:
                entries = await self.bus.read_events(self.instance_id)
            except BusUnavailable as e:
                await asyncio.sleep(outage.failed(e))
                continue
            outage.succeeded()
            done: list[str] = []
            if self._on_received is not None and entries:
                self._on_received(sum(len(batch.events) for _, batch in entries))
            for entry_id, batch in entries:
                try:
                    self.events_applied += await self._apply_events(batch)
                except asyncio.CancelledError:
                    raise
                except Exception:  # the HTTP delivery will bring it again
                    log.exception("applying kernel events from Redis failed")
                done.append(entry_id)
            with contextlib.suppress(BusUnavailable):
                await self.bus.ack_events(done)

    # -- change notices ---------------------------------------------------------------
    def _local_change(self, *, remote: bool) -> None:
        if not remote:
            self._notice_wanted.set()

    async def _notices_out(self) -> None:
        outage = _Outage("change notices to Redis")
        while True:
            await self._notice_wanted.wait()
            self._notice_wanted.clear()
            try:
                await self.bus.publish_change(self.instance_id)
                outage.succeeded()
            except BusUnavailable as e:
                await asyncio.sleep(outage.failed(e))
                continue
            await asyncio.sleep(self._notice_interval_s)  # coalesce bursts

    async def _notices_in(self) -> None:
        outage = _Outage("change notices from Redis")
        while True:
            try:
                async for origin in self.bus.changes():
                    outage.succeeded()
                    if origin != self.instance_id:
                        self.notices_received += 1
                        self.hub.publish(remote=True)
            except BusUnavailable as e:
                await asyncio.sleep(outage.failed(e))
