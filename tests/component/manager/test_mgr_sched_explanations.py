"""Why sessions stay pending is written off the pass (manager/scheduler/explanations.py):
coalesced, changed explanations first, unchanged ones at most every ``refresh_s``, in
chunks, ``retries`` added by the database."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from accelshare.manager.models import Session
from accelshare.manager.scheduler import explanations, loop
from accelshare.manager.scheduler.explanations import Explanations
from accelshare.sched.snapshot import SchedulingSnapshot

from .cluster import Cluster, Frozen


async def too_big(cluster: Cluster, n: int) -> list[str]:
    await cluster.add_agent("i-node01")  # two GPUs of 1.0 share
    ids = []
    for i in range(n):
        created = await cluster.create(
            {"cuda.shares": "3"}, name=f"big{i}", enqueueOnly=True, waitForAgents=True
        )
        assert created.status_code == 201, created.text
        ids.append(created.json()["sessionId"])
    return ids


async def skip_after(cluster: Cluster, retries: int) -> None:
    patched = await cluster.admin.patch(
        "/admin/scaling-groups/default",
        json={"scheduler_opts": {"config": {"num_retries_to_skip": retries}}},
    )
    assert patched.status_code == 200, patched.text


async def scheduler_of(cluster: Cluster, name: str) -> dict[str, Any] | None:
    data = (await cluster.session(name))["statusData"]
    return data.get("scheduler") if data else None


async def test_a_pass_leaves_them_queued_and_a_flush_writes_them_in_chunks(
    frozen: Frozen, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster, _ = frozen
    await too_big(cluster, 3)
    writer = cluster.manager.scheduler.explanations
    writer.chunk = 2
    chunks: list[int] = []
    write = explanations.write_explanations

    async def writing(db: Any, entries: Any) -> Any:
        chunks.append(len(entries))
        return await write(db, entries)

    monkeypatch.setattr(explanations, "write_explanations", writing)
    await cluster.manager.scheduler.run_once(flush=False)
    assert chunks == []
    assert writer.queued == 3
    assert await scheduler_of(cluster, "big0") is None  # nothing written by the pass
    await writer.flush()
    assert chunks == [2, 1]
    for i in range(3):
        scheduler = await scheduler_of(cluster, f"big{i}")
        assert scheduler is not None
        assert scheduler["retries"] == 1
        assert scheduler["kind"] == "no-agent"


async def test_passes_coalesce_and_their_retries_add_up(
    frozen: Frozen, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster, clock = frozen
    [sid] = await too_big(cluster, 1)
    writer = cluster.manager.scheduler.explanations
    await skip_after(cluster, 5)  # fifo ordering by retries: the snapshot reads them
    seen: list[SchedulingSnapshot] = []
    load_snapshot = loop.load_snapshot

    async def capturing(*args: Any, **kwargs: Any) -> Any:
        loaded = await load_snapshot(*args, **kwargs)
        seen.append(loaded.snapshot)
        return loaded

    monkeypatch.setattr(loop, "load_snapshot", capturing)
    for _ in range(3):
        clock.advance(timedelta(seconds=1))
        await cluster.manager.scheduler.run_once(flush=False)
    # nothing written yet, but every pass saw the attempts of the ones before
    assert [s.pending[0].retries for s in seen] == [0, 1, 2]
    assert writer.unwritten(sid) == 3
    await writer.flush()
    assert writer.unwritten(sid) == 0
    assert writer.rows_written == 1  # one write for three passes
    scheduler = await scheduler_of(cluster, "big0")
    assert scheduler is not None
    assert scheduler["retries"] == 3
    assert scheduler["last_try"] == clock().isoformat()  # the newest pass's
    # plain fifo orders by age only: the snapshot does not even read the stored count
    await skip_after(cluster, 0)
    await cluster.manager.scheduler.run_once()
    assert seen[-1].pending[0].retries == 0
    scheduler = await scheduler_of(cluster, "big0")
    assert scheduler is not None
    assert scheduler["retries"] == 4


async def test_retries_are_added_to_what_is_stored(frozen: Frozen) -> None:
    cluster, _ = frozen
    [sid] = await too_big(cluster, 1)
    await cluster.manager.scheduler.run_once()
    # another replica wrote meanwhile (its count is in the row, not in this process)
    async with cluster.manager.db.begin(write=True) as db:
        row = await db.get(Session, uuid.UUID(sid))
        assert row is not None
        row.status_data = {**row.status_data, "scheduler": {"retries": 41}}
    await cluster.manager.scheduler.run_once()
    scheduler = await scheduler_of(cluster, "big0")
    assert scheduler is not None
    assert scheduler["retries"] == 42


async def test_unchanged_ones_wait_for_refresh_changed_ones_do_not(frozen: Frozen) -> None:
    cluster, clock = frozen
    await too_big(cluster, 2)
    now = [1000.0]
    manager = cluster.manager
    writer = manager.scheduler.explanations = Explanations(
        manager.db, refresh_s=5.0, monotonic=lambda: now[0]
    )
    await manager.scheduler.run_once(flush=False)
    await writer._write(due_only=True)  # new: written at once
    assert writer.rows_written == 2
    clock.advance(timedelta(seconds=1))
    await manager.scheduler.run_once(flush=False)
    await writer._write(due_only=True)  # the same explanations: not due yet
    assert writer.rows_written == 2
    assert writer.queued == 2
    now[0] += 5.0
    await writer._write(due_only=True)  # due now
    assert writer.rows_written == 4
    first = await scheduler_of(cluster, "big0")
    assert first is not None
    assert first["retries"] == 2

    # big1 now fits only partly: its explanation changes and is written at once
    async with manager.db.begin(write=True) as db:
        await db.execute(
            sa.update(Session)
            .where(Session.name == "big1")
            .values(requested_slots={"cpu": "1", "mem": str(2**30), "cuda.shares": "4"})
        )
    manager.scheduler.snapshot_caches.clear()
    await manager.scheduler.run_once(flush=False)
    await writer._write(due_only=True)
    assert writer.rows_written == 5  # big1 only
    big1 = await scheduler_of(cluster, "big1")
    assert big1 is not None
    assert "needs 4" in big1["msg"]
    await writer.stop()


async def test_a_group_with_nothing_pending_is_forgotten(frozen: Frozen) -> None:
    cluster, _ = frozen
    [sid] = await too_big(cluster, 1)
    writer = cluster.manager.scheduler.explanations
    await cluster.manager.scheduler.run_once()
    assert writer.groups == {"default"}
    deleted = await cluster.admin.delete(f"/session/{sid}")
    assert deleted.status_code < 300, deleted.text
    await cluster.manager.scheduler.run_once()
    assert writer.groups == frozenset()
    assert writer.queued == 0


async def test_a_chunk_waits_while_binds_are_in_flight(frozen: Frozen) -> None:
    """Binds come first on the writer: a chunk waits for the binder to be idle, and
    goes anyway after ``defer_max_s`` (a cluster that never stops binding)."""
    cluster, _ = frozen
    await too_big(cluster, 2)
    manager = cluster.manager
    binds_idle = asyncio.Event()  # binds in flight
    writer = manager.scheduler.explanations = Explanations(
        manager.db, binds_idle=binds_idle, defer_max_s=30.0
    )
    await manager.scheduler.run_once(flush=False)
    writing = asyncio.create_task(writer._write(due_only=True, gated=True))
    await asyncio.sleep(0.2)
    assert writer.rows_written == 0
    assert not writing.done()
    binds_idle.set()  # the last bind ended
    await asyncio.wait_for(writing, 5)
    assert writer.rows_written == 2

    binds_idle.clear()
    writer.defer_max_s = 0.05
    await manager.scheduler.run_once(flush=False)
    await asyncio.wait_for(writer._write(due_only=False, gated=True), 5)
    assert writer.rows_written == 4  # written after waiting 50 ms, binds or not
    await writer.flush()  # a flush never waits
    await writer.stop()


async def test_the_binder_is_idle_only_while_nothing_is_bound(frozen: Frozen) -> None:
    cluster, _ = frozen
    await cluster.add_agent("i-node01")
    binder = cluster.manager.binder
    assert binder.idle.is_set()
    gate = asyncio.Event()
    original = binder.bind_batch

    async def held(jobs: Any) -> None:
        await gate.wait()
        await original(jobs)

    binder.bind_batch = held  # type: ignore[method-assign]
    created = await cluster.create({"cpu": "1"}, name="held", enqueueOnly=True)
    assert created.status_code == 201, created.text
    await cluster.manager.scheduler.run_once()
    assert not binder.idle.is_set()  # its bind waits on the gate
    gate.set()
    await asyncio.wait_for(binder.idle.wait(), 10)
    assert (await cluster.session("held"))["status"] == "RUNNING"


async def test_a_waited_for_explanation_does_not_defer_to_binds(frozen: Frozen) -> None:
    """A create that answers with its session's reason waits in ``settled``: the chunk
    holding it goes at once even while binds are in flight."""
    cluster, _ = frozen
    [sid, _other] = await too_big(cluster, 2)
    manager = cluster.manager
    binds_idle = asyncio.Event()  # binds in flight, for longer than the test waits
    writer = manager.scheduler.explanations = Explanations(
        manager.db, binds_idle=binds_idle, defer_max_s=60.0
    )
    await manager.scheduler.run_once(flush=False)
    writing = asyncio.create_task(writer._write(due_only=True, gated=True))
    await asyncio.sleep(0.1)
    assert writer.rows_written == 0  # deferring to the binds
    assert writer.unwritten(sid) == 1  # picked but not written: its retry still counts
    assert await writer.settled(sid, 5.0)  # a waiter: written now
    assert writer.unwritten(sid) == 0
    await asyncio.wait_for(writing, 5)
    assert writer.rows_written == 2
    scheduler = await scheduler_of(cluster, "big0")
    assert scheduler is not None
    assert "needs 3" in scheduler["msg"]
    await writer.stop()
