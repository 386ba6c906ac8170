"""The agent's side of the Redis bus: live stats every few seconds, kernel events at once.

    link = AgentBusLink(bus, agent_id="i-node01", collect=service.collect_stats,
                        interval_s=5.0)
    link.start()
    link.publish_event(event)      # from the service's event hook (fire and forget)
    await link.stop()

Stats: every ``interval_s`` the plugins' node and kernel stats become one
:class:`~accelshare.protocol.StatsReport` (``seq`` + 1 per tick).  While Redis is down the
ticks fail; the agent keeps running, logs the outage once, and the first report that
goes through again carries ``missed`` ticks and ``gap_s`` (and the agent logs the gap).

Events: mirrored to the Redis stream as they happen, for the manager's fast path; the
acknowledged HTTP delivery (:mod:`.manager_link`) stays the durable one, so an event
that cannot be published (Redis down, queue full) is only late, never lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from accelshare.aio import cancel_and_wait
from accelshare.bus import BusUnavailable, GapTracker, RedisBus
from accelshare.protocol import KernelEvent, KernelEventBatch, KernelStats, NodeStats, StatsReport

__all__ = ["AgentBusLink"]

log = logging.getLogger(__name__)

StatsCollect = Callable[[], Awaitable[tuple[NodeStats, KernelStats]]]


class AgentBusLink:
    def __init__(
        self,
        bus: RedisBus,
        *,
        agent_id: str,
        collect: StatsCollect,
        interval_s: float,
        monotonic: Callable[[], float] = time.monotonic,
        max_queued_events: int = 10_000,
    ) -> None:
        self.bus = bus
        self.agent_id = agent_id
        self._collect = collect
        self._interval_s = interval_s
        self._monotonic = monotonic
        self._events: asyncio.Queue[KernelEvent] = asyncio.Queue(max_queued_events)
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = asyncio.Event()
        self.tracker = GapTracker()
        self.seq = 0
        self.published = 0
        self.events_published = 0
        self.events_dropped = 0
        self._events_down = False

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._stats_loop(), name="agent-bus-stats"),
            asyncio.create_task(self._events_loop(), name="agent-bus-events"),
        ]

    async def stop(self) -> None:
        self._stopping.set()
        await cancel_and_wait(self._tasks)
        self._tasks = []
        await self.bus.close()

    # -- stats ------------------------------------------------------------------------
    async def publish_stats_once(self) -> bool:
        """One tick: collect, publish; False when Redis did not take it."""
        self.seq += 1
        now = self._monotonic()
        node, kernels = await self._collect()
        tracker = self.tracker
        if tracker.missed and tracker.last_ok is not None:  # ending an outage now
            gap_s = now - tracker.last_ok
        else:
            gap_s = tracker.last_gap.seconds if tracker.last_gap is not None else 0.0
        report = StatsReport(
            agent_id=self.agent_id,
            seq=self.seq,
            at=node.at,
            node=node,
            kernels=kernels,
            missed=tracker.missed_total,
            gap_s=round(gap_s, 3),
        )
        try:
            await self.bus.publish_stats(report)
        except BusUnavailable as e:
            if self.tracker.failed(now=now):
                log.warning("stats not published, the agent keeps trying: %s", e)
            return False
        gap = self.tracker.succeeded(now=now)
        if gap is not None:
            log.info(
                "stats published to Redis again after a gap of %.1f s (%d tick(s) missed)",
                gap.seconds,
                gap.missed,
            )
        self.published += 1
        return True

    async def _stats_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                # bounded: a tick that hangs (a plugin, a half-open connection) is a
                # failed tick, never a silent end of the stats
                async with asyncio.timeout(max(4 * self.bus.settings.timeout_s, 5.0)):
                    await self.publish_stats_once()
            except TimeoutError:
                if self.tracker.failed(now=self._monotonic()):
                    log.warning("a stats tick took too long; the agent keeps trying")
            except Exception:  # a plugin's bug must not end the loop
                log.exception("collecting stats for the bus failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), self._interval_s)

    # -- events -----------------------------------------------------------------------
    def publish_event(self, event: KernelEvent) -> None:
        """Queue ``event`` for the stream (never blocks; see the module docstring)."""
        try:
            self._events.put_nowait(event)
        except asyncio.QueueFull:
            self.events_dropped += 1

    async def _events_loop(self) -> None:
        while not self._stopping.is_set():
            batch = [await self._events.get()]
            while not self._events.empty() and len(batch) < 500:
                batch.append(self._events.get_nowait())
            try:
                async with asyncio.timeout(max(4 * self.bus.settings.timeout_s, 5.0)):
                    await self.bus.publish_events(
                        KernelEventBatch(agent_id=self.agent_id, events=batch)
                    )
            except (BusUnavailable, TimeoutError) as e:
                # the HTTP delivery still carries these events: drop them here
                self.events_dropped += len(batch)
                if not self._events_down:
                    log.warning("kernel events not mirrored to Redis (HTTP still delivers): %s", e)
                self._events_down = True
                continue
            if self._events_down:
                log.info("kernel events mirrored to Redis again")
            self._events_down = False
            self.events_published += len(batch)
