"""The rows a grouped bind step reads and writes: Core statements, no ORM objects."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from accelshare.protocol import KernelReport

from ...models import Agent, Kernel, Session
from ..apply import BindJob
from .requests import allocations_json

__all__ = ["KERNEL_REPORT_UPDATE", "Loaded", "kernel_columns", "load_many"]

_SESSIONS = cast(sa.Table, Session.__table__)
_KERNELS = cast(sa.Table, Kernel.__table__)
_AGENTS = cast(sa.Table, Agent.__table__)
_CHUNK = 500  # ids per IN list (SQLite and asyncpg bind-parameter limits)

KERNEL_REPORT_UPDATE = (
    sa.update(_KERNELS)
    .where(_KERNELS.c.id == sa.bindparam("b_id"))
    .values(
        allocation=sa.bindparam("b_allocs", type_=_KERNELS.c.allocation.type),
        container_id=sa.bindparam("b_container"),
        service_ports=sa.bindparam("b_ports", type_=_KERNELS.c.service_ports.type),
    )
)


def kernel_columns(kernel: sa.Row[Any], report: KernelReport) -> dict[str, Any]:
    """``KERNEL_REPORT_UPDATE``'s parameters: what the report says about the kernel
    (its allocation, container id and service ports), else what the row has."""
    return {
        "b_id": kernel.id,
        "b_allocs": allocations_json(report) if report.allocations else kernel.allocation,
        "b_container": report.container_id or kernel.container_id,
        "b_ports": (
            [m.model_dump(mode="json") for m in report.service_ports]
            if report.service_ports
            else kernel.service_ports
        ),
    }


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
        "vfolder_mounts",
    )
]
_KERNEL_COLUMNS = [
    _KERNELS.c[name] for name in ("id", "session_id", "allocation", "container_id", "service_ports")
]
_AGENT_COLUMNS = [_AGENTS.c[name] for name in ("id", "address", "runtime", "images")]
# what the accept step reads: a session's status, an agent's address (the session's
# JSON columns and the agent's image list are parsed only where a request is built)
_SESSION_STATUS = [_SESSIONS.c.id, _SESSIONS.c.status]
_AGENT_ADDRESS = [_AGENTS.c.id, _AGENTS.c.address]


@dataclass(slots=True)
class Loaded:
    """What a grouped step reads (Core rows, no ORM objects): the sessions (locked),
    their kernels and their agents."""

    rows: dict[uuid.UUID, sa.Row[Any]]
    kernels: dict[uuid.UUID, list[sa.Row[Any]]]
    agents: dict[str, sa.Row[Any]]


async def load_many(db: AsyncSession, jobs: list[BindJob], *, requests: bool = True) -> Loaded:
    """The jobs' sessions (locked, ``SELECT ... FOR UPDATE``, in id order so that two
    transactions never lock in opposite orders) and their agents; ``requests``: all the
    session columns a create request needs (the prepare step), else the sessions' status,
    their kernels (what an accepted kernel's report may leave out) and the agents'
    address (the accept step)."""
    session_columns = _SESSION_COLUMNS if requests else _SESSION_STATUS
    agent_columns = _AGENT_COLUMNS if requests else _AGENT_ADDRESS
    ids = sorted({job.session_id for job in jobs})
    loaded = Loaded({}, {}, {})
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
