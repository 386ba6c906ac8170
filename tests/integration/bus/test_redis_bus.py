"""The Redis bus against a real redis-server: stats, events, change notices, and a
Redis restart in the middle of each (nothing crashes, the gap is reported)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

import pytest

from accelshare.agent.bus_link import AgentBusLink
from accelshare.bus import BusUnavailable, RedisBus, RedisSettings
from accelshare.manager.bus_link import ManagerBusLink
from accelshare.manager.hub import ChangeHub
from accelshare.protocol import (
    KernelEvent,
    KernelEventBatch,
    KernelEventType,
    KernelStats,
    MetricValue,
    NodeStats,
    StatsReport,
)
from accelshare_testkit.redis_server import RedisProcess

pytestmark = pytest.mark.integration


def _stats(agent_id: str, util: str = "42") -> tuple[NodeStats, KernelStats]:
    now = datetime.now(UTC)
    node = NodeStats(
        agent_id=agent_id,
        at=now,
        metrics=[MetricValue(name="cuda_util", device_id="gpu0", value=util, unit="percent")],
    )
    kernels = KernelStats(
        agent_id=agent_id,
        at=now,
        kernels={"k1": [MetricValue(name="cuda_mem", value="1073741824", unit="bytes")]},
    )
    return node, kernels


def _event(kernel_id: str, kind: KernelEventType = KernelEventType.STARTED) -> KernelEvent:
    return KernelEvent(
        event_id=f"{kernel_id}:{kind.value}",
        kernel_id=kernel_id,
        session_id="s-" + kernel_id,
        event=kind,
        at=datetime.now(UTC),
    )


async def _until(check: Callable[[], Awaitable[bool]], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.02)


async def test_stats_round_trip_and_expiry(redis_settings: RedisSettings) -> None:
    bus = RedisBus(redis_settings.model_copy(update={"stats_ttl_s": 0.3}))
    try:
        node, kernels = _stats("i-a")
        report = StatsReport(agent_id="i-a", seq=7, at=node.at, node=node, kernels=kernels)
        await bus.publish_stats(report)
        got = await bus.read_stats(["i-a", "i-never"])
        assert got == {"i-a": report, "i-never": None}
        assert got["i-a"] is not None
        assert got["i-a"].node.metrics[0].value == "42"  # a decimal string, not a float

        async def expired() -> bool:
            return (await bus.read_stats(["i-a"]))["i-a"] is None

        await _until(expired, timeout_s=5)  # a silent agent's stats do not linger
    finally:
        await bus.close()


async def test_events_reach_one_consumer_of_the_group_once(
    redis_settings: RedisSettings,
) -> None:
    publisher, one, two = (
        RedisBus(redis_settings),
        RedisBus(redis_settings),
        RedisBus(redis_settings),
    )
    try:
        assert await one.read_events("m1", block_s=0.05) == []  # creates the group at the end
        for i in range(6):
            await publisher.publish_events(
                KernelEventBatch(agent_id="i-a", events=[_event(f"k{i}")])
            )
        seen: list[str] = []
        for _ in range(20):
            for reader, name in ((one, "m1"), (two, "m2")):
                entries = await reader.read_events(name, count=2, block_s=0.05)
                await reader.ack_events([entry_id for entry_id, _ in entries])
                seen += [e.kernel_id for _, batch in entries for e in batch.events]
            if len(seen) >= 6:
                break
        assert sorted(seen) == [f"k{i}" for i in range(6)]  # each once, split between replicas
        assert await one.read_events("m1", block_s=0.05) == []
    finally:
        for bus in (publisher, one, two):
            await bus.close()


async def test_an_unreachable_redis_is_a_clear_error_not_a_hang() -> None:
    from accelshare_testkit.servers import free_port

    bus = RedisBus(RedisSettings(addr=f"127.0.0.1:{free_port()}", timeout_s=0.3))
    started = time.monotonic()
    try:
        with pytest.raises(BusUnavailable, match=r"Redis at 127\.0\.0\.1:\d+ unavailable"):
            await bus.ping()
        with pytest.raises(BusUnavailable, match="reading stats"):
            await bus.read_stats(["i-a"])
    finally:
        await bus.close()
    assert time.monotonic() - started < 5


async def test_stats_survive_a_redis_restart_and_report_the_gap(
    redis_server: RedisProcess, redis_settings: RedisSettings
) -> None:
    collected = 0

    async def collect() -> tuple[NodeStats, KernelStats]:
        nonlocal collected
        collected += 1
        return _stats("i-gap", util=str(collected))

    link = AgentBusLink(
        RedisBus(redis_settings), agent_id="i-gap", collect=collect, interval_s=0.05
    )
    reader = RedisBus(redis_settings)
    link.start()
    try:

        async def published_some() -> bool:
            return link.published >= 2

        await _until(published_some)
        redis_server.stop()

        async def missed_some() -> bool:
            return link.tracker.missed >= 3

        await _until(missed_some)  # ticks fail; the loop keeps going (no crash)
        assert link._tasks
        assert not any(t.done() for t in link._tasks)
        redis_server.start()

        async def gap_reported() -> bool:
            try:
                report = (await reader.read_stats(["i-gap"]))["i-gap"]
            except BusUnavailable:
                return False
            return report is not None and report.missed >= 3

        await _until(gap_reported)
        report = (await reader.read_stats(["i-gap"]))["i-gap"]
        assert report is not None
        assert report.gap_s > 0
        # the sequence numbers show the same gap to any consumer
        assert report.seq >= link.published + report.missed
        later = await _later_report(reader, report.seq)
        assert later.missed == report.missed  # still there in every later report
        assert later.gap_s == report.gap_s
    finally:
        await link.stop()
        await reader.close()


async def _later_report(reader: RedisBus, after_seq: int) -> StatsReport:
    found: StatsReport | None = None

    async def newer() -> bool:
        nonlocal found
        found = (await reader.read_stats(["i-gap"]))["i-gap"]
        return found is not None and found.seq > after_seq

    await _until(newer)
    assert found is not None
    return found


async def test_manager_link_applies_events_and_resumes_after_a_restart(
    redis_server: RedisProcess, redis_settings: RedisSettings
) -> None:
    applied: list[str] = []

    async def apply(batch: KernelEventBatch) -> int:
        applied.extend(e.event_id for e in batch.events)
        return len(batch.events)

    link = ManagerBusLink(RedisBus(redis_settings), hub=ChangeHub(), apply_events=apply)
    publisher = RedisBus(redis_settings)
    link.start()
    try:

        async def published(kernel_id: str) -> bool:
            try:
                await publisher.publish_events(
                    KernelEventBatch(agent_id="i-a", events=[_event(kernel_id)])
                )
            except BusUnavailable:
                return False
            return True

        async def applied_k(kernel_id: str) -> bool:
            return f"{kernel_id}:started" in applied

        # the consumer group is created when the loop first reads: publish until seen
        async def first() -> bool:
            await published("k-before")
            return await applied_k("k-before")

        await _until(first)
        redis_server.stop()
        await asyncio.sleep(0.3)  # the loop meets the outage and retries (no crash)
        assert all(not t.done() for t in link._tasks)
        redis_server.start()  # a fresh Redis: no stream, no group

        async def after() -> bool:
            await published("k-after")
            return await applied_k("k-after")

        await _until(after)
    finally:
        await link.stop()
        await publisher.close()


async def test_change_notices_wake_the_other_replica(redis_settings: RedisSettings) -> None:
    hub1, hub2 = ChangeHub(), ChangeHub()

    async def no_events(batch: KernelEventBatch) -> int:
        return 0

    one = ManagerBusLink(RedisBus(redis_settings), hub=hub1, apply_events=no_events)
    two = ManagerBusLink(RedisBus(redis_settings), hub=hub2, apply_events=no_events)
    one.start()
    two.start()
    try:
        await asyncio.sleep(0.3)  # both subscribed
        version = hub2.version

        async def woken() -> bool:
            hub1.publish()
            return await hub2.wait(timeout_s=0.2)

        await _until(woken)
        assert hub2.version > version
        assert two.notices_received >= 1
        assert one.notices_received == 0  # its own notices are not echoed back
    finally:
        await one.stop()
        await two.stop()
