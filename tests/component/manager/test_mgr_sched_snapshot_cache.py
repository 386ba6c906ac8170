"""The snapshot caches (parses of rows kept between passes) never serve stale data: every
pass's snapshot equals one built from scratch, whatever changed between passes, and
entries of rows no longer read are dropped."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from accelshare.common import ResourceSlot
from accelshare.manager.clock import FrozenClock
from accelshare.manager.models import (
    Agent,
    AgentHeldRevision,
    Image,
    Kernel,
    Session,
    SessionDependency,
)
from accelshare.manager.scheduler import loop
from accelshare.manager.scheduler.snapshot import LoadedSnapshot, SnapshotCache

from .cluster import Cluster, running_cluster


@pytest.fixture
async def cluster(db_url: str, tmp_path: Path) -> AsyncIterator[Cluster]:
    # a frozen clock: heartbeats and writes between passes leave every timestamp as it
    # was, so only the rows' contents can tell the cache that they changed
    clock = FrozenClock(datetime.now(UTC))
    async with running_cluster(db_url, tmp_path / "state", clock=clock, background=False) as c:
        yield c


@pytest.fixture
def checked(monkeypatch: pytest.MonkeyPatch) -> list[LoadedSnapshot]:
    """Every pass's snapshot is also built without a cache, in the same transaction;
    the two must be equal.  The cached ones are collected."""
    load_snapshot = loop.load_snapshot
    seen: list[LoadedSnapshot] = []

    async def both(db: Any, *args: Any, **kwargs: Any) -> LoadedSnapshot:
        cached = await load_snapshot(db, *args, **kwargs)
        fresh = await load_snapshot(db, *args, **{**kwargs, "cache": SnapshotCache()})
        assert cached.snapshot.agents == fresh.snapshot.agents
        assert cached.snapshot.pending == fresh.snapshot.pending
        assert cached.snapshot.predicate_context == fresh.snapshot.predicate_context
        assert cached.agent_revisions == fresh.agent_revisions
        seen.append(cached)
        return cached

    monkeypatch.setattr(loop, "load_snapshot", both)
    return seen


def cache_of(cluster: Cluster) -> SnapshotCache:
    return cluster.manager.scheduler.snapshot_caches["default"]


async def write(cluster: Cluster, statement: Any) -> None:
    """One statement in its own write transaction, behind the scheduler's back."""
    async with cluster.manager.db.begin(write=True) as db:
        await db.execute(statement)


async def test_unchanged_rows_are_reused_and_changed_ones_reread(
    cluster: Cluster, checked: list[LoadedSnapshot]
) -> None:
    await cluster.add_agent("i-node01")
    # fifo skipping sessions that failed often: the snapshot reads retries
    patched = await cluster.admin.patch(
        "/admin/scaling-groups/default",
        json={"scheduler_opts": {"config": {"num_retries_to_skip": 5}}},
    )
    assert patched.status_code == 200, patched.text
    # too large for the agent: stays pending, pass after pass
    big = await cluster.create(
        {"cuda.shares": "100"}, name="big", enqueueOnly=True, waitForAgents=True
    )
    assert big.status_code == 201, big.text
    await cluster.manager.scheduler.run_once()
    cache = cache_of(cluster)
    [(_, first_agent)] = cache.agents.values()
    [(_, first_pending)] = cache.pending.values()
    await cluster.manager.scheduler.run_once()
    [(_, agent)] = cache.agents.values()
    [(_, pending)] = cache.pending.values()
    assert agent is first_agent  # nothing changed: the same objects, not parsed again
    assert pending.retries == first_pending.retries + 1  # retries still from the row
    assert pending.requested_slots is first_pending.requested_slots

    # the agent's stored heartbeat view and slots change (same heartbeat time, same
    # occupancy revision): re-read
    async with cluster.manager.db.begin(write=True) as db:
        row = await db.get(Agent, "i-node01")
        assert row is not None
        views = {k: dict(v) for k, v in row.map_views.items()}
        key = next(iter(views))
        devices = [dict(d) for d in views[key]["devices"]]
        devices[0]["allocated"] = devices[0]["capacity"]  # a device taken outside
        views[key] = {**views[key], "devices": devices}
        row.map_views = views
        row.available_slots = ResourceSlot({**row.available_slots, "cpu": 3})
    await cluster.manager.scheduler.run_once()
    [(_, agent)] = cache.agents.values()
    assert agent is not first_agent
    assert agent.state.available_slots["cpu"] == 3
    [state] = [m for m in agent.maps if m.key == key]
    assert state.devices[0].allocated == state.devices[0].capacity

    # the pending session's request changes (no status change): re-read, and placed
    await write(
        cluster,
        sa.update(Session)
        .where(Session.name == "big")
        .values(requested_slots=ResourceSlot({"cpu": 1, "mem": 2**30, "cuda.shares": 1})),
    )
    [result] = await cluster.manager.scheduler.run_once()
    assert len(result.jobs) == 1
    assert checked[-1].snapshot.pending[0].requested_slots["cuda.shares"] == 1
    await cluster.wait_status("big", "RUNNING")


async def test_new_and_cancelled_pending_sessions_and_the_memory_bound(
    cluster: Cluster, checked: list[LoadedSnapshot]
) -> None:
    await cluster.add_agent("i-node01")
    first = await cluster.create(
        {"cuda.shares": "100"}, name="a", enqueueOnly=True, waitForAgents=True
    )
    assert first.status_code == 201, first.text
    await cluster.manager.scheduler.run_once()
    cache = cache_of(cluster)
    assert len(cache.pending) == 1
    second = await cluster.create(
        {"cuda.shares": "100"}, name="b", enqueueOnly=True, waitForAgents=True
    )
    assert second.status_code == 201, second.text
    await cluster.manager.scheduler.run_once()
    assert {p.name for p in checked[-1].snapshot.pending} == {"a", "b"}
    assert len(cache.pending) == 2
    # cancelled: gone from the next snapshot and from the cache
    deleted = await cluster.admin.delete(f"/session/{first.json()['sessionId']}")
    assert deleted.status_code < 300, deleted.text
    await cluster.manager.scheduler.run_once()
    assert [p.name for p in checked[-1].snapshot.pending] == ["b"]
    assert [p.id for _, p in cache.pending.values()] == [second.json()["sessionId"]]
    # the agent leaves the group's schedulable set: its entry goes too
    await write(cluster, sa.update(Agent).values(is_schedulable=False))
    await cluster.manager.scheduler.run_once()
    assert checked[-1].snapshot.agents == ()
    assert cache.agents == {}
    # nothing pending in the group: its cache is dropped
    deleted = await cluster.admin.delete(f"/session/{second.json()['sessionId']}")
    assert deleted.status_code < 300, deleted.text
    await cluster.manager.scheduler.run_once()
    assert cluster.manager.scheduler.snapshot_caches == {}


async def test_an_image_requirement_is_kept_while_equal_and_renewed_when_it_changes(
    cluster: Cluster, checked: list[LoadedSnapshot]
) -> None:
    agent = await cluster.add_agent("i-node01")
    agent.images = ["python:3.11"]
    await agent.heartbeat()
    added = await cluster.admin.post(
        "/admin/images",
        json={"ref": "python:3.11", "min_slots": {"cpu": "1"}, "accelerators": ["cuda"]},
    )
    assert added.status_code == 201, added.text
    big = await cluster.create(
        {"cuda.shares": "100"},
        image="python:3.11",
        name="big",
        enqueueOnly=True,
        waitForAgents=True,
    )
    assert big.status_code == 201, big.text
    await cluster.manager.scheduler.run_once()
    cache = cache_of(cluster)
    [(_, first)] = cache.pending.values()
    assert first.image is not None
    await cluster.manager.scheduler.run_once()
    [(_, again)] = cache.pending.values()
    assert again is first  # the catalogue's equal requirement: the same session object
    # the catalogue entry changes (the session row does not): the session is renewed
    await write(
        cluster,
        sa.update(Image)
        .where(Image.ref == "python:3.11")
        .values(min_slots=ResourceSlot({"cpu": 2})),
    )
    await cluster.manager.scheduler.run_once()
    [(_, renewed)] = cache.pending.values()
    assert renewed is not first
    assert renewed.image is not None
    assert renewed.image.min_slots == ResourceSlot({"cpu": 2})
    assert checked[-1].snapshot.pending == (renewed,)


async def test_the_fast_path_serves_last_pass_entries_only_while_their_inputs_hold(
    cluster: Cluster, checked: list[LoadedSnapshot]
) -> None:
    """Without retries read (the default picker options), an entry of the last pass at
    the revision just read is taken as is; a change of the dependencies, of the group's
    fragmentation default or of reading retries goes the full way (``checked`` compares
    every pass with a snapshot built from scratch)."""
    await cluster.add_agent("i-node01")
    a = await cluster.create({"cuda.shares": "100"}, name="a", enqueueOnly=True, waitForAgents=True)
    b = await cluster.create({"cuda.shares": "100"}, name="b", enqueueOnly=True, waitForAgents=True)
    assert a.status_code == b.status_code == 201, (a.text, b.text)
    await cluster.manager.scheduler.run_once()
    cache = cache_of(cluster)
    first = {p.name: p for _, p in cache.pending.values()}
    await cluster.manager.scheduler.run_once()
    again = {p.name: p for _, p in cache.pending.values()}
    assert again["a"] is first["a"]
    assert again["b"] is first["b"]

    # "a"'s own row changes (its request; still too large): read and parsed again on
    # the fast path, "b" still served as it was
    await write(
        cluster,
        sa.update(Session)
        .where(Session.name == "a")
        .values(requested_slots=ResourceSlot({"cuda.shares": 200})),
    )
    await cluster.manager.scheduler.run_once()
    moved = {p.name: p for _, p in cache.pending.values()}
    assert moved["a"].requested_slots["cuda.shares"] == 200
    assert moved["b"] is first["b"]
    first = moved

    # "b" comes to depend on "a" (a row of the dependencies table: "b"'s own row and
    # revision stay as they were): the fast path must not serve "b" as it was
    await write(
        cluster,
        sa.insert(SessionDependency).values(
            session_id=uuid.UUID(b.json()["sessionId"]),
            depends_on=uuid.UUID(a.json()["sessionId"]),
        ),
    )
    await cluster.manager.scheduler.run_once()
    now = {p.name: p for _, p in cache.pending.values()}
    assert now["a"] is first["a"]  # its key still matches: the same object
    assert now["b"].dependencies == (a.json()["sessionId"],)

    # "a" carries no fragmentation option of its own (rows enqueued before the option
    # was recorded): the group's default applies, and then flips, "a"'s row unchanged
    await write(cluster, sa.update(Session).where(Session.name == "a").values(resource_opts={}))
    await cluster.manager.scheduler.run_once()
    assert next(p for _, p in cache.pending.values() if p.name == "a").allow_fragmentation
    patched = await cluster.admin.patch(
        "/admin/scaling-groups/default",
        json={"scheduler_opts": {"allow_fractional_resource_fragmentation": False}},
    )
    assert patched.status_code == 200, patched.text
    await cluster.manager.scheduler.run_once()
    flipped = {p.name: p for _, p in cache.pending.values()}
    assert not flipped["a"].allow_fragmentation
    assert flipped["b"].allow_fragmentation  # its own option, recorded at enqueue

    # retries read (fifo skipping): not the fast path; they count from the rows
    patched = await cluster.admin.patch(
        "/admin/scaling-groups/default",
        json={"scheduler_opts": {"config": {"num_retries_to_skip": 5}}},
    )
    assert patched.status_code == 200, patched.text
    await cluster.manager.scheduler.run_once()
    await cluster.manager.scheduler.run_once()
    counted = {p.name: p.retries for _, p in cache.pending.values()}
    assert counted["a"] >= 1
    assert counted["b"] >= 1
    # and back to not reading them: all 0 again, not the last pass's counts
    patched = await cluster.admin.patch(
        "/admin/scaling-groups/default",
        json={"scheduler_opts": {"config": {"num_retries_to_skip": 0}}},
    )
    assert patched.status_code == 200, patched.text
    await cluster.manager.scheduler.run_once()
    assert {p.retries for _, p in cache.pending.values()} == {0}


async def _held_revision(cluster: Cluster, agent_id: str) -> int | None:
    """SQLite: the agent's ``agent_held_revisions`` row (None: none; PostgreSQL never
    writes one)."""
    async with cluster.manager.db.begin() as db:
        return (
            await db.execute(
                sa.select(AgentHeldRevision.revision).where(AgentHeldRevision.agent_id == agent_id)
            )
        ).scalar_one_or_none()


async def test_held_kernels_rewritten_behind_the_scheduler_are_read_again(
    cluster: Cluster, checked: list[LoadedSnapshot]
) -> None:
    """An agent's held kernels are read only when their version moved (SQLite: the
    kernels' triggers bump ``agent_held_revisions``; PostgreSQL: their row versions).
    Kernel rows written by Core statements, behind the manager's back — amounts, device
    allocations, agent, status — show in the next snapshot as in one built from
    scratch (``checked``), and a write of a column the snapshot does not read leaves
    the agent's entry as it was."""
    sqlite = cluster.manager.db.dialect == "sqlite"
    await cluster.add_agent("i-node01")
    await cluster.add_agent("i-node02")
    small = await cluster.create({"cpu": 1, "mem": "1g", "cuda.shares": "0.5"}, name="small")
    assert small.status_code == 201, small.text
    await cluster.manager.scheduler.run_once()
    await cluster.wait_status("small", "RUNNING")
    big = await cluster.create(
        {"cuda.shares": "100"}, name="big", enqueueOnly=True, waitForAgents=True
    )
    assert big.status_code == 201, big.text  # never fits: every run_once makes a pass
    async with cluster.manager.db.begin() as db:
        kernel_id, holder = (
            await db.execute(
                sa.select(Kernel.id, Kernel.agent_id)
                .join(Session, Session.id == Kernel.session_id)
                .where(Session.name == "small")
            )
        ).one()
    assert holder is not None
    other = "i-node02" if holder == "i-node01" else "i-node01"
    await cluster.manager.scheduler.run_once()
    cache = cache_of(cluster)

    def agent(agent_id: str) -> Any:
        return cache.agents[agent_id][1]

    def shares(agent_id: str) -> Any:
        return agent(agent_id).state.occupied_slots.get_amount("cuda.shares")

    assert shares(holder) == Decimal("0.5")
    before = agent(holder)
    revision = await _held_revision(cluster, holder)
    assert (revision is not None) is sqlite

    async def rewrite_kernel(**values: Any) -> None:
        await write(cluster, sa.update(Kernel).where(Kernel.id == kernel_id).values(**values))
        await cluster.manager.scheduler.run_once()

    await rewrite_kernel(status_info="a column the snapshot does not read")
    assert agent(holder) is before  # not parsed again
    assert await _held_revision(cluster, holder) == revision

    await rewrite_kernel(
        occupied_slots=ResourceSlot({"cpu": 1, "mem": 2**30, "cuda.shares": "0.7"})
    )
    assert shares(holder) == Decimal("0.7")
    if sqlite:
        assert await _held_revision(cluster, holder) == (revision or 0) + 1

    await rewrite_kernel(agent_id=other)  # moved: both agents' kernels changed
    assert shares(holder) == 0
    assert shares(other) == Decimal("0.7")
    moved = agent(other)

    await rewrite_kernel(status="TERMINATING")  # still holding: read again (SQLite), parsed alike
    assert agent(other) is moved
    await rewrite_kernel(status="TERMINATED")  # no longer holds anything
    assert shares(other) == 0
    assert len(checked) == 7  # each pass compared with a snapshot built without cache
