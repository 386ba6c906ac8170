"""Prometheus metrics of one manager (its own registry: several apps may share a process).

* ``accelshare_sessions{status}`` and ``accelshare_agents{status}`` — gauges set from the
  database when ``/metrics`` is scraped (no drifting counters);
* ``accelshare_scheduler_pass_seconds`` — histogram of pass latency (snapshot + plan +
  apply, lock held);
* ``accelshare_scheduler_placements_total`` / ``..._failures_total`` — sessions placed /
  left pending per pass; ``accelshare_bind_failures_total`` — kernels the agents refused;
  ``accelshare_bind_conflicts_total`` — plans an agent refused as no longer fitting
  (those sessions were planned again);
* ``accelshare_event_delivery_seconds{path}`` — from a kernel event on its agent to the
  manager applying it, by the path that brought it first (``http`` or ``redis``; hosts'
  clocks must agree for this to mean anything across machines);
  ``accelshare_bus_events_received_total`` — kernel events read from the Redis stream.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

__all__ = ["ManagerMetrics"]


class ManagerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.sessions = Gauge(
            "accelshare_sessions", "Sessions by status", ["status"], registry=self.registry
        )
        self.agents = Gauge(
            "accelshare_agents", "Agents by status", ["status"], registry=self.registry
        )
        self.pass_seconds = Histogram(
            "accelshare_scheduler_pass_seconds",
            "Scheduling pass latency (lock held: snapshot, plan, apply)",
            ["scaling_group"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=self.registry,
        )
        self.placements = Counter(
            "accelshare_scheduler_placements",
            "Sessions placed on an agent",
            ["scaling_group"],
            registry=self.registry,
        )
        self.pending_left = Counter(
            "accelshare_scheduler_failures",
            "Sessions a pass left pending",
            ["scaling_group"],
            registry=self.registry,
        )
        self.event_delivery = Histogram(
            "accelshare_event_delivery_seconds",
            "Kernel event age when the manager applied it, by the path that brought it first",
            ["path"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=self.registry,
        )
        self.bus_events = Counter(
            "accelshare_bus_events_received",
            "Kernel events read from the Redis stream (applied or already known)",
            registry=self.registry,
        )
        self.bind_failures = Counter(
            "accelshare_bind_failures",
            "Kernels an agent refused or that could not be created",
            registry=self.registry,
        )
        self.bind_conflicts = Counter(
            "accelshare_bind_conflicts",
            "Plans an agent refused as no longer fitting (the sessions were planned again)",
            registry=self.registry,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
