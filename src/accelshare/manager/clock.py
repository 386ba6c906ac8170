"""The manager's clock: injected everywhere a timestamp or a deadline is computed.

Tests pass a :class:`FrozenClock` and move it by hand; nothing sleeps.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TypeAlias

__all__ = ["Clock", "FrozenClock", "utcnow"]

Clock: TypeAlias = Callable[[], datetime]
"""A zero-argument callable returning a timezone-aware UTC ``datetime``."""


def utcnow() -> datetime:
    return datetime.now(UTC)


class FrozenClock:
    """A clock that only moves when told to (for tests and deterministic tools)."""

    def __init__(self, start: datetime) -> None:
        if start.tzinfo is None:
            raise ValueError("FrozenClock needs a timezone-aware start")
        self.now = start

    def __call__(self) -> datetime:
        return self.now

    def advance(self, delta: timedelta) -> datetime:
        self.now += delta
        return self.now
