"""SQLite statements on the event loop's thread (aiosqlite without the thread hop).

aiosqlite runs every call (``execute``, each ``fetch``, ``close`` of a cursor,
``commit``) in a worker thread and hands the result back through the event loop: a
queue put, a thread wake-up and a ``call_soon_threadsafe`` per call, three or more per
statement.  For the manager's statements (index lookups of microseconds) that hand-off
is the cost: many times the statement's own, and, at dozens of statements per session,
a large part of the manager's CPU (``bench/stmt_bench.py`` measures a statement both
ways).

:class:`InlineConnection` is an ``aiosqlite.Connection`` whose calls run at once on
the calling (event loop) thread.  The worker thread is kept for what may wait:

* opening the connection (file creation, WAL recovery);
* a statement SQLite refuses as *busy* — another connection (another process, say
  ``mgr dbschema``) holds the write lock.  The connection's own busy timeout is 0, so
  the first try fails at once instead of sleeping on the loop's thread; the same call
  is then made again in the worker thread with ``[db] busy-timeout`` in force, and the
  loop keeps serving meanwhile.  Retrying is safe: a busy statement did nothing
  (``BEGIN IMMEDIATE`` did not take the lock; a write step was refused before it
  changed a page; a refused ``COMMIT`` leaves the transaction open, to be retried).

* an ``executemany`` of many rows (:data:`BULK_ROWS`): the scheduler's bulk writes
  (thousands of placements, their kernels and history rows; explanations in chunks)
  take tens to hundreds of milliseconds of SQLite's C code, during which the sqlite3
  module releases the GIL between rows' steps: in the worker thread they run beside the
  event loop (binds, requests) on another core, and the hop is noise next to them.

While a call is queued to or running in the worker thread, every other call on the
connection goes there too, behind it (FIFO): a connection is never used from two
threads at once.  This matters when the caller is cancelled mid-statement — SQLAlchemy
then closes the connection at once, and that close, made on the loop's thread beside a
running ``executemany``, crashed the interpreter (found in the scheduler benchmark when
the manager stopped during a large explanations write).

The price: a long single statement (a scan of 10,000 pending sessions) holds the loop
for its duration instead of letting other tasks run while SQLite's C code works.  The
manager's other statements are short and indexed, so this is the better trade for the
embedded setup.
The SQLite connection is created with ``check_same_thread=False``: it is used by one
task at a time (the pool's checkout) but from the loop's thread and, for busy waits,
the worker's.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from functools import partial
from typing import Any

import aiosqlite

__all__ = ["InlineConnection", "connect_inline"]

_SQLITE_BUSY = 5
_SQLITE_LOCKED = 6


BULK_ROWS = 64
"""An ``executemany`` of at least this many rows runs in the worker thread (see the
module docstring)."""


def _is_bulk(fn: Callable[..., Any], args: tuple[Any, ...]) -> bool:
    return (
        getattr(fn, "__name__", "") == "executemany"
        and len(args) > 1
        and isinstance(args[1], list | tuple)
        and len(args[1]) >= BULK_ROWS
    )


def _is_busy(error: sqlite3.OperationalError) -> bool:
    code = getattr(error, "sqlite_errorcode", None)
    if code is None:  # pragma: no cover - Python < 3.11 has no error codes
        return "locked" in str(error)
    return (code & 0xFF) in (_SQLITE_BUSY, _SQLITE_LOCKED)


class InlineConnection(aiosqlite.Connection):
    """``aiosqlite.Connection`` running its calls on the caller's thread (module doc)."""

    def __init__(
        self, connector: Callable[[], sqlite3.Connection], *, busy_timeout_ms: int
    ) -> None:
        super().__init__(connector, iter_chunk_size=64)
        self._thread.daemon = True  # as SQLAlchemy does for aiosqlite's own thread
        self.busy_timeout_ms = busy_timeout_ms
        self.busy_waits = 0  # calls that had to wait in the worker thread
        self.bulk_calls = 0  # executemany calls of many rows, run in the worker thread
        # calls queued to or running in the worker thread: while any is, every call goes
        # there too (FIFO), so nothing touches the connection beside it — a caller
        # cancelled while its statement runs there gets the connection closed by
        # SQLAlchemy at once, and that close must wait for the statement
        self._in_worker = 0
        self._in_worker_lock = threading.Lock()

    async def _execute(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if not self._running or not self._connection:
            raise ValueError("Connection closed")
        if _is_bulk(fn, args):
            self.bulk_calls += 1
            return await self._in_worker_thread(partial(self._with_busy_timeout, fn, args, kwargs))
        if self._worker_busy():
            return await self._in_worker_thread(partial(fn, *args, **kwargs))
        try:
            return fn(*args, **kwargs)
        except sqlite3.OperationalError as e:
            if not _is_busy(e):
                raise
        self.busy_waits += 1
        return await self._in_worker_thread(partial(self._with_busy_timeout, fn, args, kwargs))

    def _worker_busy(self) -> bool:
        with self._in_worker_lock:
            return self._in_worker > 0

    async def _in_worker_thread(self, call: Callable[[], Any]) -> Any:
        """``call`` in the connection's worker thread, counted until it has run there
        (not until the caller stops waiting: a cancelled caller leaves it running)."""

        def counted() -> Any:
            try:
                return call()
            finally:
                with self._in_worker_lock:
                    self._in_worker -= 1

        if not self._running or not self._connection:
            raise ValueError("Connection closed")
        with self._in_worker_lock:
            self._in_worker += 1
        # queued now (aiosqlite's own checks passed above): the worker thread runs it,
        # and every call queued before its stop sentinel, whatever happens to the caller
        return await super()._execute(counted)  # type: ignore[no-untyped-call]

    def _with_busy_timeout(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """In the worker thread: ``fn`` again, waiting up to the busy timeout."""
        conn = self._conn
        conn.execute(f"PRAGMA busy_timeout={self.busy_timeout_ms:d}")
        try:
            return fn(*args, **kwargs)
        finally:
            conn.execute("PRAGMA busy_timeout=0")


async def connect_inline(
    database: str, *, busy_timeout_ms: int, uri: bool = False
) -> InlineConnection:
    """An open :class:`InlineConnection` to ``database`` (busy timeout 0 on the
    connection itself: waits happen in the worker thread, see the module docstring)."""

    def connector() -> sqlite3.Connection:
        return sqlite3.connect(database, timeout=0, check_same_thread=False, uri=uri)

    connection = InlineConnection(connector, busy_timeout_ms=busy_timeout_ms)
    await connection
    return connection
