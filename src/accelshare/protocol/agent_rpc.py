"""The agent's RPC: creating, destroying and listing kernels, and what it answers.

The manager calls these routes on each agent (the table is in :mod:`accelshare.protocol`);
every request carries the shared cluster secret in :data:`CLUSTER_SECRET_HEADER`.
"""

from __future__ import annotations

import enum
from typing import Annotated, Literal

from pydantic import Field, TypeAdapter

from .fields import Amount, ExitCode, SlotAllocationWire, WireModel

__all__ = [
    "CLUSTER_SECRET_HEADER",
    "MAX_CREATE_BATCH",
    "CreateKernelBatch",
    "CreateKernelRequest",
    "KernelList",
    "KernelReport",
    "KernelReports",
    "KernelStatus",
    "ServicePortMapping",
]

CLUSTER_SECRET_HEADER = "X-Accelshare-Cluster-Secret"

MAX_CREATE_BATCH = 256  # requests in one POST /v1/kernels/batch


class KernelStatus(enum.StrEnum):
    PREPARING = "PREPARING"
    RUNNING = "RUNNING"
    EXITED = "EXITED"  # ended by itself or was destroyed
    FAILED = "FAILED"  # could not start


class CreateKernelRequest(WireModel):
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


class ServicePortMapping(WireModel):
    """An app service of a kernel: the port it declared and the host port the agent gave
    it from ``[container] port-range`` (the app proxy connects to the host port)."""

    name: Annotated[str, Field(max_length=32)]
    protocol: Literal["http"] = "http"
    container_port: Annotated[int, Field(ge=1, le=65535)]
    host_port: Annotated[int, Field(ge=1, le=65535)]


class KernelReport(WireModel):
    kernel_id: str
    session_id: str = ""
    status: KernelStatus
    image: str = ""
    allocations: SlotAllocationWire = Field(default_factory=dict)
    container_id: str | None = None
    exit_code: ExitCode | None = None
    reason: str = ""
    # The kernel's app services and their host ports (empty from older agents).
    service_ports: list[ServicePortMapping] = Field(default_factory=list)


class KernelList(WireModel):
    kernels: list[KernelReport]


CreateKernelBatch = TypeAdapter(
    Annotated[list[CreateKernelRequest], Field(max_length=MAX_CREATE_BATCH)]
)
"""The body of ``POST /v1/kernels/batch``: a JSON list of create requests."""

KernelReports = TypeAdapter(list[KernelReport])
"""Its answer: a JSON list of reports, one per request, in order."""
