"""Engine and transaction helpers for SQLite (embedded) and PostgreSQL (asyncpg).

One :class:`Database` per manager process.  Use :meth:`Database.begin` for a unit of
work (an ``AsyncSession`` inside one transaction, committed on success and rolled
back on error)::

    async with db.begin() as session:                 # read (or a light write)
        user = await session.get(User, user_id)
    async with db.begin(write=True) as session:       # read-modify-write
        ...

SQLite specifics (applied on every new connection):

* the file is created 0600 before SQLite opens it (:mod:`.private_files`), so its
  ``-wal`` / ``-shm`` files are 0600 too (SQLite gives them the database's mode);
* ``journal_mode=WAL`` (readers never block the writer), ``foreign_keys=ON``,
  ``synchronous=NORMAL``, ``busy_timeout`` from ``[db] busy-timeout``;
* the driver's own transaction handling is turned off and we emit ``BEGIN``
  ourselves, so that ``write=True`` can use ``BEGIN IMMEDIATE``: a read-modify-write
  transaction takes the write lock *first* and waits (busy timeout) for it, instead of
  failing with "database is locked" when it upgrades from a read lock.  This is
  SQLAlchemy's documented recipe for SAVEPOINT/transactional DDL support too.
* write transactions of this process queue on an in-process lock (:meth:`_writer`)
  before ``BEGIN IMMEDIATE``: SQLite's own busy handler waits for a held write lock by
  sleeping (1, 2, 5, ... up to 100 ms at a time), so writers contending through it
  left the database idle between them and serialised a busy manager at a few writes
  per second.  The lock hands over at once, in arrival order.  Waiting for it is
  bounded by the busy timeout; after that the transaction goes ahead without it and
  SQLite's busy handling decides, as before (so a nested write never deadlocks).
  Other processes (``mgr dbschema``) still meet SQLite's busy handler.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import event, text
from sqlalchemy.dialects.sqlite.aiosqlite import SQLiteDialect_aiosqlite
from sqlalchemy.engine import URL, Connection, make_url
from sqlalchemy.ext.asyncio import (
    AsyncConnection,
    AsyncEngine,
    AsyncSession,
    create_async_engine,
)
from sqlalchemy.pool import StaticPool

from .config import ManagerConfig, normalize_db_url
from .private_files import prepare_sqlite_file
from .sqlite_inline import InlineConnection, connect_inline

__all__ = ["Database", "is_memory_sqlite"]

log = logging.getLogger(__name__)

_WRITE_OPTION = "accelshare_write"


def is_memory_sqlite(url: URL) -> bool:
    return url.get_backend_name() == "sqlite" and url.database in (None, "", ":memory:")


def _inline_creator(url: URL, busy_timeout_ms: int) -> Callable[[], Awaitable[Any]]:
    """``async_creator`` for the engine: an :class:`InlineConnection` to ``url``'s
    database (file name or SQLite URI, as SQLAlchemy's own dialect reads the URL)."""
    args, params = SQLiteDialect_aiosqlite().create_connect_args(url)
    database, uri = str(args[0]), bool(params.get("uri", False))

    async def create() -> InlineConnection:
        return await connect_inline(database, busy_timeout_ms=busy_timeout_ms, uri=uri)

    return create


def _install_sqlite_pragmas(engine: AsyncEngine, *, busy_timeout_ms: int, wal: bool) -> None:
    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # we emit BEGIN ourselves (see module doc)
        cursor = dbapi_connection.cursor()
        try:
            if wal:
                cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute("PRAGMA synchronous=NORMAL")
            # 0 on the inline connection: a busy statement is retried in its worker
            # thread with the timeout (.sqlite_inline), never waited for on the loop
            inline = isinstance(
                getattr(dbapi_connection, "driver_connection", None), InlineConnection
            )
            cursor.execute(f"PRAGMA busy_timeout={0 if inline else busy_timeout_ms:d}")
        finally:
            cursor.close()

    @event.listens_for(engine.sync_engine, "begin")
    def _on_begin(connection: Connection) -> None:
        immediate = connection.get_execution_options().get(_WRITE_OPTION, False)
        connection.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


class Database:
    """The manager's database: an async engine plus transaction helpers."""

    def __init__(self, engine: AsyncEngine, *, busy_timeout_s: float = 10.0) -> None:
        self.engine = engine
        self._busy_timeout_s = busy_timeout_s
        # one writer lock per event loop (tests run several loops over one Database)
        self._writer_locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = (
            weakref.WeakKeyDictionary()
        )

    @classmethod
    def from_url(
        cls,
        url: URL | str,
        *,
        pool_size: int = 8,
        max_overflow: int = 16,
        busy_timeout_s: float = 10.0,
        echo: bool = False,
    ) -> Database:
        """Create the engine.  A file SQLite URL gets its file created private (0600, in a
        0700 directory when that is missing too) before SQLite opens it."""
        url = normalize_db_url(url) if isinstance(url, str) else url
        # hide_parameters: statement parameters (secret keys, password hashes) never
        # appear in SQL logs (echo) or in exception messages.
        kwargs: dict[str, Any] = {"echo": echo, "hide_parameters": True}
        if url.get_backend_name() == "sqlite":
            memory = is_memory_sqlite(url)
            if memory:
                kwargs["poolclass"] = StaticPool  # one shared in-memory database
            elif not str(url.database).startswith("file:"):  # not a SQLite URI filename
                # The database holds every secret key: 0600 in a 0700 directory when
                # created, tightened (with a warning) when found open to others.
                prepare_sqlite_file(Path(str(url.database)).expanduser())
            # statements run on the loop's thread; busy waits in a worker (.sqlite_inline)
            kwargs["async_creator"] = _inline_creator(url, int(busy_timeout_s * 1000))
            # aiosqlite logs every statement *with its parameters* at DEBUG, which
            # defeats hide_parameters under --log-level debug; keep it at INFO unless
            # someone set its level on purpose (docs/reliability.md, bug 2).
            aiosqlite_log = logging.getLogger("aiosqlite")
            if aiosqlite_log.level == logging.NOTSET:
                aiosqlite_log.setLevel(logging.INFO)
            engine = create_async_engine(url, **kwargs)
            _install_sqlite_pragmas(
                engine, busy_timeout_ms=int(busy_timeout_s * 1000), wal=not memory
            )
        else:
            kwargs.update(pool_size=pool_size, max_overflow=max_overflow, pool_pre_ping=True)
            engine = create_async_engine(url, **kwargs)
        return cls(engine, busy_timeout_s=busy_timeout_s)

    @classmethod
    def from_config(cls, config: ManagerConfig) -> Database:
        return cls.from_url(
            config.db_url,
            pool_size=config.db.pool_size,
            max_overflow=config.db.max_overflow,
            busy_timeout_s=config.db.busy_timeout,
            echo=config.db.echo,
        )

    @property
    def url(self) -> URL:
        return make_url(self.engine.url)

    @property
    def dialect(self) -> str:
        """``"sqlite"`` or ``"postgresql"``."""
        return self.engine.dialect.name

    def safe_url(self) -> str:
        """The URL without its password (for logs and CLI output)."""
        return self.engine.url.render_as_string(hide_password=True)

    @asynccontextmanager
    async def connect(self, *, write: bool = False) -> AsyncIterator[AsyncConnection]:
        """A Core connection inside one transaction (committed on success)."""
        async with self._writer(write), self.engine.connect() as conn:
            if write:
                await conn.execution_options(**{_WRITE_OPTION: True})
            async with conn.begin():
                yield conn

    @asynccontextmanager
    async def begin(self, *, write: bool = False) -> AsyncIterator[AsyncSession]:
        """An ORM session inside one transaction (committed on success, else rolled back).

        Objects stay usable after the commit (``expire_on_commit=False``).
        """
        async with self._writer(write), self.engine.connect() as conn:
            if write:
                await conn.execution_options(**{_WRITE_OPTION: True})
            session = AsyncSession(bind=conn, expire_on_commit=False)
            async with session, session.begin():
                yield session

    @asynccontextmanager
    async def begin_queued_write(self) -> AsyncIterator[AsyncSession]:
        """:meth:`begin` with ``write=True``: the scheduling pipeline's short, never-nested
        write transactions (apply, failures, the binder's grouped steps).  On SQLite every
        writer of this process already queues on the writer lock (see :meth:`_writer`), so
        they never collide on the database's write lock, where SQLite's busy handler sleeps
        up to 100 ms per try."""
        async with self.begin(write=True) as session:
            yield session

    @asynccontextmanager
    async def _writer(self, write: bool) -> AsyncIterator[None]:
        """SQLite, ``write``: hold this process's writer lock (see the module doc)."""
        if not write or self.engine.dialect.name != "sqlite":
            yield
            return
        loop = asyncio.get_running_loop()
        lock = self._writer_locks.get(loop)
        if lock is None:
            lock = self._writer_locks[loop] = asyncio.Lock()
        acquired = False
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._busy_timeout_s):
                acquired = await lock.acquire()
        if not acquired:
            log.warning("waited %.0f s for the writer lock; going on", self._busy_timeout_s)
        try:
            yield
        finally:
            if acquired:
                lock.release()

    async def ping(self) -> None:
        """Raise if the database cannot answer ``SELECT 1``."""
        async with self.engine.connect() as conn:
            await conn.execute(text("SELECT 1"))

    async def dispose(self) -> None:
        await self.engine.dispose()
