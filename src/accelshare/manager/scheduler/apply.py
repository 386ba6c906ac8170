"""Apply a plan in the pass's transaction, with an optimistic check per agent.

For each agent that got sessions, inside a SAVEPOINT:

1. every assigned session still PENDING (``SELECT ... FOR UPDATE``; a session cancelled
   since the snapshot is skipped) moves to SCHEDULED with the agent recorded, a
   status-history row, and a kernel row holding the *planned* per-device placement
   (so the next pass counts it even before the agent creates the kernel);
2. the agent's ``occupied_slots`` is recomputed from its resource-occupying kernels
   and written with a compare-and-set on ``occupancy_revision``
   (``WHERE occupancy_revision = <seen in the snapshot>``).  Zero rows means a release
   or another scheduler moved first: the savepoint rolls back, those sessions stay
   PENDING untouched, and the caller runs another pass.  Resources are never given
   twice, whatever the interleaving.

Sessions left pending get ``status_info`` and ``status_data.scheduler`` (one
``executemany``), guarded by ``status = 'PENDING'``.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from accelshare.common import ResourceSlot, canonical_decimal
from accelshare.sched.lifecycle import SessionStatus
from accelshare.sched.plan import Assignment, SchedulingPlan

from ..models import Agent, Kernel, Session
from ..transitions import OCCUPYING, change_status
from .snapshot import LoadedSnapshot

__all__ = ["AppliedPlan", "BindJob", "apply_plan"]

log = logging.getLogger(__name__)

_MAX_INFO = 512


@dataclass(frozen=True, slots=True)
class BindJob:
    """A SCHEDULED session whose kernel must be created on its agent."""

    session_id: uuid.UUID
    kernel_id: uuid.UUID
    agent_id: str  # RPCs go to its current address (agents.address), read at each call


@dataclass(slots=True)
class AppliedPlan:
    jobs: list[BindJob] = field(default_factory=list)
    conflicts: set[str] = field(default_factory=set)  # agents whose CAS failed

    @property
    def placed(self) -> int:
        return len(self.jobs)


class _Conflict(Exception):
    pass


def _device_allocs_json(assignment: Assignment) -> dict[str, dict[str, str]]:
    return {
        slot: {device: canonical_decimal(amount) for device, amount in per_device.items()}
        for slot, per_device in assignment.device_allocs.items()
    }


async def _apply_agent(
    db: AsyncSession,
    loaded: LoadedSnapshot,
    agent_id: str,
    assigned: list[Assignment],
    rows: dict[str, Session],
    now: datetime,
) -> list[BindJob]:
    url = loaded.agent_urls[agent_id]
    jobs: list[BindJob] = []
    for a in assigned:
        row = rows.get(a.session_id)
        if row is None or row.status is not SessionStatus.PENDING:
            continue
        kernel = Kernel(
            id=uuid.uuid4(),
            session_id=row.id,
            agent_id=agent_id,
            agent_address=url,
            image=row.image,
            requested_slots=row.requested_slots,
            occupied_slots=a.requested_slots,
            device_allocs=_device_allocs_json(a),
            status=SessionStatus.PENDING,
            created_at=now,
        )
        db.add(kernel)
        row.agent_id = agent_id
        row.occupied_slots = a.requested_slots
        data = dict(row.status_data or {})
        data["scheduler"] = {
            **(data.get("scheduler") or {}),
            "last_try": now.isoformat(),
            "passed_predicates": [{"name": r.name} for r in a.passed_predicates],
            "failed_predicates": [],
            "msg": f"Scheduled on agent {agent_id}",
            "agents": [],
            "kind": "scheduled",
        }
        row.status_data = data
        await change_status(
            db,
            row,
            SessionStatus.SCHEDULED,
            reason=f"scheduled on agent {agent_id}",
            now=now,
            kernels=[kernel],
        )
        jobs.append(BindJob(row.id, kernel.id, agent_id))
    if not jobs:
        return []
    await db.flush()
    total = ResourceSlot()
    for (slots,) in await db.execute(
        sa.select(Kernel.occupied_slots).where(
            Kernel.agent_id == agent_id, Kernel.status.in_(OCCUPYING)
        )
    ):
        total = total + slots
    seen = loaded.agent_revisions[agent_id]
    result = await db.execute(
        sa.update(Agent)
        .where(Agent.id == agent_id, Agent.occupancy_revision == seen)
        .values(occupied_slots=total, occupancy_revision=seen + 1)
        .execution_options(synchronize_session=False)
    )
    if getattr(result, "rowcount", 0) != 1:
        raise _Conflict(agent_id)
    return jobs


async def apply_plan(
    db: AsyncSession, loaded: LoadedSnapshot, plan: SchedulingPlan, now: datetime
) -> AppliedPlan:
    applied = AppliedPlan()
    by_agent = plan.by_agent()
    if by_agent:
        ids = [uuid.UUID(a.session_id) for a in plan.assignments]
        rows = {
            str(r.id): r
            for r in (
                await db.execute(sa.select(Session).where(Session.id.in_(ids)).with_for_update())
            ).scalars()
        }
        for agent_id in sorted(by_agent):
            try:
                async with db.begin_nested():
                    applied.jobs.extend(
                        await _apply_agent(db, loaded, agent_id, by_agent[agent_id], rows, now)
                    )
            except _Conflict:
                log.info("agent %s changed during the pass; its placements wait", agent_id)
                applied.conflicts.add(agent_id)
    if plan.failures:
        params: list[dict[str, Any]] = []
        for failure in plan.failures:
            data = dict(loaded.status_data.get(failure.session_id) or {})
            data["scheduler"] = failure.scheduler_data(now)
            info = failure.msg if len(failure.msg) <= _MAX_INFO else failure.msg[:509] + "..."
            params.append({"b_id": uuid.UUID(failure.session_id), "b_info": info, "b_data": data})
        table = cast(sa.Table, Session.__table__)
        await db.execute(
            sa.update(table)
            .where(table.c.id == sa.bindparam("b_id"), table.c.status == SessionStatus.PENDING)
            .values(status_info=sa.bindparam("b_info"), status_data=sa.bindparam("b_data")),
            params,
        )
    return applied
