"""Counting what a publisher could not send (pure, no I/O).

A stats publisher ticks every few seconds; while the bus is down its ticks fail.  The
first tick that goes through again carries how many were missed and how long the gap
was, and the publisher logs the outage once when it starts and once when it ends::

    tracker = GapTracker()
    tracker.failed(now=10.0)        # True: an outage starts (log it)
    tracker.failed(now=15.0)        # False: still the same outage
    tracker.succeeded(now=20.0)     # Gap(missed=2, seconds=20.0 - last_ok): log and report

``missed_total`` and ``last_gap`` stay after the outage, so every later report still
says how much was lost (a consumer polling now and then cannot miss it).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Gap", "GapTracker"]


@dataclass(frozen=True, slots=True)
class Gap:
    missed: int
    seconds: float


@dataclass(slots=True)
class GapTracker:
    last_ok: float | None = None
    missed: int = 0  # in the current outage
    outage_since: float | None = None
    missed_total: int = 0  # since the start
    last_gap: Gap | None = None  # the latest outage that ended

    def failed(self, *, now: float) -> bool:
        """Count a failed tick; True when this starts an outage."""
        self.missed += 1
        self.missed_total += 1
        if self.outage_since is None:
            self.outage_since = now
            return True
        return False

    def succeeded(self, *, now: float) -> Gap | None:
        """A tick went through: the gap it ends (None when nothing was missed)."""
        gap = None
        if self.missed:
            since = self.last_ok if self.last_ok is not None else self.outage_since
            gap = Gap(self.missed, max(0.0, now - (since if since is not None else now)))
            self.last_gap = gap
        self.last_ok = now
        self.missed = 0
        self.outage_since = None
        return gap
