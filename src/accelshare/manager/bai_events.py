"""Backend.AI's session events: what ``GET /events/session`` streams (``backend.ai
session events``, ``events``, ``session watch``, the SDK's ``listen_events()``).

Every status change the manager records (``session_status_history``) becomes the events
Backend.AI sends for it, with its payload ``{"sessionId", "sessionName",
"ownerAccessKey", "reason", "exitCode"}`` (kernel events add ``"kernelId"`` and
``"clusterRole": "main"``)::

    PENDING      session_enqueued
    SCHEDULED    session_scheduled
    PREPARING    kernel_preparing            PULLING    kernel_pulling
    CREATING     kernel_creating
    RUNNING      kernel_started, session_started
    TERMINATING  kernel_terminating, session_terminating
    TERMINATED   kernel_terminated, then session_success or session_failure (a session
                 with a result: a batch session's exit code), then session_terminated
    CANCELLED    kernel_cancelled, session_cancelled

``scope`` keeps the ``session_*`` events, the ``kernel_*`` ones, or both (``*``).  One
session's stream starts with its history (a client that connects late still sees how it
got here) and ends after its final event with ``server_close`` (Backend.AI's client
reconnects to a stream that ends without it); the stream of all of a user's sessions
(``sessionName=*``) sends what happens from the moment it connects and stays open.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any, Literal

import sqlalchemy as sa

from accelshare.sched.lifecycle import FINAL_STATUSES, SessionResult, SessionStatus

from .db import Database
from .errors import InvalidRequest, PermissionDenied
from .hub import ChangeHub
from .models import Kernel, Session, SessionStatusHistory, UserRole
from .services.actor import Actor
from .services.sessions import SessionService

__all__ = ["SCOPES", "BackendAIEvents", "events_of"]

Scope = Literal["*", "session", "kernel"]
SCOPES = ("*", "session", "kernel")
POLL_S = 0.5

_S = SessionStatus
_SESSION_EVENTS: dict[SessionStatus, tuple[str, ...]] = {
    _S.PENDING: ("session_enqueued",),
    _S.SCHEDULED: ("session_scheduled",),
    _S.RUNNING: ("session_started",),
    _S.TERMINATING: ("session_terminating",),
    _S.TERMINATED: ("session_terminated",),
    _S.CANCELLED: ("session_cancelled",),
}
_KERNEL_EVENTS: dict[SessionStatus, tuple[str, ...]] = {
    _S.PREPARING: ("kernel_preparing",),
    _S.PULLING: ("kernel_pulling",),
    _S.CREATING: ("kernel_creating",),
    _S.RUNNING: ("kernel_started",),
    _S.TERMINATING: ("kernel_terminating",),
    _S.TERMINATED: ("kernel_terminated",),
    _S.CANCELLED: ("kernel_cancelled",),
}

_ROWS = (
    sa.select(
        SessionStatusHistory.id,
        SessionStatusHistory.to_status,
        SessionStatusHistory.reason,
        Session.id.label("session_id"),
        Session.name,
        Session.access_key,
        Session.exit_code,
        Session.result,
        sa.select(Kernel.id)
        .where(Kernel.session_id == Session.id)
        .order_by(Kernel.id)
        .limit(1)
        .scalar_subquery()
        .label("kernel_id"),
    )
    .join(Session, Session.id == SessionStatusHistory.session_id)
    .where(SessionStatusHistory.id > sa.bindparam("after"))
    .order_by(SessionStatusHistory.id)
    .limit(500)
)


def events_of(row: Any, scope: Scope) -> list[tuple[str, dict[str, Any]]]:
    """The Backend.AI events of one status change (see the module docstring)."""
    status: SessionStatus = row.to_status
    base = {
        "reason": row.reason or "",
        "sessionName": row.name,
        "ownerAccessKey": row.access_key,
        "sessionId": str(row.session_id),
        "exitCode": row.exit_code if status is _S.TERMINATED else None,
    }
    kernel = base
    if row.kernel_id is not None:
        kernel = {**base, "kernelId": str(row.kernel_id), "clusterRole": "main"}
    found: list[tuple[str, dict[str, Any]]] = []
    if scope in ("*", "kernel"):
        found += [(name, kernel) for name in _KERNEL_EVENTS.get(status, ())]
    if scope in ("*", "session"):
        if status is _S.TERMINATED and row.result is SessionResult.SUCCESS:
            found.append(("session_success", base))
        elif status is _S.TERMINATED and row.result is SessionResult.FAILURE:
            found.append(("session_failure", base))
        found += [(name, base) for name in _SESSION_EVENTS.get(status, ())]
    return found


class BackendAIEvents:
    def __init__(self, db: Database, hub: ChangeHub, sessions: SessionService) -> None:
        self.db = db
        self.hub = hub
        self.sessions = sessions

    async def open(
        self,
        caller: Actor,
        *,
        session_name: str | None,
        session_id: str | None,
        owner_access_key: str | None,
        scope: str,
        keepalive_s: float = 15.0,
    ) -> AsyncIterator[tuple[str, dict[str, Any]] | None]:
        """The stream's events, ``None`` for a keep-alive; what cannot be streamed (an
        unknown scope or session, another user's key) is refused before it starts."""
        if scope not in SCOPES:
            raise InvalidRequest(
                f"scope: expected one of {', '.join(SCOPES)}, received {scope!r}",
                field="scope",
                expected=" | ".join(SCOPES),
                received=scope,
            )
        checked: Scope = scope  # type: ignore[assignment]
        ref = session_id or session_name or "*"
        if ref == "*":
            key = owner_access_key or caller.access_key
            if key != caller.access_key and not caller.role.includes(UserRole.ADMIN):
                raise PermissionDenied(
                    "Only an admin may follow another user's sessions",
                    field="ownerAccessKey",
                    received=key,
                )
            # a domain admin follows the sessions of their own domain only
            domain = None if caller.role is UserRole.SUPERADMIN else caller.domain_name
            async with self.db.connect() as conn:
                start = await conn.scalar(sa.select(sa.func.max(SessionStatusHistory.id)))
            return self._follow(None, (key, domain), int(start or 0), checked, keepalive_s)
        target = await self.sessions.resolve(caller, ref, owner_access_key)
        return self._follow(target, None, 0, checked, keepalive_s)

    async def _follow(
        self,
        session_id: uuid.UUID | None,
        owner: tuple[str, str | None] | None,
        after: int,
        scope: Scope,
        keepalive_s: float,
    ) -> AsyncIterator[tuple[str, dict[str, Any]] | None]:
        query = _ROWS
        if session_id is not None:
            query = query.where(SessionStatusHistory.session_id == session_id)
        elif owner is not None:
            access_key, domain = owner
            query = query.where(Session.access_key == access_key)
            if domain is not None:
                query = query.where(Session.domain_name == domain)
        idle = 0.0
        while True:
            async with self.db.connect() as conn:
                rows: Sequence[Any] = (await conn.execute(query, {"after": after})).all()
            for row in rows:
                after = row.id
                for event in events_of(row, scope):
                    yield event
                if session_id is not None and row.to_status in FINAL_STATUSES:
                    # the client reconnects to a stream that just ends; this tells it not to
                    yield ("server_close", {})
                    return
            if rows:
                idle = 0.0
                continue
            if not await self.hub.wait(POLL_S):
                idle += POLL_S
                if idle >= keepalive_s:
                    idle = 0.0
                    yield None
            await asyncio.sleep(0)
