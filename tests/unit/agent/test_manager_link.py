"""Heartbeats and event delivery against a fake manager (httpx.MockTransport, no network)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from accelshare.agent.events import EventOutbox
from accelshare.agent.manager_link import EVENTS_PATH, HEARTBEAT_PATH, ManagerLink
from accelshare.protocol import CLUSTER_SECRET_HEADER, Heartbeat, HeartbeatAck, KernelEventType

AT = datetime(2024, 1, 1, tzinfo=UTC)
SECRET = "s3cret-s3cret-s3cret"


class FakeManager:
    def __init__(self) -> None:
        self.down = False
        self.status = 200
        self.heartbeats: list[dict[str, Any]] = []
        self.batches: list[dict[str, Any]] = []
        self.secrets: set[str | None] = set()
        self.destroy: list[str] = []
        self.calls = 0

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.calls += 1
        if self.down:
            raise httpx.ConnectError("connection refused", request=request)
        self.secrets.add(request.headers.get(CLUSTER_SECRET_HEADER))
        if self.status != 200:
            return httpx.Response(self.status, json={"title": "nope"})
        body = json.loads(request.content)
        if request.url.path == HEARTBEAT_PATH:
            self.heartbeats.append(body)
            return httpx.Response(200, json={"destroy_kernels": self.destroy})
        assert request.url.path == EVENTS_PATH
        self.batches.append(body)
        return httpx.Response(204)


async def until(check: Callable[[], object], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.005)


def make_link(
    manager: FakeManager, outbox: EventOutbox, acks: list[HeartbeatAck] | None = None
) -> ManagerLink:
    async def on_ack(ack: HeartbeatAck) -> None:
        if acks is not None:
            acks.append(ack)

    return ManagerLink(
        endpoint="http://manager:8081",
        agent_id="i-1",
        secret=SECRET,
        outbox=outbox,
        build_heartbeat=lambda: Heartbeat(
            agent_id="i-1", rpc_url="http://127.0.0.1:6001", slots={}, alloc_maps={}
        ),
        on_ack=on_ack,
        interval_s=0.01,
        transport=httpx.MockTransport(manager.handle),
        min_backoff_s=0.001,
        max_backoff_s=0.01,
    )


async def test_heartbeats_carry_the_secret_and_acks_reach_the_agent() -> None:
    manager, acks = FakeManager(), []
    manager.destroy = ["k-gone"]
    link = make_link(manager, EventOutbox(), acks)
    link.start()
    await until(lambda: len(manager.heartbeats) >= 3 and acks)
    await link.stop()
    assert manager.secrets == {SECRET}
    assert manager.heartbeats[0]["agent_id"] == "i-1"
    assert acks[0].destroy_kernels == ["k-gone"]
    assert link.reachable is True


async def test_events_are_batched_and_dropped_only_once_acknowledged() -> None:
    manager, outbox = FakeManager(), EventOutbox()
    manager.down = True
    link = make_link(manager, outbox)
    link.start()
    for i in range(3):
        outbox.emit(f"k{i}", "s", KernelEventType.STARTED, at=AT)
    link.notify_events()
    await until(lambda: link.reachable is False)
    assert len(outbox) == 3  # kept while the manager is down
    manager.down = False
    await until(lambda: len(outbox) == 0)
    await link.stop()
    sent = [e["event_id"] for batch in manager.batches for e in batch["events"]]
    assert sent == ["k0:started", "k1:started", "k2:started"]
    assert manager.batches[0]["agent_id"] == "i-1"


async def test_an_outage_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    manager = FakeManager()
    manager.down = True
    link = make_link(manager, EventOutbox())
    with caplog.at_level(logging.INFO, logger="accelshare.agent.manager_link"):
        link.start()
        await until(lambda: link._failures >= 5)
        manager.down = False
        await until(lambda: link.reachable is True)
        await link.stop()
    unreachable = [r for r in caplog.records if "unreachable" in r.getMessage()]
    again = [r for r in caplog.records if "reachable again" in r.getMessage()]
    assert len(unreachable) == 1
    assert len(again) == 1


async def test_a_refusing_manager_counts_as_down_and_events_stay(
    caplog: pytest.LogCaptureFixture,
) -> None:
    manager, outbox = FakeManager(), EventOutbox()
    manager.status = 401
    link = make_link(manager, outbox)
    outbox.emit("k1", "s", KernelEventType.EXITED, at=AT, exit_code=0)
    with caplog.at_level(logging.WARNING, logger="accelshare.agent.manager_link"):
        link.start()
        link.notify_events()
        await until(lambda: link.reachable is False)
    assert any("refused the" in r.getMessage() and "401" in r.getMessage() for r in caplog.records)
    assert await link.send_heartbeat() is None
    await link.stop(flush_timeout_s=0.5)
    assert len(outbox) == 1


def _replicas(managers: dict[str, FakeManager]) -> httpx.MockTransport:
    """One transport routing by host to each fake manager replica."""
    return httpx.MockTransport(lambda request: managers[request.url.host].handle(request))


def _link_to(
    endpoints: list[str], transport: httpx.MockTransport, outbox: EventOutbox
) -> ManagerLink:
    async def on_ack(ack: HeartbeatAck) -> None:
        return None

    return ManagerLink(
        endpoint=endpoints,
        agent_id="i-1",
        secret=SECRET,
        outbox=outbox,
        build_heartbeat=lambda: Heartbeat(
            agent_id="i-1", rpc_url="http://127.0.0.1:6001", slots={}, alloc_maps={}
        ),
        on_ack=on_ack,
        interval_s=10.0,  # long: a failover must not wait for the next interval
        transport=transport,
        min_backoff_s=0.001,
        max_backoff_s=0.01,
    )


async def test_a_dead_replica_is_left_for_the_next_one_at_once() -> None:
    one, two = FakeManager(), FakeManager()
    link = _link_to(
        ["http://m1:8081", "http://m2:8081/"],
        _replicas({"m1": one, "m2": two}),
        EventOutbox(),
    )
    assert await link.send_heartbeat() is not None
    assert (len(one.heartbeats), len(two.heartbeats)) == (1, 0)  # the first replica first
    one.down = True
    link.start()
    try:
        await until(lambda: two.heartbeats)  # no 10 s wait: retried on m2 at once
        assert link.reachable is True
    finally:
        await link.stop(flush_timeout_s=0)
    # and it stays there: events go to the replica that answers
    outbox = EventOutbox()
    outbox.emit("k1", "s1", KernelEventType.STARTED, at=AT)
    link = _link_to(["http://m1:8081", "http://m2:8081"], _replicas({"m1": one, "m2": two}), outbox)
    link.start()
    try:
        await until(lambda: two.batches)
        assert not one.batches
        assert len(outbox) == 0
    finally:
        await link.stop(flush_timeout_s=0)


async def test_a_5xx_fails_over_but_a_refusal_does_not() -> None:
    one, two = FakeManager(), FakeManager()
    transport = _replicas({"m1": one, "m2": two})
    link = _link_to(["http://m1:8081", "http://m2:8081"], transport, EventOutbox())
    one.status = 503  # a replica whose database is down
    assert await link.send_heartbeat() is None
    assert await link.send_heartbeat() is not None
    assert (one.calls, two.calls, len(two.heartbeats)) == (1, 1, 1)
    two.status = 401  # a wrong cluster secret on the replica that answers: a refusal
    assert await link.send_heartbeat() is None
    assert await link.send_heartbeat() is None
    assert (one.calls, two.calls) == (1, 3)  # the agent did not wander back to m1
    await link.stop(flush_timeout_s=0)


async def test_a_single_endpoint_keeps_retrying_the_same_manager() -> None:
    manager = FakeManager()
    link = _link_to(["http://m1:8081"], _replicas({"m1": manager}), EventOutbox())
    manager.down = True
    assert await link.send_heartbeat() is None
    manager.down = False
    assert await link.send_heartbeat() is not None
    await link.stop(flush_timeout_s=0)
