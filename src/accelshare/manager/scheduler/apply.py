"""Apply a plan with an optimistic check per agent, in bulk (Core statements).

In the apply transaction (the scheduler's lock held; on SQLite the database's write
lock too, which the pass takes for the apply only, not while it plans):

1. the assigned sessions are loaded and locked (``SELECT ... FOR UPDATE``, in chunks);
   one no longer PENDING (cancelled since the snapshot) is skipped;
2. every agent that keeps placements gets a compare-and-set on its
   ``occupancy_revision`` (``UPDATE agents ... WHERE (id, occupancy_revision) IN
   (<seen in the snapshot>) RETURNING id``, one statement for many agents).  An agent
   the statement did not return had a release or another scheduler move first: its
   placements are dropped, those sessions stay PENDING untouched, and the caller runs
   another pass.  Resources are never given twice, whatever the interleaving;
3. for the agents that won, in multi-row statements: each session moves to SCHEDULED
   with the agent recorded (guarded by ``status = 'PENDING'``), a status-history row,
   and a kernel row holding the *planned* per-device placement (so the next pass
   counts it even before the agent creates the kernel; the bind sends it to the agent,
   which takes exactly that placement);
4. those agents' ``occupied_slots`` are recomputed from their resource-occupying
   kernels (one query, one ``executemany``).

Sessions left pending get ``status_info`` and ``status_data.scheduler`` from
:mod:`.explanations`, off the pass.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar, cast

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from accelshare.common import ResourceSlot, canonical_decimal
from accelshare.sched.lifecycle import SessionStatus
from accelshare.sched.outcome import Assignment, SchedulingPlan

from ..models import Agent, Kernel, Session, SessionStatusHistory
from ..transitions import occupied_by_agent
from .snapshot import LoadedSnapshot

__all__ = ["AppliedPlan", "BindJob", "apply_plan"]

log = logging.getLogger(__name__)

_MAX_INFO = 512
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class BindJob:
    """A SCHEDULED session whose kernel must be created on its agent."""

    session_id: uuid.UUID
    kernel_id: uuid.UUID
    agent_id: str  # RPCs go to its current address (agents.address), read at each call
    # the planned per-device placement (slot -> device -> canonical decimal, the kernel
    # row's allocation): the create request carries it and the agent takes it as is
    plan: Mapping[str, Mapping[str, str]] | None = field(default=None, compare=False)


@dataclass(slots=True)
class AppliedPlan:
    jobs: list[BindJob] = field(default_factory=list)
    conflicts: set[str] = field(default_factory=set)  # agents whose CAS failed

    @property
    def placed(self) -> int:
        return len(self.jobs)


_CHUNK = 500  # rows per IN list / VALUES list (SQLite and asyncpg bind-parameter limits)


def _allocation_json(assignment: Assignment) -> dict[str, dict[str, str]]:
    return {
        slot: {device: canonical_decimal(amount) for device, amount in per_device.items()}
        for slot, per_device in assignment.kernel_allocation.items()
    }


def clip_info(text: str) -> str:
    """``status_info`` is at most 1,024 characters."""
    return text if len(text) <= _MAX_INFO else text[: _MAX_INFO - 3] + "..."


def _chunks(items: Sequence[_T], size: int = _CHUNK) -> Iterator[Sequence[_T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


async def _lock_pending(
    db: AsyncSession, ids: Sequence[uuid.UUID]
) -> dict[str, tuple[str, ResourceSlot, dict[str, Any]]]:
    """``{session id: (image, requested_slots, status_data)}`` of those still PENDING,
    locked for this transaction (PostgreSQL row locks; SQLite holds the write lock)."""
    table = _sessions()
    found: dict[str, tuple[str, ResourceSlot, dict[str, Any]]] = {}
    for chunk in _chunks(sorted(ids)):
        rows = await db.execute(
            sa.select(
                table.c.id,
                table.c.status,
                table.c.image,
                table.c.requested_slots,
                table.c.status_data,
            )
            .where(table.c.id.in_(chunk))
            .with_for_update()
        )
        for sid, status, image, requested, data in rows:
            if status is SessionStatus.PENDING:
                found[str(sid)] = (image, requested, dict(data or {}))
    return found


async def _compare_and_set(db: AsyncSession, seen: Mapping[str, int]) -> set[str]:
    """Bump the revision of every agent still at the revision ``seen``; the ones bumped."""
    table = cast(sa.Table, Agent.__table__)
    won: set[str] = set()
    for chunk in _chunks(sorted(seen)):
        result = await db.execute(
            sa.update(table)
            .where(
                sa.tuple_(table.c.id, table.c.occupancy_revision).in_(
                    [(agent_id, seen[agent_id]) for agent_id in chunk]
                )
            )
            .values(occupancy_revision=table.c.occupancy_revision + 1)
            .returning(table.c.id)
        )
        won.update(agent_id for (agent_id,) in result)
    return won


async def _recompute_occupancy(db: AsyncSession, agent_ids: Sequence[str]) -> None:
    """``agents.occupied_slots`` = the sum over their resource-occupying kernels."""
    totals = await occupied_by_agent(db, agent_ids)
    table = cast(sa.Table, Agent.__table__)
    await db.execute(
        sa.update(table)
        .where(table.c.id == sa.bindparam("b_id"))
        .values(occupied_slots=sa.bindparam("b_slots", type_=table.c.occupied_slots.type)),
        [{"b_id": agent_id, "b_slots": total} for agent_id, total in totals.items()],
    )


def _sessions() -> sa.Table:
    return cast(sa.Table, Session.__table__)


def _kernels() -> sa.Table:
    return cast(sa.Table, Kernel.__table__)


async def apply_plan(
    db: AsyncSession, loaded: LoadedSnapshot, plan: SchedulingPlan, now: datetime
) -> AppliedPlan:
    """Apply the plan's placements (see the module docstring); failures are not written."""
    applied = AppliedPlan()
    by_agent = plan.by_agent()
    if not by_agent:
        return applied
    pending = await _lock_pending(db, [uuid.UUID(a.session_id) for a in plan.assignments])
    live = {
        agent_id: [a for a in assigned if a.session_id in pending]
        for agent_id, assigned in by_agent.items()
    }
    live = {agent_id: assigned for agent_id, assigned in live.items() if assigned}
    if not live:
        return applied
    won = await _compare_and_set(db, {a: loaded.agent_revisions[a] for a in live})
    for agent_id in sorted(set(live) - won):
        log.info("agent %s changed during the pass; its placements wait", agent_id)
        applied.conflicts.add(agent_id)
    kernel_rows: list[dict[str, Any]] = []
    session_params: list[dict[str, Any]] = []
    history_rows: list[dict[str, Any]] = []
    for agent_id in sorted(won):
        url = loaded.agent_urls[agent_id]
        reason = f"scheduled on agent {agent_id}"
        info = clip_info(reason)
        for a in live[agent_id]:
            image, requested, data = pending[a.session_id]
            sid = uuid.UUID(a.session_id)
            kernel_id = uuid.uuid4()
            planned = _allocation_json(a)
            kernel_rows.append(
                {
                    "id": kernel_id,
                    "session_id": sid,
                    "cluster_role": "main",
                    "cluster_idx": 1,
                    "agent_id": agent_id,
                    "agent_address": url,
                    "image": image,
                    "requested_slots": requested,
                    "occupied_slots": a.requested_slots,
                    "allocation": planned,
                    "status": SessionStatus.SCHEDULED,
                    "status_info": info,
                    "status_data": {},
                    "status_changed_at": now,
                    "service_ports": [],
                    "created_at": now,
                }
            )
            data["scheduler"] = {
                **(data.get("scheduler") or {}),
                "last_try": now.isoformat(),
                "passed_predicates": [{"name": r.name} for r in a.passed_predicates],
                "failed_predicates": [],
                "msg": f"Scheduled on agent {agent_id}",
                "agents": [],
                "kind": "scheduled",
            }
            session_params.append(
                {
                    "b_id": sid,
                    "b_agent": agent_id,
                    "b_occupied": a.requested_slots,
                    "b_data": data,
                    "b_info": info,
                }
            )
            history_rows.append(
                {
                    "session_id": sid,
                    "from_status": SessionStatus.PENDING,
                    "to_status": SessionStatus.SCHEDULED,
                    "reason": info,
                    "changed_at": now,
                }
            )
            applied.jobs.append(BindJob(sid, kernel_id, agent_id, planned))
    if not applied.jobs:
        return applied
    sessions = _sessions()
    await db.execute(
        sa.update(sessions)
        .where(sessions.c.id == sa.bindparam("b_id"), sessions.c.status == SessionStatus.PENDING)
        .values(
            status=SessionStatus.SCHEDULED,
            agent_id=sa.bindparam("b_agent"),
            occupied_slots=sa.bindparam("b_occupied", type_=sessions.c.occupied_slots.type),
            status_data=sa.bindparam("b_data", type_=sessions.c.status_data.type),
            status_info=sa.bindparam("b_info"),
            status_changed_at=now,
            scheduled_at=now,
        ),
        session_params,
    )
    await db.execute(sa.insert(_kernels()), kernel_rows)
    await db.execute(sa.insert(cast(sa.Table, SessionStatusHistory.__table__)), history_rows)
    await _recompute_occupancy(db, sorted(won))
    return applied
