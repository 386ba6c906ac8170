"""What a caller sees of sessions: the JSON shapes and the visibility rule.

Visibility (spec 07): a user sees and touches only its own sessions, an admin those of
its domain, a superadmin all; anything else is "not found" (404, raised by the
look-ups of :mod:`.reads`), so ids of other users' sessions do not leak.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from accelshare.common import ResourceSlot
from accelshare.sched.lifecycle import SessionStatus

from ...models import Kernel, Session, User, UserRole
from ..actor import Actor
from .spec import app_services

__all__ = [
    "HistoryFields",
    "KernelFields",
    "create_answer",
    "iso",
    "owner_emails",
    "reported_ports_of",
    "session_json",
    "visibility_filter",
    "visible",
]


class KernelFields(Protocol):
    """What :func:`session_json` reads of a kernel (a :class:`~...models.Kernel`, or a
    row of those columns)."""

    @property
    def id(self) -> uuid.UUID: ...
    @property
    def agent_id(self) -> str | None: ...
    @property
    def status(self) -> SessionStatus: ...
    @property
    def container_id(self) -> str | None: ...
    @property
    def allocation(self) -> dict[str, dict[str, str]]: ...
    @property
    def occupied_slots(self) -> ResourceSlot: ...
    @property
    def service_ports(self) -> list[Any]: ...


class HistoryFields(Protocol):
    """What :func:`session_json` reads of a status change (a
    :class:`~...models.SessionStatusHistory`, or a row of those columns)."""

    @property
    def from_status(self) -> SessionStatus | None: ...
    @property
    def to_status(self) -> SessionStatus: ...
    @property
    def reason(self) -> str | None: ...
    @property
    def changed_at(self) -> datetime: ...


def visible(caller: Actor, row: Session) -> bool:
    """Whether ``caller`` may see the session ``row``."""
    if caller.role is UserRole.SUPERADMIN:
        return True
    if caller.role is UserRole.ADMIN:
        return row.domain_name == caller.domain_name
    return row.user_id == caller.user_id


def visibility_filter(caller: Actor) -> sa.ColumnElement[bool]:
    """:func:`visible` as a ``WHERE`` clause over ``sessions``."""
    if caller.role is UserRole.SUPERADMIN:
        return sa.true()
    if caller.role is UserRole.ADMIN:
        return Session.domain_name == caller.domain_name
    return Session.user_id == caller.user_id


def iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def _reported_ports(kernels: Sequence[KernelFields]) -> list[Any] | None:
    """The app ports of the first kernel its agent reported them for (the one
    ``GET /session/{id}/apps`` and the proxy use), ``None`` if none did."""
    return next((k.service_ports for k in kernels if k.service_ports), None)


async def reported_ports_of(
    db: AsyncSession, session_ids: Sequence[uuid.UUID]
) -> dict[uuid.UUID, list[Any]]:
    """:func:`_reported_ports` of many sessions in one query (session lists)."""
    if not session_ids:
        return {}
    found: dict[uuid.UUID, list[Any]] = {}
    result = await db.execute(
        sa.select(Kernel.session_id, Kernel.service_ports)
        .where(Kernel.session_id.in_(session_ids))
        .order_by(Kernel.session_id, Kernel.cluster_idx)
    )
    for session_id, service_ports in result:
        if service_ports and session_id not in found:
            found[session_id] = service_ports
    return found


async def owner_emails(db: AsyncSession, rows: Sequence[Session]) -> dict[uuid.UUID, str]:
    """The owners' e-mails of a page of sessions, in one query (the console's Owner
    column shows them rather than access keys)."""
    user_ids = {r.user_id for r in rows}
    if not user_ids:
        return {}
    result = await db.execute(sa.select(User.id, User.email).where(User.id.in_(user_ids)))
    return {row.id: row.email for row in result}


def session_json(
    row: Session,
    kernels: Sequence[KernelFields] = (),
    history: Sequence[HistoryFields] = (),
    dependencies: Sequence[uuid.UUID] = (),
    *,
    reported_ports: Sequence[Any] | None = None,
) -> dict[str, Any]:
    """The REST shape of a session (Backend.AI's names where it has them).

    ``row`` is a :class:`~...models.Session` or a Core row of the ``sessions`` columns
    (the same attributes).

    ``servicePorts`` carry each app's ``hostPort`` from the kernels (or, for lists,
    ``reported_ports``: the kernels' ports fetched in one query)."""
    occupied = row.occupied_slots.to_json()
    body: dict[str, Any] = {
        "sessionId": str(row.id),
        "sessionName": row.name,
        "type": row.session_type.value,
        "status": row.status.value,
        "statusInfo": row.status_info,
        "statusData": row.status_data or {},
        "statusChangedAt": iso(row.status_changed_at),
        "result": row.result.value,
        "exitCode": row.exit_code,
        "image": row.image,
        "architecture": row.architecture,
        "requestedSlots": row.requested_slots.nonzero().to_json(),
        "occupiedSlots": occupied,
        "occupyingSlots": occupied,
        "resourceOpts": row.resource_opts or {},
        "environ": row.environ or {},
        "startupCommand": row.startup_command,
        "priority": row.priority,
        "startsAt": iso(row.starts_at),
        "tag": row.tag,
        "scalingGroup": row.scaling_group,
        "agentId": row.agent_id,
        "accessKey": row.access_key,
        "userId": str(row.user_id),
        "groupId": str(row.group_id),
        "domainName": row.domain_name,
        "creationTime": iso(row.created_at),
        "scheduledAt": iso(row.scheduled_at),
        "startedAt": iso(row.started_at),
        "terminationTime": iso(row.terminated_at),
        "dependencies": [str(d) for d in dependencies],
        # the storage folders its kernels mount: {name, host_path, kernel_path, read_only}
        "mounts": list(row.vfolder_mounts or []),
        "servicePorts": app_services(
            row.environ, reported_ports if reported_ports is not None else _reported_ports(kernels)
        ),
    }
    if kernels:
        body["kernels"] = [
            {
                "kernelId": str(k.id),
                "agentId": k.agent_id,
                "status": k.status.value,
                "containerId": k.container_id,
                "deviceAllocs": k.allocation or {},
                "occupiedSlots": k.occupied_slots.to_json(),
            }
            for k in kernels
        ]
    if history:
        body["statusHistory"] = [
            {
                "from": h.from_status.value if h.from_status else None,
                "to": h.to_status.value,
                "reason": h.reason,
                "at": iso(h.changed_at),
            }
            for h in history
        ]
    return body


def create_answer(session: Mapping[str, Any], *, created: bool) -> dict[str, Any]:
    """Backend.AI's create answer plus the whole session under ``session``."""
    return {
        "sessionId": session["sessionId"],
        "sessionName": session["sessionName"],
        "status": session["status"],
        "statusInfo": session["statusInfo"],
        "created": created,
        "servicePorts": session.get("servicePorts", []),
        "session": dict(session),
    }
