"""Embedded-store-only behaviour: persistence, WAL, a store held locked, the event log."""

from __future__ import annotations

import asyncio
import fcntl
import os
import sqlite3
import time
from contextlib import closing
from pathlib import Path

import pytest

from accelshare.config import ConfigStore, ConfigStoreUnavailable
from accelshare.config.embedded import EmbeddedBackend

pytestmark = pytest.mark.integration


async def test_data_survives_a_reopen_and_uses_wal(tmp_path: Path) -> None:
    path = tmp_path / "data" / "config-store.db"
    async with ConfigStore(EmbeddedBackend(path)) as store:
        await store.put_prefix("config", {"a": "1", "b": {"c": "2"}})
    async with ConfigStore(EmbeddedBackend(path)) as store:
        assert await store.get_prefix("config") == {"a": "1", "b": {"c": "2"}}
    with closing(sqlite3.connect(path)) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)


async def test_a_store_locked_by_another_process_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "config-store.db"
    async with ConfigStore(EmbeddedBackend(path, timeout_s=0.3)) as store:
        await store.put("config/a", "1")
        blocker = sqlite3.connect(path, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")  # another writer holding the write lock
        try:
            started = time.monotonic()
            with pytest.raises(ConfigStoreUnavailable, match="stayed locked"):
                await store.put("config/a", "2")
            assert time.monotonic() - started < 3
            assert await store.get("config/a") == "1"  # readers are not blocked (WAL)
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        await store.put("config/a", "2")


async def test_opening_waits_for_another_process_creating_the_store(tmp_path: Path) -> None:
    # Switching a fresh file to WAL does not wait on SQLite's busy handler, so two
    # processes creating the store at once used to fail at once with "database is
    # locked" (a CI flake).  The first open is serialised by an flock instead.
    path = tmp_path / "config-store.db"
    sidecar = tmp_path / "config-store.db.init.lock"
    fd = os.open(sidecar, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # another process is creating the store
        store = ConfigStore(EmbeddedBackend(path, timeout_s=5))
        async with store:
            opening = asyncio.create_task(store.put("config/a", "1"))
            await asyncio.sleep(0.3)
            assert not opening.done()  # it waits instead of failing
            fcntl.flock(fd, fcntl.LOCK_UN)
            await asyncio.wait_for(opening, 5)
            assert await store.get("config/a") == "1"
        fcntl.flock(fd, fcntl.LOCK_EX)
        started = time.monotonic()
        async with ConfigStore(EmbeddedBackend(tmp_path / "other.db", timeout_s=5)) as other:
            await other.put("config/a", "1")  # another file's lock does not block it
        assert time.monotonic() - started < 3
        (tmp_path / "third.db.init.lock").touch()
        fd3 = os.open(tmp_path / "third.db.init.lock", os.O_RDWR)
        fcntl.flock(fd3, fcntl.LOCK_EX)
        try:
            async with ConfigStore(EmbeddedBackend(tmp_path / "third.db", timeout_s=0.3)) as third:
                with pytest.raises(ConfigStoreUnavailable, match=r"\(opening it\).*0.3 s"):
                    await third.put("config/a", "1")
        finally:
            os.close(fd3)
    finally:
        os.close(fd)


async def test_old_events_are_trimmed(tmp_path: Path) -> None:
    now = [1000.0]
    backend = EmbeddedBackend(tmp_path / "s.db", event_retention_s=10, clock=lambda: now[0])
    async with ConfigStore(backend) as store:
        for i in range(70):  # the log is trimmed every 64 revisions
            now[0] += 1
            await store.put("config/a", str(i))
    with closing(sqlite3.connect(tmp_path / "s.db")) as conn:
        (oldest,) = conn.execute("SELECT MIN(revision) FROM events").fetchone()
    assert oldest > 50


async def test_closing_ends_open_watches(tmp_path: Path) -> None:
    store = ConfigStore(EmbeddedBackend(tmp_path / "s.db", poll_interval_s=0.01))
    ready = asyncio.Event()
    seen: list[str] = []

    async def follow() -> None:
        async for event in store.watch_prefix("", ready=ready):
            seen.append(event.key)

    task = asyncio.create_task(follow())
    await asyncio.wait_for(ready.wait(), 5)
    await store.close()
    await asyncio.wait_for(task, 5)
    assert seen == []
