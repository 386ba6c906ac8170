"""StatusWatch: waiters for session statuses share one query per change."""

from __future__ import annotations

import asyncio
import uuid

import sqlalchemy as sa

from accelshare.manager.config import ManagerConfig
from accelshare.manager.db import Database
from accelshare.manager.hub import ChangeHub
from accelshare.manager.models import Session
from accelshare.manager.status_watch import StatusWatch
from accelshare.sched.lifecycle import FINAL_STATUSES, SessionStatus

from .test_mgr_models import add_session, db

__all__ = ["db"]


def running(status: SessionStatus) -> bool:
    return status is SessionStatus.RUNNING


def up_or_ended(status: SessionStatus) -> bool:
    return status is SessionStatus.RUNNING or status in FINAL_STATUSES


async def set_status(db: Database, session_id: uuid.UUID, status: SessionStatus) -> None:
    async with db.begin(write=True) as session:
        await session.execute(
            sa.update(Session).where(Session.id == session_id).values(status=status)
        )


async def test_waiters_wake_on_publish_with_one_query_per_change(
    db: Database,
    manager_config: ManagerConfig,
) -> None:
    hub = ChangeHub()
    watch = StatusWatch(db, hub, poll_s=30.0)  # no timer: only publishes wake it
    ids = [await add_session(db, name=f"s{i}") for i in range(4)]
    queries = 0
    real_check = watch._check_all

    async def counted() -> None:
        nonlocal queries
        queries += 1
        await real_check()

    watch._check_all = counted  # type: ignore[method-assign]
    waiters = [asyncio.create_task(watch.wait_for(i, up_or_ended, 10.0)) for i in ids]
    await asyncio.sleep(0.05)
    before = queries
    for session_id in ids[:3]:
        await set_status(db, session_id, SessionStatus.RUNNING)
    hub.publish()
    done = await asyncio.gather(*waiters[:3])
    assert done == [SessionStatus.RUNNING] * 3
    assert queries - before <= 2  # one per wake-up, not one per waiter
    assert not waiters[3].done()
    await set_status(db, ids[3], SessionStatus.CANCELLED)
    hub.publish()
    assert await asyncio.wait_for(waiters[3], 5.0) is SessionStatus.CANCELLED
    await watch.close()


async def test_timeout_unknown_session_and_poll_without_publish(
    db: Database,
    manager_config: ManagerConfig,
) -> None:
    hub = ChangeHub()
    watch = StatusWatch(db, hub, poll_s=0.05)
    session_id = await add_session(db)
    assert await watch.wait_for(session_id, running, 0.1) is None  # timed out
    assert await watch.wait_for(uuid.uuid4(), running, 5.0) is None  # no such session
    waiter = asyncio.create_task(watch.wait_for(session_id, running, 5.0))
    await asyncio.sleep(0.02)
    await set_status(db, session_id, SessionStatus.RUNNING)  # nobody publishes
    assert await waiter is SessionStatus.RUNNING  # the timer found it
    assert watch._waiters == {}
    await watch.close()


def count_queries(watch: StatusWatch) -> list[int]:
    """A one-element list counting ``watch``'s status queries."""
    count = [0]
    real_check = watch._check_all

    async def counted() -> None:
        count[0] += 1
        await real_check()

    watch._check_all = counted  # type: ignore[method-assign]
    return count


async def test_a_waiter_whose_status_is_known_costs_no_query_until_a_status_changes(
    db: Database,
    manager_config: ManagerConfig,
) -> None:
    hub = ChangeHub()
    watch = StatusWatch(db, hub, poll_s=30.0)  # no timer: only publishes wake it
    queries = count_queries(watch)
    session_id = await add_session(db)  # PENDING
    known_at = hub.status_version
    waiter = asyncio.create_task(
        watch.wait_for(session_id, up_or_ended, 10.0, unchanged_since=known_at)
    )
    await asyncio.sleep(0.05)
    assert queries[0] == 0  # registered without a query
    other = await add_session(db, name="other")
    hub.publish(statuses=False)  # another session enqueued: no status changed
    await asyncio.sleep(0.05)
    assert queries[0] == 0
    assert not waiter.done()
    assert hub.status_version == known_at
    await set_status(db, session_id, SessionStatus.RUNNING)
    hub.publish()
    assert await asyncio.wait_for(waiter, 5.0) is SessionStatus.RUNNING
    assert queries[0] == 1
    # a remote publish always counts as a status change
    waiter = asyncio.create_task(
        watch.wait_for(other, up_or_ended, 10.0, unchanged_since=hub.status_version)
    )
    await asyncio.sleep(0.05)
    await set_status(db, other, SessionStatus.CANCELLED)
    hub.publish(remote=True, statuses=False)
    assert await asyncio.wait_for(waiter, 5.0) is SessionStatus.CANCELLED
    await watch.close()


async def test_a_status_published_before_the_waiter_came_is_read_at_once(
    db: Database,
    manager_config: ManagerConfig,
) -> None:
    hub = ChangeHub()
    watch = StatusWatch(db, hub, poll_s=30.0)  # no timer: only publishes wake it
    queries = count_queries(watch)
    session_id = await add_session(db)
    known_at = hub.status_version  # read before the change below
    await set_status(db, session_id, SessionStatus.RUNNING)
    hub.publish()  # nobody waits yet: this wakes nothing
    got = await asyncio.wait_for(
        watch.wait_for(session_id, up_or_ended, 10.0, unchanged_since=known_at), 5.0
    )
    assert got is SessionStatus.RUNNING  # found by the waiter's own query
    assert queries[0] == 1
    await watch.close()
