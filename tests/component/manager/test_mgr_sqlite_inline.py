"""SQLite statements run on the event loop's thread; busy waits happen in a worker.

The manager's SQLite connections are :class:`~accelshare.manager.sqlite_inline.InlineConnection`:
a statement runs at once on the loop's thread (no thread hop per call), and one that
SQLite refuses as busy (another connection holds the write lock) is made again in the
connection's worker thread with the busy timeout, so the loop keeps serving meanwhile.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy import exc as sa_exc

from accelshare.manager.db import Database
from accelshare.manager.sqlite_inline import InlineConnection


async def _setup(path: Path, busy_timeout_s: float = 10.0) -> Database:
    db = Database.from_url(f"sqlite+aiosqlite:///{path}", busy_timeout_s=busy_timeout_s)
    async with db.engine.begin() as conn:
        await conn.execute(sa.text("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)"))
    return db


async def _driver(db: Database) -> InlineConnection:
    async with db.engine.connect() as conn:
        raw = await conn.get_raw_connection()
        driver = raw.driver_connection
    assert isinstance(driver, InlineConnection)
    return driver


async def test_statements_run_on_the_loops_thread(tmp_path: Path) -> None:
    db = await _setup(tmp_path / "a.db")
    try:
        seen: list[str] = []
        async with db.engine.connect() as conn:
            raw = await conn.get_raw_connection()
            sqlite_conn = raw.driver_connection._conn  # type: ignore[union-attr]
            sqlite_conn.create_function(
                "whose_thread", 0, lambda: seen.append(threading.current_thread().name) or 1
            )
            assert (await conn.execute(sa.text("SELECT whose_thread()"))).scalar_one() == 1
            # the connection's own busy timeout is 0 (waits go to the worker thread)
            assert (await conn.execute(sa.text("PRAGMA busy_timeout"))).scalar_one() == 0
            assert (await conn.execute(sa.text("PRAGMA journal_mode"))).scalar_one() == "wal"
        assert seen == [threading.current_thread().name]
    finally:
        await db.engine.dispose()


async def test_a_busy_write_waits_in_the_worker_while_the_loop_serves(tmp_path: Path) -> None:
    path = tmp_path / "b.db"
    db = await _setup(path)
    try:
        driver = await _driver(db)
        waits_before = driver.busy_waits
        other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        other.execute("BEGIN IMMEDIATE")  # another connection holds the write lock
        other.execute("INSERT INTO t VALUES (1, 'other')")

        async def write() -> float:
            start = time.monotonic()
            async with db.begin(write=True) as session:
                await session.execute(sa.text("INSERT INTO t VALUES (2, 'mine')"))
            return time.monotonic() - start

        task = asyncio.create_task(write())
        start = time.monotonic()
        for _ in range(20):  # the loop keeps running while the write waits
            await asyncio.sleep(0.01)
        # a wait on the loop's thread would have held it for the busy timeout (10 s)
        assert time.monotonic() - start < 2.0
        assert not task.done()
        other.execute("COMMIT")
        waited = await asyncio.wait_for(task, 10)
        assert waited >= 0.2
        assert driver.busy_waits > waits_before
        async with db.begin() as session:
            rows = (await session.execute(sa.text("SELECT id, v FROM t ORDER BY id"))).all()
        assert [tuple(r) for r in rows] == [(1, "other"), (2, "mine")]
        other.close()
    finally:
        await db.engine.dispose()


async def test_a_lock_held_past_the_busy_timeout_is_an_error_and_nothing_written(
    tmp_path: Path,
) -> None:
    path = tmp_path / "c.db"
    db = await _setup(path, busy_timeout_s=0.3)
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        other.execute("BEGIN IMMEDIATE")
        start = time.monotonic()
        with pytest.raises(sa_exc.OperationalError, match="database is locked"):
            async with db.begin(write=True) as session:
                await session.execute(sa.text("INSERT INTO t VALUES (3, 'x')"))
        assert time.monotonic() - start >= 0.25  # waited the busy timeout, then gave up
        other.execute("ROLLBACK")
        async with db.begin() as session:
            count = (await session.execute(sa.text("SELECT count(*) FROM t"))).scalar_one()
        assert count == 0
    finally:
        other.close()
        await db.engine.dispose()


async def test_other_errors_are_raised_as_they_are(tmp_path: Path) -> None:
    db = await _setup(tmp_path / "d.db")
    try:
        driver = await _driver(db)
        waits_before = driver.busy_waits
        with pytest.raises(sa_exc.OperationalError, match="no such table: missing"):
            async with db.begin() as session:
                await session.execute(sa.text("SELECT * FROM missing"))
        with pytest.raises(sa_exc.IntegrityError):
            async with db.begin(write=True) as session:
                await session.execute(sa.text("INSERT INTO t VALUES (1, 'a'), (1, 'b')"))
        assert driver.busy_waits == waits_before  # not mistaken for busy
    finally:
        await db.engine.dispose()


async def test_a_closed_connection_refuses_calls(tmp_path: Path) -> None:
    from accelshare.manager.sqlite_inline import connect_inline

    conn = await connect_inline(str(tmp_path / "e.db"), busy_timeout_ms=100)
    cursor = await conn.execute("SELECT 1")
    assert await cursor.fetchone() == (1,)
    await conn.close()
    with pytest.raises(ValueError, match="no active connection"):
        await conn.execute("SELECT 1")
    with pytest.raises(ValueError, match="Connection closed"):
        await conn._execute(len, "x")


async def test_a_bulk_executemany_runs_in_the_worker_thread(tmp_path: Path) -> None:
    from accelshare.manager.sqlite_inline import BULK_ROWS

    db = await _setup(tmp_path / "bulk.db")
    try:
        seen: list[str] = []
        async with db.engine.connect() as conn:
            raw = await conn.get_raw_connection()
            driver = raw.driver_connection
            assert isinstance(driver, InlineConnection)
            driver._conn.create_function(
                "whose_thread", 1, lambda v: seen.append(threading.current_thread().name) or v
            )
            bulk_before = driver.bulk_calls
            insert = sa.text("INSERT INTO t (id, v) VALUES (:id, whose_thread(:v))")
            await conn.execute(insert, [{"id": i, "v": "few"} for i in range(BULK_ROWS - 1)])
            assert driver.bulk_calls == bulk_before  # a few rows: inline
            rows = [{"id": 1000 + i, "v": "many"} for i in range(BULK_ROWS)]
            await conn.execute(insert, rows)
            assert driver.bulk_calls == bulk_before + 1
            await conn.commit()
            count = await conn.execute(sa.text("SELECT count(*) FROM t"))
            assert count.scalar_one() == 2 * BULK_ROWS - 1
        loop_thread = threading.current_thread().name
        assert set(seen[: BULK_ROWS - 1]) == {loop_thread}
        assert loop_thread not in set(seen[BULK_ROWS - 1 :])  # the many rows: elsewhere
        assert len(seen) == 2 * BULK_ROWS - 1
    finally:
        await db.engine.dispose()


async def test_calls_beside_a_bulk_statement_wait_for_it_even_a_close(tmp_path: Path) -> None:
    from accelshare.manager.sqlite_inline import BULK_ROWS, connect_inline

    conn = await connect_inline(str(tmp_path / "c.db"), busy_timeout_ms=1000)
    order: list[str] = []

    def slow(v: int) -> int:
        time.sleep(0.002)  # in the worker thread: ~BULK_ROWS * 2 ms in all
        return v

    conn._conn.create_function("slow", 1, slow)
    await conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v INTEGER)")

    async def bulk() -> None:
        rows = [(i, i) for i in range(BULK_ROWS * 2)]
        await conn.executemany("INSERT INTO t VALUES (?, slow(?))", rows)
        order.append("bulk")

    task = asyncio.create_task(bulk())
    await asyncio.sleep(0.02)  # the bulk insert runs in the worker thread now
    assert conn._worker_busy()
    cursor = await conn.execute("SELECT count(*) FROM t")  # queued behind it, not beside
    assert await cursor.fetchone() == (BULK_ROWS * 2,)
    order.append("count")
    await task
    assert order == ["bulk", "count"]

    # a caller cancelled while its bulk statement runs, then the connection closed (as
    # SQLAlchemy does for a cancelled task's connection): the close waits for it
    task = asyncio.create_task(bulk())
    await asyncio.sleep(0.02)
    task.cancel()
    await conn.close()  # before the guard: the statement ran on a closed connection
    assert task.done()
    assert not conn._worker_busy()
