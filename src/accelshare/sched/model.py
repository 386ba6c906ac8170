"""Frozen inputs and outputs of a scheduling pass.

The manager loads a :class:`SchedulingSnapshot` from its database inside one
transaction, hands it to the pure scheduler, and applies the returned plan with an
optimistic check.  Nothing here does I/O.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime

from accelshare.common import ResourceSlot

from .images import ImageRequirement

__all__ = [
    "AgentState",
    "KeypairLimits",
    "PendingSession",
    "PredicateResult",
    "SessionType",
]


class SessionType(enum.StrEnum):
    INTERACTIVE = "interactive"
    BATCH = "batch"


@dataclass(frozen=True, slots=True)
class PendingSession:
    """A PENDING session as the scheduler sees it."""

    id: str
    access_key: str
    requested_slots: ResourceSlot
    created_at: datetime
    user_id: str = ""
    group_id: str = ""
    domain_name: str = ""
    name: str = ""
    priority: int = 10
    session_type: SessionType = SessionType.INTERACTIVE
    starts_at: datetime | None = None
    dependencies: tuple[str, ...] = ()
    retries: int = 0  # failed scheduling attempts so far (status_data.scheduler.retries)
    allow_fragmentation: bool = True
    designated_agent: str | None = None
    image: ImageRequirement | None = None  # None: not a catalogue image, no agent check


@dataclass(frozen=True, slots=True)
class KeypairLimits:
    """The resource-policy limits of one access key (0 = unlimited for the counts)."""

    max_concurrent_sessions: int = 0
    max_pending_session_count: int = 0
    max_pending_session_resource_slots: ResourceSlot | None = None
    total_resource_slots: ResourceSlot | None = None  # the keypair quota; None = unlimited

    @property
    def limits_running(self) -> bool:
        """Whether a scheduling predicate reads this keypair's running sessions (a
        concurrency limit or a keypair quota); the pending limits are enqueue checks."""
        return self.max_concurrent_sessions > 0 or self.total_resource_slots is not None


@dataclass(frozen=True, slots=True)
class AgentState:
    """An ALIVE, schedulable agent as the selectors see it (totals only).

    The per-device check ("can its allocation maps really hold the request?") is a
    separate :class:`~accelshare.sched.fit.DeviceFit` so that selectors stay simple.
    """

    id: str
    available_slots: ResourceSlot
    occupied_slots: ResourceSlot
    scaling_group: str = "default"
    runtime: str = "process"
    architecture: str = "x86_64"
    images: frozenset[str] = frozenset()  # what its runtime reports it can run

    @property
    def remaining_slots(self) -> ResourceSlot:
        return self.available_slots - self.occupied_slots


@dataclass(frozen=True, slots=True)
class PredicateResult:
    name: str
    passed: bool
    message: str = ""
