"""``accelshare server storage --config storage.toml``: both APIs under one uvicorn loop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Iterator
from pathlib import Path

import uvicorn

from accelshare.logs import configure_logging

from .app import StorageProxy, client_app, manager_app
from .config import StorageConfigError, load_storage_config

__all__ = ["QuietServer", "launch_storage", "serve_storage"]

log = logging.getLogger(__name__)
SWEEP_INTERVAL_S = 600.0


class QuietServer(uvicorn.Server):
    """A uvicorn server that leaves signals alone (the caller handles them)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def _split(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    return host.strip("[]"), int(port)


async def serve_storage(proxy: StorageProxy) -> None:
    """Serve until SIGTERM/SIGINT."""
    section = proxy.config.storage_proxy
    servers = []
    for app, addr in (
        (manager_app(proxy), section.manager_api),
        (client_app(proxy), section.client_api),
    ):
        host, port = _split(addr)
        config = uvicorn.Config(app, host=host, port=port, log_config=None, access_log=False,
                                timeout_graceful_shutdown=5)  # fmt: skip
        server = QuietServer(config)
        servers.append(server)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)

    async def sweep() -> None:
        while True:
            await asyncio.sleep(SWEEP_INTERVAL_S)
            for volume in proxy.volumes.values():
                with contextlib.suppress(OSError):
                    await asyncio.to_thread(volume.sweep_uploads)

    tasks = [asyncio.create_task(s.serve()) for s in servers]
    sweeper = asyncio.create_task(sweep())
    log.info(
        "storage proxy %s: manager API on %s, client API on %s (%s), volumes %s",
        section.node_id, section.manager_api, section.client_api, section.public_client_url,
        ", ".join(proxy.volumes),
    )  # fmt: skip
    waiter = asyncio.create_task(stop.wait())
    await asyncio.wait([waiter, *tasks], return_when=asyncio.FIRST_COMPLETED)
    for server in servers:
        server.should_exit = True
    sweeper.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    waiter.cancel()


def launch_storage(config_path: Path, *, log_level: str = "info", json_logs: bool = False) -> int:
    configure_logging(log_level, as_json=json_logs)
    try:
        config = load_storage_config(config_path)
    except StorageConfigError as e:
        log.error("%s", e)
        return 1
    proxy = StorageProxy(config)
    try:
        proxy.prepare()
    except OSError as e:
        log.error("cannot prepare the volumes: %s", e)
        return 1
    asyncio.run(serve_storage(proxy))
    return 0
