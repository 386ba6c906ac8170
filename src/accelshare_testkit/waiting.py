"""Polling with a deadline, for tests and benchmarks (no sleep is an assertion)::

info = await until(lambda: running(client, "s1"), "s1 to run", timeout_s=30)
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

__all__ = ["until"]

T = TypeVar("T")


async def until(
    check: Callable[[], Awaitable[T | None]],
    what: str,
    timeout_s: float = 60.0,
    interval_s: float = 0.1,
) -> T:
    """Await ``check()`` until it returns something truthy and return that; fail with
    ``AssertionError("timed out waiting for <what>")`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        await asyncio.sleep(interval_s)
