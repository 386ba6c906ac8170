"""Live statistics: what an agent's plugins measure, per node, device and kernel.

The agent answers ``GET /v1/stats/node`` and ``GET /v1/stats/kernels`` with
:class:`NodeStats` and :class:`KernelStats`, and publishes both on the bus once a tick
as a :class:`StatsReport` (:mod:`accelshare.bus`), which the manager reads.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import Field

from .fields import Amount, WireModel

__all__ = ["KernelStats", "MetricValue", "NodeStats", "StatsReport"]


class MetricValue(WireModel):
    name: str  # e.g. "cuda_util", "cuda_mem", "cpu_util", "mem"
    device_id: str | None = None  # None: the node-wide (summed) value
    value: Amount
    capacity: Amount | None = None
    unit: str = ""


class NodeStats(WireModel):
    agent_id: str
    at: datetime
    metrics: list[MetricValue]


class KernelStats(WireModel):
    agent_id: str
    at: datetime
    kernels: dict[str, list[MetricValue]]


class StatsReport(WireModel):
    """One agent's statistics tick on the bus: node and per-device metrics and
    per-kernel metrics from its plugins, a sequence number, and what Redis outages cost:
    ``missed`` ticks that could not be published since the agent started, and ``gap_s``,
    the length of the latest such gap.  Both stay in every later report, so a consumer
    that looks now and then still sees them; ``seq`` jumps by the same count."""

    agent_id: str
    seq: int = Field(ge=0)  # per agent process, +1 per tick (published or not)
    at: datetime
    node: NodeStats
    kernels: KernelStats
    missed: int = Field(default=0, ge=0)  # ticks not published since the agent started
    gap_s: float = Field(default=0.0, ge=0)  # the latest gap between published ticks, seconds
