"""Writing why sessions stay pending, off the scheduling pass (coalesced, in chunks).

A pass leaves its failures here (:meth:`Explanations.add`) and goes on; a task of the
scheduler writes them: ``status_info`` and ``status_data.scheduler`` of each session
still PENDING.  Writing thousands of explanations takes a noticeable time of the
database and the event loop; done inside the pass it would hold the scheduling lock that
long, so a release right after would wait for it, and a stream of passes would rewrite
every pending row each time.

* **Coalesced.** A session queued again before its entry was written keeps only the
  newest explanation; the retries of the passes in between add up.
* **``retries`` is added by the database** (``stored + delta`` in the UPDATE), not
  written as an absolute value: entries written late, or by two manager replicas, never
  lose or double a count.  Until written, a session's delta is in :meth:`unwritten`,
  which the snapshot adds to what it reads (``num_retries_to_skip`` sees every pass).
* **Changed first.** An explanation that differs from the one this process last wrote
  for the session (kind, message, predicates, per-agent reasons) is written at once; one
  that only moves ``retries`` and ``last_try`` is written at most every ``refresh_s``
  (5 s): on a full cluster most of the queue, most of the time.  ``last_try`` is then
  up to that old; ``retries`` is exact once written.
* Each chunk (``chunk`` sessions) is its own short write transaction: binds, API
  writes and heartbeats go between them.  A chunk waits while binds are in flight (at
  most ``defer_max_s``, 2 s): they come first on the writer.

:meth:`flush` writes everything queued now (the loop's tests and a graceful stop).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from accelshare.aio import cancel_and_wait
from accelshare.sched.lifecycle import SessionStatus
from accelshare.sched.outcome import Failure

from ..db import Database
from .apply import clip_info

__all__ = ["Explanations", "write_explanations"]

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Entry:
    failure: Failure  # the newest
    now: datetime  # its pass's time (last_try)
    delta: int  # retries to add: the failed attempts of every coalesced pass
    changed: bool  # differs from what this process last wrote for the session


def _content(failure: Failure) -> tuple[Any, ...]:
    return (
        failure.kind,
        failure.msg,
        failure.agent_reasons,
        failure.failed_predicates,
        failure.passed_predicates,
        failure.shortages,
    )


class Explanations:
    def __init__(
        self,
        db: Database,
        *,
        refresh_s: float = 5.0,
        chunk: int = 100,
        delay_s: float = 0.01,
        monotonic: Callable[[], float] = time.monotonic,
        binds_idle: asyncio.Event | None = None,
        defer_max_s: float = 2.0,
    ) -> None:
        self.db = db
        self.binds_idle = binds_idle
        self.defer_max_s = defer_max_s
        self._awaited = 0  # settled() callers waiting now: the writer defers to no bind
        self._urgent = asyncio.Event()
        self.refresh_s = refresh_s
        self.chunk = chunk
        self.delay_s = delay_s
        self._monotonic = monotonic
        self._queued: dict[str, _Entry] = {}
        self._in_flight: dict[str, int] = {}  # session -> delta being written now
        self._writing: dict[str, int] = {}  # session -> its entries being written now
        # per scaling group: session -> (content, monotonic time) of the last write
        self._written: dict[str, dict[str, tuple[tuple[Any, ...], float]]] = {}
        self._group_of: dict[str, str] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_due = 0.0
        self._write_lock = asyncio.Lock()
        self._progress = asyncio.Condition()  # notified after every chunk written
        # cleared by the scheduler while a pass runs: the task writes between passes,
        # never during one (a pass that places a release must not wait for it)
        self.gate = asyncio.Event()
        self.gate.set()
        self.rows_written = 0

    # -- what passes and snapshots call ------------------------------------------------
    def add(self, scaling_group: str, failures: Sequence[Failure], now: datetime) -> None:
        """Queue a pass's failures (every session of the group it left pending)."""
        written = self._written.setdefault(scaling_group, {})
        current = {f.session_id for f in failures}
        for gone in [sid for sid in written if sid not in current]:
            del written[gone]  # placed, cancelled or ended: nothing more to compare with
            if gone not in self._queued:
                self._group_of.pop(gone, None)
        for failure in failures:
            sid = failure.session_id
            content = _content(failure)
            delta = 1 if failure.adds_retry else 0
            last = written.get(sid)
            changed = last is None or last[0] != content
            entry = self._queued.get(sid)
            if entry is None:
                self._queued[sid] = _Entry(failure, now, delta, changed)
            else:
                entry.failure, entry.now = failure, now
                entry.delta += delta
                entry.changed = entry.changed or changed
            self._group_of[sid] = scaling_group
        self._wake.set()

    def forget(self, scaling_group: str) -> None:
        """The group has nothing pending any more: drop what was remembered of its
        writes (entries still queued are written as usual)."""
        for sid in self._written.pop(scaling_group, {}):
            if sid not in self._queued:
                self._group_of.pop(sid, None)

    def unwritten(self, session_id: str) -> int:
        """Retries of ``session_id`` counted by passes but not in the database yet."""
        entry = self._queued.get(session_id)
        return (entry.delta if entry is not None else 0) + self._in_flight.get(session_id, 0)

    @property
    def groups(self) -> frozenset[str]:
        """The scaling groups whose writes are remembered."""
        return frozenset(self._written)

    @property
    def queued(self) -> int:
        return len(self._queued)

    async def settled(self, session_id: str, timeout_s: float) -> bool:
        """Wait until nothing about ``session_id`` is queued or being written (True), or
        the timeout.  A new session's first explanation is a changed one: written at
        once, so this is short."""

        def done() -> bool:
            return session_id not in self._queued and session_id not in self._writing

        if done():
            return True
        self._awaited += 1
        self._urgent.set()  # a chunk deferring to binds goes now (a create waits for it)
        try:
            async with asyncio.timeout(max(0.0, timeout_s)), self._progress:
                await self._progress.wait_for(done)
        except TimeoutError:
            return False
        finally:
            self._awaited -= 1
            if not self._awaited:
                self._urgent.clear()
        return True

    # -- the writer ----------------------------------------------------------------------
    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="accelshare-explanations")

    async def stop(self, *, flush: bool = True) -> None:
        if self._task is not None:
            # a write round in progress finishes first: the task is cancelled between
            # rounds, never inside a statement (its transaction would be rolled back
            # and the connection closed under the statement)
            async with self._write_lock:
                await cancel_and_wait([self._task])
            self._task = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if flush:
            await self.flush()

    async def flush(self) -> None:
        """Write every queued explanation now, changed or not (whatever the gate)."""
        await self._write(due_only=False, gated=False)

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            # a moment first: the binds the pass just submitted reach the (SQLite)
            # writer lock before the explanations, and more passes may coalesce
            await asyncio.sleep(self.delay_s)
            self._wake.clear()
            try:
                await self._write(due_only=True, gated=True)
            except asyncio.CancelledError:
                raise
            except Exception:  # the entries were re-queued: try again in a second
                log.exception("writing the pending sessions' explanations failed")
                await asyncio.sleep(1.0)
                self._wake.set()

    def _due(self, due_only: bool) -> list[tuple[str, _Entry]]:
        now = self._monotonic()
        picked: list[tuple[str, _Entry]] = []
        next_due: float | None = None
        for sid, entry in self._queued.items():
            if not due_only or entry.changed:
                picked.append((sid, entry))
                continue
            last = self._written.get(self._group_of.get(sid, ""), {}).get(sid)
            due_at = last[1] + self.refresh_s if last is not None else now
            if due_at <= now:
                picked.append((sid, entry))
            elif next_due is None or due_at < next_due:
                next_due = due_at
        picked.sort(key=lambda item: not item[1].changed)  # changed ones first
        for sid, _ in picked:
            del self._queued[sid]
        if next_due is not None and (self._timer is None or next_due < self._timer_due):
            if self._timer is not None:
                self._timer.cancel()
            self._timer_due = next_due
            self._timer = asyncio.get_running_loop().call_later(
                max(0.0, next_due - now), self._timer_fired
            )
        return picked

    def _timer_fired(self) -> None:
        self._timer = None
        self._wake.set()

    async def _write(self, *, due_only: bool, gated: bool = False) -> None:
        async with self._write_lock:
            picked = self._due(due_only)
            # every picked session counts as being written until its chunk is: settled()
            # and unwritten() must not lose it while earlier chunks (or binds) go first
            self._mark(picked, +1)
            written = 0
            try:
                for start in range(0, len(picked), self.chunk):
                    if gated:
                        await self.gate.wait()
                        await self._yield_to_binds()
                    part = picked[start : start + self.chunk]
                    async with self.db.begin_queued_write() as db:
                        await write_explanations(db, [(e.failure, e.now, e.delta) for _, e in part])
                    written = start + len(part)
                    self._mark(part, -1)
                    done = self._monotonic()
                    for sid, entry in part:
                        group = self._written.setdefault(self._group_of.get(sid, ""), {})
                        group[sid] = (_content(entry.failure), done)
                    self.rows_written += len(part)
                    async with self._progress:
                        self._progress.notify_all()
            except BaseException:
                self._mark(picked[written:], -1)
                self._requeue(picked[written:])
                raise

    def _mark(self, entries: Sequence[tuple[str, _Entry]], sign: int) -> None:
        """Count (+1) or uncount (-1) the entries as being written, and their deltas."""
        for sid, entry in entries:
            count = self._writing.get(sid, 0) + sign
            if count:
                self._writing[sid] = count
            else:
                self._writing.pop(sid, None)
            left = self._in_flight.get(sid, 0) + sign * entry.delta
            if left:
                self._in_flight[sid] = left
            else:
                self._in_flight.pop(sid, None)

    async def _yield_to_binds(self) -> None:
        """Before a chunk: wait while binds are in flight, at most ``defer_max_s``.  The
        binds of a pass that placed thousands and these explanations share the writer
        (SQLite: one at a time); a chunk between two grouped bind steps made the binds
        wait (a third of the writer's time in a 1,000-agent fill).  Bounded, so that a
        cluster binding without pause still gets its explanations (a chunk a period), and
        not at all while someone waits in :meth:`settled` (a create answering with its
        session's reason)."""
        if self.binds_idle is None or self.binds_idle.is_set() or self._awaited:
            return
        idle = asyncio.ensure_future(self.binds_idle.wait())
        urgent = asyncio.ensure_future(self._urgent.wait())
        try:
            await asyncio.wait(
                (idle, urgent), timeout=self.defer_max_s, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            await cancel_and_wait([idle, urgent])

    def _requeue(self, entries: Sequence[tuple[str, _Entry]]) -> None:
        """Put entries that were not written back, under what was queued since."""
        for sid, entry in entries:
            newer = self._queued.get(sid)
            if newer is None:
                self._queued[sid] = entry
            else:
                newer.delta += entry.delta
                newer.changed = True


def _sessions() -> sa.Table:
    from ..models import Session

    return Session.__table__  # type: ignore[return-value]


async def write_explanations(db: Any, entries: Sequence[tuple[Failure, datetime, int]]) -> int:
    """``status_info`` and ``status_data.scheduler`` of sessions still PENDING (a session
    placed, cancelled or destroyed meanwhile keeps what it has).  Only the ``scheduler``
    key is replaced, by the database, and its ``retries`` is the stored one plus the
    entry's delta.  PostgreSQL: one ``UPDATE ... FROM unnest(...)``; SQLite: one prepared
    ``UPDATE`` run over all of them.  Returns how many were given."""
    if not entries:
        return 0
    ids = [uuid.UUID(failure.session_id) for failure, _, _ in entries]
    infos = [clip_info(failure.msg) for failure, _, _ in entries]
    docs = [json.dumps(failure.scheduler_data(now)) for failure, now, _ in entries]
    deltas = [delta for _, _, delta in entries]
    conn = await db.connection()
    if conn.dialect.name == "postgresql":
        await conn.execute(
            sa.text(
                "UPDATE sessions SET status_info = v.info,"
                " status_data = jsonb_set(CASE WHEN jsonb_typeof(sessions.status_data) ="
                " 'object' THEN sessions.status_data ELSE '{}'::jsonb END, '{scheduler}',"
                " jsonb_set(v.doc::jsonb, '{retries}', to_jsonb(v.delta + CASE WHEN"
                " jsonb_typeof(sessions.status_data #> '{scheduler,retries}') = 'number'"
                " THEN (sessions.status_data #>> '{scheduler,retries}')::numeric::bigint"
                " ELSE 0 END)))"
                " FROM unnest(CAST(:ids AS uuid[]), CAST(:infos AS text[]),"
                " CAST(:docs AS text[]), CAST(:deltas AS bigint[])) AS v(id, info, doc, delta)"
                " WHERE sessions.id = v.id AND sessions.status = :pending"
            ),
            {
                "ids": ids,
                "infos": infos,
                "docs": docs,
                "deltas": deltas,
                "pending": SessionStatus.PENDING.value,
            },
        )
        return len(ids)
    table = _sessions()
    column = table.c.status_data
    base = sa.case((sa.func.json_type(column) == "object", column), else_=sa.literal_column("'{}'"))
    stored = sa.func.coalesce(
        sa.cast(sa.func.json_extract(column, "$.scheduler.retries"), sa.Integer()), 0
    )
    doc = sa.func.json_set(
        sa.func.json(sa.bindparam("b_doc", type_=sa.String())),
        "$.retries",
        stored + sa.bindparam("b_delta", type_=sa.Integer()),
    )
    await conn.execute(
        sa.update(table)
        .where(table.c.id == sa.bindparam("b_id"), table.c.status == SessionStatus.PENDING)
        .values(
            status_info=sa.bindparam("b_info"),
            status_data=sa.func.json_set(base, "$.scheduler", doc),
        ),
        [
            {"b_id": sid, "b_info": info, "b_doc": doc_text, "b_delta": delta}
            for sid, info, doc_text, delta in zip(ids, infos, docs, deltas, strict=True)
        ],
    )
    return len(ids)
