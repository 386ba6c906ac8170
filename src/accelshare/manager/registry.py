"""The agent registry: heartbeats, kernel events, LOST agents and reconciliation.

Called by ``POST /internal/agents/heartbeat`` and ``/internal/agents/events`` (cluster
secret) and by the manager's sweep timer.

**Heartbeat** (idempotent): a heartbeat naming an unknown scaling group is refused
before anything is recorded; otherwise add the reported slot types to the known set in
the config store (never removed); upsert the agent row (status ALIVE, RPC URL,
available slots, the per-device alloc-map views, slot metadata, quanta, plugin summary,
last heartbeat); reconcile the reported kernels with the database:

* a kernel the manager considers ended (TERMINATED/CANCELLED), or is destroying
  (TERMINATING), is listed in ``HeartbeatAck.destroy_kernels``;
* a kernel the manager has no row for is *reported* (logged, kept in
  ``agents.status_data.unknown_kernels``; its devices count as taken for scheduling)
  and left alone — it may belong to another manager's database;
* a kernel the agent reports RUNNING / EXITED / FAILED moves its session on, the same
  way the corresponding event would (missed events are caught up);
* a kernel the manager has as RUNNING/ERROR (or TERMINATING) that the agent no longer
  reports ended: TERMINATED with the reason.  For RUNNING kernels this is only
  concluded when the agent comes back from LOST or the kernel has been RUNNING longer
  than ``agent-timeout`` (a heartbeat sent just before the kernel started must not end
  it).

A new agent, a returning one, or changed capacity/devices triggers a scheduling pass.

**Events** (``KernelEventBatch``): started -> RUNNING; exited -> TERMINATED (exit code,
result, resources released); failed -> CANCELLED with the reason (ERROR then
TERMINATED once RUNNING).  Each event id is applied once (``kernel_events``).

**Sweep**: an ALIVE agent silent for ``agent-timeout`` becomes LOST; its sessions keep
their status (the kernels may still run) and their ``status_info`` says so;
TERMINATING sessions on it end (nothing can confirm them any more; the agent is told
to destroy the kernel when it returns).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from accelshare.common import ResourceSlot, SlotTypes
from accelshare.protocol import (
    Heartbeat,
    HeartbeatAck,
    KernelEvent,
    KernelEventBatch,
    KernelEventType,
    KernelStatus,
)
from accelshare.sched.lifecycle import (
    FINAL_STATUSES,
    SessionResult,
    SessionStatus,
    can_transition,
)

from .clock import Clock
from .db import Database
from .hub import ChangeHub
from .models import Agent, AgentStatus, Kernel, KernelEventRecord, ScalingGroup, Session
from .scheduler.binding import BINDABLE, allocations_json
from .slots import KnownSlots
from .transitions import (
    OCCUPYING,
    change_status,
    change_status_many,
    forward_steps,
    lock_session,
    session_kernels,
    walk_forward,
)

__all__ = ["AgentRegistry", "UnknownScalingGroup"]

log = logging.getLogger(__name__)


class UnknownScalingGroup(ValueError):
    def __init__(self, name: str, known: list[str]) -> None:
        super().__init__(
            f"unknown scaling group {name!r} (known: {', '.join(known) or 'none'}); create it"
            " with the admin API or change the agent's scaling group"
        )
        self.name = name


@dataclass(frozen=True, slots=True)
class _Action:
    """One session change a heartbeat calls for, applied in its own transaction."""

    kind: str  # running | ended | failed | vanished
    session_id: uuid.UUID
    kernel_id: uuid.UUID | None = None
    allocations: dict[str, dict[str, str]] | None = None
    service_ports: list[dict[str, Any]] | None = None
    exit_code: int | None = None
    reason: str = ""

    async def apply(self, registry: AgentRegistry, db: AsyncSession, now: datetime) -> bool:
        """Returns True when resources were released."""
        if self.kind == "running":
            await registry._running(
                db, self.session_id, self.kernel_id, self.allocations, self.service_ports, now
            )
            return False
        if self.kind == "ended":
            return await registry._ended(db, self.session_id, self.exit_code, self.reason, now)
        if self.kind == "failed":
            return await registry._failed(db, self.session_id, self.reason, now)
        return await registry._vanished(db, self.session_id, self.reason, now)


@dataclass(slots=True)
class _Outcome:
    released: bool = False
    changed: bool = False


def _plugins_summary(hb: Heartbeat) -> dict[str, Any]:
    return {
        key: {
            "kind": view.kind,
            "strategy": view.strategy,
            "quantum": view.quantum,
            "exclusive_slot_types": list(view.exclusive_slot_types),
            "slots": sorted({d.slot_name for d in view.devices}),
            "devices": len(view.devices),
            **({"status": dict(hb.plugin_status[key])} if hb.plugin_status.get(key) else {}),
        }
        for key, view in hb.alloc_maps.items()
    }


def _quanta(hb: Heartbeat) -> dict[str, str]:
    quanta: dict[str, str] = {}
    for view in hb.alloc_maps.values():
        if view.kind == "fractional" and view.quantum:
            for device in view.devices:
                quanta.setdefault(device.slot_name, view.quantum)
    return quanta


def _as_uuid(value: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(value)
    except ValueError:
        return None


def _insert_ignoring_duplicates(dialect: str) -> Any:
    """The dialect's ``insert`` (both have ``on_conflict_do_nothing``)."""
    return postgresql.insert if dialect == "postgresql" else sqlite.insert


# The kernel-event path's statements, prebuilt: every event runs them, and building a
# statement (and its cache key) each time cost about as much as running it on SQLite.
_RECORD_EVENT = {
    dialect: _insert_ignoring_duplicates(dialect)(KernelEventRecord)
    .values(
        event_id=sa.bindparam("event_id"),
        agent_id=sa.bindparam("agent_id"),
        kernel_id=sa.bindparam("kernel_id"),
        event=sa.bindparam("event"),
        received_at=sa.bindparam("received_at"),
    )
    .on_conflict_do_nothing(index_elements=["event_id"])
    .returning(KernelEventRecord.event_id)
    for dialect in ("sqlite", "postgresql")
}
_SESSION_OF_KERNEL = sa.select(Kernel.session_id).where(Kernel.id == sa.bindparam("kernel_id"))
_LOCKED_STATUS = (
    sa.select(Session.status).where(Session.id == sa.bindparam("session_id")).with_for_update()
)


async def _require_scaling_group(db: AsyncSession, name: str) -> None:
    if await db.get(ScalingGroup, name) is None:
        names = list((await db.execute(sa.select(ScalingGroup.name))).scalars())
        raise UnknownScalingGroup(name, names)


_RECONCILED = (
    Kernel.id,
    Kernel.agent_id,
    Kernel.status,
    Kernel.status_changed_at,
    Kernel.session_id,
)


class AgentRegistry:
    def __init__(
        self,
        *,
        db: Database,
        known_slots: KnownSlots,
        hub: ChangeHub,
        clock: Clock,
        agent_timeout_s: float,
        on_change: Callable[[], None],
        on_event_applied: Callable[[KernelEvent, str], None] | None = None,
    ) -> None:
        self.db = db
        self.known_slots = known_slots
        self.hub = hub
        self.clock = clock
        self.agent_timeout = timedelta(seconds=agent_timeout_s)
        self.on_change = on_change
        # (event, path) for each event applied the first time: "http" or "redis"
        self.on_event_applied = on_event_applied

    # -- heartbeats -------------------------------------------------------------------------
    async def heartbeat(self, hb: Heartbeat) -> HeartbeatAck:
        """Upsert, then reconcile.  Lock order everywhere is *session, then agent* (as a
        destroy or an event takes them), so the agent row is updated in a transaction of
        its own and each session change gets its own short transaction: no deadlock.

        A heartbeat naming an unknown scaling group is refused before anything is
        recorded, its slot types included; the known set grows before the agent row
        is written, so no pass sees the agent's slots before they are known."""
        async with self.db.begin() as db:
            await _require_scaling_group(db, hb.scaling_group)
        await self.known_slots.add({slot: SlotTypes(cap.type) for slot, cap in hb.slots.items()})
        outcome = _Outcome()
        async with self.db.begin(write=True) as db:
            now = self.clock()
            await _require_scaling_group(db, hb.scaling_group)  # may have gone meanwhile
            agent = await db.get(Agent, hb.agent_id)
            returning = agent is not None and agent.status is not AgentStatus.ALIVE
            agent = self._upsert(db, agent, hb, now, outcome)
            actions, destroy, unknown = await self._reconcile_plan(db, agent.id, hb, now, returning)
            data = dict(agent.status_data or {})
            data["unknown_kernels"] = unknown
            data["reconciled_at"] = now.isoformat()
            if returning:
                data["returned_at"] = now.isoformat()
            agent.status_data = data
        for action in actions:
            async with self.db.begin(write=True) as db:
                outcome.released |= await action.apply(self, db, self.clock())
        if returning:
            async with self.db.begin(write=True) as db:
                await self._note_sessions(db, hb.agent_id, f"agent {hb.agent_id} is back", now)
        self.hub.publish()
        if outcome.changed or outcome.released:
            self.on_change()
        return HeartbeatAck(destroy_kernels=destroy)

    def _upsert(
        self, db: AsyncSession, agent: Agent | None, hb: Heartbeat, now: datetime, out: _Outcome
    ) -> Agent:
        available = ResourceSlot({slot: Decimal(cap.capacity) for slot, cap in hb.slots.items()})
        views = {key: view.model_dump(mode="json") for key, view in hb.alloc_maps.items()}
        if agent is None:
            agent = Agent(
                id=hb.agent_id,
                status=AgentStatus.ALIVE,
                status_changed_at=now,
                first_contact_at=now,
                occupied_slots=ResourceSlot(),
                occupancy_revision=0,
                status_data={},
            )
            db.add(agent)
            out.changed = True
            log.info(
                "agent %s joined (%s, scaling group %s)", hb.agent_id, hb.rpc_url, hb.scaling_group
            )
        elif agent.status is not AgentStatus.ALIVE:
            log.info("agent %s is back (was %s)", hb.agent_id, agent.status)
            agent.status = AgentStatus.ALIVE
            agent.status_changed_at = now
            agent.lost_at = None
            out.changed = True
        if (
            agent.available_slots != available
            or agent.map_views != views
            or agent.address != hb.rpc_url
            or agent.scaling_group != hb.scaling_group
            or (agent.images or []) != hb.images
            or agent.runtime != hb.runtime
        ):
            out.changed = True
        agent.address = hb.rpc_url
        agent.scaling_group = hb.scaling_group
        agent.region = hb.region
        agent.architecture = hb.architecture
        agent.version = hb.version
        agent.available_slots = available
        agent.map_views = views
        agent.slot_metadata = dict(hb.slot_metadata)
        agent.quanta = _quanta(hb)
        agent.compute_plugins = _plugins_summary(hb)
        agent.images = list(hb.images)
        agent.runtime = hb.runtime
        agent.last_heartbeat_at = now
        return agent

    async def _reconcile_plan(
        self, db: AsyncSession, agent_id: str, hb: Heartbeat, now: datetime, returning: bool
    ) -> tuple[list[_Action], list[str], list[str]]:
        """What the reported kernels mean: session changes, kernels to destroy, unknown ones."""
        reported = {k.kernel_id: k for k in hb.kernels}
        ids = [u for u in map(_as_uuid, reported) if u is not None]
        # the five columns read below, by Core (ORM kernels with their JSON columns parsed
        # cost ~70 ms a heartbeat of an agent running 600 kernels, in its write transaction)
        known: dict[str, sa.Row[uuid.UUID, str | None, SessionStatus, datetime, uuid.UUID]] = {}
        for start in range(0, len(ids), 500):
            query = sa.select(*_RECONCILED).where(Kernel.id.in_(ids[start : start + 500]))
            for kernel in await db.execute(query):
                known[str(kernel.id)] = kernel
        mine = await db.execute(
            sa.select(*_RECONCILED).where(Kernel.agent_id == agent_id, Kernel.status.in_(OCCUPYING))
        )
        for kernel in mine:
            known.setdefault(str(kernel.id), kernel)
        unknown = sorted(k for k in reported if k not in known)
        if unknown:
            log.warning(
                "agent %s reports kernel(s) this manager does not know: %s",
                agent_id,
                ", ".join(unknown),
            )
        gone = (KernelStatus.EXITED, KernelStatus.FAILED)
        actions: list[_Action] = []
        destroy: list[str] = []
        for kernel_id, kernel in sorted(known.items()):
            report = reported.get(kernel_id)
            if kernel.agent_id != agent_id or kernel.status in FINAL_STATUSES:
                if report is not None and report.status not in gone:
                    destroy.append(kernel_id)
                continue
            if report is None:
                long_ago = kernel.status_changed_at < now - self.agent_timeout
                if kernel.status is SessionStatus.TERMINATING or (
                    kernel.status in (SessionStatus.RUNNING, SessionStatus.ERROR)
                    and (returning or long_ago)
                ):
                    why = f"the agent {agent_id} no longer reports the kernel"
                    actions.append(_Action("vanished", kernel.session_id, reason=why))
                continue
            if kernel.status is SessionStatus.TERMINATING and report.status not in gone:
                destroy.append(kernel_id)
            if report.status is KernelStatus.RUNNING and kernel.status in BINDABLE:
                actions.append(
                    _Action(
                        "running",
                        kernel.session_id,
                        kernel_id=kernel.id,
                        allocations=allocations_json(report) if report.allocations else None,
                        service_ports=[m.model_dump(mode="json") for m in report.service_ports]
                        or None,
                    )
                )
            elif report.status is KernelStatus.EXITED:
                actions.append(
                    _Action(
                        "ended", kernel.session_id, exit_code=report.exit_code, reason=report.reason
                    )
                )
            elif report.status is KernelStatus.FAILED:
                actions.append(_Action("failed", kernel.session_id, reason=report.reason))
        return actions, destroy, unknown

    async def _vanished(
        self, db: AsyncSession, session_id: uuid.UUID, reason: str, now: datetime
    ) -> bool:
        row = await lock_session(db, session_id)
        if row is None or row.status not in (
            SessionStatus.RUNNING,
            SessionStatus.ERROR,
            SessionStatus.TERMINATING,
        ):
            return False
        if row.status is SessionStatus.RUNNING:
            row.result = SessionResult.FAILURE
        await change_status(db, row, SessionStatus.TERMINATED, reason=reason, now=now)
        return True

    async def _running(
        self,
        db: AsyncSession,
        session_id: uuid.UUID,
        kernel_id: uuid.UUID | None,
        allocations: dict[str, dict[str, str]] | None,
        service_ports: list[dict[str, Any]] | None,
        now: datetime,
    ) -> None:
        row = await lock_session(db, session_id)
        if row is None or row.status not in BINDABLE:
            return
        kernels = await session_kernels(db, row.id)
        for kernel in kernels:
            if kernel.id == kernel_id and allocations:
                kernel.allocation = allocations
            if kernel.id == kernel_id and service_ports:
                kernel.service_ports = service_ports
        await walk_forward(
            db, row, SessionStatus.RUNNING, reason="the kernel is running", now=now, kernels=kernels
        )

    # -- events -----------------------------------------------------------------------------
    async def apply_events(self, batch: KernelEventBatch, *, path: str = "http") -> int:
        """Apply each event once, whichever path brings it first (``http``: the agent's
        acknowledged call, ``redis``: the bus); returns how many were new."""
        applied = 0
        released = False
        for event in batch.events:
            try:
                result = await self._apply_event(batch.agent_id, event)
            except IntegrityError:  # the same id applied concurrently by another request
                continue
            if result is not None:
                applied += 1
                released |= result
                if self.on_event_applied is not None:
                    self.on_event_applied(event, path)
        if applied:
            self.hub.publish()
        if released:
            self.on_change()
        return applied

    async def _apply_event(self, agent_id: str, event: KernelEvent) -> bool | None:
        async with self.db.begin(write=True) as db:
            # the id first, in one statement: nothing inserted means applied before
            recorded = await db.execute(
                _RECORD_EVENT[self.db.dialect],
                {
                    "event_id": event.event_id,
                    "agent_id": agent_id,
                    "kernel_id": event.kernel_id,
                    "event": event.event.value,
                    "received_at": self.clock(),
                },
            )
            if recorded.scalar_one_or_none() is None:
                return None
            kernel_uuid = _as_uuid(event.kernel_id)
            session_id = (
                await db.scalar(_SESSION_OF_KERNEL, {"kernel_id": kernel_uuid})
                if kernel_uuid
                else None
            )
            if session_id is None:
                log.warning(
                    "agent %s: event %s for unknown kernel %s",
                    agent_id,
                    event.event,
                    event.kernel_id,
                )
                return False
            now = self.clock()
            if event.event is KernelEventType.STARTED:
                await self._started(db, session_id, kernel_uuid, event, now)
                return False
            if event.event is KernelEventType.EXITED:
                return await self._ended(db, session_id, event.exit_code, event.reason, now)
            return await self._failed(db, session_id, event.reason, now)

    async def _started(
        self,
        db: AsyncSession,
        session_id: uuid.UUID,
        kernel_id: uuid.UUID | None,
        event: KernelEvent,
        now: datetime,
    ) -> None:
        """A kernel started: its session walks forward to RUNNING (Core statements: the
        session's status, locked, and :func:`change_status_many`; nothing is released)."""
        status = await db.scalar(_LOCKED_STATUS, {"session_id": session_id})
        if status not in BINDABLE:  # already RUNNING, or ended meanwhile
            return
        if event.service_ports and kernel_id is not None:
            # the create's answer may be recorded after this event moved the session to
            # RUNNING: its apps' host ports must be known by then
            await db.execute(
                sa.update(Kernel)
                .where(Kernel.id == kernel_id)
                .values(service_ports=[m.model_dump(mode="json") for m in event.service_ports])
                .execution_options(synchronize_session=False)
            )
        steps = forward_steps(status, SessionStatus.RUNNING, "the kernel started")
        await change_status_many(db, [(session_id, steps)], now=now)

    @staticmethod
    async def _has_ended(db: AsyncSession, session_id: uuid.UUID) -> bool:
        """Whether the session is gone or final, by its status alone (locked): a kernel's
        end usually arrives after its session was destroyed, and then the full ORM row
        need not be loaded."""
        status = await db.scalar(_LOCKED_STATUS, {"session_id": session_id})
        return status is None or status in FINAL_STATUSES

    async def _ended(
        self,
        db: AsyncSession,
        session_id: uuid.UUID,
        exit_code: int | None,
        reason: str,
        now: datetime,
    ) -> bool:
        if await self._has_ended(db, session_id):
            return False
        row = await lock_session(db, session_id)
        if row is None or row.status in FINAL_STATUSES:
            return False
        kernels = await session_kernels(db, row.id)
        if row.status in BINDABLE:  # exited before we saw it start
            await walk_forward(
                db,
                row,
                SessionStatus.RUNNING,
                reason="the kernel started",
                now=now,
                kernels=kernels,
            )
        if row.status not in (
            SessionStatus.RUNNING,
            SessionStatus.TERMINATING,
            SessionStatus.ERROR,
        ):
            return False
        row.exit_code = exit_code
        for kernel in kernels:
            kernel.exit_code = exit_code
        if row.status is SessionStatus.TERMINATING:
            # A destroy is under way and this is its kernel ending (killed by it, or
            # ending as it was asked to): the session ends as the destroy itself ends it
            # (SessionLifecycle._confirm_destroyed), with the destroy's reason and no
            # result made up from the signal's exit code.  Without this, the second
            # session of `destroy A B` (whose exit event often comes first) ended as a
            # FAILURE while the first ended as destroyed.
            why = row.status_info or "destroyed"
        else:
            if row.result is SessionResult.UNDEFINED:
                row.result = SessionResult.SUCCESS if exit_code == 0 else SessionResult.FAILURE
            why = reason or f"the kernel exited with code {exit_code}"
        await change_status(db, row, SessionStatus.TERMINATED, reason=why, now=now, kernels=kernels)
        return True

    async def _failed(
        self, db: AsyncSession, session_id: uuid.UUID, reason: str, now: datetime
    ) -> bool:
        if await self._has_ended(db, session_id):
            return False
        row = await lock_session(db, session_id)
        if row is None or row.status in FINAL_STATUSES:
            return False
        why = f"the kernel failed: {reason or 'no reason given'}"
        kernels = await session_kernels(db, row.id)
        if can_transition(row.status, SessionStatus.CANCELLED):
            await change_status(
                db, row, SessionStatus.CANCELLED, reason=why, now=now, kernels=kernels
            )
            return True
        if row.status is not SessionStatus.ERROR:
            await change_status(db, row, SessionStatus.ERROR, reason=why, now=now, kernels=kernels)
        row.result = SessionResult.FAILURE
        await change_status(db, row, SessionStatus.TERMINATED, reason=why, now=now, kernels=kernels)
        return True

    # -- the LOST sweep ---------------------------------------------------------------------
    async def sweep(self) -> list[str]:
        """Mark agents silent for ``agent-timeout`` LOST; returns their ids.

        The agents are marked in one transaction, their sessions noted and their
        TERMINATING sessions ended in later ones (session-then-agent lock order)."""
        lost: list[tuple[str, datetime]] = []
        async with self.db.begin(write=True) as db:
            now = self.clock()
            deadline = now - self.agent_timeout
            agents = list(
                (
                    await db.execute(
                        sa.select(Agent)
                        .where(
                            Agent.status == AgentStatus.ALIVE, Agent.last_heartbeat_at < deadline
                        )
                        .with_for_update()
                    )
                ).scalars()
            )
            for agent in agents:
                agent.status = AgentStatus.LOST
                agent.status_changed_at = now
                agent.lost_at = now
                lost.append((agent.id, agent.last_heartbeat_at))
                log.warning(
                    "agent %s is LOST: no heartbeat since %s", agent.id, agent.last_heartbeat_at
                )
        released = False
        for agent_id, last in lost:
            note = f"agent {agent_id} is LOST (no heartbeat since {last.isoformat()})"
            async with self.db.begin(write=True) as db:
                await self._note_sessions(db, agent_id, note, now)
            released |= await self._end_terminating(agent_id)
        if lost:
            self.hub.publish()
        if released:
            self.on_change()
        return [agent_id for agent_id, _ in lost]

    async def _note_sessions(
        self, db: AsyncSession, agent_id: str, note: str, now: datetime
    ) -> None:
        rows = (
            await db.execute(
                sa.select(Session).where(
                    Session.agent_id == agent_id, Session.status.in_(OCCUPYING)
                )
            )
        ).scalars()
        for row in rows:
            row.status_info = note
            data = dict(row.status_data or {})
            data["agent"] = {"note": note, "at": now.isoformat()}
            row.status_data = data

    async def _end_terminating(self, agent_id: str) -> bool:
        async with self.db.begin() as db:
            ids = list(
                (
                    await db.execute(
                        sa.select(Session.id).where(
                            Session.agent_id == agent_id,
                            Session.status == SessionStatus.TERMINATING,
                        )
                    )
                ).scalars()
            )
        ended = False
        for session_id in ids:
            async with self.db.begin(write=True) as db:
                row = await lock_session(db, session_id)
                if row is None or row.status is not SessionStatus.TERMINATING:
                    continue
                await change_status(
                    db,
                    row,
                    SessionStatus.TERMINATED,
                    reason=f"destroyed; agent {agent_id} is LOST and cannot confirm it",
                    now=self.clock(),
                )
                ended = True
        return ended
