"""The pass pipeline: plan outside the write lock, apply with a compare-and-set per agent,
binds started before the explanations of the sessions left pending are written."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from accelshare.manager.db import Database
from accelshare.manager.models import Agent, Kernel, Session
from accelshare.manager.scheduler import explanations, loop
from accelshare.manager.transitions import recompute_agent_occupancy
from accelshare.sched.outcome import SchedulingPlan
from accelshare.sched.plan import PlacedPass

from .cluster import Cluster, Frozen


async def kernels_of(cluster: Cluster, name: str) -> int:
    async with cluster.manager.db.begin() as db:
        count = await db.scalar(
            sa.select(sa.func.count())
            .select_from(Kernel)
            .join(Session, Session.id == Kernel.session_id)
            .where(Session.name == name)
        )
    return int(count or 0)


def record_explains(monkeypatch: pytest.MonkeyPatch, order: list[str]) -> None:
    """Append "explain" to ``order`` whenever a pass works out its explanations."""
    explain = PlacedPass.explain

    def explaining(placed: PlacedPass) -> SchedulingPlan:
        order.append("explain")
        return explain(placed)

    monkeypatch.setattr(PlacedPass, "explain", explaining)


async def test_a_release_between_plan_and_apply_sends_the_placement_to_the_next_pass(
    frozen: Frozen, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write lands after the snapshot (on SQLite too: the pass holds no write lock while
    it plans): the agent's compare-and-set fails, nothing of the stale plan is applied,
    and the next pass places the session on fresh figures."""
    cluster, _clock = frozen
    await cluster.add_agent("i-node01")
    created = await cluster.create({"cuda.shares": "1"}, name="late", enqueueOnly=True)
    assert created.status_code == 201, created.text
    apply_plan = loop.apply_plan
    bumped: list[int] = []

    async def release_first(*args: Any, **kwargs: Any) -> Any:
        if not bumped:  # a release of another session on the agent, committed now
            async with cluster.manager.db.begin(write=True) as db:
                await recompute_agent_occupancy(db, "i-node01")
                bumped.append(1)
        return await apply_plan(*args, **kwargs)

    monkeypatch.setattr(loop, "apply_plan", release_first)
    [result] = await cluster.manager.scheduler.run_once()
    assert result.plan is not None
    assert len(result.plan.assignments) == 1
    assert result.jobs == ()
    assert result.conflicts == frozenset({"i-node01"})
    assert (await cluster.session("late"))["status"] == "PENDING"
    assert await kernels_of(cluster, "late") == 0
    [result] = await cluster.manager.scheduler.run_once()
    assert len(result.jobs) == 1
    assert not result.conflicts
    await cluster.wait_status("late", "RUNNING")
    assert await kernels_of(cluster, "late") == 1
    async with cluster.manager.db.begin() as db:
        agent = await db.get(Agent, "i-node01")
        assert agent is not None
        assert agent.occupied_slots.get_amount("cuda.shares") == 1


async def test_binds_start_before_the_failures_are_worked_out_or_written_and_retries_count(
    frozen: Frozen, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster, clock = frozen
    await cluster.add_agent("i-node01")  # two GPUs of 1.0 share
    for name in ("fits", "too-big"):
        shares = "2" if name == "fits" else "3"
        created = await cluster.create(
            {"cuda.shares": shares}, name=name, enqueueOnly=True, waitForAgents=True
        )
        assert created.status_code == 201, created.text
    order: list[str] = []
    binder = cluster.manager.binder
    submit, write = binder.submit, explanations.write_explanations

    def submitting(jobs: Any) -> None:
        order.append("binds")
        submit(jobs)

    async def writing(*args: Any, **kwargs: Any) -> Any:
        order.append("failures")
        return await write(*args, **kwargs)

    monkeypatch.setattr(binder, "submit", submitting)
    monkeypatch.setattr(explanations, "write_explanations", writing)
    record_explains(monkeypatch, order)
    [result] = await cluster.manager.scheduler.run_once()
    assert order == ["binds", "explain", "failures"]
    assert result.plan is not None
    assert [f.msg.split(";")[0] for f in result.plan.failures] == [
        "No agent could hold the request even if it were empty"  # 3 shares, 2 GPUs
    ]
    await cluster.wait_status("fits", "RUNNING")
    first = (await cluster.session("too-big"))["statusData"]["scheduler"]
    clock.advance(timedelta(seconds=5))
    await cluster.manager.scheduler.run_once()
    second = (await cluster.session("too-big"))["statusData"]["scheduler"]
    assert (first["retries"], second["retries"]) == (1, 2)
    assert second["last_try"] == clock().isoformat() != first["last_try"]
    # a placed session's scheduler data is not overwritten by the failures' write
    placed = (await cluster.session("fits"))["statusData"]["scheduler"]
    assert placed["kind"] == "scheduled"


async def test_with_many_sessions_left_pending_the_binds_get_a_head_start(
    frozen: Frozen, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster, _clock = frozen
    await cluster.add_agent("i-node01")
    for name, shares in (("fits", "1"), ("too-big", "3")):
        created = await cluster.create(
            {"cuda.shares": shares}, name=name, enqueueOnly=True, waitForAgents=True
        )
        assert created.status_code == 201, created.text
    order: list[str] = []
    binder = cluster.manager.binder
    bind_chunk = binder._bind_chunk

    async def binding(jobs: Any) -> None:
        await asyncio.sleep(0.02)  # a bind that takes a while
        await bind_chunk(jobs)
        order.append("bound")

    monkeypatch.setattr(binder, "_bind_chunk", binding)
    record_explains(monkeypatch, order)
    monkeypatch.setattr(loop, "BIND_HEAD_START_FAILURES", 1)  # one session left is many
    monkeypatch.setattr(loop, "BIND_HEAD_START_S", 5.0)  # ample: the bind ends first
    await cluster.manager.scheduler.run_once()
    assert order == ["bound", "explain"]
    # a head start is bounded: a bind that hangs does not hold the pass
    order.clear()
    monkeypatch.setattr(loop, "BIND_HEAD_START_S", 0.01)
    hang = asyncio.Event()

    async def hanging(jobs: Any) -> None:
        await hang.wait()
        await bind_chunk(jobs)
        order.append("bound")

    monkeypatch.setattr(binder, "_bind_chunk", hanging)
    created = await cluster.create({"cuda.shares": "0.5"}, name="later", enqueueOnly=True)
    assert created.status_code == 201, created.text
    await cluster.manager.scheduler.run_once()
    assert order == ["explain"]
    hang.set()
    await cluster.wait_status("later", "RUNNING")
    for _ in range(500):  # the bind task's last steps may follow the status by a moment
        if "bound" in order:
            break
        await asyncio.sleep(0.01)
    assert order == ["explain", "bound"]


async def test_a_session_cancelled_after_the_snapshot_is_not_placed(
    frozen: Frozen, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster, _clock = frozen
    await cluster.add_agent("i-node01")
    created = await cluster.create({"cuda.shares": "1"}, name="gone", enqueueOnly=True)
    assert created.status_code == 201, created.text
    sid = uuid.UUID(created.json()["sessionId"])
    apply_plan = loop.apply_plan

    async def cancel_first(*args: Any, **kwargs: Any) -> Any:
        response = await cluster.admin.delete(f"/session/{sid}")
        assert response.status_code == 200, response.text
        return await apply_plan(*args, **kwargs)

    monkeypatch.setattr(loop, "apply_plan", cancel_first)
    [result] = await cluster.manager.scheduler.run_once()
    assert result.jobs == ()
    assert (await cluster.session(str(sid)))["status"] in ("CANCELLED", "TERMINATED")
    assert await kernels_of(cluster, "gone") == 0


async def test_queued_writes_take_turns(database: Database) -> None:
    """SQLite: the pipeline's write transactions queue in the process (never two at once);
    PostgreSQL: plain write transactions, which may overlap."""
    trace: list[str] = []
    inside = asyncio.Event()

    async def write(name: str) -> None:
        async with database.begin_queued_write() as db:
            trace.append(f"{name} in")
            inside.set()
            await db.execute(sa.select(1))
            await asyncio.sleep(0.05)
            trace.append(f"{name} out")

    first = asyncio.create_task(write("a"))
    await inside.wait()
    await asyncio.gather(first, write("b"))
    if database.dialect == "sqlite":
        assert trace == ["a in", "a out", "b in", "b out"]
    else:
        assert sorted(trace) == ["a in", "a out", "b in", "b out"]
