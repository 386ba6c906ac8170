"""The scheduling loop: when passes run, the lock, and what happens after a pass.

Triggers (:meth:`Scheduler.trigger`): a session enqueued, a session ended (resources
released), an agent joined or changed, and a timer (``schedule-interval``, 2 s).
Triggers coalesce: a trigger during a pass schedules exactly one more pass, which
starts after a rest as long as that pass took (at most :data:`PASS_GAP_MAX_S`, 50 ms),
so that under a stream of creates each pass places several sessions; a trigger that
finds the loop idle runs a pass at once.

One scheduler at a time:

* in this process, an ``asyncio.Lock``;
* across manager replicas on PostgreSQL, a session-level ``pg_advisory_lock`` per
  scaling group on a connection of its own, held across the pass's transactions;
* SQLite is the embedded, one-process setup: the in-process lock is enough.

A pass per scaling group (with PENDING sessions) is a pipeline of short transactions:
cancel sessions past the group's ``pending_timeout`` (a write transaction), load the
snapshot (one read transaction), decide the placements with the pure
:func:`~accelshare.sched.plan.place_pass` in a worker thread (``asyncio.to_thread``, no
transaction open: on SQLite binds, destroys and heartbeats write meanwhile), apply them
(one write transaction, compare-and-set per agent, which rejects placements on agents
that changed since the snapshot), submit the binds (:mod:`.binding`, outside the lock),
then work out why the others stay pending (:meth:`~accelshare.sched.plan.PlacedPass.explain`,
in the worker thread again) and hand those explanations to
:class:`~.explanations.Explanations`, whose
task writes them off the pass and its lock (coalesced, changed ones first, in short
chunks) — a release is placed, and the next pass starts, without waiting for thousands
of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

import sqlalchemy as sa

from accelshare.aio import cancel_and_wait
from accelshare.common import SlotTypes
from accelshare.config import ConfigStore
from accelshare.sched.fit import MapLayouts
from accelshare.sched.lifecycle import SessionStatus
from accelshare.sched.memo import PlanMemo
from accelshare.sched.outcome import SchedulingPlan
from accelshare.sched.plan import place_pass
from accelshare.sched.snapshot import SchedulerOptions

from ..clock import Clock
from ..db import Database
from ..hub import ChangeHub
from ..maintenance import ManagerStatus, read_manager_status
from ..metrics import ManagerMetrics
from ..models import Kernel, ScalingGroup, Session
from ..slots import KnownSlots
from ..transitions import change_status
from .apply import BindJob, apply_plan
from .binding import BINDABLE, Binder
from .explanations import Explanations
from .snapshot import SnapshotCache, load_snapshot

__all__ = ["PassResult", "Scheduler", "advisory_key"]

log = logging.getLogger(__name__)

ROUNDROBIN_KEY = "resource-group-states/{scaling_group}/agselector.roundrobin"
PASS_GAP_MAX_S = 0.05
"""The longest rest between back-to-back passes (see ``_run_forever``)."""
BIND_HEAD_START_S = 0.05
"""How long a pass that leaves many sessions pending (:data:`BIND_HEAD_START_FAILURES`)
lets its binds run alone before it works out their explanations, whose worker thread
shares the GIL with the binds' steps on the event loop (beside 10,000 explanations a
release's one bind took ~2× as long)."""
BIND_HEAD_START_FAILURES = 500
SCHEDULER_PLUGINS_PREFIX = "config/plugins/scheduler"


def advisory_key(name: str) -> int:
    """A stable signed 64-bit key for ``pg_advisory_lock`` (not Python's salted hash)."""
    digest = hashlib.sha256(f"accelshare.scheduler:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


@dataclass(frozen=True, slots=True)
class PassResult:
    scaling_group: str
    plan: SchedulingPlan | None  # None: the group's options are broken (logged)
    jobs: tuple[BindJob, ...]
    cancelled: int  # sessions cancelled for pending_timeout
    conflicts: frozenset[str]


class Scheduler:
    def __init__(
        self,
        *,
        db: Database,
        store: ConfigStore,
        known_slots: KnownSlots,
        binder: Binder,
        hub: ChangeHub,
        metrics: ManagerMetrics,
        clock: Clock,
        interval_s: float = 2.0,
    ) -> None:
        self.db = db
        self.store = store
        self.known_slots = known_slots
        self.binder = binder
        self.hub = hub
        self.metrics = metrics
        self.clock = clock
        self.interval_s = interval_s
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.passes_completed = 0
        # per scaling group: parses of rows between passes (never their values: the
        # snapshot reads every row each pass and reuses a parse only for identical text)
        self.snapshot_caches: dict[str, SnapshotCache] = {}
        # written while no bind is in flight (or a chunk every defer_max_s): the binds of a
        # large pass and the explanations of those left share the (SQLite) writer
        self.explanations = Explanations(db, binds_idle=binder.idle)
        # per scaling group: the shown agents' reasons, reused while an agent's snapshot
        # is the same object (the snapshot cache's), see sched.memo.PlanMemo
        self.plan_memos: dict[str, PlanMemo] = {}
        # the device layouts' empty maps and verdicts, shared by every group's passes
        self.map_layouts = MapLayouts()

    # -- triggers and the loop ----------------------------------------------------------
    def trigger(self) -> None:
        self._wake.set()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run_forever(), name="accelshare-scheduler")
            self.explanations.start()

    async def stop(self, *, drain_s: float = 5.0) -> None:
        if self._task is not None:
            await cancel_and_wait([self._task])
            self._task = None
        await self.binder.drain(drain_s)
        try:
            await self.explanations.stop(flush=True)
        except Exception:  # the explanations are rewritten by the next manager's passes
            log.exception("writing the last explanations at stop failed")

    async def _run_forever(self) -> None:
        while True:
            # asyncio.timeout, not wait_for: Python 3.11's wait_for swallows a cancellation
            # that lands just as the event fires, and stop() would then wait forever.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.interval_s):
                    await self._wake.wait()
            self._wake.clear()
            started = time.monotonic()
            try:
                await self.run_once(flush=False)
            except asyncio.CancelledError:
                raise
            except Exception:  # keep scheduling: the next trigger retries
                log.exception("scheduling pass failed")
                await asyncio.sleep(min(self.interval_s, 1.0))
            if self._wake.is_set():
                # Triggered again while it ran (sessions arriving back to back): let the
                # next pass gather them, resting as long as this pass took (at most
                # PASS_GAP_MAX_S) — one pass per few sessions instead of one per session,
                # whose fixed cost (the snapshot) would take the manager's CPU from the
                # requests.  A trigger that finds the loop idle is served at once.
                await asyncio.sleep(min(time.monotonic() - started, PASS_GAP_MAX_S))

    def next_pass_mark(self) -> int:
        """For :meth:`wait_for_pass`: a pass that starts after now has completed once the
        count exceeds this (a pass already running may have missed what was just written)."""
        return self.passes_completed + (1 if self._lock.locked() else 0)

    async def wait_for_pass(
        self, after: int, timeout_s: float, session_id: str | None = None
    ) -> bool:
        """Wait until more than ``after`` passes completed (True) or the timeout; with
        ``session_id``, also until that pass's explanation of it, if it stayed pending,
        is written (they are written off the pass)."""
        deadline = time.monotonic() + timeout_s
        while self.passes_completed <= after:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            await self.hub.wait(min(left, 0.5))
        if session_id is not None:
            return await self.explanations.settled(session_id, deadline - time.monotonic())
        return True

    # -- one round over every scaling group with pending sessions ------------------------
    async def run_once(self, *, flush: bool = True) -> list[PassResult]:
        """One pass per scaling group with pending sessions.  ``flush``: also write the
        explanations of the sessions left pending before returning (the loop leaves
        them to the explanations' task, which writes between passes)."""
        if await read_manager_status(self.store) is ManagerStatus.FROZEN:
            # frozen for maintenance (..maintenance): nothing is placed; the pending
            # sessions say so (hold_for_maintenance)
            async with self._lock:
                self.passes_completed += 1
            self.hub.publish()
            return []
        async with self._lock, self._explanations_held():
            known = await self.known_slots.load()  # one set for the whole round
            results: list[PassResult] = []
            groups = await self._groups_with_pending()
            for scaling_group in groups:
                results.append(await self._pass(scaling_group, known))
            for gone in set(self.snapshot_caches) - set(groups):  # nothing pending there
                del self.snapshot_caches[gone]
            for gone in set(self.plan_memos) - set(groups):
                del self.plan_memos[gone]
            for gone in set(self.explanations.groups) - set(groups):
                self.explanations.forget(gone)
            self.passes_completed += 1
        if flush:
            await self.explanations.flush()
        self.hub.publish()
        for result in results:  # their binds were submitted by the pass itself
            if result.conflicts:
                self.trigger()
        return results

    async def hold_for_maintenance(self, reason: str) -> int:
        """The manager was just frozen: wait for a pass in progress, write its
        explanations, then give every PENDING session ``reason`` as its ``status_info``
        (the passes place nothing while frozen).  Returns how many."""
        async with self._lock:
            await self.explanations.flush()
            for group in list(self.explanations.groups):
                self.explanations.forget(group)
            async with self.db.begin(write=True) as db:
                result = await db.execute(
                    sa.update(Session)
                    .where(Session.status == SessionStatus.PENDING)
                    .values(status_info=reason)
                    .execution_options(synchronize_session=False)
                )
        self.hub.publish()
        return int(getattr(result, "rowcount", 0) or 0)

    def release_maintenance(self) -> None:
        """The manager was unfrozen: the next pass places or explains every pending
        session afresh (replacing the maintenance reason)."""
        for group in list(self.explanations.groups):
            self.explanations.forget(group)
        self.trigger()

    @contextlib.asynccontextmanager
    async def _explanations_held(self) -> AsyncIterator[None]:
        """The explanations' task writes no chunk while passes run."""
        self.explanations.gate.clear()
        try:
            yield
        finally:
            self.explanations.gate.set()

    async def resume(self) -> int:
        """After a start: bind again what a previous manager left between SCHEDULED and
        CREATING (the agent's create is idempotent by kernel id).  Returns how many."""
        async with self.db.begin() as db:
            rows = await db.execute(
                sa.select(Session.id, Kernel.id, Kernel.agent_id, Kernel.allocation)
                .join(Kernel, Kernel.session_id == Session.id)
                .where(Session.status.in_(sorted(BINDABLE)))
                .order_by(Session.scheduled_at, Session.id)
            )
            jobs = [
                BindJob(sid, kid, agent_id, plan or None)
                for sid, kid, agent_id, plan in rows
                if agent_id is not None
            ]
        if jobs:
            log.info("resuming %d bind(s) left by a previous manager", len(jobs))
            self.binder.submit(jobs)
        return len(jobs)

    async def rescue_stale_binds(self, older_than: timedelta) -> int:
        """Bind again sessions stuck between SCHEDULED and CREATING for longer than
        ``older_than`` that this process is not binding: their binder was a manager
        replica that died (or lost its database connection) mid-bind.  Safe while that
        replica still works on them: the agent's create is idempotent by kernel id and
        each step re-checks the session's status under its row lock."""
        cutoff = self.clock() - older_than
        async with self.db.begin() as db:
            rows = await db.execute(
                sa.select(Session.id, Kernel.id, Kernel.agent_id, Kernel.allocation)
                .join(Kernel, Kernel.session_id == Session.id)
                .where(Session.status.in_(sorted(BINDABLE)), Session.status_changed_at < cutoff)
                .order_by(Session.scheduled_at, Session.id)
            )
            jobs = [
                BindJob(sid, kid, agent_id, plan or None)
                for sid, kid, agent_id, plan in rows
                if agent_id is not None and sid not in self.binder.in_flight
            ]
        if jobs:
            log.warning(
                "re-binding %d session(s) stuck for over %s s between SCHEDULED and CREATING"
                " (their manager replica stopped mid-bind?)",
                len(jobs),
                int(older_than.total_seconds()),
            )
            self.binder.submit(jobs)
        return len(jobs)

    async def _groups_with_pending(self) -> list[str]:
        """The scaling groups with a pending session: one index probe per group (the
        sessions' ``(scaling_group, status, ...)`` index), not a GROUP BY over every
        pending session (a few ms a pass at 10,000 pending, before the pass starts)."""
        pending = (
            sa.select(sa.literal(1))
            .where(
                Session.scaling_group == ScalingGroup.name,
                Session.status == SessionStatus.PENDING,
            )
            .exists()
        )
        async with self.db.begin() as db:
            rows = await db.execute(
                sa.select(ScalingGroup.name).where(pending).order_by(ScalingGroup.name)
            )
            return [name for (name,) in rows]

    @contextlib.asynccontextmanager
    async def _group_lock(self, scaling_group: str) -> AsyncIterator[None]:
        """The scaling group's lock across manager replicas (PostgreSQL): a session-level
        ``pg_advisory_lock`` on a connection of its own, held across the pass's short
        transactions (snapshot, apply, failures).  The connection is discarded when the
        unlock cannot be confirmed, which releases the lock with it.  SQLite (embedded,
        one manager process) needs nothing beyond the in-process lock."""
        if self.db.dialect != "postgresql":
            yield
            return
        key = advisory_key(scaling_group)
        conn = await self.db.engine.connect()
        try:
            await conn.execute(sa.select(sa.func.pg_advisory_lock(key)))
            await conn.commit()
            yield
        finally:
            try:
                await conn.execute(sa.select(sa.func.pg_advisory_unlock(key)))
                await conn.commit()
            except BaseException:
                await conn.invalidate()  # closing the connection releases the lock
                raise
            finally:
                await conn.close()

    async def _pass(self, scaling_group_name: str, known: Mapping[str, SlotTypes]) -> PassResult:
        """One scaling group's pass; ``known``: the slot types read for the round."""
        started = time.perf_counter()
        last_rr = await self.store.get(ROUNDROBIN_KEY.format(scaling_group=scaling_group_name))
        store_options = await self.store_scheduler_options(scaling_group_name)
        async with self._group_lock(scaling_group_name):
            async with self.db.begin() as db:
                scaling_group = await db.get(ScalingGroup, scaling_group_name)
            if scaling_group is None or not scaling_group.is_active:
                return PassResult(scaling_group_name, None, (), 0, frozenset())
            try:
                options = SchedulerOptions.from_scaling_group(
                    scaling_group.scheduler,
                    scaling_group.scheduler_opts,
                    store_options.get(scaling_group.scheduler or "fifo"),
                )
            except ValueError as e:
                log.error("scaling group %s: %s; not scheduling it", scaling_group_name, e)
                return PassResult(scaling_group_name, None, (), 0, frozenset())
            now = self.clock()
            cancelled = await self._cancel_timed_out(scaling_group, now)
            # the snapshot in one read transaction (counters and quotas consistent with
            # it); no write lock is held while it is planned: the apply's per-agent
            # compare-and-set rejects placements on agents that changed meanwhile
            async with self.db.begin() as db:
                loaded = await load_snapshot(
                    db,
                    scaling_group,
                    now=now,
                    known=known,
                    options=options,
                    last_roundrobin_agent=last_rr or None,
                    cache=self.snapshot_caches.setdefault(scaling_group_name, SnapshotCache()),
                    unwritten_retries=self.explanations.unwritten,
                )
            # pure and CPU-bound: in a worker thread, so that binds, heartbeats and the
            # API keep being served while a large pass is planned (the GIL is shared,
            # but the event loop is not frozen for seconds)
            memo = self.plan_memos.get(scaling_group_name)
            if memo is None:
                memo = self.plan_memos[scaling_group_name] = PlanMemo(layouts=self.map_layouts)
            placed = await asyncio.to_thread(place_pass, loaded.snapshot, memo)
            async with self.db.begin_queued_write() as db:
                applied = await apply_plan(db, loaded, placed.placements, now)
            # binds start now: a released room is filled without waiting for the
            # explanations of thousands of sessions left pending, neither their working
            # out (sched.plan.PlacedPass) nor their writing
            if applied.jobs:
                binds = self.binder.submit(list(applied.jobs))
                left = len(loaded.snapshot.pending) - len(placed.placements.assignments)
                if left >= BIND_HEAD_START_FAILURES:
                    await asyncio.wait(binds, timeout=BIND_HEAD_START_S)
            plan = await asyncio.to_thread(placed.explain)
            # why the others stay pending: written by the explanations' task, off the
            # pass and its lock (coalesced, in chunks; see .explanations)
            self.explanations.add(scaling_group_name, plan.failures, now)
        self.metrics.pass_seconds.labels(scaling_group_name).observe(time.perf_counter() - started)
        self.metrics.placements.labels(scaling_group_name).inc(applied.placed)
        self.metrics.pending_left.labels(scaling_group_name).inc(len(plan.failures))
        if plan.last_roundrobin_agent and plan.last_roundrobin_agent != last_rr:
            await self.store.put(
                ROUNDROBIN_KEY.format(scaling_group=scaling_group_name), plan.last_roundrobin_agent
            )
        return PassResult(
            scaling_group_name, plan, tuple(applied.jobs), cancelled, frozenset(applied.conflicts)
        )

    async def store_scheduler_options(self, scaling_group_name: str) -> dict[str, dict[str, str]]:
        """``config/plugins/scheduler/<picker>/<option>`` from the config store, the
        scaling group's scope (``sgroup/<name>/``) over the global one:
        ``{picker: {option: value}}`` (plain strings; nested subtrees are ignored).
        Read once per pass, before its transaction."""
        tree = await self.store.scoped(scaling_group=scaling_group_name).get_prefix(
            SCHEDULER_PLUGINS_PREFIX
        )
        return {
            str(picker): {str(k): v for k, v in options.items() if isinstance(v, str)}
            for picker, options in tree.items()
            if isinstance(options, dict)
        }

    async def _cancel_timed_out(self, scaling_group: ScalingGroup, now: datetime) -> int:
        """Cancel the group's sessions pending past ``pending_timeout`` (own transaction)."""
        timeout = float((scaling_group.scheduler_opts or {}).get("pending_timeout", 0) or 0)
        if timeout <= 0:
            return 0
        deadline = now - timedelta(seconds=timeout)
        async with self.db.begin(write=True) as db:
            rows = list(
                (
                    await db.execute(
                        sa.select(Session)
                        .where(
                            Session.scaling_group == scaling_group.name,
                            Session.status == SessionStatus.PENDING,
                            Session.created_at < deadline,
                        )
                        .with_for_update()
                    )
                ).scalars()
            )
            for row in rows:
                await change_status(
                    db,
                    row,
                    SessionStatus.CANCELLED,
                    reason=f"pending for more than pending_timeout ({timeout:g} s) of scaling"
                    f" group {scaling_group.name}",
                    now=now,
                )
        return len(rows)
