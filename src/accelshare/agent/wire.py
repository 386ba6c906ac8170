"""The agent <-> manager wire protocol (JSON over HTTP), shared by both sides.

Agent RPC (served by the agent, called by the manager; every request carries the
shared cluster secret in ``X-Accelshare-Cluster-Secret``)::

    POST   /v1/kernels                  CreateKernelRequest -> KernelReport  (idempotent by kernel_id)
    DELETE /v1/kernels/{kernel_id}      -> KernelReport                       (idempotent)
    GET    /v1/kernels                  -> KernelList
    GET    /v1/kernels/{kernel_id}/logs -> text/plain
    GET    /v1/alloc-map                -> AllocMapView        (?form=compat -> {device: "0.80"})
    GET    /v1/stats/node               -> NodeStats
    GET    /v1/stats/kernels            -> KernelStats
    GET    /v1/health                   -> {"status": "ok", "agent_id": ...}
    GET    /metrics                     -> Prometheus text (no secret needed)

Manager endpoints for agents (same secret)::

    POST /internal/agents/heartbeat     Heartbeat -> HeartbeatAck
    POST /internal/agents/events        KernelEventBatch -> 204

Amounts are decimal strings (``"0.6"``, ``"2147483648"``) everywhere: never floats.
Unknown fields are ignored so that a newer agent can talk to an older manager.
"""

from __future__ import annotations

import enum
from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from accelshare.common import SlotTypes

__all__ = [
    "CLUSTER_SECRET_HEADER",
    "AllocMapView",
    "CreateKernelRequest",
    "DeviceView",
    "Heartbeat",
    "HeartbeatAck",
    "KernelEvent",
    "KernelEventBatch",
    "KernelEventType",
    "KernelList",
    "KernelReport",
    "KernelStats",
    "KernelStatus",
    "MetricValue",
    "NodeStats",
    "PluginMapView",
    "SlotCapacity",
]

CLUSTER_SECRET_HEADER = "X-Accelshare-Cluster-Secret"

Amount = str  # a decimal string; parse with Decimal(), never float()
SlotAllocationWire = dict[str, dict[str, Amount]]  # slot -> device -> amount


class _Wire(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class KernelStatus(enum.StrEnum):
    PREPARING = "PREPARING"
    RUNNING = "RUNNING"
    EXITED = "EXITED"  # ended by itself or was destroyed
    FAILED = "FAILED"  # could not start


class SlotCapacity(_Wire):
    type: SlotTypes
    capacity: Amount


class DeviceView(_Wire):
    device_id: str
    slot_name: str
    slot_type: SlotTypes
    capacity: Amount
    allocated: Amount
    free: Amount | None = None  # capacity - allocated (added later; None from older agents)
    numa_node: int | None = None
    model_name: str = ""
    kernels: dict[str, Amount] = Field(default_factory=dict)  # kernel id -> amount held


class PluginMapView(_Wire):
    """One plugin's allocation map: enough for the manager's per-device dry run."""

    key: str
    kind: str  # "discrete" | "fractional"
    strategy: str  # "FILL" | "EVENLY"
    quantum: Amount | None = None  # fractional maps only
    exclusive_slot_types: list[str] = Field(default_factory=list)
    devices: list[DeviceView]
    # Devices still held by kernels under a slot the current plugin set renamed
    # (e.g. fractional -> discrete); counted as occupied until those kernels end.
    legacy_allocations: SlotAllocationWire = Field(default_factory=dict)


class AllocMapView(_Wire):
    agent_id: str
    maps: dict[str, PluginMapView]  # plugin key -> map


class Heartbeat(_Wire):
    agent_id: str
    rpc_url: str  # e.g. "http://127.0.0.1:6001"
    scaling_group: str = "default"
    region: str = "local"
    architecture: str = "x86_64"
    version: str = ""
    slots: dict[str, SlotCapacity]  # available (total) capacity per slot
    alloc_maps: dict[str, PluginMapView]
    slot_metadata: dict[str, dict[str, object]] = Field(default_factory=dict)
    kernels: list[KernelReport] = Field(default_factory=list)
    images: list[str] = Field(default_factory=list)
    runtime: str = "process"  # the agent's kernel runtime: process | docker
    sent_at: datetime | None = None


class HeartbeatAck(_Wire):
    # Kernels the manager considers gone (their sessions ended): the agent destroys them.
    destroy_kernels: list[str] = Field(default_factory=list)


class CreateKernelRequest(_Wire):
    kernel_id: str
    session_id: str
    image: str
    requested_slots: dict[str, Amount]
    command: list[str] | None = None  # None: the kernel stays up until destroyed
    # A batch session's command line, whole; the runtime makes the argv (KernelSpec).
    startup_command: str | None = None
    environ: dict[str, str] = Field(default_factory=dict)
    allow_fractional_resource_fragmentation: bool = True
    owner_access_key: str = ""
    labels: dict[str, str] = Field(default_factory=dict)


class KernelReport(_Wire):
    kernel_id: str
    session_id: str = ""
    status: KernelStatus
    image: str = ""
    allocations: SlotAllocationWire = Field(default_factory=dict)
    container_id: str | None = None
    exit_code: int | None = None
    reason: str = ""


class KernelList(_Wire):
    kernels: list[KernelReport]


class KernelEventType(enum.StrEnum):
    STARTED = "started"
    EXITED = "exited"
    FAILED = "failed"


class KernelEvent(_Wire):
    event_id: str  # unique; the manager ignores an id it has already applied
    kernel_id: str
    session_id: str
    event: KernelEventType
    exit_code: int | None = None
    reason: str = ""
    at: datetime


class KernelEventBatch(_Wire):
    agent_id: str
    events: list[KernelEvent]


class MetricValue(_Wire):
    name: str  # e.g. "cuda_util", "cuda_mem", "cpu_util", "mem"
    device_id: str | None = None  # None: the node-wide (summed) value
    value: Amount
    capacity: Amount | None = None
    unit: str = ""


class NodeStats(_Wire):
    agent_id: str
    at: datetime
    metrics: list[MetricValue]


class KernelStats(_Wire):
    agent_id: str
    at: datetime
    kernels: dict[str, list[MetricValue]]


Heartbeat.model_rebuild()
