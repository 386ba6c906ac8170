"""The agents' held kernels: what their resource-occupying kernels hold, read as one text.

The database joins an agent's resource-occupying kernels' ids and stored JSON texts into
one string (:func:`_held_text`), the cache key of the agent's occupancy and per-device
allocations, parsed (:class:`Held`) only when it changed.  The texts themselves are read
only for the agents whose held kernels changed since the last pass: PostgreSQL compares
a digest of the kernels' row versions, SQLite the agent's held revision
(``agent_held_revisions``, bumped by triggers on the kernels).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import aggregate_order_by
from sqlalchemy.ext.asyncio import AsyncSession

from ...models import Agent, AgentStatus, Kernel
from ...transitions import OCCUPYING
from .cache import SnapshotCache, keep_current
from .stored import json_text

__all__ = ["NO_HELD", "Held", "read_held_texts"]


_KERNEL_SEP = "\x1e"  # between kernels (never in JSON text: control characters are escaped)
_FIELD_SEP = "\x1f"  # between a kernel's id, occupied slots and device allocations


def _held_text(dialect: str) -> sa.ColumnElement[str]:
    """One agent's resource-occupying kernels as one string: ``id FS slots FS allocs``
    per kernel, joined by RS (in id order on PostgreSQL; SQLite's scan order, stable for
    unchanged rows — another order only costs a parse)."""
    row = (
        sa.cast(Kernel.id, sa.Text())
        + _FIELD_SEP
        + sa.func.coalesce(json_text(Kernel.occupied_slots), "null")
        + _FIELD_SEP
        + sa.func.coalesce(json_text(Kernel.allocation), "null")
    )
    if dialect == "postgresql":
        return sa.func.string_agg(row, aggregate_order_by(sa.literal(_KERNEL_SEP), Kernel.id))
    return sa.func.aggregate_strings(row, _KERNEL_SEP)


def _held_filter(scaling_group: str) -> tuple[sa.ColumnElement[bool], ...]:
    return (
        Agent.scaling_group == scaling_group,
        Agent.status == AgentStatus.ALIVE,
        Agent.is_schedulable.is_(True),
        Kernel.status.in_(OCCUPYING),
    )


async def read_held_texts(
    db: AsyncSession, scaling_group: str, agents: Sequence[Sequence[Any]], cache: SnapshotCache
) -> dict[str, str]:
    """Each agent's held kernels as :func:`_held_text` (agents holding none left out),
    read again only for the agents whose held kernels changed: by their row versions on
    PostgreSQL, by their held revision on SQLite (``agents``: the rows of
    :func:`~.agents.agent_heads`)."""
    if db.get_bind().dialect.name == "postgresql":
        return await _held_texts_by_version(db, scaling_group, cache)
    return await _held_texts_by_revision(db, scaling_group, agents, cache)


async def _held_texts_by_version(
    db: AsyncSession, scaling_group: str, cache: SnapshotCache
) -> dict[str, str]:
    """PostgreSQL: :func:`_held_text` per agent, read only for agents whose held kernels'
    row versions changed.  Every pass reads, per agent, an md5 of its held kernels'
    ``id:xmin`` pairs (``xmin``: the transaction that wrote the row version; any insert,
    update or change of status or agent makes a new one, and a kernel that stops
    holding leaves the set), which is cheap; the texts (``jsonb`` turned into text for
    every kernel, the expensive part) only where that digest moved."""
    version = sa.cast(Kernel.id, sa.Text()) + ":" + sa.literal_column("kernels.xmin::text")
    digests = {
        agent_id: digest
        for agent_id, digest in await db.execute(
            sa.select(
                Kernel.agent_id,
                sa.func.md5(
                    sa.func.string_agg(version, aggregate_order_by(sa.literal(","), Kernel.id))
                ),
            )
            .join(Agent, Agent.id == Kernel.agent_id)
            .where(*_held_filter(scaling_group))
            .group_by(Kernel.agent_id)
        )
        if agent_id is not None
    }
    cache.held_versions, stale = keep_current(cache.held_versions, digests.items())
    for start in range(0, len(stale), 500):
        chunk = stale[start : start + 500]
        for agent_id, digest, text in await db.execute(
            sa.select(
                Kernel.agent_id,
                sa.func.md5(
                    sa.func.string_agg(version, aggregate_order_by(sa.literal(","), Kernel.id))
                ),
                _held_text("postgresql"),
            )
            .join(Agent, Agent.id == Kernel.agent_id)
            .where(*_held_filter(scaling_group), Kernel.agent_id.in_(chunk))
            .group_by(Kernel.agent_id)
        ):
            if agent_id is not None:
                cache.held_versions[agent_id] = (digest, text)
    return {
        agent_id: text for agent_id, (_, text) in cache.held_versions.items() if text is not None
    }


async def _held_texts_by_revision(
    db: AsyncSession, scaling_group: str, agents: Sequence[Sequence[Any]], cache: SnapshotCache
) -> dict[str, str]:
    """SQLite: :func:`_held_text` per agent, read only for agents whose held revision
    (the last column of :func:`~.agents.agent_heads`; ``agent_held_revisions``, bumped by the
    kernels' triggers on every write of what the text is made of) moved.  An agent
    without held kernels is kept as ``None``, so it is not read again either."""
    cache.held_versions, stale = keep_current(
        cache.held_versions, ((head[0], head[-1]) for head in agents)
    )
    if stale:
        revisions = {head[0]: head[-1] for head in agents}
        for start in range(0, len(stale), 500):
            chunk = stale[start : start + 500]
            texts: dict[str, str | None] = dict.fromkeys(chunk)
            for held_by, held_text in await db.execute(
                sa.select(Kernel.agent_id, _held_text("sqlite"))
                .join(Agent, Agent.id == Kernel.agent_id)
                .where(*_held_filter(scaling_group), Kernel.agent_id.in_(chunk))
                .group_by(Kernel.agent_id)
            ):
                if held_by is not None:
                    texts[held_by] = held_text
            for agent_id, maybe in texts.items():
                cache.held_versions[agent_id] = (revisions[agent_id], maybe)
    return {
        agent_id: text for agent_id, (_, text) in cache.held_versions.items() if text is not None
    }


@dataclass(frozen=True, slots=True)
class Held:
    """An agent's held kernels parsed from :func:`_held_text`: their ids (canonical
    ``str(uuid)``) and how many hold each (slots text, allocations text) pair."""

    ids: frozenset[str]
    shapes: dict[tuple[str, str], int]

    @classmethod
    def parse(cls, text: str) -> Held:
        ids: set[str] = set()
        shapes: dict[tuple[str, str], int] = {}
        for kernel in text.split(_KERNEL_SEP):
            kernel_id, slots_text, allocs_text = kernel.split(_FIELD_SEP)
            ids.add(_uuid_text(kernel_id))
            shape = (slots_text, allocs_text)
            shapes[shape] = shapes.get(shape, 0) + 1
        return cls(frozenset(ids), shapes)


NO_HELD = Held(frozenset(), {})


def _uuid_text(raw: Any) -> str:
    """A kernel id as read with :func:`~.stored.raw` in the canonical ``str(uuid)`` form (SQLite
    stores 32 hex digits; PostgreSQL's driver returns a UUID object)."""
    if isinstance(raw, str) and len(raw) == 32:
        return f"{raw[:8]}-{raw[8:12]}-{raw[12:16]}-{raw[16:20]}-{raw[20:]}"
    return str(raw)
