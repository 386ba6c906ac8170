"""The agent's RPC: creating, destroying and listing kernels, and what it answers.

The manager calls these routes on each agent (the table is in :mod:`accelshare.protocol`);
every request carries the shared cluster secret in :data:`CLUSTER_SECRET_HEADER`.

**The bind carries the plan.**  The manager's ``CreateKernelRequest`` has the requested
slots as exact decimal strings (user grammar such as ``"2g"`` is parsed once, at the
manager's API) and ``planned_allocations``: the per-device placement its planner chose
(slot -> device -> amount, the shape of ``KernelReport.allocations``).  The agent checks
the plan against its allocation maps (devices, free amounts, quantum grid, totals equal
to the request, the maps' own rules) and takes exactly that placement, all or nothing;
it runs its placement strategy only for a request without a plan (an older manager, a
direct RPC).  A plan that no longer fits (a device it names is gone or has less free
than the plan puts there) is refused as a *conflict*: a FAILED report with
``conflict: true``, no event, nothing recorded on the agent; the manager puts the
session back in its queue and plans it again.  Any other refusal is an ordinary FAILED
report.  Since the agent takes the plan as is, the order in which creates reach it does
not matter: the manager sends binds to one agent concurrently.
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
    "KernelMount",
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


class KernelMount(WireModel):
    """A storage folder bound into a kernel.

    ``host_path`` is the folder on the agent's host (a volume every agent mounts at the
    same path, see docs/storage.md); ``kernel_path`` is where the kernel sees it:
    ``/home/work/<name>`` unless the user chose another path.  ``read_only``: the kernel
    cannot write it (a share with ``ro`` permission, or the ``:ro`` form)."""

    name: Annotated[str, Field(min_length=1, max_length=64)]
    host_path: Annotated[str, Field(min_length=1, max_length=4096)]
    kernel_path: Annotated[str, Field(min_length=1, max_length=4096)]
    read_only: bool = False


class CreateKernelRequest(WireModel):
    kernel_id: str
    session_id: str
    image: str
    # exact decimal strings from the manager ("2147483648"); a direct RPC may also write
    # a byte slot as a binary size ("2g") when it sends no plan
    requested_slots: dict[str, Amount]
    # The manager's placement (slot -> device -> exact decimal string), taken as is by
    # the agent; None: the agent places the request itself (an older manager, a direct RPC).
    planned_allocations: SlotAllocationWire | None = None
    command: list[str] | None = None  # None: the kernel stays up until destroyed
    # A batch session's command line, whole; the runtime makes the argv (KernelSpec).
    startup_command: str | None = None
    environ: dict[str, str] = Field(default_factory=dict)
    allow_fractional_resource_fragmentation: bool = True
    owner_access_key: str = ""
    labels: dict[str, str] = Field(default_factory=dict)
    # Storage folders bound into the kernel (empty from older managers).
    mounts: Annotated[list[KernelMount], Field(max_length=64)] = Field(default_factory=list)


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
    # With status FAILED: the request's plan no longer fits this agent (nothing was
    # created or recorded, no event follows); the manager plans the session again.
    conflict: bool = False


class KernelList(WireModel):
    kernels: list[KernelReport]


CreateKernelBatch = TypeAdapter(
    Annotated[list[CreateKernelRequest], Field(max_length=MAX_CREATE_BATCH)]
)
"""The body of ``POST /v1/kernels/batch``: a JSON list of create requests."""

KernelReports = TypeAdapter(list[KernelReport])
"""Its answer: a JSON list of reports, one per request, in order."""
