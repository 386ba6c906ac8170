"""The binder's group commit: concurrent callers share one call of the step."""

from __future__ import annotations

import asyncio

import pytest

from accelshare.manager.scheduler.binding.group_commit import GroupCommit


async def test_callers_arriving_during_a_step_share_the_next_one() -> None:
    calls: list[list[int]] = []
    gate = asyncio.Event()

    async def step(requests: list[int]) -> list[int]:
        calls.append(list(requests))
        if len(calls) == 1:
            await gate.wait()
        return [r * 10 for r in requests]

    group: GroupCommit[int, int] = GroupCommit(step)
    first = asyncio.create_task(group([1]))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    later = [asyncio.create_task(group(reqs)) for reqs in ([2, 3], [4], [5, 6])]
    await asyncio.sleep(0)
    gate.set()
    assert await first == [10]
    assert [await t for t in later] == [[20, 30], [40], [50, 60]]
    assert calls == [[1], [2, 3, 4, 5, 6]]


async def test_a_step_is_limited_in_size() -> None:
    calls: list[list[int]] = []

    async def step(requests: list[int]) -> list[int]:
        calls.append(list(requests))
        await asyncio.sleep(0)
        return requests

    group: GroupCommit[int, int] = GroupCommit(step, limit=3)
    results = await asyncio.gather(group([1, 2]), group([3]), group([4, 5]), group([6, 7, 8, 9]))
    assert results == [[1, 2], [3], [4, 5], [6, 7, 8, 9]]
    # an over-limit request goes alone; the others are packed up to the limit
    assert calls == [[1, 2, 3], [4, 5], [6, 7, 8, 9]]


async def test_a_failed_step_fails_its_callers_only() -> None:
    async def step(requests: list[int]) -> list[int]:
        await asyncio.sleep(0)
        if 0 in requests:
            raise RuntimeError("boom")
        return requests

    group: GroupCommit[int, int] = GroupCommit(step)
    failing = asyncio.create_task(group([0]))
    await asyncio.sleep(0)
    ok = asyncio.create_task(group([1]))  # queued behind the failing step
    with pytest.raises(RuntimeError, match="boom"):
        await failing
    assert await ok == [1]
    await group.close()
