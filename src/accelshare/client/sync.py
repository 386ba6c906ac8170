"""A thin synchronous wrapper for scripts: the async client on a private event loop.

::

    from accelshare.client import SyncAccelshareClient

    with SyncAccelshareClient.from_env() as client:
        created = client.sessions.create("python", resources={"cuda.shares": "0.5"})
        for event in client.sessions.events(created.session_id):   # a plain iterator
            print(event.status)

Same methods, arguments, results and errors as :class:`AccelshareClient`; each call
runs to completion before it returns.  Not for use inside a running event loop (use
the async client there).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import httpx

from .client import AccelshareClient
from .config import ClientConfig

__all__ = ["SyncAccelshareClient"]


def _iterate(runner: asyncio.Runner, stream: AsyncIterator[Any]) -> Iterator[Any]:
    try:
        while True:
            try:
                yield runner.run(anext(stream))  # type: ignore[arg-type]
            except StopAsyncIteration:
                return
    finally:
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            runner.run(aclose())


class _SyncView:
    """Wraps an object of the async client: coroutine methods run to completion,
    async iterators become iterators, sub-APIs are wrapped in turn."""

    def __init__(self, target: Any, runner: asyncio.Runner) -> None:
        self._target = target
        self._runner = runner

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._target, name)
        if name.startswith("_"):
            return attr
        if inspect.iscoroutinefunction(attr) or inspect.isasyncgenfunction(attr):
            return self._wrap(attr)
        if hasattr(attr, "_http") and not callable(attr):
            return _SyncView(attr, self._runner)
        return attr

    def _wrap(self, method: Callable[..., Any]) -> Callable[..., Any]:
        runner = self._runner

        def call(*args: Any, **kwargs: Any) -> Any:
            result = method(*args, **kwargs)
            if inspect.isasyncgen(result):
                return _iterate(runner, result)
            return runner.run(result)

        call.__name__ = getattr(method, "__name__", "call")
        call.__doc__ = method.__doc__
        return call


class SyncAccelshareClient(_SyncView):
    def __init__(
        self,
        config: ClientConfig,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        timeout_s: float | None = None,
    ) -> None:
        runner = asyncio.Runner()
        client = runner.run(_make(config, transport, timeout_s))
        super().__init__(client, runner)

    @classmethod
    def from_env(
        cls,
        *,
        endpoint: str | None = None,
        access_key: str | None = None,
        secret_key: str | None = None,
        config_file: Path | None = None,
    ) -> Self:
        from .config import load_client_config

        return cls(
            load_client_config(
                endpoint=endpoint,
                access_key=access_key,
                secret_key=secret_key,
                config_file=config_file,
            )
        )

    def close(self) -> None:
        try:
            self._runner.run(self._target.close())
        finally:
            self._runner.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


async def _make(
    config: ClientConfig, transport: httpx.AsyncBaseTransport | None, timeout_s: float | None
) -> AccelshareClient:
    # Built inside the loop that will use it.
    return AccelshareClient(config, transport=transport, timeout_s=timeout_s)
