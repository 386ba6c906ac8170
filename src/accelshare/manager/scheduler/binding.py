"""Binding: create each SCHEDULED session's kernel on its agent, outside the scheduling lock.

Binds to different agents run concurrently; binds to one agent run one after another
in plan order (the agent then allocates in the order the manager planned, so its
placements match the planned ones: its allocator is order-dependent, and concurrent
requests would reach it in any order).  Every RPC goes to the agent's *current* address
(``agents.address``, updated by each heartbeat), read when the RPC is made, so a bind
resumed after an agent moved reaches it.  Per session::

    SCHEDULED -> PREPARING            (before the RPC; PULLING instead when the agent is
                                       a docker agent whose engine lacks the image:
                                       the create RPC pulls it first, docs/images.md)
    POST <agent>/v1/kernels           (CreateKernelRequest; idempotent by kernel_id)
      refused / unreachable / FAILED  -> CANCELLED with the reason, resources released
      accepted                        -> PREPARED -> CREATING (the agent's real
                                         per-device allocation replaces the planned one)
      report RUNNING (or the agent's "started" event, whichever comes first) -> RUNNING

Binds to one agent go in batches of up to :data:`BIND_BATCH` sessions: one transaction
moves the whole batch to PREPARING, the create RPCs follow one by one in plan order,
and one transaction records every accepted kernel (per session the transitions are
exactly the ones above; a batch costs two transactions instead of two per session).
At most :data:`MAX_CONCURRENT_BATCHES` batches (agents) are in flight at once, so a
pass that placed sessions on 1,000 agents does not queue 1,000 tasks on the
database's connection pool.

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
from collections.abc import Callable
from datetime import datetime
from decimal import Decimal

from sqlalchemy.ext.asyncio import AsyncSession

from accelshare.agent.wire import CreateKernelRequest, KernelReport, KernelStatus
from accelshare.aio import cancel_and_wait
from accelshare.common import canonical_decimal
from accelshare.sched.lifecycle import SessionResult, SessionStatus, can_transition
from accelshare.sched.model import SessionType

from ..agent_client import AgentClient, AgentRPCError
from ..clock import Clock
from ..db import Database
from ..hub import ChangeHub
from ..metrics import ManagerMetrics
from ..models import Agent, Session
from ..transitions import change_status, lock_session, session_kernels, walk_forward
from .apply import BindJob

__all__ = [
    "BINDABLE",
    "BIND_BATCH",
    "MAX_CONCURRENT_BATCHES",
    "Binder",
    "allocations_json",
    "kernel_request",
]

log = logging.getLogger(__name__)

BIND_BATCH = 64
MAX_CONCURRENT_BATCHES = 4

BINDABLE = frozenset(
    {
        SessionStatus.SCHEDULED,
        SessionStatus.PREPARING,
        SessionStatus.PULLING,
        SessionStatus.PREPARED,
        SessionStatus.CREATING,
    }
)


def kernel_request(job: BindJob, row: Session) -> CreateKernelRequest:
    """The agent's create request for ``row``'s kernel.

    A batch session's ``startupCommand`` goes as ``startup_command``, whole: the agent's
    runtime runs it in the session's environment (process runtime: ``shell`` runs the
    string as its script, ``python`` and other non-``-c`` environments take its
    shell-style words as arguments; docker: ``/bin/sh -c`` in the container).  The
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
    return CreateKernelRequest(
        kernel_id=str(job.kernel_id),
        session_id=str(row.id),
        image=row.image,
        requested_slots=row.requested_slots.nonzero().to_json(),
        startup_command=startup,
        environ=dict(row.environ or {}),
        allow_fractional_resource_fragmentation=bool(
            opts.get("allow_fractional_resource_fragmentation", True)
        ),
        owner_access_key=row.access_key,
        labels=labels,
    )


def allocations_json(report: KernelReport) -> dict[str, dict[str, str]]:
    return {
        slot: {d: canonical_decimal(Decimal(v)) for d, v in per.items()}
        for slot, per in report.allocations.items()
    }


def _pulls(agent: Agent, image: str) -> bool:
    """Whether creating a kernel of ``image`` on ``agent`` starts with a pull: a docker
    agent whose last heartbeat did not list the image (its engine's repo tags)."""
    return agent.runtime == "docker" and image not in (agent.images or ())


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
        self._agent_locks: dict[str, asyncio.Lock] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._batches = asyncio.Semaphore(MAX_CONCURRENT_BATCHES)
        # sessions this process is binding now (a stale-bind rescue leaves them alone)
        self.in_flight: set[uuid.UUID] = set()

    def submit(self, jobs: list[BindJob]) -> None:
        """Start binding ``jobs`` (grouped by agent, in order) in background tasks."""
        by_agent: dict[str, list[BindJob]] = {}
        for job in jobs:
            by_agent.setdefault(job.agent_id, []).append(job)
            self.in_flight.add(job.session_id)
        for agent_jobs in by_agent.values():
            task = asyncio.create_task(self._bind_agent(agent_jobs))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            ids = frozenset(j.session_id for j in agent_jobs)
            task.add_done_callback(functools.partial(self._done, ids))

    def _done(self, session_ids: frozenset[uuid.UUID], _task: asyncio.Task[None]) -> None:
        self.in_flight.difference_update(session_ids)

    async def drain(self, timeout_s: float) -> None:
        """Wait for binds in flight (graceful stop); cancel what is left after ``timeout_s``."""
        tasks = set(self._tasks)
        if not tasks:
            return
        _done, pending = await asyncio.wait(tasks, timeout=timeout_s)
        await cancel_and_wait(pending)

    async def _bind_agent(self, jobs: list[BindJob]) -> None:
        lock = self._agent_locks.setdefault(jobs[0].agent_id, asyncio.Lock())
        async with lock:
            for start in range(0, len(jobs), BIND_BATCH):
                chunk = jobs[start : start + BIND_BATCH]
                async with self._batches:
                    try:
                        await self.bind_batch(chunk)
                    except asyncio.CancelledError:
                        raise
                    except Exception:  # a bug must not stop the other binds
                        log.exception("binding a batch failed unexpectedly; one by one")
                        await self._bind_each(chunk)

    async def _bind_each(self, jobs: list[BindJob]) -> None:
        for job in jobs:
            try:
                await self.bind(job)
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug must not stop the other binds
                log.exception("binding session %s failed unexpectedly", job.session_id)

    async def bind_batch(self, jobs: list[BindJob]) -> None:
        """Bind ``jobs`` (one agent, plan order): see the module docstring."""
        now = self.clock()
        async with self.db.begin(write=True) as db:
            prepared = [(job, await self._prepare_in(db, job, now)) for job in jobs]
        self.hub.publish()
        reports: list[tuple[BindJob, KernelReport]] = []
        for job, ready in prepared:
            if ready is None:
                continue
            report = await self._create(job, *ready)
            if report is not None:
                reports.append((job, report))
        if not reports:
            return
        now = self.clock()
        async with self.db.begin(write=True) as db:
            outcomes = [await self._accepted_in(db, job, report, now) for job, report in reports]
        self.hub.publish()
        if any(released for released, _ in outcomes):
            self.on_release()
        for (job, _), (_, destroy_at) in zip(reports, outcomes, strict=True):
            if destroy_at is not None:
                await self._destroy_quietly(job, destroy_at)

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
        if report.status is KernelStatus.FAILED:
            await self._cancel(job, f"the kernel failed to start: {report.reason or 'no reason'}")
            return None
        return report

    async def _prepare_in(
        self, db: AsyncSession, job: BindJob, now: datetime
    ) -> tuple[CreateKernelRequest, str | None] | None:
        """PREPARING, and the request with the agent's current address (None: unknown
        agent); None when the session is no longer to be bound."""
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

    async def _accepted_in(
        self, db: AsyncSession, job: BindJob, report: KernelReport, now: datetime
    ) -> tuple[bool, str | None]:
        """Record an accepted kernel: ``(resources released, address to destroy it at)``."""
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
