"""What manager, agents, bus and clients exchange (JSON over HTTP and Redis).

Agent RPC (served by the agent, called by the manager; every request carries the
shared cluster secret in ``X-Accelshare-Cluster-Secret``)::

    POST   /v1/kernels                  CreateKernelRequest -> KernelReport  (idempotent by kernel_id)
    POST   /v1/kernels/batch            [CreateKernelRequest] -> [KernelReport]  (one report per
                                        request, in order; at most MAX_CREATE_BATCH; an older
                                        agent answers 404/405 and gets single creates)
    DELETE /v1/kernels/{kernel_id}      -> KernelReport                       (idempotent)
    GET    /v1/kernels                  -> KernelList
    GET    /v1/kernels/{kernel_id}/logs -> text/plain
    POST   /v1/kernels/{kernel_id}/execute  ExecuteRequest -> ExecuteResult  (a run's step)
    DELETE /v1/kernels/{kernel_id}/execute/{run_id}  -> 204  (kills the run)
    GET    /v1/alloc-map                -> AllocMapView        (?form=compat -> {device: "0.80"})
    GET    /v1/stats/node               -> NodeStats
    GET    /v1/stats/kernels            -> KernelStats
    GET    /v1/health                   -> {"status": "ok", "agent_id": ...}
    PUT    /v1/kernels/{kernel_id}/files?path=REL       file bytes -> FileUploadResult
    GET    /v1/kernels/{kernel_id}/files?path=REL       -> application/x-tar (a file or folder)
    GET    /v1/kernels/{kernel_id}/files/list?path=REL  -> FileList
    GET    /metrics                     -> Prometheus text (no secret needed)

Manager endpoints for agents (same secret)::

    POST /internal/agents/heartbeat     Heartbeat -> HeartbeatAck
    POST /internal/agents/events        KernelEventBatch -> 204

On the bus (Redis, when configured): kernel events as a :class:`KernelEventBatch`, and
each agent's latest :class:`StatsReport`.

Amounts are decimal strings (``"0.6"``, ``"2147483648"``) everywhere: never floats.
Unknown fields are ignored so that a newer agent can talk to an older manager.  What
the manager stores is checked at the edge (:mod:`.fields`).

The modules: :mod:`.agent_rpc` (kernels: create, report, list), :mod:`.storage` (the
storage proxy's manager- and client-facing APIs), :mod:`.execute` (code
execution in a kernel), :mod:`.files` (a kernel's working folder), :mod:`.heartbeat`
(heartbeats and kernel events), :mod:`.maps` (allocation map views), :mod:`.stats`
(live statistics) and :mod:`.fields` (field types, base models, checks).  This package
imports nothing of accelshare but :mod:`accelshare.common` (an import-linter contract
in ``pyproject.toml`` holds it to that).
"""

from .agent_rpc import (
    CLUSTER_SECRET_HEADER,
    MAX_CREATE_BATCH,
    CreateKernelBatch,
    CreateKernelRequest,
    KernelList,
    KernelMount,
    KernelReport,
    KernelReports,
    KernelStatus,
    ServicePortMapping,
)
from .execute import BatchOptions, ExecuteRequest, ExecuteResult
from .files import FileEntry, FileList, FileUploadResult
from .heartbeat import (
    Heartbeat,
    HeartbeatAck,
    KernelEvent,
    KernelEventBatch,
    KernelEventType,
    SlotCapacity,
)
from .maps import AllocMapView, DeviceView, PluginMapView
from .stats import KernelStats, MetricValue, NodeStats, StatsReport

__all__ = [
    "CLUSTER_SECRET_HEADER",
    "MAX_CREATE_BATCH",
    "AllocMapView",
    "BatchOptions",
    "CreateKernelBatch",
    "CreateKernelRequest",
    "DeviceView",
    "ExecuteRequest",
    "ExecuteResult",
    "FileEntry",
    "FileList",
    "FileUploadResult",
    "Heartbeat",
    "HeartbeatAck",
    "KernelEvent",
    "KernelEventBatch",
    "KernelEventType",
    "KernelList",
    "KernelMount",
    "KernelReport",
    "KernelReports",
    "KernelStats",
    "KernelStatus",
    "MetricValue",
    "NodeStats",
    "PluginMapView",
    "ServicePortMapping",
    "SlotCapacity",
    "StatsReport",
]
