"""Reaching a running session: where its web terminal, apps, execute API and files
live (its kernel on its agent), for its owner or a superadmin."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from accelshare.sched.lifecycle import FINAL_STATUSES, SessionStatus

from ...db import Database
from ...errors import Conflict, NotFound, PermissionDenied, Unavailable
from ...models import UserRole
from ...transitions import agent_addresses, session_kernels
from ..actor import Actor
from .reads import SessionReads
from .spec import app_services

__all__ = ["ProxyTarget", "SessionReach"]


@dataclass(frozen=True, slots=True)
class ProxyTarget:
    """A running session's kernel as the app proxy reaches it."""

    session_id: uuid.UUID
    kernel_id: str
    agent_url: str
    service_ports: tuple[dict[str, Any], ...]

    def service(self, name: str) -> dict[str, Any] | None:
        return next((s for s in self.service_ports if s.get("name") == name), None)

    def host_port(self, name: str) -> int | None:
        """The port on the agent's host that serves ``name`` (None: no such service)."""
        service = self.service(name)
        return None if service is None else int(service.get("hostPort") or service["port"])


class SessionReach:
    """The session service's :meth:`proxy_target`."""

    def __init__(self, *, reads: SessionReads, db: Database) -> None:
        self.reads = reads
        self.db = db

    async def proxy_target(self, caller: Actor, ref: str) -> ProxyTarget:
        """Where the session's terminal and apps live, for its owner or a superadmin.

        Not visible, or ended: ``NotFound`` (a closed session's routes disappear); a
        domain admin's look at a user's session: ``PermissionDenied`` (a terminal is the
        user's own shell: admins manage sessions, they do not enter them); not RUNNING
        yet: ``Conflict``."""
        async with self.db.begin() as db:
            row = await self.reads.find(db, caller, ref, None)
            if row.status in FINAL_STATUSES or row.status is SessionStatus.TERMINATING:
                raise NotFound(
                    f"Session {ref!r} has ended ({row.status.value})",
                    field="session",
                    expected="a running session",
                    received=row.status.value,
                )
            if row.user_id != caller.user_id and caller.role is not UserRole.SUPERADMIN:
                raise PermissionDenied(
                    f"Only the owner of session {ref!r} (or a superadmin) may open its "
                    "terminal or apps",
                    field="session",
                    received=ref,
                )
            if row.status is not SessionStatus.RUNNING:
                raise Conflict(
                    f"Session {ref!r} is {row.status.value}, not RUNNING yet",
                    field="session",
                    expected="RUNNING",
                    received=row.status.value,
                )
            kernels = await session_kernels(db, row.id)
            addresses = await agent_addresses(db, kernels)
        target = next((k for k in kernels if k.agent_id in addresses), None)
        if target is None or target.agent_id is None:
            raise Unavailable(
                f"The agent of session {ref!r} has no known address",
                field="agent",
                received=row.agent_id,
            )
        return ProxyTarget(
            session_id=row.id,
            kernel_id=str(target.id),
            agent_url=addresses[target.agent_id],
            service_ports=tuple(app_services(row.environ, target.service_ports)),
        )
