"""In-process "something changed" notifications (session status changes, finished passes).

Waiters re-read the database after a wake-up, so a missed or spurious notification
only costs a poll: the database stays the source of truth, and waiters also wake on
a timeout so that changes made by *another* manager replica are seen too::

    while not done():
        await hub.wait(timeout_s=0.5)
"""

from __future__ import annotations

import asyncio
import contextlib

__all__ = ["ChangeHub"]


class ChangeHub:
    def __init__(self) -> None:
        self._event = asyncio.Event()
        self.version = 0

    def publish(self) -> None:
        """Wake every current waiter (callable from sync code on the event loop)."""
        self.version += 1
        event, self._event = self._event, asyncio.Event()
        event.set()

    async def wait(self, timeout_s: float) -> bool:
        """Wait for the next :meth:`publish` (True) or the timeout (False)."""
        event = self._event
        # asyncio.timeout rather than wait_for, which (Python 3.11) can swallow a
        # cancellation that coincides with the event firing.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await event.wait()
            return True
        return False
