"""Prometheus metrics of one agent (``GET /metrics``, no secret needed).

::

    accelshare_agent_kernels_running                 gauge    live kernels
    accelshare_agent_slot_capacity{slot="cpu"}       gauge    total capacity per slot
    accelshare_agent_slot_allocated{slot="cpu"}      gauge    allocated per slot
    accelshare_agent_legacy_kernels                  gauge    kernels holding renamed slots
    accelshare_agent_events_pending                  gauge    events not yet acknowledged
    accelshare_agent_kernel_create_seconds           histogram  create -> running (agent side)
    accelshare_agent_kernel_creates_total{result}    counter  running / failed / conflict

Gauges are read from the agent's state at scrape time (a custom collector), so nothing
has to keep them in step.  Each agent has its own registry (several agents may live in
one test process).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from decimal import Decimal

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = ["CONTENT_TYPE", "AgentMetrics", "StateSample"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass(frozen=True, slots=True)
class StateSample:
    kernels_running: int
    slots: dict[str, tuple[Decimal, Decimal]]  # slot -> (capacity, allocated)
    legacy_kernels: int
    events_pending: int


class _StateCollector(Collector):
    def __init__(self, sample: Callable[[], StateSample]) -> None:
        self._sample = sample

    def collect(self) -> Iterator[Metric]:
        state = self._sample()
        yield GaugeMetricFamily(
            "accelshare_agent_kernels_running", "Live kernels", value=state.kernels_running
        )
        capacity = GaugeMetricFamily(
            "accelshare_agent_slot_capacity", "Total capacity per slot", labels=["slot"]
        )
        allocated = GaugeMetricFamily(
            "accelshare_agent_slot_allocated", "Allocated amount per slot", labels=["slot"]
        )
        for slot, (cap, alloc) in sorted(state.slots.items()):
            capacity.add_metric([slot], float(cap))
            allocated.add_metric([slot], float(alloc))
        yield capacity
        yield allocated
        yield GaugeMetricFamily(
            "accelshare_agent_legacy_kernels",
            "Kernels holding slots the current plugin set renamed or dropped",
            value=state.legacy_kernels,
        )
        yield GaugeMetricFamily(
            "accelshare_agent_events_pending",
            "Kernel events not yet acknowledged by the manager",
            value=state.events_pending,
        )


class AgentMetrics:
    def __init__(self, sample: Callable[[], StateSample]) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.create_seconds = Histogram(
            "accelshare_agent_kernel_create_seconds",
            "Agent-side create_kernel latency until the kernel runs",
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self.creates = Counter(
            "accelshare_agent_kernel_creates",
            "create_kernel outcomes",
            labelnames=["result"],
            registry=self.registry,
        )
        self.registry.register(_StateCollector(sample))

    def render(self) -> bytes:
        return generate_latest(self.registry)
