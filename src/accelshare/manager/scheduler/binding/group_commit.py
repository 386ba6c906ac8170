"""Group commit: one call of a step for the requests of many concurrent callers."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

from accelshare.aio import cancel_and_wait

__all__ = ["GROUP_LIMIT", "GroupCommit"]

GROUP_LIMIT = 1024  # sessions per group-committed transaction


_Req = TypeVar("_Req")
_Res = TypeVar("_Res")


class GroupCommit(Generic[_Req, _Res]):
    """Run ``step`` over the requests of many callers at once: what arrives while one
    call of ``step`` runs is handled by the next (up to ``limit`` requests a call).
    ``step`` returns one result per request, in order; its exception goes to all."""

    def __init__(
        self, step: Callable[[list[_Req]], Awaitable[list[_Res]]], limit: int = GROUP_LIMIT
    ) -> None:
        self._step = step
        self._limit = limit
        self._queue: list[tuple[list[_Req], asyncio.Future[list[_Res]]]] = []
        self._task: asyncio.Task[None] | None = None

    async def __call__(self, requests: list[_Req]) -> list[_Res]:
        future: asyncio.Future[list[_Res]] = asyncio.get_running_loop().create_future()
        self._queue.append((requests, future))
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        while self._queue:
            batch: list[tuple[list[_Req], asyncio.Future[list[_Res]]]] = []
            size = 0
            while self._queue and (not batch or size + len(self._queue[0][0]) <= self._limit):
                item = self._queue.pop(0)
                batch.append(item)
                size += len(item[0])
            batch = [(reqs, fut) for reqs, fut in batch if not fut.cancelled()]
            if not batch:
                continue
            try:
                results = await self._step([r for reqs, _ in batch for r in reqs])
            except Exception as e:
                for _, fut in batch:
                    if not fut.done():
                        fut.set_exception(e)
                continue
            except BaseException:
                for _, fut in batch:
                    fut.cancel()
                raise
            start = 0
            for reqs, fut in batch:
                if not fut.done():
                    fut.set_result(results[start : start + len(reqs)])
                start += len(reqs)

    async def close(self) -> None:
        if self._task is not None:
            await cancel_and_wait([self._task])
            self._task = None
