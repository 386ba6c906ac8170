"""The embedded backend: one SQLite file (WAL mode) shared by every process on a host.

Why SQLite: it is in the standard library, survives crashes, and lets a manager and
several agent processes on one machine read and write the same file at once (WAL:
readers never block the writer; writers queue on ``BEGIN IMMEDIATE`` up to
``timeout_s``).  The semantics follow etcd:

- every write transaction gets the next *revision*; each changed key adds a row to an
  ``events`` log with that revision (kept ``event_retention_s``, default 10 minutes);
- watchers in a process share one poller that reads the log every ``poll_interval_s``
  and hands each watcher the events after its own cursor, so a watcher never misses
  or repeats an event, whichever process wrote it;
- leases are rows with an expiry time (wall clock, shared by processes); whoever
  touches the store first after the expiry deletes the lease's keys, which produces
  ordinary DELETE events, as etcd does;
- locks are ``flock`` locks on files in ``<path>.locks/``: exclusive across processes
  and across stores within one process, and released by the kernel if the holder dies.

All SQLite calls run on one private thread per backend (``sqlite3`` is blocking).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import logging
import os
import sqlite3
import time
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Callable,
    Iterable,
    Iterator,
    Sequence,
)
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TypeVar

from accelshare.aio import cancel_and_wait

from .backend import (
    Delete,
    DeleteTree,
    GuardFailed,
    KVBackend,
    Put,
    TreeGuard,
    TreeSnapshot,
    TxnOp,
    in_tree,
)
from .errors import (
    ConfigStoreError,
    ConfigStoreNotFound,
    ConfigStoreUnavailable,
    LeaseNotFound,
    LockTimeout,
)
from .types import WatchEvent, WatchEventType

__all__ = ["EmbeddedBackend"]

log = logging.getLogger(__name__)
T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS kv (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL,
    lease_id INTEGER,
    mod_revision INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS kv_lease ON kv (lease_id) WHERE lease_id IS NOT NULL;
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY,
    revision INTEGER NOT NULL,
    key TEXT NOT NULL,
    value TEXT NOT NULL,
    kind TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS events_revision ON events (revision);
CREATE TABLE IF NOT EXISTS leases (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    ttl_s INTEGER NOT NULL,
    expires_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS leases_expiry ON leases (expires_at);
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
INSERT OR IGNORE INTO meta (name, value) VALUES ('schema', 1), ('revision', 0), ('compacted', 0);
"""
_TRIM_EVERY_REVISIONS = 64


def _tree_clause(column: str = "key") -> str:
    # Keys under root + "/" sort between root + "/" and root + "0" ("0" follows "/").
    return f"({column} = ? OR ({column} >= ? AND {column} < ?))"


def _tree_args(root: str) -> tuple[str, str, str]:
    return root, root + "/", root + "0"


class _Txn:
    """The writes of one ``BEGIN IMMEDIATE`` transaction and the events they produce."""

    def __init__(self, conn: sqlite3.Connection, now: float) -> None:
        self.conn = conn
        self.now = now
        (current,) = conn.execute("SELECT value FROM meta WHERE name = 'revision'").fetchone()
        self.revision: int = current + 1
        self.events: list[tuple[int, str, str, str, float]] = []

    def put_many(self, puts: Sequence[Put]) -> None:
        lease_ids = {op.lease_id for op in puts if op.lease_id}
        for lease_id in lease_ids:
            if not self.conn.execute("SELECT 1 FROM leases WHERE id = ?", (lease_id,)).fetchone():
                raise LeaseNotFound(lease_id)
        self.conn.executemany(
            "INSERT INTO kv (key, value, lease_id, mod_revision) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (key) DO UPDATE SET value = excluded.value,"
            " lease_id = excluded.lease_id, mod_revision = excluded.mod_revision",
            [(op.key, op.value, op.lease_id or None, self.revision) for op in puts],
        )
        self.events.extend((self.revision, op.key, op.value, "put", self.now) for op in puts)

    def delete_keys(self, keys: Iterable[str]) -> None:
        rows = [(key,) for key in keys]
        self.conn.executemany("DELETE FROM kv WHERE key = ?", rows)
        self.events.extend((self.revision, key, "", "delete", self.now) for (key,) in rows)

    def delete(self, key: str) -> None:
        if self.conn.execute("SELECT 1 FROM kv WHERE key = ?", (key,)).fetchone():
            self.delete_keys([key])

    def delete_tree(self, root: str) -> None:
        keys = [
            key
            for (key,) in self.conn.execute(
                f"SELECT key FROM kv WHERE {_tree_clause()} ORDER BY key", _tree_args(root)
            )
        ]
        self.delete_keys(keys)

    def drop_leases(self, lease_ids: Sequence[int]) -> None:
        for lease_id in lease_ids:
            keys = [
                key
                for (key,) in self.conn.execute(
                    "SELECT key FROM kv WHERE lease_id = ? ORDER BY key", (lease_id,)
                )
            ]
            self.delete_keys(keys)
            self.conn.execute("DELETE FROM leases WHERE id = ?", (lease_id,))

    def check_guard(self, guard: TreeGuard) -> None:
        # Any event in the tree after the guard's revision (a put or a delete) fails it.
        # The event log records deletes, so guard.keys (for etcd) is not needed here.
        changed = self.conn.execute(
            f"SELECT 1 FROM events WHERE revision > ? AND {_tree_clause()} LIMIT 1",
            (guard.revision, *_tree_args(guard.key)),
        ).fetchone()
        if changed:
            raise GuardFailed(guard.key)

    def finish(self, retention_s: float) -> int:
        """Record the events and bump the revision (only if something changed)."""
        if not self.events:
            return self.revision - 1
        self.conn.executemany(
            "INSERT INTO events (revision, key, value, kind, created_at) VALUES (?, ?, ?, ?, ?)",
            self.events,
        )
        self.conn.execute("UPDATE meta SET value = ? WHERE name = 'revision'", (self.revision,))
        if self.revision % _TRIM_EVERY_REVISIONS == 0:
            cutoff = self.now - retention_s
            row = self.conn.execute(
                "SELECT MAX(revision) FROM events WHERE created_at < ?", (cutoff,)
            ).fetchone()
            if row[0] is not None:
                self.conn.execute("DELETE FROM events WHERE revision <= ?", (row[0],))
                self.conn.execute("UPDATE meta SET value = ? WHERE name = 'compacted'", (row[0],))
        return self.revision


@dataclass(eq=False)
class _Watcher:
    key: str
    tree: bool
    cursor: int  # the last revision this watcher has seen
    queue: asyncio.Queue[list[WatchEvent] | None] = field(default_factory=asyncio.Queue)

    def matches(self, key: str) -> bool:
        return in_tree(key, self.key) if self.tree else key == self.key


class EmbeddedBackend(KVBackend):
    def __init__(
        self,
        path: Path,
        *,
        timeout_s: float = 5.0,
        poll_interval_s: float = 0.05,
        event_retention_s: float = 600.0,
        clock: Callable[[], float] = time.time,
        create: bool = True,
    ) -> None:
        """``create``: make the file (and its folder) if it does not exist; without it a
        missing file is :class:`ConfigStoreNotFound` and nothing is written to disk."""
        self._path = Path(path)
        self._create = create
        self.description = f"the embedded config store at {self._path}"
        self._timeout_s = timeout_s
        self._poll_interval_s = poll_interval_s
        self._retention_s = event_retention_s
        self._clock = clock
        self._locks_dir = self._path.with_name(self._path.name + ".locks")
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="accelshare-config")
        self._conn: sqlite3.Connection | None = None
        self._watchers: set[_Watcher] = set()
        self._poller: asyncio.Task[None] | None = None
        self._closed = False

    # -- plumbing -------------------------------------------------------------------

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        if self._closed:
            raise ConfigStoreError(f"{self.description} is closed")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._call, fn)

    def _call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        try:
            return fn(self._connection())
        except sqlite3.OperationalError as e:
            if "locked" in str(e) or "busy" in str(e):
                raise ConfigStoreUnavailable(
                    f"{self.description} stayed locked by another process"
                    f" for more than {self._timeout_s:g} s"
                ) from e
            raise ConfigStoreError(f"{self.description}: {e}") from e
        except sqlite3.DatabaseError as e:
            raise ConfigStoreError(f"{self.description}: {e}") from e

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            try:
                if self._create:
                    # private from the start: the tree may hold secrets (etcd credentials,
                    # plugin options); SQLite gives its -wal/-shm files the main file's mode
                    self._path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                    os.close(os.open(self._path, os.O_RDWR | os.O_CREAT, 0o600))
                else:
                    os.close(os.open(self._path, os.O_RDWR))
            except FileNotFoundError as e:
                if not self._create:
                    raise ConfigStoreNotFound(self._path) from e
                raise ConfigStoreUnavailable(f"cannot create {self._path}: {e}") from e
            except OSError as e:
                raise ConfigStoreUnavailable(f"cannot create {self._path}: {e}") from e
            # Switching a new file to WAL does not wait on SQLite's busy handler: two
            # processes opening a fresh store at once would see "database is locked"
            # at once.  So the first open (WAL switch + schema) is serialised across
            # processes by an flock on a sidecar file, waited for up to timeout_s.
            with self._init_lock():
                conn = sqlite3.connect(
                    self._path,
                    timeout=self._timeout_s,
                    isolation_level=None,
                    check_same_thread=False,
                )
                try:
                    conn.execute("PRAGMA journal_mode=WAL")
                    conn.execute("PRAGMA synchronous=NORMAL")
                    conn.execute("BEGIN IMMEDIATE")
                    try:
                        for statement in _SCHEMA.split(";"):
                            if statement.strip():
                                conn.execute(statement)
                        conn.execute("COMMIT")
                    except BaseException:
                        conn.execute("ROLLBACK")
                        raise
                except BaseException:
                    conn.close()
                    raise
            self._conn = conn
        return self._conn

    @contextlib.contextmanager
    def _init_lock(self) -> Iterator[None]:
        path = self._path.with_name(self._path.name + ".init.lock")
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            deadline = time.monotonic() + self._timeout_s
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise ConfigStoreUnavailable(
                            f"{self.description} stayed locked by another process"
                            f" (opening it) for more than {self._timeout_s:g} s"
                        ) from None
                    time.sleep(0.01)
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def _write(
        self, conn: sqlite3.Connection, body: Callable[[_Txn], None], *, sweep: bool = True
    ) -> int:
        if sweep:
            self._sweep(conn)
        conn.execute("BEGIN IMMEDIATE")
        try:
            txn = _Txn(conn, self._clock())
            body(txn)
            revision = txn.finish(self._retention_s)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        return revision

    def _sweep(self, conn: sqlite3.Connection) -> None:
        """Delete the keys of expired leases (a cheap indexed read when none expired)."""
        now = self._clock()
        if not conn.execute(
            "SELECT 1 FROM leases WHERE expires_at <= ? LIMIT 1", (now,)
        ).fetchone():
            return

        def expire(txn: _Txn) -> None:
            expired = [
                lease_id
                for (lease_id,) in txn.conn.execute(
                    "SELECT id FROM leases WHERE expires_at <= ?", (now,)
                )
            ]
            txn.drop_leases(expired)

        self._write(conn, expire, sweep=False)

    def _read(self, conn: sqlite3.Connection, body: Callable[[], T]) -> T:
        self._sweep(conn)
        conn.execute("BEGIN")  # one snapshot for all the statements in body
        try:
            return body()
        finally:
            conn.execute("COMMIT")

    # -- key-value ------------------------------------------------------------------

    async def get(self, key: str) -> str | None:
        def run(conn: sqlite3.Connection) -> str | None:
            self._sweep(conn)
            row = conn.execute("SELECT value FROM kv WHERE key = ?", (key,)).fetchone()
            return None if row is None else str(row[0])

        return await self._run(run)

    async def get_tree(self, key: str) -> TreeSnapshot:
        def run(conn: sqlite3.Connection) -> TreeSnapshot:
            def body() -> TreeSnapshot:
                (revision,) = conn.execute(
                    "SELECT value FROM meta WHERE name = 'revision'"
                ).fetchone()
                rows = conn.execute(
                    f"SELECT key, value FROM kv WHERE {_tree_clause()} ORDER BY key",
                    _tree_args(key),
                ).fetchall()
                return TreeSnapshot(revision, [(str(k), str(v)) for k, v in rows])

            return self._read(conn, body)

        return await self._run(run)

    async def commit(self, ops: Sequence[TxnOp], *, guard: TreeGuard | None = None) -> int:
        def body(txn: _Txn) -> None:
            if guard is not None:
                txn.check_guard(guard)
            puts: list[Put] = []
            for op in ops:
                if isinstance(op, Put):
                    puts.append(op)
                    continue
                if puts:
                    txn.put_many(puts)
                    puts = []
                if isinstance(op, Delete):
                    txn.delete(op.key)
                elif isinstance(op, DeleteTree):
                    txn.delete_tree(op.key)
            if puts:
                txn.put_many(puts)

        return await self._run(lambda conn: self._write(conn, body))

    # -- leases ---------------------------------------------------------------------

    async def grant_lease(self, ttl_s: int) -> int:
        def run(conn: sqlite3.Connection) -> int:
            cursor = conn.execute(
                "INSERT INTO leases (ttl_s, expires_at) VALUES (?, ?)",
                (ttl_s, self._clock() + ttl_s),
            )
            return int(cursor.lastrowid or 0)

        return await self._run(run)

    async def refresh_lease(self, lease_id: int) -> None:
        def run(conn: sqlite3.Connection) -> int:
            self._sweep(conn)
            return conn.execute(
                "UPDATE leases SET expires_at = ? + ttl_s WHERE id = ?", (self._clock(), lease_id)
            ).rowcount

        if await self._run(run) == 0:
            raise LeaseNotFound(lease_id)

    async def revoke_lease(self, lease_id: int) -> None:
        await self._run(lambda conn: self._write(conn, lambda txn: txn.drop_leases([lease_id])))

    # -- watches --------------------------------------------------------------------

    async def watch(
        self,
        key: str,
        *,
        tree: bool,
        start_revision: int | None = None,
        ready: asyncio.Event | None = None,
    ) -> AsyncGenerator[WatchEvent, None]:
        if start_revision is None:
            cursor = await self._run(
                lambda conn: int(
                    conn.execute("SELECT value FROM meta WHERE name = 'revision'").fetchone()[0]
                )
            )
        else:
            cursor = start_revision - 1
        watcher = _Watcher(key, tree, cursor)
        self._watchers.add(watcher)
        if self._poller is None or self._poller.done():
            self._poller = asyncio.create_task(self._poll_loop(), name="config-store-poller")
        if ready is not None:
            ready.set()
        try:
            while (batch := await watcher.queue.get()) is not None:
                for event in batch:
                    yield event
        finally:
            self._watchers.discard(watcher)

    async def _poll_loop(self) -> None:
        while self._watchers and not self._closed:
            since = min(w.cursor for w in self._watchers)
            try:
                rows, compacted = await self._run(partial(self._fetch_events, since=since))
            except ConfigStoreError as e:
                if self._closed:
                    return
                log.warning("watch poll of %s failed, retrying: %s", self.description, e)
                await asyncio.sleep(max(self._poll_interval_s, 0.5))
                continue
            if compacted > since:
                log.warning(
                    "watchers of %s fell behind the event log; events up to revision %d are lost",
                    self.description,
                    compacted,
                )
            if rows:
                top = rows[-1].revision
                for watcher in list(self._watchers):
                    batch = [
                        e for e in rows if e.revision > watcher.cursor and watcher.matches(e.key)
                    ]
                    watcher.cursor = max(watcher.cursor, top)
                    if batch:
                        watcher.queue.put_nowait(batch)
            await asyncio.sleep(self._poll_interval_s)

    def _fetch_events(
        self, conn: sqlite3.Connection, *, since: int
    ) -> tuple[list[WatchEvent], int]:
        def body() -> tuple[list[WatchEvent], int]:
            rows = conn.execute(
                "SELECT revision, key, value, kind FROM events WHERE revision > ? ORDER BY id",
                (since,),
            ).fetchall()
            (compacted,) = conn.execute(
                "SELECT value FROM meta WHERE name = 'compacted'"
            ).fetchone()
            events = [
                WatchEvent(str(key), str(value), WatchEventType(kind), int(revision))
                for revision, key, value, kind in rows
            ]
            return events, int(compacted)

        return self._read(conn, body)

    # -- locks ----------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def lock(self, key: str, *, timeout_s: float | None) -> AsyncIterator[None]:
        self._locks_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        path = self._locks_dir / (hashlib.sha256(key.encode()).hexdigest()[:32] + ".lock")
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            loop = asyncio.get_running_loop()
            deadline = None if timeout_s is None else loop.time() + timeout_s
            delay = 0.005
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if deadline is not None and loop.time() >= deadline:
                        raise LockTimeout(key, timeout_s or 0.0) from None
                    wait = delay if deadline is None else min(delay, deadline - loop.time())
                    await asyncio.sleep(max(wait, 0.0))
                    delay = min(delay * 2, 0.1)
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    # -- lifecycle ------------------------------------------------------------------

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._poller is not None:
            await cancel_and_wait([self._poller])
        for watcher in list(self._watchers):
            watcher.queue.put_nowait(None)
        loop = asyncio.get_running_loop()
        conn, self._conn = self._conn, None
        if conn is not None:
            await loop.run_in_executor(self._executor, conn.close)
        self._executor.shutdown(wait=True)
