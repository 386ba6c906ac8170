"""Sessions, their kernels, dependencies and status history.

The status column takes values of :class:`accelshare.sched.lifecycle.SessionStatus`
(the same enum for kernels); the manager checks every change against the lifecycle
table and appends a :class:`SessionStatusHistory` row in the same transaction.

Indexes follow the scheduler's queries (issue 7): pending sessions per scaling group
in FIFO order, and resource-occupying sessions counted per keypair, user, group and
domain for the quota predicates.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from accelshare.common import ResourceSlot
from accelshare.manager.clock import utcnow
from accelshare.sched.lifecycle import SessionResult, SessionStatus
from accelshare.sched.model import SessionType

from .base import Base, JSONDocument, ResourceSlotJSON, UTCDateTime, str_enum
from .triggers import KERNEL_HELD, SESSION_SCHED

__all__ = [
    "DEFAULT_PRIORITY",
    "Kernel",
    "KernelEventRecord",
    "Session",
    "SessionDependency",
    "SessionStatusHistory",
]

DEFAULT_PRIORITY = 10
MAX_PRIORITY = 100


class Session(Base):
    __tablename__ = "sessions"
    __table_args__ = (
        sa.CheckConstraint(f"priority >= 0 AND priority <= {MAX_PRIORITY}", name="priority_range"),
        # covering for the scheduler's every-pass read of the pending sessions' ids and
        # revisions (models.triggers): no table row is visited
        sa.Index(
            "ix_sessions_sgroup_status_created",
            "scaling_group",
            "status",
            "created_at",
            "id",
            "sched_revision",
        ),
        sa.Index("ix_sessions_access_key_status", "access_key", "status"),
        sa.Index("ix_sessions_user_status", "user_id", "status"),
        sa.Index("ix_sessions_group_status", "group_id", "status"),
        sa.Index("ix_sessions_domain_status", "domain_name", "status"),
        sa.Index("ix_sessions_access_key_name", "access_key", "name"),
    )

    id: Mapped[uuid.UUID] = mapped_column(sa.Uuid(), primary_key=True, default=uuid.uuid4)
    name: Mapped[str] = mapped_column(sa.String(64))
    session_type: Mapped[SessionType] = mapped_column(
        str_enum(SessionType, 16), default=SessionType.INTERACTIVE
    )
    # ownership
    access_key: Mapped[str] = mapped_column(sa.ForeignKey("keypairs.access_key"))
    user_id: Mapped[uuid.UUID] = mapped_column(sa.ForeignKey("users.id"))
    group_id: Mapped[uuid.UUID] = mapped_column(sa.ForeignKey("groups.id"))
    domain_name: Mapped[str] = mapped_column(sa.ForeignKey("domains.name"))
    # what was asked for
    image: Mapped[str] = mapped_column(sa.String(512))
    architecture: Mapped[str] = mapped_column(sa.String(32), default="x86_64")
    requested_slots: Mapped[ResourceSlot] = mapped_column(ResourceSlotJSON())
    resource_opts: Mapped[dict[str, Any]] = mapped_column(JSONDocument, default=dict)
    environ: Mapped[dict[str, str]] = mapped_column(JSONDocument, default=dict)
    startup_command: Mapped[str | None] = mapped_column(sa.Text())
    priority: Mapped[int] = mapped_column(default=DEFAULT_PRIORITY)
    starts_at: Mapped[datetime | None] = mapped_column(UTCDateTime())  # batch: not before
    cluster_size: Mapped[int] = mapped_column(default=1)
    tag: Mapped[str | None] = mapped_column(sa.String(64))  # Backend.AI's free-text note
    # the storage folders its kernels mount: KernelMount objects as JSON (NULL: none);
    # session_vfolder_mounts has the same by folder id
    vfolder_mounts: Mapped[list[dict[str, Any]] | None] = mapped_column(JSONDocument)
    # where it runs
    scaling_group: Mapped[str] = mapped_column(sa.ForeignKey("scaling_groups.name"))
    agent_id: Mapped[str | None] = mapped_column(sa.ForeignKey("agents.id"), index=True)
    designated_agent_id: Mapped[str | None] = mapped_column(sa.String(64))  # manual assignment
    # bumped by the database when a column the scheduler reads of a pending session
    # changes (.triggers.SESSION_SCHED)
    sched_revision: Mapped[int] = mapped_column(
        sa.BigInteger(), default=0, server_default=sa.text("0")
    )
    occupied_slots: Mapped[ResourceSlot] = mapped_column(ResourceSlotJSON(), default=ResourceSlot)
    # state
    status: Mapped[SessionStatus] = mapped_column(
        str_enum(SessionStatus), default=SessionStatus.PENDING, index=True
    )
    status_info: Mapped[str | None] = mapped_column(sa.String(512))  # short human reason
    status_data: Mapped[dict[str, Any]] = mapped_column(JSONDocument, default=dict)
    status_changed_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    result: Mapped[SessionResult] = mapped_column(
        str_enum(SessionResult, 16), default=SessionResult.UNDEFINED
    )
    exit_code: Mapped[int | None] = mapped_column()
    # timeline
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    scheduled_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    terminated_at: Mapped[datetime | None] = mapped_column(UTCDateTime())


SESSION_SCHED.install(cast(sa.Table, Session.__table__))


class Kernel(Base):
    """One container or process of a session (a single-node session has one)."""

    __tablename__ = "kernels"
    __table_args__ = (sa.Index("ix_kernels_agent_status", "agent_id", "status"),)

    id: Mapped[uuid.UUID] = mapped_column(sa.Uuid(), primary_key=True, default=uuid.uuid4)
    session_id: Mapped[uuid.UUID] = mapped_column(
        sa.ForeignKey("sessions.id", ondelete="CASCADE"), index=True
    )
    cluster_role: Mapped[str] = mapped_column(sa.String(16), default="main")
    cluster_idx: Mapped[int] = mapped_column(default=1)
    agent_id: Mapped[str | None] = mapped_column(sa.ForeignKey("agents.id"))
    # The agent's address when the kernel was scheduled (informational, as in Backend.AI):
    # RPCs always go to agents.address, which each heartbeat keeps current.
    agent_address: Mapped[str | None] = mapped_column(sa.String(256))
    image: Mapped[str] = mapped_column(sa.String(512))
    requested_slots: Mapped[ResourceSlot] = mapped_column(ResourceSlotJSON())
    occupied_slots: Mapped[ResourceSlot] = mapped_column(ResourceSlotJSON(), default=ResourceSlot)
    # the kernel's allocation, {slot: {device_id: "amount"}}, as planned by the scheduler
    # and then granted by the agent's alloc maps
    allocation: Mapped[dict[str, dict[str, str]]] = mapped_column(JSONDocument, default=dict)
    status: Mapped[SessionStatus] = mapped_column(
        str_enum(SessionStatus), default=SessionStatus.PENDING
    )
    status_info: Mapped[str | None] = mapped_column(sa.String(512))
    status_data: Mapped[dict[str, Any]] = mapped_column(JSONDocument, default=dict)
    status_changed_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    container_id: Mapped[str | None] = mapped_column(sa.String(128))  # docker id or process id
    service_ports: Mapped[list[Any]] = mapped_column(JSONDocument, default=list)
    exit_code: Mapped[int | None] = mapped_column()
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    terminated_at: Mapped[datetime | None] = mapped_column(UTCDateTime())


# the kernels -> agent_held_revisions triggers (SQLite), once both tables exist
KERNEL_HELD.install(Base.metadata)


class SessionDependency(Base):
    """``session_id`` may start only after ``depends_on`` TERMINATED successfully."""

    __tablename__ = "session_dependencies"

    session_id: Mapped[uuid.UUID] = mapped_column(
        sa.ForeignKey("sessions.id", ondelete="CASCADE"), primary_key=True
    )
    depends_on: Mapped[uuid.UUID] = mapped_column(
        sa.ForeignKey("sessions.id", ondelete="CASCADE"), primary_key=True, index=True
    )


class SessionStatusHistory(Base):
    """Every status change of a session, in order (``from_status`` NULL on creation)."""

    __tablename__ = "session_status_history"

    id: Mapped[int] = mapped_column(
        sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True
    )
    session_id: Mapped[uuid.UUID] = mapped_column(
        sa.ForeignKey("sessions.id", ondelete="CASCADE"), index=True
    )
    from_status: Mapped[SessionStatus | None] = mapped_column(str_enum(SessionStatus))
    to_status: Mapped[SessionStatus] = mapped_column(str_enum(SessionStatus))
    reason: Mapped[str | None] = mapped_column(sa.String(512))
    changed_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class KernelEventRecord(Base):
    """An agent event already applied (``event_id`` is unique): events are applied once.

    Agents resend a batch when they do not get the 204 (a lost response); the
    registry inserts the id first and skips the event when the id is already here.
    """

    __tablename__ = "kernel_events"

    event_id: Mapped[str] = mapped_column(sa.String(128), primary_key=True)
    agent_id: Mapped[str] = mapped_column(sa.String(64))
    kernel_id: Mapped[str] = mapped_column(sa.String(64))
    event: Mapped[str] = mapped_column(sa.String(16))
    received_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow, index=True)
