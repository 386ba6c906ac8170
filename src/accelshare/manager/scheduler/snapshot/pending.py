r"""The group's PENDING sessions as :class:`~accelshare.sched.model.PendingSession`\ s.

Every pass reads the pending sessions' ids and ``sched_revision`` in FIFO order; a
session's other columns only when its ``sched_revision`` moved (bumped by the database
on any change of them, :mod:`accelshare.manager.models.triggers`).  A session is built
again only when its row, its dependencies, its image's requirement or the group's
default fragmentation option changed; its retries are read only when the picker orders
by them.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from accelshare.sched.images import ImageRequirement
from accelshare.sched.lifecycle import SessionStatus
from accelshare.sched.model import PendingSession

from ...images import requirement_of
from ...models import Image, ScalingGroup, Session, SessionDependency
from .cache import SnapshotCache, Texts, keep_current
from .stored import json_text, parse_slots, raw

__all__ = ["load_pending"]


async def load_pending(
    db: AsyncSession,
    scaling_group: ScalingGroup,
    cache: SnapshotCache,
    texts: Texts,
    unwritten: Callable[[str], int] | None = None,
    with_retries: bool = True,
) -> list[PendingSession]:
    """The group's PENDING sessions in FIFO order; ``unwritten(session_id)``: failed
    attempts not written yet, added to the stored retries when ``with_retries``."""
    # Core on the session's connection (no ORM row processing); of ``status_data`` only
    # ``scheduler.retries`` is read, by the database, and only ``with_retries`` (the
    # picker orders by it: fifo with num_retries_to_skip; otherwise no decision reads it
    # and the explanations add theirs in SQL), so the (large) documents are not parsed.
    # JSON columns, times and enums come as stored and ids as stored (SQLite: hex
    # strings), the cache key: parsed only for a row not seen as is.
    t = cast(sa.Table, Session.__table__)
    conn = await db.connection()
    retries_column = (
        t.c.status_data[("scheduler", "retries")].as_integer()
        if with_retries
        else sa.literal(0, sa.Integer())
    )
    # every pass: the pending sessions' ids and sched_revision, in FIFO order, from the
    # covering index alone (without retries); their other columns only for rows not
    # read before at that revision (bumped by the database on any change of them,
    # models.triggers), in chunks of 500 ids
    heads = (
        await conn.execute(
            sa.select(raw(t.c.id), t.c.sched_revision, retries_column)
            .where(t.c.scaling_group == scaling_group.name, t.c.status == SessionStatus.PENDING)
            .order_by(t.c.created_at, t.c.id)
        )
    ).all()  # fetched at once (iterating fetches row by row through the async adapter)
    cache.rows, stale = keep_current(cache.rows, ((sid, revision) for sid, revision, _ in heads))
    for start in range(0, len(stale), 500):
        chunk = [_uuid(sid) for sid in stale[start : start + 500]]
        for fetched in await conn.execute(
            sa.select(
                raw(t.c.id),
                t.c.sched_revision,
                t.c.access_key,
                json_text(t.c.requested_slots),
                raw(t.c.created_at),
                raw(t.c.user_id),
                raw(t.c.group_id),
                t.c.domain_name,
                t.c.name,
                t.c.priority,
                raw(t.c.session_type),
                raw(t.c.starts_at),
                json_text(t.c.resource_opts),
                t.c.designated_agent_id,
                t.c.image,
            ).where(t.c.id.in_(chunk))
        ):
            cache.rows[fetched[0]] = (fetched[1], tuple(fetched))
    cached_rows = cache.rows
    deps: dict[Any, list[str]] = {}
    if heads:  # the pending sessions' by a join from the (small) dependencies table: not
        # IN lists of thousands of ids, nor an IN subquery (which reads every pending id
        # again to find the few sessions with dependencies)
        dep_rows = await conn.execute(
            sa.select(raw(SessionDependency.session_id), SessionDependency.depends_on)
            .join(t, t.c.id == SessionDependency.session_id)
            .where(t.c.scaling_group == scaling_group.name, t.c.status == SessionStatus.PENDING)
        )
        for sid, dep in dep_rows:
            deps.setdefault(sid, []).append(str(dep))
    default_frag = bool(
        (scaling_group.scheduler_opts or {}).get("allow_fractional_resource_fragmentation", True)
    )
    catalogue: dict[str, ImageRequirement] = {}
    wanted = {entry[1][-1] for entry in cached_rows.values()}
    if wanted:
        for image in (await db.execute(sa.select(Image).where(Image.ref.in_(wanted)))).scalars():
            fresh = requirement_of(image)
            known = cache.catalogue.get(image.ref)
            # the previous pass's object when equal: the rows' keys below then compare
            # by identity (a dataclass __eq__ per pending row otherwise)
            catalogue[image.ref] = known if known is not None and known == fresh else fresh
    cache.catalogue = catalogue
    parse = _RawColumns.of(t, conn.dialect)
    pending = []
    previous = cache.pending
    cache.pending = {}
    current = cache.pending
    hits = 0
    no_deps: tuple[str, ...] = ()
    # Fast path: with the inputs beyond the rows as in the last pass and no retries read,
    # an entry of the last pass at the revision just read has the key this pass would
    # build (its dependencies and image requirement come from those equal inputs, its
    # other columns are the revision's): taken as is, without building the key.
    inputs = (with_retries, default_frag, deps, catalogue)  # (retries: read or all 0)
    fast = not with_retries and cache.pending_inputs == inputs
    cache.pending_inputs = inputs
    for sid, head_revision, stored_retries in heads:
        if fast:
            entry = previous.get(sid)
            if entry is not None and entry[0][0] == head_revision:
                hits += 1
                current[sid] = entry
                pending.append(entry[1])
                continue
        found = cached_rows.get(sid)
        if found is None:  # (a row gone between the two reads)
            continue
        revision, row = found
        retries = int(stored_retries or 0)
        requirement = catalogue.get(row[-1])
        dependencies = tuple(sorted(deps[sid])) if sid in deps else no_deps
        entry = previous.get(sid)
        key = (revision, dependencies, requirement, default_frag)
        if entry is not None and entry[0] == key:
            hits += 1
            session = entry[1]
            if session.retries != retries:
                session = _with_retries(session, retries)
                entry = (key, session)
        else:
            cache.misses += 1
            session = _pending_session(
                row, retries, dependencies, requirement, default_frag, texts, parse
            )
            entry = (key, session)
        current[sid] = entry
        # (only when read: otherwise no decision reads retries, and the object the
        # cache hands stays the same, which the planner's memo keys by)
        if with_retries and unwritten is not None and (extra := unwritten(session.id)):
            session = _with_retries(session, session.retries + extra)
        pending.append(session)
    cache.hits += hits
    return pending


@dataclass(frozen=True, slots=True)
class _RawColumns:
    """The result processing of the columns :func:`load_pending` reads as stored (applied
    on a cache miss only): the times' and the session type's."""

    created_at: Callable[[Any], Any]
    starts_at: Callable[[Any], Any]
    session_type: Callable[[Any], Any]

    @classmethod
    def of(cls, table: sa.Table, dialect: sa.Dialect) -> _RawColumns:
        def processor(column: str) -> Callable[[Any], Any]:
            process = table.c[column].type.dialect_impl(dialect).result_processor(dialect, None)
            return process if process is not None else (lambda value: value)

        return cls(processor("created_at"), processor("starts_at"), processor("session_type"))


def _uuid(raw: Any) -> uuid.UUID:
    return raw if isinstance(raw, uuid.UUID) else uuid.UUID(str(raw))


def _with_retries(s: PendingSession, retries: int) -> PendingSession:
    # positional, not dataclasses.replace (which introspects the fields every call)
    return PendingSession(
        s.id,
        s.access_key,
        s.requested_slots,
        s.created_at,
        s.user_id,
        s.group_id,
        s.domain_name,
        s.name,
        s.priority,
        s.session_type,
        s.starts_at,
        s.dependencies,
        retries,
        s.allow_fragmentation,
        s.designated_agent,
        s.image,
    )


def _pending_session(
    row: Any,
    retries: int,
    dependencies: tuple[str, ...],
    image: ImageRequirement | None,
    default_frag: bool,
    texts: Texts,
    parse: _RawColumns,
) -> PendingSession:
    (
        sid,
        _,
        access_key,
        requested,
        created_at,
        user_id,
        group_id,
        domain_name,
        name,
        priority,
        session_type,
        starts_at,
        opts,
        designated,
        _,
    ) = row
    opts_doc = json.loads(opts or "null")
    frag = (opts_doc if isinstance(opts_doc, dict) else {}).get(
        "allow_fractional_resource_fragmentation", default_frag
    )
    return PendingSession(
        id=str(_uuid(sid)),
        access_key=access_key,
        requested_slots=texts.get("slots", requested, parse_slots),
        created_at=parse.created_at(created_at),
        user_id=str(_uuid(user_id)),
        group_id=str(_uuid(group_id)),
        domain_name=domain_name,
        name=name,
        priority=priority,
        session_type=parse.session_type(session_type),
        starts_at=parse.starts_at(starts_at),
        dependencies=dependencies,
        retries=retries,
        allow_fragmentation=bool(frag),
        designated_agent=designated,
        image=image,
    )
