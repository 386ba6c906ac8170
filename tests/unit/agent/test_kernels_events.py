"""Kernel registry and event outbox (pure)."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import pytest

from accelshare.agent.events import EventOutbox, event_id
from accelshare.agent.kernels import KernelRecord, KernelRegistry
from accelshare.protocol import KernelEventType, KernelStatus

AT = datetime(2024, 1, 1, tzinfo=UTC)


def test_registry_lifecycle_and_reports() -> None:
    registry = KernelRegistry()
    record = registry.add(KernelRecord("k1", session_id="s1", image="python"))
    assert record.status is KernelStatus.PREPARING
    record.allocations = {"cpu": {"0": Decimal(1)}, "mem": {"root": Decimal(2 << 30)}}
    record.mark_running(cid="42", pids=(42,), at=1.0)
    assert [r.kernel_id for r in registry.live()] == ["k1"]
    with pytest.raises(ValueError, match="already registered"):
        registry.add(KernelRecord("k1"))
    finished = registry.finish("k1", KernelStatus.EXITED, exit_code=0, reason="exited", at=2.0)
    assert finished is record
    assert registry.finish("k1", KernelStatus.EXITED) is None  # once
    assert registry.live() == []
    report = registry.get("k1").report()  # type: ignore[union-attr]
    assert report.status is KernelStatus.EXITED
    assert report.allocations == {"cpu": {"0": "1"}, "mem": {"root": "2147483648"}}
    assert report.container_id == "42"
    assert report.exit_code == 0
    with pytest.raises(ValueError, match="not a finished status"):
        registry.finish("k1", KernelStatus.RUNNING)


def test_registry_keeps_a_bounded_number_of_finished_kernels() -> None:
    registry = KernelRegistry(keep_finished=2)
    for i in range(4):
        registry.add(KernelRecord(f"k{i}"))
        registry.finish(f"k{i}", KernelStatus.FAILED, reason="x")
    assert [r.kernel_id for r in registry.all()] == ["k2", "k3"]
    registry.forget("k3")
    assert registry.get("k3") is None


def test_outbox_ids_dedup_ack_and_bound() -> None:
    outbox = EventOutbox(max_pending=3)
    first = outbox.emit("k1", "s1", KernelEventType.STARTED, at=AT)
    assert first is not None
    assert first.event_id == "k1:started"
    assert outbox.emit("k1", "s1", KernelEventType.STARTED, at=AT) is None  # same event
    outbox.emit("k1", "s1", KernelEventType.EXITED, at=AT, exit_code=137, reason="oom-killed")
    batch = outbox.peek(10)
    assert [e.event_id for e in batch] == ["k1:started", "k1:exited"]
    assert batch[1].exit_code == 137
    assert outbox.ack(["k1:started"]) == 1
    assert outbox.emit("k1", "s1", KernelEventType.STARTED, at=AT) is None  # acked: not again
    for i in range(4):
        outbox.emit(f"k{i + 2}", "s", KernelEventType.STARTED, at=AT)
    assert len(outbox) == 3
    assert outbox.dropped == 2
    assert outbox.peek(1)[0].event_id == "k3:started"


def test_event_ids_fit_the_managers_column() -> None:
    long_id = "k" * 128
    eid = event_id(long_id, KernelEventType.EXITED)
    assert len(eid) <= 128
    assert eid.endswith(":exited")
    assert eid == event_id(long_id, KernelEventType.EXITED)  # stable
    assert event_id("k1", KernelEventType.FAILED) == "k1:failed"
