r"""The group's ALIVE, schedulable agents as :class:`~accelshare.sched.snapshot.AgentSnapshot`\ s.

Every pass reads every agent's revisions (:func:`agent_heads`); its own parsed columns
(slots, runtime, architecture, images, heartbeat views: 13 kB per agent of 8 GPUs and 64
cores) only when its ``views_revision`` moved, which a database trigger bumps on any
change of them (:mod:`accelshare.manager.models.triggers`), whoever writes.  Its
*occupied* totals are recomputed from its resource-occupying kernels (:mod:`.held`) and
its per-device maps rebuilt from its heartbeat views and those kernels
(:mod:`.device_maps`).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from accelshare.common import Allocation, ResourceSlot
from accelshare.sched.model import AgentState
from accelshare.sched.snapshot import AgentSnapshot

from ...models import Agent, AgentHeldRevision, AgentStatus, Kernel
from .cache import SnapshotCache, Texts, keep_current
from .device_maps import ReportedViews, add_alloc, map_states, parse_alloc
from .held import NO_HELD, Held, read_held_texts
from .stored import json_text, parse_slots, raw

__all__ = ["AgentColumns", "agent_heads", "load_agents"]


@dataclass(frozen=True, slots=True, eq=False)
class AgentColumns:
    """An agent's parsed columns as of one ``views_revision`` (compared by identity: a
    new revision is a new object)."""

    available_slots: ResourceSlot
    runtime: str
    architecture: str
    images: frozenset[str]
    views: ReportedViews


def agent_heads(dialect: str, scaling_group: str) -> sa.Select[Any]:
    """The group's ALIVE, schedulable agents: id, ``views_revision``,
    ``first_contact_at`` (a row deleted and made again differs), ``occupancy_revision``,
    address and, on SQLite, the revision of their held kernels (0: never written)."""
    columns: list[Any] = [
        Agent.id,
        Agent.views_revision,
        raw(Agent.first_contact_at),
        Agent.occupancy_revision,
        Agent.address,
    ]
    if dialect == "sqlite":
        columns.append(sa.func.coalesce(AgentHeldRevision.revision, 0))
    query = sa.select(*columns)
    if dialect == "sqlite":
        query = query.outerjoin(AgentHeldRevision, AgentHeldRevision.agent_id == Agent.id)
    return query.where(
        Agent.scaling_group == scaling_group,
        Agent.status == AgentStatus.ALIVE,
        Agent.is_schedulable.is_(True),
    ).order_by(Agent.id)


async def _agent_inputs(
    db: AsyncSession, heads: Sequence[Sequence[Any]], cache: SnapshotCache
) -> dict[str, AgentColumns]:
    """Each agent's :class:`AgentColumns`: the previous pass's while its
    ``(views_revision, first_contact_at)`` is the one it was read at, else read and
    parsed (in chunks of 500 ids, in the snapshot's transaction)."""
    cache.inputs, stale = keep_current(
        cache.inputs, ((head[0], (head[1], head[2])) for head in heads)
    )
    for start in range(0, len(stale), 500):
        rows = await db.execute(
            sa.select(
                Agent.id,
                Agent.views_revision,
                raw(Agent.first_contact_at),
                json_text(Agent.available_slots),
                Agent.runtime,
                Agent.architecture,
                json_text(Agent.images),
                json_text(Agent.map_views),
            ).where(Agent.id.in_(stale[start : start + 500]))
        )
        for agent_id, revision, first_contact, slots, runtime, arch, images, views in rows:
            cache.inputs[agent_id] = (
                (revision, first_contact),
                AgentColumns(
                    parse_slots(json.loads(slots or "null")),
                    runtime or "process",
                    arch,
                    frozenset(json.loads(images or "null") or ()),
                    ReportedViews.parse(views),
                ),
            )
    return {agent_id: entry[1] for agent_id, entry in cache.inputs.items()}


async def load_agents(
    db: AsyncSession, scaling_group: str, cache: SnapshotCache, texts: Texts
) -> tuple[list[AgentSnapshot], dict[str, int], dict[str, str]]:
    """The group's agents' snapshots (in id order), and each agent's
    ``occupancy_revision`` and address.  An agent's snapshot is the previous pass's
    while its columns, its held kernels' text and which of its reported kernels the
    manager has rows for are the same."""
    # Every agent's revisions; its parsed columns (13 kB of heartbeat views per agent
    # of 8 GPUs and 64 cores) only when its views_revision moved: the database bumps it
    # whenever one of them changes (models.triggers), for any writer.
    agents = list(await db.execute(agent_heads(db.get_bind().dialect.name, scaling_group)))
    if not agents:
        cache.clear()
        return [], {}, {}
    inputs = await _agent_inputs(db, agents, cache)
    # the group's resource-occupying kernels, by a join (not an IN list of thousands of
    # agent ids), one row per agent: the database joins each kernel's id and stored
    # texts into one string (:mod:`.held`), the cache key, parsed only when it changed
    # (not a Python row per kernel)
    held_texts = await read_held_texts(db, scaling_group, agents, cache)
    held = {a: texts.get_raw("held", t, Held.parse) for a, t in held_texts.items()}
    views = {a.id: inputs[a.id].views for a in agents}
    # which reported kernels the manager has a row for: those the agent holds (just
    # read) and, looked up, the others (ended ones, moved ones, or strangers the agent
    # runs on its own)
    known: set[str] = set()
    unheld_ids: set[str] = set()
    for agent_id, parsed_views in views.items():
        holds = held.get(agent_id, NO_HELD).ids
        known.update(parsed_views.kernels & holds)
        unheld_ids.update(parsed_views.kernels - holds)
    unheld = sorted(u for u in map(_as_uuid, unheld_ids) if u is not None)
    for start in range(0, len(unheld), 500):
        chunk = unheld[start : start + 500]
        known.update(
            str(k) for (k,) in await db.execute(sa.select(Kernel.id).where(Kernel.id.in_(chunk)))
        )
    known_kernels = frozenset(known)
    snapshots = []
    previous = cache.agents
    cache.agents = {}
    for agent_id, *_ in agents:
        shapes = held.get(agent_id, NO_HELD).shapes
        parsed = views[agent_id]
        columns = inputs[agent_id]
        key = (columns, held_texts.get(agent_id), parsed.kernels & known_kernels)
        entry = previous.get(agent_id)
        if entry is not None and entry[0] == key:
            cache.hits += 1
            snapshot = entry[1]
        else:
            cache.misses += 1
            allocs: Allocation = {}
            for (_, k_allocs), count in shapes.items():
                add_alloc(allocs, texts.get("alloc", k_allocs, parse_alloc), count)
            occupied = ResourceSlot.sum_of(
                (texts.get("slots", k_slots, parse_slots), count)
                for (k_slots, _), count in shapes.items()
            )
            snapshot = AgentSnapshot(
                AgentState(
                    agent_id,
                    columns.available_slots,
                    occupied,
                    scaling_group,
                    runtime=columns.runtime,
                    architecture=columns.architecture,
                    images=columns.images,
                ),
                map_states(parsed.maps, allocs, known_kernels),
            )
        cache.agents[agent_id] = (key, snapshot)
        snapshots.append(snapshot)
    return (
        snapshots,
        {a.id: a.occupancy_revision for a in agents},
        {a.id: a.address for a in agents},
    )


def _as_uuid(value: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(value)
    except ValueError:
        return None
