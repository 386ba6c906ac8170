"""cancel_and_wait: a task that swallows a cancellation is still stopped (the Python 3.11
redis-py hang seen in CI), errors are logged not raised, and the caller stays
cancellable."""

from __future__ import annotations

import asyncio
import logging

import pytest

from accelshare.aio import cancel_and_wait


async def _swallows_cancellations(times: int | list[int], swallowed: list[int]) -> None:
    # What a retry loop does when a library turns our cancellation into its own
    # timeout error: it catches it and goes round again.  ``times`` may be a one-item
    # list, for a limit the test changes later.
    while True:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            limit = times[0] if isinstance(times, list) else times
            if len(swallowed) >= limit:
                raise
            swallowed.append(1)
            task = asyncio.current_task()
            assert task is not None
            task.uncancel()


async def test_a_task_that_swallows_cancellations_is_cancelled_until_it_ends() -> None:
    swallowed: list[int] = []
    task = asyncio.create_task(_swallows_cancellations(3, swallowed))
    await asyncio.sleep(0)
    await asyncio.wait_for(cancel_and_wait([task], recancel_every_s=0.01), timeout=5)
    assert task.cancelled()
    assert len(swallowed) == 3  # it took four cancellations


async def test_one_plain_cancel_would_have_hung() -> None:
    # The control: what the old stop() did (cancel once, await) does not end.
    swallowed: list[int] = []
    task = asyncio.create_task(_swallows_cancellations(1, swallowed))
    await asyncio.sleep(0)
    task.cancel()
    done, _pending = await asyncio.wait([task], timeout=0.2)
    assert not done
    await cancel_and_wait([task])
    assert task.cancelled()


async def test_errors_are_logged_and_finished_tasks_are_fine(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def fails() -> None:
        raise RuntimeError("boom")

    async def returns() -> None:
        return None

    failing = asyncio.create_task(fails(), name="the-failing-one")
    finished = asyncio.create_task(returns())
    await asyncio.sleep(0)
    with caplog.at_level(logging.ERROR, logger="accelshare.aio"):
        await cancel_and_wait([failing, finished])
    assert [r.getMessage() for r in caplog.records] == [
        "task the-failing-one ended with an error while stopping"
    ]
    assert caplog.records[0].exc_info is not None
    await cancel_and_wait([])  # nothing to do


async def test_the_caller_stays_cancellable() -> None:
    swallowed: list[int] = []
    limit = [10**9]
    stubborn = asyncio.create_task(_swallows_cancellations(limit, swallowed))
    await asyncio.sleep(0)
    stopper = asyncio.create_task(cancel_and_wait([stubborn], recancel_every_s=0.01))
    await asyncio.sleep(0.05)
    stopper.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stopper
    assert len(swallowed) >= 2  # it was being cancelled over and over
    limit[0] = 0  # clean up: it swallows no more
    await cancel_and_wait([stubborn])
    assert stubborn.cancelled()
