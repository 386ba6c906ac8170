"""Changing a live session: destroy, rename, modify (name, priority) and restart.

Each change locks the session (on PostgreSQL with
:func:`~accelshare.manager.transitions.lock_session`, and for a rename, modify or
restart with its owner's enqueue lock too, so no create of the same name interleaves;
SQLite's ``BEGIN IMMEDIATE`` serialises writers) and records its status changes through
:func:`~accelshare.manager.transitions.change_status`.  The agents are called outside
the transaction; a LOST agent is not waited for.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from accelshare.protocol import CreateKernelRequest, KernelReport, KernelStatus
from accelshare.sched.lifecycle import FINAL_STATUSES, SessionResult, SessionStatus

from ...agent_client import AgentClient, AgentRPCError
from ...clock import Clock
from ...db import Database
from ...errors import Conflict, InvalidRequest, Unavailable
from ...hub import ChangeHub
from ...models import Agent, AgentStatus, Kernel, Session, SessionStatusHistory
from ...scheduler.apply import BindJob
from ...scheduler.binding import BINDABLE, allocations_json, kernel_request
from ...transitions import change_status, lock_session, session_kernels
from ..actor import Actor
from .admission import lock_owner
from .reads import SessionReads, live_by_name
from .spec import MAX_PRIORITY, SESSION_NAME_RULE, session_name_problem

__all__ = ["SessionLifecycle"]

log = logging.getLogger(__name__)

_AGENT_REACH = sa.select(Agent.id, Agent.address, Agent.status).where(
    Agent.id.in_(sa.bindparam("ids", expanding=True))
)
_AGENT_STATUS = sa.select(Agent.status).where(Agent.id == sa.bindparam("id"))
_SHORT_ANSWER = sa.select(Session.id, Session.name, Session.status, Session.status_info).where(
    Session.id == sa.bindparam("id")
)


async def _agent_reach(
    db: AsyncSession, kernels: Sequence[Kernel]
) -> tuple[dict[str, str], set[str]]:
    """The kernels' agents: ``{id: current RPC address}`` (as :func:`agent_addresses`)
    and which of those are not ALIVE (LOST or gone), in one query (a destroy's)."""
    ids = {k.agent_id for k in kernels if k.agent_id is not None}
    if not ids:
        return {}, set()
    rows = await db.execute(_AGENT_REACH, {"ids": sorted(ids)})
    addresses: dict[str, str] = {}
    lost: set[str] = set()
    for agent_id, address, status in rows:
        if address:
            addresses[agent_id] = address
            if status is not AgentStatus.ALIVE:
                lost.add(agent_id)
    return addresses, lost


_RESTART_GUARD = timedelta(minutes=5)  # a restart older than this has died with its manager


@dataclass(slots=True)
class _KernelSwap:
    """A kernel being restarted: its row's values, the new kernel's id and request."""

    old: dict[str, Any]
    new_id: uuid.UUID
    agent_url: str
    request: CreateKernelRequest | None = None

    def new_values(self, now: datetime) -> dict[str, Any]:
        return {
            **self.old,
            "id": self.new_id,
            "container_id": None,
            "service_ports": [],
            "exit_code": None,
            "status_changed_at": now,
            "created_at": now,
            "started_at": now,
            "terminated_at": None,
        }


_KERNEL_COLUMNS = tuple(c.key for c in cast(sa.Table, Kernel.__table__).columns)


def _kernel_values(kernel: Kernel) -> dict[str, Any]:
    return {name: getattr(kernel, name) for name in _KERNEL_COLUMNS}


class SessionLifecycle:
    """The changes of a live session (the session service's destroy, rename, modify
    and restart)."""

    def __init__(
        self,
        *,
        reads: SessionReads,
        db: Database,
        client: AgentClient,
        hub: ChangeHub,
        clock: Clock,
        trigger: Callable[[], None],
    ) -> None:
        self.reads = reads
        self.db = db
        self.client = client
        self.hub = hub
        self.clock = clock
        self.trigger = trigger

    # -- destroy ----------------------------------------------------------------------------
    async def destroy(
        self, caller: Actor, ref: str, *, forced: bool = False, owner_access_key: str | None = None
    ) -> dict[str, Any]:
        now = self.clock()
        who = f"destroyed by {caller.email}"
        targets: list[tuple[str, str]] = []  # (agent url, kernel id) to destroy on the agent
        unreachable: list[str] = []  # LOST agents: not called (reconciled when they return)
        confirm = False
        released = False
        async with self.db.begin(write=True) as db:
            row = await self.reads.find(db, caller, ref, owner_access_key)
            if self.db.dialect == "postgresql":  # SQLite: BEGIN IMMEDIATE serialises writers
                locked = await lock_session(db, row.id)
                assert locked is not None
                row = locked
            kernels = await session_kernels(db, row.id)
            addresses, lost = await _agent_reach(db, kernels)
            targets = [
                (addresses[k.agent_id], str(k.id))
                for k in kernels
                if k.agent_id in addresses and k.agent_id not in lost
            ]
            unreachable = sorted(lost)
            if row.status in FINAL_STATUSES:
                targets, unreachable = [], []
            elif row.status is SessionStatus.PENDING:
                await change_status(
                    db, row, SessionStatus.CANCELLED, reason=who, now=now, kernels=kernels
                )
                targets = []
            elif row.status in BINDABLE:
                await change_status(
                    db, row, SessionStatus.CANCELLED, reason=who, now=now, kernels=kernels
                )
                released = True
            else:  # RUNNING, ERROR, TERMINATING
                if row.status is not SessionStatus.TERMINATING:
                    await change_status(
                        db, row, SessionStatus.TERMINATING, reason=who, now=now, kernels=kernels
                    )
                confirm = True
            session_id = row.id
        self.hub.publish()
        # a LOST agent is not waited for (its RPC would time out): the session ends here
        # and the agent destroys the kernel when it comes back (its heartbeat's ack)
        errors: list[str] = [f"agent {agent_id} is LOST" for agent_id in unreachable]
        for url, kernel_id in targets:
            try:
                await self.client.destroy_kernel(url, kernel_id)
            except AgentRPCError as e:
                if e.status_code != 404:  # "no such kernel": it is gone, which is the goal
                    errors.append(str(e))
        if confirm:
            released = await self._confirm_destroyed(session_id, who, errors, forced)
        if released:
            self.trigger()
        self.hub.publish()
        return await self._short_answer(session_id)

    async def _confirm_destroyed(
        self, session_id: uuid.UUID, who: str, errors: list[str], forced: bool
    ) -> bool:
        async with self.db.begin(write=True) as db:
            row = await lock_session(db, session_id)
            if row is None or row.status is not SessionStatus.TERMINATING:
                return row is not None and row.status in FINAL_STATUSES
            kernels = await session_kernels(db, row.id)
            agent_status = (
                await db.scalar(_AGENT_STATUS, {"id": row.agent_id}) if row.agent_id else None
            )
            lost = agent_status is not AgentStatus.ALIVE
            if errors and not forced and not lost:
                row.status_info = (
                    f"{who}; the agent did not confirm yet ({errors[0]}); it is asked again at"
                    " its next heartbeat"
                )
                return False
            reason = who
            if errors:
                reason += (
                    f" (agent {row.agent_id} is LOST)"
                    if lost
                    else " (forced; the agent did not confirm)"
                )
            await change_status(
                db, row, SessionStatus.TERMINATED, reason=reason, now=self.clock(), kernels=kernels
            )
            return True

    async def _short_answer(self, session_id: uuid.UUID) -> dict[str, Any]:
        """``{sessionId, sessionName, status, statusInfo}`` as the session is now."""
        async with self.db.connect() as conn:  # four columns, not the ORM row
            answer = (await conn.execute(_SHORT_ANSWER, {"id": session_id})).one()
        return {
            "sessionId": str(answer.id),
            "sessionName": answer.name,
            "status": answer.status.value,
            "statusInfo": answer.status_info,
        }

    # -- rename, priority -------------------------------------------------------------------
    async def rename(
        self, caller: Actor, ref: str, new_name: str, owner_access_key: str | None = None
    ) -> dict[str, Any]:
        """Give a live session another name (the rule of ``POST /session``'s ``name``;
        not one of the owner's other live sessions').  Its id, kernels and allocation
        are unchanged.  Answers ``{sessionId, sessionName, status}``."""
        async with self.db.begin(write=True) as db:
            row = await self.reads.find(db, caller, ref, owner_access_key)
            row = await self._lock_for_change(db, row)
            await self._rename_row(db, row, new_name)
            answer = {"sessionId": str(row.id), "sessionName": row.name, "status": row.status.value}
        self.hub.publish()
        log.info("session %s renamed to %s by %s", answer["sessionId"], new_name, caller.email)
        return answer

    async def modify(
        self,
        caller: Actor,
        ref: str,
        *,
        name: str | None = None,
        priority: int | None = None,
    ) -> dict[str, Any]:
        """Backend.AI's ``modify_compute_session``: a new name (as :meth:`rename`) and/or
        a new scheduling priority (0..MAX_PRIORITY, only while the session is PENDING:
        afterwards there is no queue to reorder).  Both or neither change.  The session's
        full JSON afterwards."""
        if priority is not None and not 0 <= priority <= MAX_PRIORITY:
            raise InvalidRequest(
                f"priority must be from 0 to {MAX_PRIORITY} (received {priority})",
                field="priority",
                expected=f"an integer from 0 to {MAX_PRIORITY}",
                received=priority,
            )
        async with self.db.begin(write=True) as db:
            row = await self.reads.find(db, caller, ref, None)
            row = await self._lock_for_change(db, row)
            if priority is not None and priority != row.priority:
                if row.status is not SessionStatus.PENDING:
                    raise Conflict(
                        f"The priority of session {row.name!r} can change only while it is"
                        f" PENDING; it is {row.status.value}",
                        field="status",
                        expected="PENDING",
                        received=row.status.value,
                    )
                row.priority = priority
            if name is not None:
                await self._rename_row(db, row, name)
            session_id = row.id
        if priority is not None:
            self.trigger()  # the queue's order may have changed
        self.hub.publish()
        return await self.reads.current_json(session_id)

    async def _lock_for_change(self, db: AsyncSession, row: Session) -> Session:
        """``row`` locked (PostgreSQL: with the owner's enqueue lock, so no create of the
        same name interleaves; SQLite's ``BEGIN IMMEDIATE`` serialises writers)."""
        if self.db.dialect != "postgresql":
            return row
        await lock_owner(db, row.access_key)
        locked = await lock_session(db, row.id)
        assert locked is not None
        return locked

    async def _rename_row(self, db: AsyncSession, row: Session, new_name: str) -> None:
        problem = session_name_problem(new_name)
        if problem is not None:
            raise InvalidRequest(
                f"Invalid session name {new_name!r}: {problem}",
                field="name",
                expected=SESSION_NAME_RULE,
                received=new_name,
            )
        if row.status in FINAL_STATUSES or row.status is SessionStatus.TERMINATING:
            raise Conflict(
                f"Session {row.name!r} has ended ({row.status.value}): only a live session"
                " can be renamed",
                field="status",
                expected="a live session (not TERMINATING or ended)",
                received=row.status.value,
            )
        if new_name == row.name:
            return
        existing = await live_by_name(db, row.access_key, new_name)
        if existing is not None and existing.id != row.id:
            raise Conflict(
                f"A session named {new_name!r} already exists ({existing.status.value});"
                " choose another name",
                field="name",
                expected="a name not used by the owner's live sessions",
                received=new_name,
                sessionId=str(existing.id),
            )
        row.name = new_name

    # -- restart ----------------------------------------------------------------------------
    async def restart(
        self, caller: Actor, ref: str, owner_access_key: str | None = None
    ) -> dict[str, Any]:
        """Backend.AI's ``session restart``: each kernel of a RUNNING session destroyed on
        its agent and created again with the same allocation (the same devices and
        amounts: the kernel row's ``allocation`` sent as the create's plan).  The
        session keeps its id, name, status (RUNNING) and resources; each kernel gets a new
        id (a new kernel row, the old one removed first, so the old kernel's exit event
        and heartbeats refer to no kernel of the session and cannot end it).  The history
        records a RUNNING -> RUNNING change, "restarted by ...".  A batch session's
        startup command runs again; the kernel's scratch directory is new.

        Not RUNNING (a batch session that has ended included): ``Conflict`` naming the
        status; its agent not ALIVE: ``Unavailable``.  A kernel that cannot be created
        again ends the session (ERROR -> TERMINATED, FAILURE, with the agent's reason)."""
        who = caller.email
        now = self.clock()
        async with self.db.begin(write=True) as db:
            row = await self.reads.find(db, caller, ref, owner_access_key)
            row = await self._lock_for_change(db, row)
            if row.status is not SessionStatus.RUNNING:
                raise Conflict(
                    f"Session {row.name!r} is {row.status.value}: only a RUNNING session can"
                    " be restarted",
                    field="status",
                    expected="RUNNING",
                    received=row.status.value,
                )
            began = (row.status_data or {}).get("restarting")
            if isinstance(began, str) and datetime.fromisoformat(began) > now - _RESTART_GUARD:
                raise Conflict(
                    f"Session {row.name!r} is being restarted already (since {began})",
                    field="status",
                    expected="RUNNING, not restarting",
                    received="restarting",
                )
            kernels = await session_kernels(db, row.id)
            addresses, lost = await _agent_reach(db, kernels)
            missing = [k for k in kernels if k.agent_id not in addresses or k.agent_id in lost]
            if not kernels or missing:
                agent = missing[0].agent_id if missing else row.agent_id
                raise Unavailable(
                    f"Session {row.name!r} cannot be restarted: its agent {agent} is not"
                    " reachable (LOST or unknown)",
                    field="agent",
                    received=agent,
                )
            swaps: list[_KernelSwap] = []
            for old in kernels:
                assert old.agent_id is not None
                swap = _KernelSwap(
                    old=_kernel_values(old),
                    new_id=uuid.uuid4(),
                    agent_url=addresses[old.agent_id],
                )
                job = BindJob(row.id, swap.new_id, old.agent_id, plan=old.allocation or None)
                swap.request = kernel_request(job, row)
                swaps.append(swap)
                await db.delete(old)
            await db.flush()
            for swap in swaps:
                db.add(Kernel(**swap.new_values(now)))
            row.status_data = {**(row.status_data or {}), "restarting": now.isoformat()}
            row.status_info = f"restarting (by {who})"
            session_id = row.id
        self.hub.publish()
        log.info("session %s: restarting %d kernel(s) for %s", session_id, len(swaps), who)
        return await self._restart_kernels(session_id, swaps, who)

    async def _restart_kernels(
        self, session_id: uuid.UUID, swaps: list[_KernelSwap], who: str
    ) -> dict[str, Any]:
        failure: str | None = None
        reports: dict[uuid.UUID, KernelReport] = {}
        for swap in swaps:
            old_id = str(swap.old["id"])
            try:
                await self.client.destroy_kernel(swap.agent_url, old_id)
            except AgentRPCError as e:
                if e.status_code != 404:
                    failure = f"the kernel {old_id} could not be destroyed: {e}"
                    break
            assert swap.request is not None
            try:
                report = await self.client.create_kernel(swap.agent_url, swap.request)
            except AgentRPCError as e:
                failure = f"the kernel could not be created again: {e}"
                break
            if report.status is KernelStatus.FAILED:
                failure = f"the kernel could not be created again: {report.reason or 'no reason'}"
                break
            reports[swap.new_id] = report
        stale: list[tuple[str, str]] = []  # kernels created for a session ended meanwhile
        released = False
        async with self.db.begin(write=True) as db:
            row = await lock_session(db, session_id)
            if row is None or row.status is not SessionStatus.RUNNING:
                stale = [(s.agent_url, str(s.new_id)) for s in swaps if s.new_id in reports]
            else:
                kernels = await session_kernels(db, row.id)
                for kernel in kernels:
                    got = reports.get(kernel.id)
                    if got is None:
                        continue
                    if got.allocations:
                        kernel.allocation = allocations_json(got)
                    kernel.container_id = got.container_id
                    kernel.service_ports = [m.model_dump(mode="json") for m in got.service_ports]
                row.status_data = {
                    k: v for k, v in (row.status_data or {}).items() if k != "restarting"
                }
                now = self.clock()
                if failure is None:
                    reason = f"restarted by {who}"
                    db.add(
                        SessionStatusHistory(
                            session_id=row.id,
                            from_status=SessionStatus.RUNNING,
                            to_status=SessionStatus.RUNNING,
                            reason=reason,
                            changed_at=now,
                        )
                    )
                    row.status_info = reason
                    row.status_changed_at = now
                else:
                    why = f"restart by {who} failed: {failure}"
                    await change_status(
                        db, row, SessionStatus.ERROR, reason=why, now=now, kernels=kernels
                    )
                    row.result = SessionResult.FAILURE
                    await change_status(
                        db, row, SessionStatus.TERMINATED, reason=why, now=now, kernels=kernels
                    )
                    released = True
                    stale = [(s.agent_url, str(s.new_id)) for s in swaps if s.new_id in reports]
        for url, kernel_id in stale:
            try:
                await self.client.destroy_kernel(url, kernel_id)
            except AgentRPCError as e:  # the agent's next heartbeat is told to destroy it
                log.info("session %s: kernel %s not destroyed yet: %s", session_id, kernel_id, e)
        if released:
            self.trigger()
        self.hub.publish()
        if failure is not None:
            log.warning("session %s: restart failed: %s", session_id, failure)
        return await self._short_answer(session_id)
