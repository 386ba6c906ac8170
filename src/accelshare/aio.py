"""Small asyncio helpers shared by the agent, the manager and the bus (not the pure core).

``cancel_and_wait`` exists because one ``task.cancel()`` is not always enough on
Python 3.11: a cancellation that arrives while a library is inside its own timeout
(redis-py wraps every read in ``asyncio.timeout``) can be turned into that library's
timeout error, which a retry loop then catches and goes on.  The task is left
"cancelling" but running, and ``await task`` waits forever.  This was seen for real: the
manager's Redis events loop, stopped while Redis restarted, hung the test run in about
one stop in five.  Cancelling again until the task has ended closes the gap::

    await cancel_and_wait(self._tasks)
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

__all__ = ["cancel_and_wait"]

log = logging.getLogger(__name__)


async def cancel_and_wait(
    tasks: Iterable[asyncio.Task[object]] | Iterable[asyncio.Task[None]],
    *,
    recancel_every_s: float = 0.1,
) -> None:
    """Cancel ``tasks`` and return once every one of them has ended.

    A task that swallowed the cancellation is cancelled again every
    ``recancel_every_s``.  An exception a task ended with (other than the cancellation)
    is logged, not raised: the caller is shutting down and has nothing to do with it.
    If the caller itself is cancelled meanwhile, that cancellation propagates.
    """
    every = list(tasks)
    pending = {task for task in every if not task.done()}
    while pending:
        for task in pending:
            task.cancel()
        _done, pending = await asyncio.wait(pending, timeout=recancel_every_s)
    for task in every:
        if task.cancelled():
            continue
        error = task.exception()
        if error is not None:
            log.error("task %s ended with an error while stopping", task.get_name(), exc_info=error)
