"""What an agent sends the manager unasked: its heartbeat and its kernels' events.

``POST /internal/agents/heartbeat`` carries a :class:`Heartbeat` and is answered with a
:class:`HeartbeatAck`; ``POST /internal/agents/events`` (or the bus's event stream when
Redis is configured) carries a :class:`KernelEventBatch`.  Both are checked at the edge
(:class:`~accelshare.protocol.fields.CheckedModel`): the manager stores them.
"""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Annotated

from pydantic import Field

from accelshare.common import SlotTypes

from .agent_rpc import KernelReport, ServicePortMapping
from .fields import (
    AgentId,
    CheckedModel,
    EventId,
    ExitCode,
    HeldAmount,
    HttpUrl,
    KernelId,
    Label,
    SlotKey,
    WireModel,
)
from .maps import PluginMapView

__all__ = [
    "Heartbeat",
    "HeartbeatAck",
    "KernelEvent",
    "KernelEventBatch",
    "KernelEventType",
    "SlotCapacity",
]


class SlotCapacity(WireModel):
    type: SlotTypes
    capacity: HeldAmount


class Heartbeat(CheckedModel):
    agent_id: AgentId
    rpc_url: HttpUrl  # e.g. "http://127.0.0.1:6001"
    scaling_group: Label = "default"
    region: Label = "local"
    architecture: Annotated[str, Field(max_length=32)] = "x86_64"
    version: Label = ""
    slots: dict[SlotKey, SlotCapacity]  # available (total) capacity per slot
    alloc_maps: dict[str, PluginMapView]
    slot_metadata: dict[str, dict[str, object]] = Field(default_factory=dict)
    kernels: list[KernelReport] = Field(default_factory=list)
    images: list[str] = Field(default_factory=list)
    runtime: str = "process"  # the agent's kernel runtime: process | docker
    sent_at: datetime | None = None
    # plugin key -> what it reports about itself now (cuda: fraction enforcement, MPS)
    plugin_status: dict[str, dict[str, str]] = Field(default_factory=dict)


class HeartbeatAck(WireModel):
    # Kernels the manager considers gone (their sessions ended): the agent destroys them.
    destroy_kernels: list[str] = Field(default_factory=list)


class KernelEventType(enum.StrEnum):
    STARTED = "started"
    EXITED = "exited"
    FAILED = "failed"


class KernelEvent(WireModel):
    event_id: EventId
    kernel_id: KernelId
    session_id: Annotated[str, Field(max_length=64)]
    event: KernelEventType
    exit_code: ExitCode | None = None
    reason: str = ""
    at: datetime
    # "started": the kernel's app services and their host ports, so that a session the
    # event moves to RUNNING before the create's answer is recorded has them at once
    # (empty from older agents and for other events).
    service_ports: list[ServicePortMapping] = Field(default_factory=list)


class KernelEventBatch(CheckedModel):
    agent_id: AgentId
    events: list[KernelEvent]
