"""Binding: create each SCHEDULED session's kernel on its agent, outside the scheduling lock.

The create request carries the plan: the per-device placement the pass chose (the
kernel row's ``device_allocs``) with the requested slots as exact decimals, and the
agent takes exactly that placement after checking it against its maps (an agent that
ignores the field, an older one, places the request itself; its answer is recorded).
So the order in which creates reach an agent does not matter: binds run concurrently,
to one agent as to many.  Every RPC goes to the agent's *current* address
(``agents.address``, updated by each heartbeat), read when the RPC is made, so a bind
resumed after an agent moved reaches it.  Per session::

    SCHEDULED -> PREPARING            (before the RPC; PULLING instead when the agent is
                                       a docker agent whose engine lacks the image:
                                       the create RPC pulls it first, docs/images.md)
    POST <agent>/v1/kernels/batch     (the batch's CreateKernelRequests, one KernelReport
                                       each; idempotent by kernel_id.  An agent without
                                       the route answers 404/405: POST <agent>/v1/kernels
                                       per kernel from then on)
      conflict (the plan no longer    -> PENDING, its kernel row deleted and the agent's
      fits the agent's maps)             occupancy recomputed: a later pass plans it again
                                         (the agent heartbeats at once with its maps)
      refused / unreachable / FAILED  -> CANCELLED with the reason, resources released
      accepted                        -> PREPARED -> CREATING (the agent's per-device
                                         allocation recorded: the plan, or what an older
                                         agent chose)
      report RUNNING (or the agent's "started" event, whichever comes first) -> RUNNING

Binds go in batches of up to :data:`BIND_BATCH` sessions of one agent, each batch a
task of its own (several batches of one agent run at once): one step moves the whole
batch to PREPARING, one batched create RPC follows (the agent creates the kernels
concurrently), and one step records every accepted kernel (per session the
transitions are exactly the ones above).  The two database
steps are *group-committed across agents*: the batches of every agent that reach a
step while the previous transaction of that step runs are handled together in the
next one, with multi-row Core statements, no ORM objects (one ``SELECT ... FOR
UPDATE`` of the sessions, one of their kernels, one of the agents; one executemany
UPDATE of the kernels' reported columns, and :func:`change_status_many`: one
multi-row INSERT of the history rows, one executemany UPDATE of the sessions, one of
their kernels).  A kernel reported EXITED already (its session ends and releases its
resources) is recorded through the ORM path of :func:`change_status` instead.  So a
pass that placed 8,850 sessions on 1,000 agents costs a few dozen transactions, not
thousands, while the RPCs of up to :data:`MAX_CONCURRENT_AGENTS` batches are in flight
at once.  Should a grouped transaction fail, each batch is bound again session by
session (a transaction each), so one bad row cannot hold the others back.

A session destroyed while its bind was in flight gets its kernel destroyed right
after.  Binding is also how a restarted manager resumes: sessions it finds between
SCHEDULED and CREATING are bound again (the agent answers an existing kernel_id with
its current report).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any, Generic, TypeVar, cast

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from accelshare.aio import cancel_and_wait
from accelshare.common import canonical_decimal
from accelshare.protocol import CreateKernelRequest, KernelReport, KernelStatus
from accelshare.sched.lifecycle import SessionResult, SessionStatus, can_transition
from accelshare.sched.model import SessionType

from ..agent_client import AgentClient, AgentRPCError
from ..clock import Clock
from ..db import Database
from ..hub import ChangeHub
from ..metrics import ManagerMetrics
from ..models import Agent, Kernel, Session
from ..transitions import (
    Step,
    change_status,
    change_status_many,
    forward_steps,
    lock_session,
    session_kernels,
    walk_forward,
)
from .apply import BindJob

__all__ = [
    "BINDABLE",
    "BIND_BATCH",
    "MAX_CONCURRENT_AGENTS",
    "Binder",
    "allocations_json",
    "kernel_request",
]

log = logging.getLogger(__name__)

BIND_BATCH = 64
MAX_CONCURRENT_AGENTS = 128  # batches in flight (docs/performance.md)
_GROUP_LIMIT = 1024  # sessions per group-committed transaction

BINDABLE = frozenset(
    {
        SessionStatus.SCHEDULED,
        SessionStatus.PREPARING,
        SessionStatus.PULLING,
        SessionStatus.PREPARED,
        SessionStatus.CREATING,
    }
)


_SESSIONS = cast(sa.Table, Session.__table__)
_KERNELS = cast(sa.Table, Kernel.__table__)
_AGENTS = cast(sa.Table, Agent.__table__)


def kernel_request(job: BindJob, row: Session | sa.Row[Any]) -> CreateKernelRequest:
    """The agent's create request for ``row``'s kernel.

    The request carries ``job``'s plan (the per-device placement of the pass) when
    it places every requested slot; a plan the pass made for part of the slots only
    (an agent that reports no devices for some) is left out and the agent places the
    request itself.

    A batch session's ``startupCommand`` goes as ``startup_command``, whole: the agent's
    runtime runs it with ``/bin/sh -c`` in the kernel, as Backend.AI does (in its working
    folder, with its environment; the environment's interpreter first on PATH).  The
    manager adds no interpreter of its own.  An interactive session's startup command
    is only recorded, as the ``startup_command`` label.
    """
    opts = row.resource_opts or {}
    startup: str | None = None
    labels = {"session_name": row.name, "session_type": row.session_type.value}
    if row.startup_command:
        if row.session_type is SessionType.BATCH:
            startup = row.startup_command
        else:
            labels["startup_command"] = row.startup_command
    requested = row.requested_slots.nonzero().to_json()  # exact decimals, never "2g"
    return CreateKernelRequest(
        kernel_id=str(job.kernel_id),
        session_id=str(row.id),
        image=row.image,
        requested_slots=requested,
        planned_allocations=_plan_of(job, requested),
        startup_command=startup,
        environ=dict(row.environ or {}),
        allow_fractional_resource_fragmentation=bool(
            opts.get("allow_fractional_resource_fragmentation", True)
        ),
        owner_access_key=row.access_key,
        labels=labels,
    )


def _plan_of(job: BindJob, requested: dict[str, str]) -> dict[str, dict[str, str]] | None:
    """The plan to send: ``job.plan`` when it places every requested slot, else None."""
    plan = job.plan
    if not plan or any(slot not in plan for slot in requested):
        return None
    return {slot: dict(per_device) for slot, per_device in plan.items()}


_KERNEL_REPORT_UPDATE = (
    sa.update(_KERNELS)
    .where(_KERNELS.c.id == sa.bindparam("b_id"))
    .values(
        device_allocs=sa.bindparam("b_allocs", type_=_KERNELS.c.device_allocs.type),
        container_id=sa.bindparam("b_container"),
        service_ports=sa.bindparam("b_ports", type_=_KERNELS.c.service_ports.type),
    )
)


def _kernel_columns(kernel: sa.Row[Any], report: KernelReport) -> dict[str, Any]:
    """``_KERNEL_REPORT_UPDATE``'s parameters: what the report says about the kernel
    (its allocation, container id and service ports), else what the row has."""
    return {
        "b_id": kernel.id,
        "b_allocs": allocations_json(report) if report.allocations else kernel.device_allocs,
        "b_container": report.container_id or kernel.container_id,
        "b_ports": (
            [m.model_dump(mode="json") for m in report.service_ports]
            if report.service_ports
            else kernel.service_ports
        ),
    }


def allocations_json(report: KernelReport) -> dict[str, dict[str, str]]:
    return {
        slot: {d: canonical_decimal(Decimal(v)) for d, v in per.items()}
        for slot, per in report.allocations.items()
    }


def _pulls(agent: Agent | sa.Row[Any], image: str) -> bool:
    """Whether creating a kernel of ``image`` on ``agent`` starts with a pull: a docker
    agent whose last heartbeat did not list the image (its engine's repo tags)."""
    return agent.runtime == "docker" and image not in (agent.images or ())


_Prepared = tuple[CreateKernelRequest, str | None]
_CHUNK = 500  # ids per IN list (SQLite and asyncpg bind-parameter limits)
_SESSION_COLUMNS = [
    _SESSIONS.c[name]
    for name in (
        "id",
        "status",
        "name",
        "session_type",
        "image",
        "requested_slots",
        "resource_opts",
        "environ",
        "startup_command",
        "access_key",
    )
]
_KERNEL_COLUMNS = [
    _KERNELS.c[name]
    for name in ("id", "session_id", "device_allocs", "container_id", "service_ports")
]
_AGENT_COLUMNS = [_AGENTS.c[name] for name in ("id", "address", "runtime", "images")]
# what the accept step reads: a session's status, an agent's address (the session's
# JSON columns and the agent's image list are parsed only where a request is built)
_SESSION_STATUS = [_SESSIONS.c.id, _SESSIONS.c.status]
_AGENT_ADDRESS = [_AGENTS.c.id, _AGENTS.c.address]


@dataclass(slots=True)
class _Loaded:
    """What a grouped step reads (Core rows, no ORM objects): the sessions (locked),
    their kernels and their agents."""

    rows: dict[uuid.UUID, sa.Row[Any]]
    kernels: dict[uuid.UUID, list[sa.Row[Any]]]
    agents: dict[str, sa.Row[Any]]


async def _load_many(db: AsyncSession, jobs: list[BindJob], *, requests: bool = True) -> _Loaded:
    """The jobs' sessions (locked, ``SELECT ... FOR UPDATE``, in id order so that two
    transactions never lock in opposite orders) and their agents; ``requests``: all the
    session columns a create request needs (the prepare step), else the sessions' status,
    their kernels (what an accepted kernel's report may leave out) and the agents'
    address (the accept step)."""
    session_columns = _SESSION_COLUMNS if requests else _SESSION_STATUS
    agent_columns = _AGENT_COLUMNS if requests else _AGENT_ADDRESS
    ids = sorted({job.session_id for job in jobs})
    loaded = _Loaded({}, {}, {})
    for start in range(0, len(ids), _CHUNK):
        chunk = ids[start : start + _CHUNK]
        query = (
            sa.select(*session_columns)
            .where(_SESSIONS.c.id.in_(chunk))
            .order_by(_SESSIONS.c.id)
            .with_for_update()
        )
        loaded.rows.update((r.id, r) for r in await db.execute(query))
        if requests:
            continue
        kernel_query = (
            sa.select(*_KERNEL_COLUMNS)
            .where(_KERNELS.c.session_id.in_(chunk))
            .order_by(_KERNELS.c.session_id, _KERNELS.c.cluster_idx)
        )
        for kernel in await db.execute(kernel_query):
            loaded.kernels.setdefault(kernel.session_id, []).append(kernel)
    agent_ids = sorted({job.agent_id for job in jobs})
    for start in range(0, len(agent_ids), _CHUNK):
        agent_query = sa.select(*agent_columns).where(
            _AGENTS.c.id.in_(agent_ids[start : start + _CHUNK])
        )
        loaded.agents.update((a.id, a) for a in await db.execute(agent_query))
    return loaded


_Req = TypeVar("_Req")
_Res = TypeVar("_Res")


class _GroupCommit(Generic[_Req, _Res]):
    """Run ``step`` over the requests of many callers at once: what arrives while one
    call of ``step`` runs is handled by the next (up to ``limit`` requests a call).
    ``step`` returns one result per request, in order; its exception goes to all."""

    def __init__(
        self, step: Callable[[list[_Req]], Awaitable[list[_Res]]], limit: int = _GROUP_LIMIT
    ) -> None:
        self._step = step
        self._limit = limit
        self._queue: list[tuple[list[_Req], asyncio.Future[list[_Res]]]] = []
        self._task: asyncio.Task[None] | None = None

    async def __call__(self, requests: list[_Req]) -> list[_Res]:
        future: asyncio.Future[list[_Res]] = asyncio.get_running_loop().create_future()
        self._queue.append((requests, future))
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        while self._queue:
            batch: list[tuple[list[_Req], asyncio.Future[list[_Res]]]] = []
            size = 0
            while self._queue and (not batch or size + len(self._queue[0][0]) <= self._limit):
                item = self._queue.pop(0)
                batch.append(item)
                size += len(item[0])
            batch = [(reqs, fut) for reqs, fut in batch if not fut.cancelled()]
            if not batch:
                continue
            try:
                results = await self._step([r for reqs, _ in batch for r in reqs])
            except Exception as e:
                for _, fut in batch:
                    if not fut.done():
                        fut.set_exception(e)
                continue
            except BaseException:
                for _, fut in batch:
                    fut.cancel()
                raise
            start = 0
            for reqs, fut in batch:
                if not fut.done():
                    fut.set_result(results[start : start + len(reqs)])
                start += len(reqs)

    async def close(self) -> None:
        if self._task is not None:
            await cancel_and_wait([self._task])
            self._task = None


class Binder:
    def __init__(
        self,
        *,
        db: Database,
        client: AgentClient,
        hub: ChangeHub,
        metrics: ManagerMetrics,
        clock: Clock,
        on_release: Callable[[], None],
    ) -> None:
        self.db = db
        self.client = client
        self.hub = hub
        self.metrics = metrics
        self.clock = clock
        self.on_release = on_release
        self._tasks: set[asyncio.Task[None]] = set()
        # set while no bind is in flight (the explanations wait for it: see .explanations)
        self.idle = asyncio.Event()
        self.idle.set()
        self._agents = asyncio.Semaphore(MAX_CONCURRENT_AGENTS)
        self._prepare_group: _GroupCommit[BindJob, _Prepared | None] = _GroupCommit(
            self._prepare_step
        )
        self._accept_group: _GroupCommit[tuple[BindJob, KernelReport], tuple[bool, str | None]] = (
            _GroupCommit(self._accept_step)
        )
        # agent addresses that answered POST /v1/kernels/batch with 404/405 (older agents)
        self._single_creates: set[str] = set()
        # sessions this process is binding now (a stale-bind rescue leaves them alone)
        self.in_flight: set[uuid.UUID] = set()

    def submit(self, jobs: list[BindJob]) -> list[asyncio.Task[None]]:
        """Start binding ``jobs`` in background tasks (returned): one per batch of up to
        :data:`BIND_BATCH` sessions of one agent, all running at once (at most
        :data:`MAX_CONCURRENT_AGENTS` batches in flight)."""
        started: list[asyncio.Task[None]] = []
        by_agent: dict[str, list[BindJob]] = {}
        for job in jobs:
            by_agent.setdefault(job.agent_id, []).append(job)
            self.in_flight.add(job.session_id)
        if by_agent:
            self.idle.clear()
        for agent_jobs in by_agent.values():
            for start in range(0, len(agent_jobs), BIND_BATCH):
                chunk = agent_jobs[start : start + BIND_BATCH]
                task = asyncio.create_task(self._bind_chunk(chunk))
                self._tasks.add(task)
                ids = frozenset(j.session_id for j in chunk)
                task.add_done_callback(functools.partial(self._done, ids))
                started.append(task)
        return started

    def _done(self, session_ids: frozenset[uuid.UUID], task: asyncio.Task[None]) -> None:
        self.in_flight.difference_update(session_ids)
        self._tasks.discard(task)
        if not self._tasks:
            self.idle.set()

    async def drain(self, timeout_s: float) -> None:
        """Wait for binds in flight (graceful stop); cancel what is left after ``timeout_s``."""
        tasks = set(self._tasks)
        if tasks:
            _done, pending = await asyncio.wait(tasks, timeout=timeout_s)
            await cancel_and_wait(pending)
        await self._prepare_group.close()
        await self._accept_group.close()

    async def _bind_chunk(self, jobs: list[BindJob]) -> None:
        async with self._agents:
            try:
                await self.bind_batch(jobs)
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug or a failed grouped transaction: one by one
                log.exception("binding a batch failed unexpectedly; one by one")
                await self._bind_each(jobs)

    async def _bind_each(self, jobs: list[BindJob]) -> None:
        for job in jobs:
            try:
                await self.bind(job)
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug must not stop the other binds
                log.exception("binding session %s failed unexpectedly", job.session_id)

    async def bind_batch(self, jobs: list[BindJob]) -> None:
        """Bind ``jobs`` (one agent): see the module docstring."""
        prepared = await self._prepare_group(jobs)
        self.hub.publish()
        ready = [(job, p) for job, p in zip(jobs, prepared, strict=True) if p is not None]
        reports = await self._create_many(ready)
        if not reports:
            return
        outcomes = await self._accept_group(reports)
        self.hub.publish()
        if any(released for released, _ in outcomes):
            self.on_release()
        for (job, _), (_, destroy_at) in zip(reports, outcomes, strict=True):
            if destroy_at is not None:
                await self._destroy_quietly(job, destroy_at)

    async def _prepare_step(self, jobs: list[BindJob]) -> list[_Prepared | None]:
        """PREPARING (or PULLING) for many sessions (any agents) in one transaction:
        Core reads, then :func:`change_status_many` (multi-row statements)."""
        async with self.db.begin_queued_write() as db:
            now = self.clock()
            loaded = await _load_many(db, jobs)
            status = {sid: row.status for sid, row in loaded.rows.items()}
            moves: list[tuple[uuid.UUID, list[Step]]] = []
            results: list[_Prepared | None] = []
            for job in jobs:
                row = loaded.rows.get(job.session_id)
                if row is None or status[row.id] not in BINDABLE:
                    results.append(None)
                    continue
                agent = loaded.agents.get(job.agent_id)
                if status[row.id] is SessionStatus.SCHEDULED:
                    if agent is not None and _pulls(agent, row.image):
                        to = SessionStatus.PULLING
                        reason = f"agent {job.agent_id} pulls image {row.image}"
                    else:
                        to = SessionStatus.PREPARING
                        reason = f"creating the kernel on agent {job.agent_id}"
                    moves.append((row.id, [(SessionStatus.SCHEDULED, to, reason)]))
                    status[row.id] = to
                results.append((kernel_request(job, row), agent.address if agent else None))
            await change_status_many(db, moves, now=now)
            return results

    async def _accept_step(
        self, reports: list[tuple[BindJob, KernelReport]]
    ) -> list[tuple[bool, str | None]]:
        """Record many accepted kernels (any agents) in one transaction: Core reads, the
        reports' kernel columns in one executemany, the transitions through
        :func:`change_status_many`.  A kernel that already EXITED (its session ends,
        resources are released) is recorded by :meth:`_accepted_in` after them."""
        async with self.db.begin_queued_write() as db:
            now = self.clock()
            loaded = await _load_many(db, [job for job, _ in reports], requests=False)
            status = {sid: row.status for sid, row in loaded.rows.items()}
            moves: list[tuple[uuid.UUID, list[Step]]] = []
            kernel_params: list[dict[str, Any]] = []
            exited: list[int] = []
            results: list[tuple[bool, str | None]] = []
            for i, (job, report) in enumerate(reports):
                row = loaded.rows.get(job.session_id)
                if row is None:
                    results.append((False, None))
                    continue
                current = status[row.id]
                if current not in BINDABLE and current is not SessionStatus.RUNNING:
                    # destroyed or cancelled while the bind was in flight
                    agent = loaded.agents.get(job.agent_id)
                    results.append((False, agent.address if agent is not None else None))
                    continue
                results.append((False, None))
                if report.status is KernelStatus.EXITED:
                    exited.append(i)
                    continue
                for kernel in loaded.kernels.get(row.id, []):
                    if kernel.id == job.kernel_id:
                        kernel_params.append(_kernel_columns(kernel, report))
                steps = forward_steps(
                    current, SessionStatus.CREATING, f"kernel accepted by agent {job.agent_id}"
                )
                if report.status is KernelStatus.RUNNING:
                    after = steps[-1][1] if steps else current
                    steps += forward_steps(after, SessionStatus.RUNNING, "the kernel is running")
                if steps:
                    moves.append((row.id, steps))
                    status[row.id] = steps[-1][1]
            if kernel_params:
                await db.execute(_KERNEL_REPORT_UPDATE, kernel_params)
            await change_status_many(db, moves, now=now)
            for i in exited:  # rare: the ORM path (it releases resources)
                job, report = reports[i]
                results[i] = await self._accepted_in(db, job, report, now)
            return results

    async def bind(self, job: BindJob) -> None:
        """Bind one session (the batch's steps, each in its own transaction)."""
        now = self.clock()
        async with self.db.begin(write=True) as db:
            prepared = await self._prepare_in(db, job, now)
        if prepared is None:
            return
        self.hub.publish()
        report = await self._create(job, *prepared)
        if report is None:
            return
        async with self.db.begin(write=True) as db:
            released, destroy_at = await self._accepted_in(db, job, report, self.clock())
        self.hub.publish()
        if released:
            self.on_release()
        if destroy_at is not None:
            await self._destroy_quietly(job, destroy_at)

    async def _create_many(
        self, ready: list[tuple[BindJob, _Prepared]]
    ) -> list[tuple[BindJob, KernelReport]]:
        """The create RPCs of one agent's batch: one ``POST /v1/kernels/batch`` per agent
        address (single creates, in order, for an agent that answered it with 404/405);
        the accepted kernels' reports, the others cancelled as by :meth:`_create`."""
        accepted: list[tuple[BindJob, KernelReport]] = []
        batches: dict[str, list[tuple[BindJob, CreateKernelRequest]]] = {}
        for job, (request, url) in ready:
            if url is None or url in self._single_creates:
                report = await self._create(job, request, url)
                if report is not None:
                    accepted.append((job, report))
            else:
                batches.setdefault(url, []).append((job, request))
        for url, items in batches.items():
            try:
                reports = await self.client.create_kernels(url, [r for _, r in items])
            except AgentRPCError as e:
                if not e.is_unsupported:
                    for job, _ in items:
                        await self._cancel(job, f"the kernel could not be created: {e}")
                    continue
                log.info("agent %s has no batch create; creating one by one", url)
                self._single_creates.add(url)
                for job, request in items:
                    report = await self._create(job, request, url)
                    if report is not None:
                        accepted.append((job, report))
                continue
            for (job, _), report in zip(items, reports, strict=True):
                if report.conflict:
                    await self._replan(job, report.reason)
                elif report.status is KernelStatus.FAILED:
                    reason = report.reason or "no reason"
                    await self._cancel(job, f"the kernel failed to start: {reason}")
                else:
                    accepted.append((job, report))
        return accepted

    async def _create(
        self, job: BindJob, request: CreateKernelRequest, agent_url: str | None
    ) -> KernelReport | None:
        """The create RPC; None when the session was cancelled instead (the reason kept)."""
        if agent_url is None:
            await self._cancel(job, f"agent {job.agent_id} is not registered")
            return None
        try:
            report = await self.client.create_kernel(agent_url, request)
        except AgentRPCError as e:
            await self._cancel(job, f"the kernel could not be created: {e}")
            return None
        if report.conflict:
            await self._replan(job, report.reason)
            return None
        if report.status is KernelStatus.FAILED:
            await self._cancel(job, f"the kernel failed to start: {report.reason or 'no reason'}")
            return None
        return report

    async def _prepare_in(
        self,
        db: AsyncSession,
        job: BindJob,
        now: datetime,
    ) -> _Prepared | None:
        """PREPARING, and the request with the agent's current address (None: unknown
        agent); None when the session is no longer to be bound (one session, ORM)."""
        row = await lock_session(db, job.session_id)
        if row is None or row.status not in BINDABLE:
            return None
        kernels = await session_kernels(db, row.id)
        agent = await db.get(Agent, job.agent_id)
        if row.status is SessionStatus.SCHEDULED:
            if agent is not None and _pulls(agent, row.image):
                to, reason = SessionStatus.PULLING, f"agent {job.agent_id} pulls image {row.image}"
            else:
                to, reason = SessionStatus.PREPARING, f"creating the kernel on agent {job.agent_id}"
            await change_status(db, row, to, reason=reason, now=now, kernels=kernels)
        return kernel_request(job, row), agent.address if agent is not None else None

    async def _cancel(self, job: BindJob, reason: str) -> None:
        self.metrics.bind_failures.inc()
        log.warning("session %s: %s", job.session_id, reason)
        async with self.db.begin(write=True) as db:
            row = await lock_session(db, job.session_id)
            if row is not None and can_transition(row.status, SessionStatus.CANCELLED):
                await change_status(
                    db, row, SessionStatus.CANCELLED, reason=reason, now=self.clock()
                )
        self.hub.publish()
        self.on_release()

    async def _replan(self, job: BindJob, reason: str) -> None:
        """The agent refused the plan as no longer fitting: the session goes back to
        PENDING (its kernel row deleted, the agent's occupancy recomputed, so the
        resources are free again in the manager's accounting) and a later pass plans it
        on the maps as they are then.  No pass is triggered here: the agent's heartbeat,
        sent at once after a conflict, triggers one when its maps differ from what the
        manager had; the loop's timer otherwise."""
        self.metrics.bind_conflicts.inc()
        log.info("session %s: agent %s refused the plan: %s", job.session_id, job.agent_id, reason)
        async with self.db.begin(write=True) as db:
            row = await lock_session(db, job.session_id)
            if row is not None and row.status in BINDABLE:
                kernels = await session_kernels(db, row.id)
                await change_status(
                    db,
                    row,
                    SessionStatus.PENDING,
                    reason=f"agent {job.agent_id} refused the plan ({reason}); planned again",
                    now=self.clock(),
                    kernels=kernels,
                )
                row.agent_id = None
                row.scheduled_at = None
                for kernel in kernels:
                    await db.delete(kernel)
        self.hub.publish()

    async def _accepted_in(
        self,
        db: AsyncSession,
        job: BindJob,
        report: KernelReport,
        now: datetime,
    ) -> tuple[bool, str | None]:
        """Record an accepted kernel: ``(resources released, address to destroy it at)``
        (one session, ORM)."""
        row = await lock_session(db, job.session_id)
        if row is None:
            return False, None
        kernels = await session_kernels(db, row.id)
        if row.status not in BINDABLE and row.status is not SessionStatus.RUNNING:
            # destroyed or cancelled while the bind was in flight
            agent = await db.get(Agent, job.agent_id)
            return False, agent.address if agent is not None else None
        for kernel in kernels:
            if kernel.id == job.kernel_id:
                if report.allocations:
                    kernel.device_allocs = allocations_json(report)
                kernel.container_id = report.container_id or kernel.container_id
                if report.service_ports:
                    kernel.service_ports = [m.model_dump(mode="json") for m in report.service_ports]
        reason = f"kernel accepted by agent {job.agent_id}"
        await walk_forward(db, row, SessionStatus.CREATING, reason=reason, now=now, kernels=kernels)
        if report.status in (KernelStatus.RUNNING, KernelStatus.EXITED):
            await walk_forward(
                db,
                row,
                SessionStatus.RUNNING,
                reason="the kernel is running",
                now=now,
                kernels=kernels,
            )
        if report.status is KernelStatus.EXITED and row.status is SessionStatus.RUNNING:
            row.exit_code = report.exit_code
            row.result = SessionResult.SUCCESS if report.exit_code == 0 else SessionResult.FAILURE
            await change_status(
                db,
                row,
                SessionStatus.TERMINATED,
                reason=f"the kernel exited with code {report.exit_code}",
                now=now,
                kernels=kernels,
            )
            return True, None
        return False, None

    async def _destroy_quietly(self, job: BindJob, address: str) -> None:
        try:
            await self.client.destroy_kernel(address, str(job.kernel_id))
        except AgentRPCError as e:  # the heartbeat's ack will ask again
            log.info("destroying kernel %s after a cancelled bind: %s", job.kernel_id, e)
