"""What travels on the bus (JSON; amounts are decimal strings, never floats).

* :class:`StatsReport` — one agent's statistics tick: node and per-device metrics
  and per-kernel metrics from its plugins, a sequence number, and what Redis outages
  cost: ``missed`` ticks that could not be published since the agent started, and
  ``gap_s``, the length of the latest such gap.  Both stay in every later report, so
  a consumer that looks now and then still sees them; ``seq`` jumps by the same count.
* kernel events are the agent wire protocol's :class:`~accelshare.agent.wire.KernelEventBatch`.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from accelshare.agent.wire import KernelStats, NodeStats

__all__ = ["StatsReport"]


class StatsReport(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    agent_id: str
    seq: int = Field(ge=0)  # per agent process, +1 per tick (published or not)
    at: datetime
    node: NodeStats
    kernels: KernelStats
    missed: int = Field(default=0, ge=0)  # ticks not published since the agent started
    gap_s: float = Field(default=0.0, ge=0)  # the latest gap between published ticks, seconds
