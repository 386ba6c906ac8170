"""What one scheduling pass decides: the placements (:class:`Assignment`) and, for every
session left pending, why (:class:`Failure`), in one :class:`SchedulingPlan` (pure,
no I/O); the pass itself is :mod:`accelshare.sched.onepass`."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from accelshare.alloc import AllocationByMap
from accelshare.common import Allocation, ResourceSlot, canonical_decimal

from .fit import device_allocation
from .model import PredicateResult

__all__ = [
    "MAX_AGENT_REASONS",
    "MAX_SHORTAGE_AGENTS",
    "NEVER_FITS",
    "Assignment",
    "DeviceShortage",
    "Failure",
    "FailureKind",
    "SchedulingPlan",
]

NEVER_FITS = (
    "No agent could hold the request even if it were empty; waiting for an agent that can to join: "
)
"""The why-pending of a session no agent of its pool could ever hold (kept by
``waitForAgents``, or enqueued before any agent of its scaling group was alive)."""
MAX_AGENT_REASONS = 10
"""A failure lists the per-agent reasons of the first 10 agents (by id) and one
``"... and N more agent(s)"`` line: a 1,000-agent cluster would otherwise compute (a
per-device dry run each) and store 1,000 lines for every pending session on every pass."""


@dataclass(frozen=True, slots=True)
class Assignment:
    """Session -> agent, with the placement the dry run made on the agent's devices."""

    session_id: str
    agent_id: str
    requested_slots: ResourceSlot
    allocation: AllocationByMap  # plugin key -> slot -> device -> amount
    passed_predicates: tuple[PredicateResult, ...] = ()

    @property
    def kernel_allocation(self) -> Allocation:
        """``{slot: {device: amount}}``: the kernel's allocation (``kernels.allocation``)."""
        return device_allocation(self.allocation)


class FailureKind(enum.StrEnum):
    PREDICATE = "predicate"  # a predicate failed; agents were not looked at
    NO_AGENT = "no-agent"  # predicates passed, no agent can hold it now
    DEFERRED = "deferred"  # not tried: a higher-priority band is waiting for resources


@dataclass(frozen=True, slots=True)
class DeviceShortage:
    """An accelerator slot a shown agent could not give a session, with that agent's
    devices of the slot as the pass ended: what the console words as "GPU 0 and GPU 1
    are full (0 of 1 fGPU free each)".  ``devices`` are ``(device, free, capacity)`` in
    the map's declaration order (a device's position there is its number)."""

    agent_id: str
    slot: str
    needs: Decimal
    devices: tuple[tuple[str, Decimal, Decimal], ...]

    def as_json(self) -> dict[str, Any]:
        return {
            "agent": self.agent_id,
            "slot": self.slot,
            "needs": canonical_decimal(self.needs),
            "devices": [
                {"id": d, "free": canonical_decimal(f), "capacity": canonical_decimal(c)}
                for d, f, c in self.devices
            ],
        }


MAX_SHORTAGE_AGENTS = 3
"""A failure carries the device shortages of at most this many of its shown agents."""


@dataclass(frozen=True, slots=True)
class Failure:
    """A session left PENDING by this pass, and why."""

    session_id: str
    kind: FailureKind
    msg: str
    retries: int  # status_data.scheduler.retries after this pass
    failed_predicates: tuple[PredicateResult, ...] = ()
    passed_predicates: tuple[PredicateResult, ...] = ()
    # "i-node01: cuda.shares needs 1.2, ..."; the first MAX_AGENT_REASONS agents by id,
    # then "... and N more agent(s)"
    agent_reasons: tuple[str, ...] = ()
    blocks_lower_priorities: bool = False
    # the accelerator slots the first shown agents could not give, device by device
    shortages: tuple[DeviceShortage, ...] = ()

    @property
    def adds_retry(self) -> bool:
        """Whether this failure counts as a failed attempt (``retries`` + 1): a deferred
        session was not tried (its ``retries`` stays, see
        :mod:`accelshare.sched.onepass`)."""
        return self.kind is not FailureKind.DEFERRED

    def scheduler_data(self, now: datetime) -> dict[str, Any]:
        """``status_data["scheduler"]`` (Backend.AI's keys, plus ``agents`` and ``kind``)."""
        return {
            "retries": self.retries,
            "last_try": now.isoformat(),
            "failed_predicates": [
                {"name": r.name, "msg": r.message} for r in self.failed_predicates
            ],
            "passed_predicates": [{"name": r.name} for r in self.passed_predicates],
            "msg": self.msg,
            "agents": list(self.agent_reasons),
            "kind": self.kind.value,
            "devices": [shortage.as_json() for shortage in self.shortages],
        }


@dataclass(frozen=True, slots=True)
class SchedulingPlan:
    scaling_group: str
    assignments: tuple[Assignment, ...]
    failures: tuple[Failure, ...]
    last_roundrobin_agent: str | None = None

    def by_agent(self) -> dict[str, list[Assignment]]:
        grouped: dict[str, list[Assignment]] = {}
        for a in self.assignments:
            grouped.setdefault(a.agent_id, []).append(a)
        return grouped
