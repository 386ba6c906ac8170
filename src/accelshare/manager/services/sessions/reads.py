"""Reading sessions: look-ups by id or name, a session's JSON, the lists, the status
history, the logs, why a session waits, and its status events.

A session is named by its id or by its owner's session name (the caller's own, or
``owner_access_key``'s for admins); a session the caller may not see
(:func:`.views.visible`) is "not found".
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from accelshare.common import ResourceSlot
from accelshare.sched.explain import explain
from accelshare.sched.lifecycle import FINAL_STATUSES, SessionStatus

from ...agent_client import AgentClient, AgentRPCError
from ...db import Database
from ...errors import NotFound, Unavailable
from ...hub import ChangeHub
from ...list_specs import SESSIONS
from ...models import Kernel, Session, SessionDependency, SessionStatusHistory
from ...querylang.compile_sql import filter_clause, order_clauses
from ...transitions import agent_addresses, session_kernels
from ..actor import Actor
from .views import (
    HistoryFields,
    KernelFields,
    iso,
    owner_emails,
    reported_ports_of,
    session_json,
    visibility_filter,
    visible,
)

__all__ = ["WAIT_POLL_S", "SessionReads", "live_by_name"]

WAIT_POLL_S = 0.5
"""How often a wait for a status change looks again without a publish (events, creates)."""

_OLDEST_FIRST = (Session.created_at, Session.id)
# an ended session's last change is its end (terminated, cancelled, failed)
_NEWEST_FIRST = (Session.status_changed_at.desc(), Session.created_at.desc(), Session.id.desc())

# The look-ups' statements (the create path's too), prebuilt: a statement built per call
# (and its cache key, computed per call) cost about as much on SQLite as running it.
_SESSION_BY_ID = sa.select(Session).where(Session.id == sa.bindparam("id"))
_HISTORY = (
    sa.select(SessionStatusHistory)
    .where(SessionStatusHistory.session_id == sa.bindparam("session_id"))
    .order_by(SessionStatusHistory.id)
)
_HISTORY_TIMES = (
    sa.select(SessionStatusHistory.to_status, SessionStatusHistory.changed_at)
    .where(SessionStatusHistory.session_id == sa.bindparam("session_id"))
    .order_by(SessionStatusHistory.id)
)
_DEPENDENCIES = sa.select(SessionDependency.depends_on).where(
    SessionDependency.session_id == sa.bindparam("session_id")
)
# A session's answer in Core rows (no ORM objects): the session with its kernels in one
# statement (one row per kernel, or one with NULL kernel columns), its history in another
_SESSIONS = cast(sa.Table, Session.__table__)
_KERNELS = cast(sa.Table, Kernel.__table__)
_KERNEL_FIELDS = (
    "id",
    "agent_id",
    "status",
    "container_id",
    "allocation",
    "occupied_slots",
    "service_ports",
)
_SESSION_WITH_KERNELS = (
    sa.select(_SESSIONS, *(_KERNELS.c[f].label(f"kernel_{f}") for f in _KERNEL_FIELDS))
    .select_from(_SESSIONS.outerjoin(_KERNELS, _KERNELS.c.session_id == _SESSIONS.c.id))
    .where(_SESSIONS.c.id == sa.bindparam("id"))
    .order_by(_KERNELS.c.cluster_idx)
)
_HISTORY_ROWS = (
    sa.select(
        SessionStatusHistory.from_status,
        SessionStatusHistory.to_status,
        SessionStatusHistory.reason,
        SessionStatusHistory.changed_at,
    )
    .where(SessionStatusHistory.session_id == sa.bindparam("session_id"))
    .order_by(SessionStatusHistory.id)
)


@dataclass(frozen=True, slots=True)
class _KernelRow:
    id: uuid.UUID
    agent_id: str | None
    status: SessionStatus
    container_id: str | None
    allocation: dict[str, dict[str, str]]
    occupied_slots: ResourceSlot
    service_ports: list[Any]


_LIVE_BY_NAME = (
    sa.select(Session)
    .where(
        Session.access_key == sa.bindparam("access_key"),
        Session.name == sa.bindparam("name"),
        Session.status.not_in(sorted(FINAL_STATUSES)),
    )
    .limit(1)
)


async def live_by_name(db: AsyncSession, access_key: str, name: str) -> Session | None:
    """The owner's live (not ended) session called ``name``, if any."""
    params = {"access_key": access_key, "name": name}
    return (await db.execute(_LIVE_BY_NAME, params)).scalar_one_or_none()


class SessionReads:
    """The session look-ups and reads; the other parts of the session service find
    their sessions here (:meth:`find`)."""

    def __init__(self, *, db: Database, client: AgentClient, hub: ChangeHub) -> None:
        self.db = db
        self.client = client
        self.hub = hub

    async def find(
        self, db: AsyncSession, caller: Actor, ref: str, owner_access_key: str | None
    ) -> Session:
        """The session ``ref`` names (an id, or a name of ``owner_access_key``'s or the
        caller's sessions: the live one, else the newest), if the caller may see it;
        otherwise ``NotFound``."""
        try:
            session_id = uuid.UUID(ref)
        except ValueError:
            session_id = None
        row: Session | None = None
        if session_id is not None:
            row = (await db.execute(_SESSION_BY_ID, {"id": session_id})).scalar_one_or_none()
        else:
            owner = owner_access_key or caller.access_key
            query = (
                sa.select(Session)
                .where(Session.name == ref, Session.access_key == owner)
                .order_by(Session.created_at.desc())
            )
            rows = list((await db.execute(query)).scalars())
            live = [r for r in rows if r.status not in FINAL_STATUSES]
            candidates = live or rows
            row = candidates[0] if candidates else None
        if row is None or not visible(caller, row):
            raise NotFound(
                f"No session {ref!r} that you can see",
                field="session",
                expected="the id or name of one of your sessions",
                received=ref,
            )
        return row

    async def resolve(
        self, caller: Actor, ref: str, owner_access_key: str | None = None
    ) -> uuid.UUID:
        async with self.db.begin() as db:
            return (await self.find(db, caller, ref, owner_access_key)).id

    async def get(
        self, caller: Actor, ref: str, owner_access_key: str | None = None
    ) -> dict[str, Any]:
        async with self.db.begin() as db:
            row = await self.find(db, caller, ref, owner_access_key)
            return await self.full_json(db, row)

    async def full_json(self, db: AsyncSession, row: Session) -> dict[str, Any]:
        """The session's JSON with its kernels, status history and dependencies."""
        kernels = await session_kernels(db, row.id)
        history = list((await db.execute(_HISTORY, {"session_id": row.id})).scalars())
        deps = list((await db.execute(_DEPENDENCIES, {"session_id": row.id})).scalars())
        return session_json(row, kernels, history, deps)

    async def current_json(
        self, session_id: uuid.UUID, *, dependencies: Sequence[uuid.UUID] | None = None
    ) -> dict[str, Any]:
        """:meth:`full_json` of the session as it is now, in a transaction of its own.

        Read as Core rows (no ORM objects, the kernels joined to the session); the
        dependencies are read unless given (a create that made none: only the enqueue
        adds dependencies)."""
        async with self.db.connect() as conn:
            rows = (await conn.execute(_SESSION_WITH_KERNELS, {"id": session_id})).all()
            if not rows:
                raise NotFound(
                    f"No session {session_id}", field="session", received=str(session_id)
                )
            history = cast(
                list[HistoryFields],
                (await conn.execute(_HISTORY_ROWS, {"session_id": session_id})).all(),
            )
            if dependencies is None:
                params = {"session_id": session_id}
                dependencies = list((await conn.execute(_DEPENDENCIES, params)).scalars())
        kernels: list[KernelFields] = [
            _KernelRow(
                r.kernel_id,
                r.kernel_agent_id,
                r.kernel_status,
                r.kernel_container_id,
                r.kernel_allocation,
                r.kernel_occupied_slots,
                r.kernel_service_ports,
            )
            for r in rows
            if r.kernel_id is not None
        ]
        return session_json(cast(Session, rows[0]), kernels, history, dependencies)

    async def list_sessions(
        self,
        caller: Actor,
        *,
        statuses: Iterable[SessionStatus] | None = None,
        access_key: str | None = None,
        limit: int = 100,
        offset: int = 0,
        newest_first: bool = False,
        filter: str | None = None,
        order: str | None = None,
    ) -> dict[str, Any]:
        """A page of the sessions the caller may see (a user: their own; an admin: the
        domain's; a superadmin: all), oldest first, or with ``newest_first`` the most
        recently changed first (the console's history of ended sessions).

        ``filter`` / ``order`` are Backend.AI's expressions over
        :data:`~.list_specs.SESSIONS` (:class:`~.querylang.QueryError` when bad); a
        given ``order`` replaces the default one."""
        wanted = (
            sorted(statuses)
            if statuses is not None
            else sorted(set(SessionStatus) - FINAL_STATUSES)
        )
        where = [visibility_filter(caller), Session.status.in_(wanted)]
        if access_key:
            where.append(Session.access_key == access_key)
        matching = filter_clause(filter, SESSIONS)
        if matching is not None:
            where.append(matching)
        if order is not None and order.strip():
            ordering = order_clauses(order, SESSIONS)
        else:
            ordering = list(_NEWEST_FIRST if newest_first else _OLDEST_FIRST)
        async with self.db.begin() as db:
            total = (
                await db.execute(sa.select(sa.func.count()).select_from(Session).where(*where))
            ).scalar_one()
            rows = (
                await db.scalars(
                    sa.select(Session).where(*where).order_by(*ordering).limit(limit).offset(offset)
                )
            ).all()
            ports = await reported_ports_of(db, [r.id for r in rows])
            emails = await owner_emails(db, rows)
            items = [
                session_json(r, reported_ports=ports.get(r.id))
                | {"ownerEmail": emails.get(r.user_id)}
                for r in rows
            ]
        return {"items": items, "total": total, "limit": limit, "offset": offset}

    async def status_history(
        self, caller: Actor, ref: str, owner_access_key: str | None = None
    ) -> dict[str, str]:
        """``{STATUS: when the session last entered it}`` (Backend.AI's ``status_history``
        shape: upper-case status names, ISO times) from the recorded status changes."""
        async with self.db.begin() as db:
            row = await self.find(db, caller, ref, owner_access_key)
            rows = (await db.execute(_HISTORY_TIMES, {"session_id": row.id})).all()
        return {status.value: iso(at) or "" for status, at in rows}

    async def logs(self, caller: Actor, ref: str, owner_access_key: str | None = None) -> str:
        async with self.db.begin() as db:
            row = await self.find(db, caller, ref, owner_access_key)
            kernels = await session_kernels(db, row.id)
            addresses = await agent_addresses(db, kernels)
        target = next((k for k in kernels if k.agent_id in addresses), None)
        if target is None or target.agent_id is None:
            return ""
        try:
            return await self.client.kernel_logs(addresses[target.agent_id], str(target.id))
        except AgentRPCError as e:
            if e.status_code == 404:
                return ""
            raise Unavailable(
                f"Cannot read the logs from agent {target.agent_id}: {e}",
                field="agent",
                received=target.agent_id,
            ) from e

    async def why(
        self, caller: Actor, ref: str, owner_access_key: str | None = None
    ) -> dict[str, Any]:
        async with self.db.begin() as db:
            row = await self.find(db, caller, ref, owner_access_key)
        data = (row.status_data or {}).get("scheduler") or {}
        return {
            "sessionId": str(row.id),
            "sessionName": row.name,
            "status": row.status.value,
            "statusInfo": row.status_info,
            "scheduler": data,
            "agents": list(data.get("agents") or []),
            "explanation": explain(row.status.value, row.status_info, data),
        }

    async def events(
        self,
        caller: Actor,
        ref: str,
        owner_access_key: str | None = None,
        *,
        keepalive_s: float = 15.0,
    ) -> AsyncIterator[dict[str, Any]]:
        """Every status change of the session (history first), until it is final."""
        session_id = await self.resolve(caller, ref, owner_access_key)
        return self._event_stream(session_id, keepalive_s)

    async def _event_stream(
        self, session_id: uuid.UUID, keepalive_s: float
    ) -> AsyncIterator[dict[str, Any]]:
        last_id = 0
        idle = 0.0
        while True:
            async with self.db.begin() as db:
                rows = list(
                    (
                        await db.execute(
                            sa.select(SessionStatusHistory)
                            .where(
                                SessionStatusHistory.session_id == session_id,
                                SessionStatusHistory.id > last_id,
                            )
                            .order_by(SessionStatusHistory.id)
                        )
                    ).scalars()
                )
            for h in rows:
                last_id = h.id
                yield {
                    "event": "status",
                    "sessionId": str(session_id),
                    "from": h.from_status.value if h.from_status else None,
                    "status": h.to_status.value,
                    "reason": h.reason,
                    "at": iso(h.changed_at),
                }
                if h.to_status in FINAL_STATUSES:
                    return
            if rows:
                idle = 0.0
            woke = await self.hub.wait(WAIT_POLL_S)
            if not woke:
                idle += WAIT_POLL_S
                if idle >= keepalive_s:
                    idle = 0.0
                    yield {"event": "keepalive"}
            await asyncio.sleep(0)
