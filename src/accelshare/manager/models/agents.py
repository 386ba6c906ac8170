"""Scaling groups and agents (the registry the scheduler reads).

An agent row is the manager's copy of what the agent last reported:

* ``available_slots`` — total capacity per slot; ``occupied_slots`` — what the manager
  has reserved for resource-occupying kernels (the manager's own accounting);
* ``map_views`` — the alloc-map views the agent reports in its heartbeat (one
  ``PluginMapView`` per allocation map: capacity and allocated amounts per device and
  slot, and which kernels hold them), used for the dry-run fit before binding;
* ``slot_metadata`` (UI metadata and slot types per slot) and ``quanta`` (slot ->
  decimal string) for request validation at enqueue;
* ``views_revision`` — bumped by a database trigger whenever ``available_slots``,
  ``runtime``, ``architecture``, ``images`` or ``map_views`` change
  (:mod:`.triggers`): the scheduler re-reads those only for agents whose revision moved;
* ``occupancy_revision`` — bumped on every reservation/release.  Reservations are a
  compare-and-set: ``UPDATE agents SET occupied_slots=:new, occupancy_revision=:rev+1
  WHERE id=:id AND occupancy_revision=:rev`` — zero rows means someone else moved first.

``agent_held_revisions`` (:class:`AgentHeldRevision`): per agent, a revision SQLite's
triggers bump whenever a kernel row on it is written in a way the scheduler's snapshot
reads (:data:`.triggers.KERNEL_HELD`); empty on PostgreSQL.
"""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from accelshare.common import ResourceSlot
from accelshare.manager.clock import utcnow
from accelshare.manager.enums import AgentStatus

from .base import Base, JSONDocument, ResourceSlotJSON, UTCDateTime, str_enum
from .triggers import AGENT_VIEWS

__all__ = [
    "DEFAULT_SCHEDULER_OPTS",
    "DEFAULT_SESSION_SLOTS",
    "Agent",
    "AgentHeldRevision",
    "AgentSelectionStrategy",
    "AgentStatus",
    "ScalingGroup",
]


class AgentSelectionStrategy(enum.StrEnum):
    DISPERSED = "dispersed"
    CONCENTRATED = "concentrated"
    LEGACY = "legacy"
    ROUNDROBIN = "roundrobin"


DEFAULT_SCHEDULER_OPTS: dict[str, Any] = {
    "pending_timeout": 0,  # seconds a session may stay PENDING; 0 = forever
    "agent_selection_strategy": AgentSelectionStrategy.DISPERSED.value,
    "allow_fractional_resource_fragmentation": True,  # default of a session's resource_opts
    "allowed_session_types": ["interactive", "batch"],
    "config": {},  # picker options, e.g. {"num_retries_to_skip": 0}
}
"""``scaling_groups.scheduler_opts`` defaults (Backend.AI's ScalingGroupOpts keys)."""

DEFAULT_SESSION_SLOTS = ResourceSlot({"cpu": 1, "mem": 1 << 30})
"""What a request without cpu / mem gets (spec 05): 1 core, 1 GiB."""


def _default_scheduler_opts() -> dict[str, Any]:
    return {**DEFAULT_SCHEDULER_OPTS, "config": {}}


class ScalingGroup(Base):
    __tablename__ = "scaling_groups"

    name: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    description: Mapped[str] = mapped_column(sa.String(512), default="")
    is_active: Mapped[bool] = mapped_column(default=True)
    is_public: Mapped[bool] = mapped_column(default=True)
    scheduler: Mapped[str] = mapped_column(sa.String(64), default="fifo")  # fifo | lifo | drf
    scheduler_opts: Mapped[dict[str, Any]] = mapped_column(
        JSONDocument, default=_default_scheduler_opts
    )
    default_session_slots: Mapped[ResourceSlot] = mapped_column(
        ResourceSlotJSON(), default=lambda: DEFAULT_SESSION_SLOTS
    )
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class Agent(Base):
    __tablename__ = "agents"
    __table_args__ = (sa.Index("ix_agents_sgroup_status", "scaling_group", "status"),)

    id: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    status: Mapped[AgentStatus] = mapped_column(str_enum(AgentStatus, 16), index=True)
    status_changed_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    region: Mapped[str] = mapped_column(sa.String(64), default="local")
    scaling_group: Mapped[str] = mapped_column(sa.ForeignKey("scaling_groups.name"))
    address: Mapped[str] = mapped_column(sa.String(256))  # RPC endpoint, e.g. "tcp://h:6001"
    architecture: Mapped[str] = mapped_column(sa.String(32), default="x86_64")
    version: Mapped[str] = mapped_column(sa.String(64), default="")
    compute_plugins: Mapped[dict[str, Any]] = mapped_column(JSONDocument, default=dict)
    available_slots: Mapped[ResourceSlot] = mapped_column(ResourceSlotJSON(), default=ResourceSlot)
    occupied_slots: Mapped[ResourceSlot] = mapped_column(ResourceSlotJSON(), default=ResourceSlot)
    occupancy_revision: Mapped[int] = mapped_column(sa.BigInteger(), default=0)
    # bumped by the database when a column the scheduler parses changes (.triggers)
    views_revision: Mapped[int] = mapped_column(
        sa.BigInteger(), default=0, server_default=sa.text("0")
    )
    # plugin key -> PluginMapView (the heartbeat's alloc_maps, as JSON)
    map_views: Mapped[dict[str, Any]] = mapped_column(JSONDocument, default=dict)
    slot_metadata: Mapped[dict[str, Any]] = mapped_column(JSONDocument, default=dict)
    quanta: Mapped[dict[str, str]] = mapped_column(JSONDocument, default=dict)
    is_schedulable: Mapped[bool] = mapped_column(default=True)
    first_contact_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    last_heartbeat_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    lost_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # what the registry noticed: {"unknown_kernels": [...], "reconciled_at": ...}
    # (nullable so that migration 0002 adds it without rebuilding the table on SQLite)
    status_data: Mapped[dict[str, Any] | None] = mapped_column(JSONDocument, default=dict)
    # the images its runtime can run now (heartbeat): docker repo tags or process
    # environment names; and which runtime it is (process | docker).  Nullable for
    # migration 0003 (see status_data).
    images: Mapped[list[str] | None] = mapped_column(JSONDocument, default=list)
    runtime: Mapped[str | None] = mapped_column(sa.String(16), default="process")

    @property
    def is_alive(self) -> bool:
        return self.status is AgentStatus.ALIVE

    @property
    def remaining_slots(self) -> ResourceSlot:
        return self.available_slots - self.occupied_slots


AGENT_VIEWS.install(cast(sa.Table, Agent.__table__))


class AgentHeldRevision(Base):
    """Bumped by SQLite's triggers on kernels (:data:`.triggers.KERNEL_HELD`) whenever a
    kernel row on the agent is inserted, deleted or changes what the scheduler's
    snapshot reads of it; no row until the first such write.  Not written on
    PostgreSQL (the snapshot reads the kernels' row versions there).  No foreign key:
    a trigger may bump it for an agent row that is being deleted."""

    __tablename__ = "agent_held_revisions"

    agent_id: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    revision: Mapped[int] = mapped_column(sa.BigInteger(), default=0)
