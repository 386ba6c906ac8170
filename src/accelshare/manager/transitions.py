"""Session status changes inside a transaction: the lifecycle table, history, release.

Every change goes through :func:`change_status`, which checks it against
:mod:`accelshare.sched.lifecycle`, appends a ``session_status_history`` row (reason +
timestamp), mirrors the status onto the session's kernels, sets the timeline
columns, and — when the session stops occupying resources — recomputes the agent's
occupancy from the database (:func:`recompute_agent_occupancy`).

Callers load the session with :func:`lock_session` (``SELECT ... FOR UPDATE`` on
PostgreSQL; SQLite's ``BEGIN IMMEDIATE`` already serialises writers), so two handlers
(a bind result and a "started" event, say) never race on one session.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm.attributes import set_committed_value
from sqlalchemy.orm.util import identity_key

from accelshare.common import ResourceSlot
from accelshare.sched.lifecycle import (
    RESOURCE_OCCUPYING_STATUSES,
    SessionStatus,
    check_transition,
    is_resource_occupying,
)

from .models import Agent, Kernel, Session, SessionStatusHistory

__all__ = [
    "FORWARD_CHAIN",
    "OCCUPYING",
    "Step",
    "agent_addresses",
    "change_status",
    "change_status_many",
    "forward_steps",
    "lock_session",
    "occupied_by_agent",
    "recompute_agent_occupancy",
    "session_kernels",
    "walk_forward",
]

_MAX_INFO = 512

FORWARD_CHAIN: tuple[SessionStatus, ...] = (
    SessionStatus.SCHEDULED,
    SessionStatus.PREPARING,
    SessionStatus.PREPARED,
    SessionStatus.CREATING,
    SessionStatus.RUNNING,
)
"""The path a bound session takes to RUNNING (PULLING is skipped: it is optional)."""

OCCUPYING = sorted(RESOURCE_OCCUPYING_STATUSES)


def _clip(text: str | None) -> str | None:
    if text is None or len(text) <= _MAX_INFO:
        return text
    return text[: _MAX_INFO - 3] + "..."


# statements run per session or per release, prebuilt (cache keys computed once)
_LOCK_SESSION = sa.select(Session).where(Session.id == sa.bindparam("session_id")).with_for_update()
_OCCUPIED_TEXT = sa.cast(Kernel.occupied_slots, sa.Text())
_OCCUPIED_BY_AGENT = (
    sa.select(Kernel.agent_id, _OCCUPIED_TEXT, sa.func.count())
    .where(
        Kernel.agent_id.in_(sa.bindparam("agent_ids", expanding=True)),
        Kernel.status.in_(OCCUPYING),
    )
    .group_by(Kernel.agent_id, _OCCUPIED_TEXT)
)


async def lock_session(db: AsyncSession, session_id: uuid.UUID) -> Session | None:
    """The session row, locked for this transaction (PostgreSQL row lock)."""
    return (await db.execute(_LOCK_SESSION, {"session_id": session_id})).scalar_one_or_none()


_SESSION_KERNELS = (
    sa.select(Kernel)
    .where(Kernel.session_id == sa.bindparam("session_id"))
    .order_by(Kernel.cluster_idx)
)


async def session_kernels(db: AsyncSession, session_id: uuid.UUID) -> list[Kernel]:
    return list((await db.execute(_SESSION_KERNELS, {"session_id": session_id})).scalars())


async def agent_addresses(db: AsyncSession, kernels: Sequence[Kernel]) -> dict[str, str]:
    """``{agent id: its current RPC address}`` for the agents of ``kernels``.

    Always the ``agents`` table (each heartbeat updates it), never ``kernels.agent_address``
    (the address when the kernel was scheduled): an agent restarted on another address
    keeps its kernels, and the manager must reach it where it is now."""
    ids = {k.agent_id for k in kernels if k.agent_id is not None}
    if not ids:
        return {}
    rows = await db.execute(sa.select(Agent.id, Agent.address).where(Agent.id.in_(sorted(ids))))
    return {agent_id: address for agent_id, address in rows if address}


async def change_status(
    db: AsyncSession,
    row: Session,
    to: SessionStatus,
    *,
    reason: str | None,
    now: datetime,
    kernels: Sequence[Kernel] | None = None,
    status_info: str | None = None,
) -> None:
    """Move ``row`` to ``to`` (raises ``InvalidStatusTransition`` if the table forbids it).

    ``status_info`` defaults to ``reason``.  Kernels (loaded when not given) follow the
    session's status.  Leaving the resource-occupying statuses releases the agent.
    """
    before = row.status
    check_transition(before, to)
    db.add(
        SessionStatusHistory(
            session_id=row.id,
            from_status=before,
            to_status=to,
            reason=_clip(reason),
            changed_at=now,
        )
    )
    row.status = to
    row.status_changed_at = now
    row.status_info = _clip(status_info if status_info is not None else reason)
    if to is SessionStatus.SCHEDULED:
        row.scheduled_at = now
    elif to is SessionStatus.RUNNING:
        row.started_at = now
    elif to in (SessionStatus.TERMINATED, SessionStatus.CANCELLED):
        row.terminated_at = now
    if kernels is None:
        kernels = await session_kernels(db, row.id)
    for kernel in kernels:
        kernel.status = to
        kernel.status_changed_at = now
        kernel.status_info = row.status_info
        if to is SessionStatus.RUNNING and kernel.started_at is None:
            kernel.started_at = now
        if to in (SessionStatus.TERMINATED, SessionStatus.CANCELLED):
            kernel.terminated_at = now
    if is_resource_occupying(before) and not is_resource_occupying(to):
        row.occupied_slots = ResourceSlot()
        await db.flush()
        agents = {k.agent_id for k in kernels if k.agent_id} | (
            {row.agent_id} if row.agent_id else set()
        )
        for agent_id in sorted(agents):
            await recompute_agent_occupancy(db, agent_id)


Step = tuple[SessionStatus, SessionStatus, str]
"""One status change of a session: ``(from, to, reason)``."""

_BULK_TARGETS = frozenset(
    {
        SessionStatus.PREPARING,
        SessionStatus.PULLING,
        SessionStatus.PREPARED,
        SessionStatus.CREATING,
        SessionStatus.RUNNING,
    }
)
_S = cast(sa.Table, Session.__table__)
_K = cast(sa.Table, Kernel.__table__)
_H = cast(sa.Table, SessionStatusHistory.__table__)


def forward_steps(current: SessionStatus, target: SessionStatus, reason: str) -> list[Step]:
    """The steps :func:`walk_forward` takes from ``current`` up to ``target`` (checked)."""
    start_at = SessionStatus.PREPARING if current is SessionStatus.PULLING else current
    if start_at not in FORWARD_CHAIN:
        return []
    start, end = FORWARD_CHAIN.index(start_at), FORWARD_CHAIN.index(target)
    steps: list[Step] = []
    before = current
    for status in FORWARD_CHAIN[start + 1 : end + 1]:
        check_transition(before, status)
        steps.append((before, status, reason))
        before = status
    return steps


def _bulk_status_update(
    table: sa.Table, key: sa.ColumnElement[Any], *, keep_started: bool
) -> sa.Update:
    """change_status_many's UPDATE of ``table`` (executemany: each row binds ``b_*``);
    ``started_at`` set on reaching RUNNING, or kept when already set (``keep_started``)."""
    started = sa.bindparam("b_started", type_=table.c.started_at.type)
    return (
        sa.update(table)
        .where(key == sa.bindparam("b_id"))
        .values(
            status=sa.bindparam("b_status", type_=table.c.status.type),
            status_changed_at=sa.bindparam("b_now", type_=table.c.status_changed_at.type),
            status_info=sa.bindparam("b_info"),
            started_at=(
                sa.func.coalesce(table.c.started_at, started)
                if keep_started
                else sa.func.coalesce(started, table.c.started_at)
            ),
        )
        .execution_options(synchronize_session=False)
    )


# change_status_many's statements, prebuilt
_INSERT_HISTORY = sa.insert(_H)
_BULK_SESSIONS = _bulk_status_update(_S, _S.c.id, keep_started=False)
_BULK_KERNELS = _bulk_status_update(_K, _K.c.session_id, keep_started=True)


async def change_status_many(
    db: AsyncSession, moves: Sequence[tuple[uuid.UUID, Sequence[Step]]], *, now: datetime
) -> None:
    """:func:`change_status` for many sessions at once, each through its ``steps`` (in
    order), with multi-row statements: one INSERT of every history row, one UPDATE
    (executemany) of the sessions, one of their kernels.  Only the binder's forward
    moves (to PREPARING, PULLING, PREPARED, CREATING, RUNNING: nothing is released);
    the sessions must be locked by the caller and not loaded as ORM objects in ``db``.
    """
    history: list[dict[str, object]] = []
    updates: list[dict[str, object]] = []
    for session_id, steps in moves:
        if not steps:
            continue
        for before, to, reason in steps:
            check_transition(before, to)
            if to not in _BULK_TARGETS:
                raise ValueError(f"change_status_many cannot move a session to {to}")
            history.append(
                {
                    "session_id": session_id,
                    "from_status": before,
                    "to_status": to,
                    "reason": _clip(reason),
                    "changed_at": now,
                }
            )
        running = any(to is SessionStatus.RUNNING for _, to, _ in steps)
        updates.append(
            {
                "b_id": session_id,
                "b_status": steps[-1][1],
                "b_info": _clip(steps[-1][2]),
                "b_started": now if running else None,
            }
        )
    if not updates:
        return
    for update in updates:
        update["b_now"] = now
    await db.execute(_INSERT_HISTORY, history)
    await db.execute(_BULK_SESSIONS, updates)
    await db.execute(_BULK_KERNELS, updates)


async def walk_forward(
    db: AsyncSession,
    row: Session,
    target: SessionStatus,
    *,
    reason: str,
    now: datetime,
    kernels: Sequence[Kernel] | None = None,
) -> list[SessionStatus]:
    """Step along :data:`FORWARD_CHAIN` up to ``target``; returns the statuses entered.

    A no-op when the session is already at (or past) ``target`` or off the chain, so
    the bind result and the agent's "started" event may arrive in either order.
    """
    # PULLING sits where PREPARING does: its next step is PREPARED.
    current = SessionStatus.PREPARING if row.status is SessionStatus.PULLING else row.status
    if current not in FORWARD_CHAIN:
        return []
    start, end = FORWARD_CHAIN.index(current), FORWARD_CHAIN.index(target)
    entered: list[SessionStatus] = []
    if kernels is None:
        kernels = await session_kernels(db, row.id)
    for status in FORWARD_CHAIN[start + 1 : end + 1]:
        await change_status(db, row, status, reason=reason, now=now, kernels=kernels)
        entered.append(status)
    return entered


async def occupied_by_agent(db: AsyncSession, agent_ids: Sequence[str]) -> dict[str, ResourceSlot]:
    """Per agent, the sum of its resource-occupying kernels' ``occupied_slots``.

    Summed by the distinct stored amounts (``GROUP BY`` the column's text, with a
    count): an agent running hundreds of kernels of a few shapes costs a few rows and
    multiplications, not one decoded document and one addition per kernel.  Exact
    (Decimal), the same as adding them one by one.
    """
    totals: dict[str, list[tuple[ResourceSlot, int]]] = {a: [] for a in agent_ids}
    parsed: dict[str, ResourceSlot] = {}
    ids = sorted(set(agent_ids))
    for start in range(0, len(ids), 500):
        rows = await db.execute(_OCCUPIED_BY_AGENT, {"agent_ids": ids[start : start + 500]})
        for agent_id, slots_text, count in rows:
            assert agent_id is not None  # selected by agent id
            slots = parsed.get(slots_text)
            if slots is None:
                slots = parsed[slots_text] = ResourceSlot.from_json(
                    json.loads(slots_text or "{}") or {}
                )
            totals[agent_id].append((slots, int(count)))
    return {agent_id: ResourceSlot.sum_of(terms) for agent_id, terms in totals.items()}


async def recompute_agent_occupancy(db: AsyncSession, agent_id: str) -> ResourceSlot | None:
    """``agents.occupied_slots`` = the sum over its resource-occupying kernels, recomputed.

    The agent row is locked first (PostgreSQL ``FOR UPDATE``), so a scheduler's
    compare-and-set on ``occupancy_revision`` either sees this release or is seen by
    it; the revision is bumped.  Returns the new occupancy (None: no such agent).

    Core statements on the two columns only: loading the ORM row decoded every JSON
    column (its device allocations and heartbeat views, hundreds of devices), a large
    part of a destroy's CPU.  An ``Agent`` already in this transaction's identity map
    gets the new values as committed state, so its holder reads them and a later
    flush of it does not write them back.
    """
    locked = await db.execute(
        sa.select(Agent.occupancy_revision).where(Agent.id == agent_id).with_for_update()
    )
    revision = locked.scalar_one_or_none()
    if revision is None:
        return None
    total = (await occupied_by_agent(db, [agent_id]))[agent_id]
    await db.execute(
        sa.update(Agent)
        .where(Agent.id == agent_id)
        .values(occupied_slots=total, occupancy_revision=revision + 1)
        .execution_options(synchronize_session=False)
    )
    held = db.sync_session.identity_map.get(identity_key(Agent, agent_id))
    if held is not None:
        set_committed_value(held, "occupied_slots", total)
        set_committed_value(held, "occupancy_revision", revision + 1)
    return total
