"""The agent <-> manager wire protocol (JSON over HTTP), shared by both sides.

Agent RPC (served by the agent, called by the manager; every request carries the
shared cluster secret in ``X-Accelshare-Cluster-Secret``)::

    POST   /v1/kernels                  CreateKernelRequest -> KernelReport  (idempotent by kernel_id)
    POST   /v1/kernels/batch            [CreateKernelRequest] -> [KernelReport]  (one report per
                                        request, in order; at most MAX_CREATE_BATCH; an older
                                        agent answers 404/405 and gets single creates)
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

What the manager stores from an agent is checked here, at the edge, so that a bad
heartbeat or event batch is a ``400`` naming the field and nothing of it is written
(docs/reliability.md): ids are 1-64 printable characters (the columns' width), URLs
http(s), capacities and allocations finite decimals >= 0 below 10^21, slot names valid,
exit codes 32-bit, no string anywhere holds NUL and no number is NaN or infinite
(PostgreSQL cannot store either).
"""

from __future__ import annotations

import enum
import functools
import json
import math
from collections.abc import Mapping, Sequence
from datetime import datetime
from decimal import Decimal, InvalidOperation
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, TypeAdapter, model_validator
from pydantic_core import PydanticCustomError

from accelshare.common import SlotName, SlotTypes
from accelshare.common.errors import InvalidSlotName
from accelshare.common.resource_slot import MAX_AMOUNT_EXPONENT

__all__ = [
    "CLUSTER_SECRET_HEADER",
    "MAX_CREATE_BATCH",
    "AllocMapView",
    "CreateKernelBatch",
    "CreateKernelRequest",
    "DeviceView",
    "Heartbeat",
    "HeartbeatAck",
    "KernelEvent",
    "KernelEventBatch",
    "KernelEventType",
    "KernelList",
    "KernelReport",
    "KernelReports",
    "KernelStats",
    "KernelStatus",
    "MetricValue",
    "NodeStats",
    "PluginMapView",
    "ServicePortMapping",
    "SlotCapacity",
]

CLUSTER_SECRET_HEADER = "X-Accelshare-Cluster-Secret"

Amount = str  # a decimal string; parse with Decimal(), never float()
INT32_MAX = 2**31 - 1
MAX_CREATE_BATCH = 256  # requests in one POST /v1/kernels/batch


def _invalid(expected: str, value: Any) -> PydanticCustomError:
    return PydanticCustomError("wire", "expected {expected}",
                               {"expected": expected, "received": repr(value)[:100]})  # fmt: skip


_HELD_EXPECTED = f'a decimal string >= 0 and below 10^{MAX_AMOUNT_EXPONENT}, such as "0.6"'


@functools.lru_cache(maxsize=4096)
def _held_amount(value: str) -> str:
    """A finite decimal >= 0 below 10^21 (what ResourceSlot accepts), kept as sent.

    Remembered per text (a refused one is not: it raises): an agent's heartbeat
    carries ~150 amounts, mostly the same few texts ("1", "0", a GPU's capacity)."""
    try:
        number = Decimal(value)
    except (InvalidOperation, ValueError):
        raise _invalid(_HELD_EXPECTED, value) from None
    if not number.is_finite() or number < 0 or number.adjusted() >= MAX_AMOUNT_EXPONENT:
        raise _invalid(_HELD_EXPECTED, value)
    return value


def _ident(width: int) -> Any:
    """1..width characters, not blank, no control characters (an id column's width)."""

    def check(value: str) -> str:
        if (
            not value.strip()
            or len(value) > width
            or any(ord(c) < 0x20 or ord(c) == 0x7F for c in value)
        ):
            expected = f"a non-empty id of at most {width} printable characters"
            raise _invalid(expected, value)
        return value

    return check


def _slot_name(value: str) -> str:
    try:
        SlotName(value)
    except InvalidSlotName:
        raise _invalid('a slot name such as "cpu", "mem" or "cuda.shares"', value) from None
    return value


def _http_url(value: str) -> str:
    if (
        not value.startswith(("http://", "https://"))
        or len(value) > 256
        or not value[7:].strip("/")
    ):
        raise _invalid('an http(s) URL of at most 256 characters such as "http://10.0.0.5:6001"',
                       value)  # fmt: skip
    return value


def _escaped(text: str) -> str:
    return text.encode("unicode_escape").decode("ascii")


def _surely_storable(data: Any) -> bool:
    """True when the C JSON encoder finds no non-finite number and writes no NUL (it
    writes ``\\u0000`` for one); False when it cannot tell (a type it does not encode, or
    that text, which an escaped backslash can also produce): then :func:`_storable`
    walks the data.  A heartbeat of 600 kernels: ~5 ms walked, ~0.3 ms encoded."""
    try:
        text = json.dumps(data, allow_nan=False)
    except (TypeError, ValueError):  # not plain JSON data, or NaN / Infinity
        return False
    return "\\u0000" not in text


def _storable(data: Any, where: str = "body") -> None:
    """Refuse what PostgreSQL cannot store, naming where it is (``slots.cpu``): NUL in
    any string (key or value) and non-finite numbers (``NaN``, ``Infinity``: not JSON,
    though Python's parser reads them)."""
    if isinstance(data, str):
        if "\x00" in data:
            raise PydanticCustomError(
                "wire", "{where}: expected text without NUL characters", {"where": where}
            )
    elif isinstance(data, float):
        if not math.isfinite(data):
            raise PydanticCustomError(
                "wire", "{where}: expected a finite number, received {value}",
                {"where": where, "value": str(data)},
            )  # fmt: skip
    elif isinstance(data, Mapping):
        for key, value in data.items():
            # a key with control characters is named escaped (\r, \x00), readable
            shown = key if not isinstance(key, str) or key.isprintable() else _escaped(key)
            path = f"{where}.{shown}".removeprefix("body.")
            _storable(key, path)
            _storable(value, path)
    elif isinstance(data, Sequence) and not isinstance(data, bytes | bytearray):
        for index, value in enumerate(data):
            _storable(value, f"{where}.{index}".removeprefix("body."))


HeldAmount = Annotated[str, AfterValidator(_held_amount)]
AgentId = Annotated[str, AfterValidator(_ident(64))]
SlotKey = Annotated[str, AfterValidator(_slot_name)]
HttpUrl = Annotated[str, AfterValidator(_http_url)]
Label = Annotated[str, Field(max_length=64)]
SlotAllocationWire = dict[str, dict[str, Amount]]  # slot -> device -> amount
HeldAllocation = dict[SlotKey, dict[Annotated[str, Field(max_length=256)], HeldAmount]]


class _Wire(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class KernelStatus(enum.StrEnum):
    PREPARING = "PREPARING"
    RUNNING = "RUNNING"
    EXITED = "EXITED"  # ended by itself or was destroyed
    FAILED = "FAILED"  # could not start


class _Checked(_Wire):
    """A message the manager stores: NUL and NaN anywhere are refused before field checks."""

    @model_validator(mode="before")
    @classmethod
    def _refuse_unstorable(cls, data: Any) -> Any:
        if not _surely_storable(data):
            _storable(data)  # raises, naming where
        return data


class SlotCapacity(_Wire):
    type: SlotTypes
    capacity: HeldAmount


class DeviceView(_Wire):
    device_id: str
    slot_name: str
    slot_type: SlotTypes
    capacity: HeldAmount
    allocated: HeldAmount
    free: Amount | None = None  # capacity - allocated (added later; None from older agents)
    numa_node: int | None = None
    model_name: str = ""
    kernels: dict[str, HeldAmount] = Field(default_factory=dict)  # kernel id -> amount held


class PluginMapView(_Wire):
    """One plugin's allocation map: enough for the manager's per-device dry run."""

    key: str
    kind: str  # "discrete" | "fractional"
    strategy: str  # "FILL" | "EVENLY"
    quantum: HeldAmount | None = None  # fractional maps only
    exclusive_slot_types: list[str] = Field(default_factory=list)
    devices: list[DeviceView]
    # Devices still held by kernels under a slot the current plugin set renamed
    # (e.g. fractional -> discrete); counted as occupied until those kernels end.
    legacy_allocations: HeldAllocation = Field(default_factory=dict)


class AllocMapView(_Wire):
    agent_id: str
    maps: dict[str, PluginMapView]  # plugin key -> map


class Heartbeat(_Checked):
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


class HeartbeatAck(_Wire):
    # Kernels the manager considers gone (their sessions ended): the agent destroys them.
    destroy_kernels: list[str] = Field(default_factory=list)


class CreateKernelRequest(_Wire):
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


class ServicePortMapping(_Wire):
    """An app service of a kernel: the port it declared and the host port the agent gave
    it from ``[container] port-range`` (the app proxy connects to the host port)."""

    name: Annotated[str, Field(max_length=32)]
    protocol: Literal["http"] = "http"
    container_port: Annotated[int, Field(ge=1, le=65535)]
    host_port: Annotated[int, Field(ge=1, le=65535)]


class KernelReport(_Wire):
    kernel_id: str
    session_id: str = ""
    status: KernelStatus
    image: str = ""
    allocations: SlotAllocationWire = Field(default_factory=dict)
    container_id: str | None = None
    exit_code: Annotated[int, Field(ge=-INT32_MAX - 1, le=INT32_MAX)] | None = None
    reason: str = ""
    # The kernel's app services and their host ports (empty from older agents).
    service_ports: list[ServicePortMapping] = Field(default_factory=list)
    # With status FAILED: the request's plan no longer fits this agent (nothing was
    # created or recorded, no event follows); the manager plans the session again.
    conflict: bool = False


class KernelList(_Wire):
    kernels: list[KernelReport]


CreateKernelBatch = TypeAdapter(
    Annotated[list[CreateKernelRequest], Field(max_length=MAX_CREATE_BATCH)]
)
"""The body of ``POST /v1/kernels/batch``: a JSON list of create requests."""

KernelReports = TypeAdapter(list[KernelReport])
"""Its answer: a JSON list of reports, one per request, in order."""


class KernelEventType(enum.StrEnum):
    STARTED = "started"
    EXITED = "exited"
    FAILED = "failed"


class KernelEvent(_Wire):
    event_id: Annotated[str, AfterValidator(_ident(128))]  # unique; applied once
    kernel_id: Annotated[str, AfterValidator(_ident(64))]
    session_id: Annotated[str, Field(max_length=64)]
    event: KernelEventType
    exit_code: Annotated[int, Field(ge=-INT32_MAX - 1, le=INT32_MAX)] | None = None
    reason: str = ""
    at: datetime
    # "started": the kernel's app services and their host ports, so that a session the
    # event moves to RUNNING before the create's answer is recorded has them at once
    # (empty from older agents and for other events).
    service_ports: list[ServicePortMapping] = Field(default_factory=list)


class KernelEventBatch(_Checked):
    agent_id: AgentId
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
