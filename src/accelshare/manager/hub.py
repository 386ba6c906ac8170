"""In-process "something changed" notifications (session status changes, finished passes).

Waiters re-read the database after a wake-up, so a missed or spurious notification
only costs a poll: the database stays the source of truth, and waiters also wake on
a timeout so that changes made by *another* manager replica are seen too::

    while not done():
        await hub.wait(timeout_s=0.5)

Listeners (:meth:`ChangeHub.add_listener`) hear every publish; the Redis bus link uses
one to tell the other replicas, and publishes their notices here with ``remote=True``
(so they are not sent back out).

``version`` counts every publish; ``status_version`` only those that may have changed
a session's status: all but the ones made with ``statuses=False`` (a session enqueued,
PENDING from its first commit).  A waiter for a session's status
(:class:`~accelshare.manager.status_watch.StatusWatch`) that read ``status_version``
before the session's row was committed knows, while the counter has not moved, that
nothing published a change of it since.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Protocol

__all__ = ["ChangeHub", "ChangeListener"]

log = logging.getLogger(__name__)


class ChangeListener(Protocol):
    def __call__(self, *, remote: bool) -> None: ...


class ChangeHub:
    def __init__(self) -> None:
        self._event = asyncio.Event()
        self._listeners: list[ChangeListener] = []
        self.version = 0
        self.status_version = 0

    def add_listener(self, listener: ChangeListener) -> None:
        self._listeners.append(listener)

    def remove_listener(self, listener: ChangeListener) -> None:
        with contextlib.suppress(ValueError):
            self._listeners.remove(listener)

    def publish(self, *, remote: bool = False, statuses: bool = True) -> None:
        """Wake every current waiter (callable from sync code on the event loop);
        ``remote``: the change happened on another replica; ``statuses=False``: no
        existing session's status changed (a session was enqueued); a remote change
        always counts as a status change."""
        self.version += 1
        if statuses or remote:
            self.status_version += 1
        event, self._event = self._event, asyncio.Event()
        event.set()
        for listener in self._listeners:
            try:
                listener(remote=remote)
            except Exception:  # a listener must not break the publisher
                log.exception("change listener failed")

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
