"""The entry point: :func:`load_snapshot`, one scaling group's snapshot in one transaction."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncSession

from accelshare.common import SlotTypes
from accelshare.sched.pickers import PickerName
from accelshare.sched.snapshot import SchedulerOptions, SchedulingSnapshot

from ...models import ScalingGroup
from .agents import load_agents
from .cache import SnapshotCache, Texts
from .context import predicate_context
from .pending import load_pending

__all__ = ["LoadedSnapshot", "load_snapshot"]


@dataclass(frozen=True, slots=True)
class LoadedSnapshot:
    """The snapshot, and each agent's ``occupancy_revision`` (the apply's optimistic
    check) and address."""

    snapshot: SchedulingSnapshot
    agent_revisions: Mapping[str, int]
    agent_urls: Mapping[str, str]


async def load_snapshot(
    db: AsyncSession,
    scaling_group: ScalingGroup,
    *,
    now: datetime,
    known: Mapping[str, SlotTypes],
    options: SchedulerOptions,
    last_roundrobin_agent: str | None = None,
    cache: SnapshotCache | None = None,
    unwritten_retries: Callable[[str], int] | None = None,
) -> LoadedSnapshot:
    """The group's snapshot; ``cache`` (the group's, kept by the caller between passes)
    saves re-parsing rows whose stored text did not change (see :mod:`.cache`);
    ``unwritten_retries(session_id)``: failed attempts counted by passes whose
    explanations are not written yet (:mod:`accelshare.manager.scheduler.explanations`),
    added to the stored ones."""
    cache = cache if cache is not None else SnapshotCache()
    texts = Texts(cache.texts)
    agents, revisions, urls = await load_agents(db, scaling_group.name, cache, texts)
    pending = await load_pending(
        db,
        scaling_group,
        cache,
        texts,
        unwritten_retries,
        with_retries=options.picker is PickerName.FIFO and options.num_retries_to_skip > 0,
    )
    ctx, by_key = await predicate_context(db, pending, now, known, texts, options)
    cache.texts = texts.used
    snapshot = SchedulingSnapshot(
        scaling_group=scaling_group.name,
        now=now,
        agents=tuple(agents),
        pending=tuple(pending),
        options=options,
        predicate_context=ctx,
        occupancy_by_access_key=by_key,
        last_roundrobin_agent=last_roundrobin_agent,
    )
    return LoadedSnapshot(snapshot, revisions, urls)
