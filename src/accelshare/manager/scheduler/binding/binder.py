"""The :class:`Binder`: binds SCHEDULED sessions' kernels on their agents, in batches.

The batches' two database steps (prepare, accept) are group-committed across agents
(:class:`~.group_commit.GroupCommit`, rows read by :func:`~.rows.load_many`); a failed
grouped transaction falls back to binding each session in a transaction of its own
(see the package's docstring for the states a session goes through).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from accelshare.aio import cancel_and_wait
from accelshare.protocol import CreateKernelRequest, KernelReport, KernelStatus
from accelshare.sched.lifecycle import SessionResult, SessionStatus, can_transition

from ...agent_client import AgentClient, AgentRPCError
from ...clock import Clock
from ...db import Database
from ...hub import ChangeHub
from ...metrics import ManagerMetrics
from ...models import Agent
from ...transitions import (
    Step,
    change_status,
    change_status_many,
    forward_steps,
    lock_session,
    session_kernels,
    walk_forward,
)
from ..apply import BindJob
from .group_commit import GroupCommit
from .requests import allocations_json, kernel_request, pulls
from .rows import KERNEL_REPORT_UPDATE, kernel_columns, load_many

__all__ = ["BINDABLE", "BIND_BATCH", "MAX_CONCURRENT_AGENTS", "Binder"]

log = logging.getLogger(__name__)

BIND_BATCH = 64
MAX_CONCURRENT_AGENTS = 128  # batches in flight (docs/performance.md)


BINDABLE = frozenset(
    {
        SessionStatus.SCHEDULED,
        SessionStatus.PREPARING,
        SessionStatus.PULLING,
        SessionStatus.PREPARED,
        SessionStatus.CREATING,
    }
)


_Prepared = tuple[CreateKernelRequest, str | None]


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
        self._prepare_group: GroupCommit[BindJob, _Prepared | None] = GroupCommit(
            self._prepare_step
        )
        self._accept_group: GroupCommit[tuple[BindJob, KernelReport], tuple[bool, str | None]] = (
            GroupCommit(self._accept_step)
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
            loaded = await load_many(db, jobs)
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
                    if agent is not None and pulls(agent, row.image):
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
            loaded = await load_many(db, [job for job, _ in reports], requests=False)
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
                        kernel_params.append(kernel_columns(kernel, report))
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
                await db.execute(KERNEL_REPORT_UPDATE, kernel_params)
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
            if agent is not None and pulls(agent, row.image):
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
                    kernel.allocation = allocations_json(report)
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
