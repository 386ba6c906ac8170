"""Waiting for sessions to reach a status: one query per change for every waiter.

``POST /session`` with ``maxWaitSeconds`` waits for its session to run.  Each waiter
re-reading its own row on every :class:`.ChangeHub` publish made N concurrent creates
cost N queries per status change anywhere (16 clients: ~170 read transactions a
second, most of the manager's event loop).  Here one task reads the status of every
session waited for in one ``SELECT ... WHERE id IN (...)`` per wake-up and resolves
the waiters whose condition holds::

    watch = StatusWatch(db, hub)
    status = await watch.wait_for(session_id, lambda s: s is SessionStatus.RUNNING, 30.0)

Wake-ups: every hub publish that may have changed a status (local or another
replica's; not a session's enqueue: :attr:`.ChangeHub.status_version`), a new waiter,
and a timer (``poll_s``) for changes nobody published.  The database stays the source
of truth: a missed publish costs at most ``poll_s``.  Publishes during a query cause
exactly one more query (the wake flag is cleared before the query, not after).

A new waiter that knows its session's status as of a ``status_version``
(``unchanged_since``: the create, which read it before committing the PENDING row)
costs no query while the counter has not moved: nothing published a change of the
session since, and its condition did not hold then.  The next wake-up or the timer
reads it with the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Callable

import sqlalchemy as sa

from accelshare.aio import cancel_and_wait
from accelshare.sched.lifecycle import SessionStatus

from .db import Database
from .hub import ChangeHub
from .models import Session

__all__ = ["StatusWatch"]

log = logging.getLogger(__name__)

StatusTest = Callable[[SessionStatus], bool]
_Answer = asyncio.Future[SessionStatus | None]  # None: the session does not exist
# prebuilt (its cache key computed once), run on a Core connection
_STATUSES = sa.select(Session.id, Session.status).where(
    Session.id.in_(sa.bindparam("ids", expanding=True))
)


class StatusWatch:
    def __init__(self, db: Database, hub: ChangeHub, *, poll_s: float = 0.5) -> None:
        self.db = db
        self.hub = hub
        self.poll_s = poll_s
        self._status_seen = hub.status_version
        self._waiters: dict[uuid.UUID, list[tuple[StatusTest, _Answer]]] = {}
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        hub.add_listener(self._on_publish)

    def _on_publish(self, *, remote: bool) -> None:
        del remote  # another replica's change counts as a status change (the hub's rule)
        if self.hub.status_version == self._status_seen:
            return  # a session enqueued: no waited-for status changed
        self._status_seen = self.hub.status_version
        if self._wake is not None:
            self._wake.set()

    async def wait_for(
        self,
        session_id: uuid.UUID,
        done: StatusTest,
        timeout_s: float,
        *,
        unchanged_since: int | None = None,
    ) -> SessionStatus | None:
        """The session's status once ``done(status)`` holds; None after ``timeout_s``
        (or when the session does not exist).

        ``unchanged_since``: the hub's ``status_version`` read when the caller last
        knew the session's status, and ``done`` did not hold for it; while the counter
        is still there, the waiter is added without a query of its own."""
        if timeout_s <= 0:
            return None
        future: _Answer = asyncio.get_running_loop().create_future()
        entry = (done, future)
        self._waiters.setdefault(session_id, []).append(entry)
        self._kick(query=unchanged_since is None or unchanged_since != self.hub.status_version)
        try:
            async with asyncio.timeout(timeout_s):
                return await future
        except TimeoutError:
            return None
        finally:
            entries = self._waiters.get(session_id)
            if entries is not None:
                with contextlib.suppress(ValueError):
                    entries.remove(entry)
                if not entries:
                    del self._waiters[session_id]

    async def close(self) -> None:
        if self._task is not None:
            await cancel_and_wait([self._task])
            self._task = None

    def _kick(self, *, query: bool = True) -> None:
        """Make sure the task runs; ``query``: read the statuses at once (a new waiter
        whose status is not known), else at the next wake-up or tick."""
        if self._wake is None:
            self._wake = asyncio.Event()
        idle = self._task is None or self._task.done()
        if query:
            self._wake.set()
        elif idle:  # nobody else waits: a publish seen before this waiter is not news
            self._wake.clear()
        if idle:
            self._task = asyncio.create_task(
                self._run(self._wake, query_first=query), name="status-watch"
            )

    async def _run(self, wake: asyncio.Event, *, query_first: bool = True) -> None:
        """Until nobody waits: read every waited-for status, resolve, sleep until woken
        (``query_first=False``: sleep first, the waiters' statuses are known)."""
        query = query_first
        while self._waiters:
            if query:
                wake.clear()
                try:
                    await self._check_all()
                except asyncio.CancelledError:
                    raise
                except Exception:  # keep serving the waiters: the next wake-up retries
                    log.exception("reading the statuses of waited-for sessions failed")
                if not self._waiters:
                    break
            query = True
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.poll_s):
                    await wake.wait()

    async def _check_all(self) -> None:
        ids = list(self._waiters)
        statuses: dict[uuid.UUID, SessionStatus] = {}
        # bounded IN lists (SQLite's variable limit; one query for the usual few waiters)
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            async with self.db.connect() as conn:
                rows = await conn.execute(_STATUSES, {"ids": chunk})
                statuses.update({row[0]: row[1] for row in rows})
        for session_id in ids:
            status = statuses.get(session_id)
            for done, future in list(self._waiters.get(session_id, ())):
                if future.done():
                    continue
                if status is None or done(status):
                    future.set_result(status)
