"""Launching the manager daemon: the application of :mod:`accelshare.api.app` under uvicorn.

``accelshare server manager`` (and ``python -m accelshare.client.cli.server_manager``)
parse the command line and call :func:`launch_manager`.

At start the database schema is created or upgraded and the defaults are bootstrapped
(the superadmin's credentials go to ``<data-dir>/admin-credentials.env`` once); then
the API (REST, GraphQL, agent endpoints, ``/metrics``) listens on
``[manager] service-addr`` with uvicorn, and with ``[apps] listen-addr`` the same
application listens there too (the apps origin).  SIGINT / SIGTERM stop it gracefully:
new requests are refused, the scheduler and the LOST sweep stop, binds in flight get a
few seconds, and the database engine is closed.  A configuration error is printed as
``error: <file>: <key>: <what was expected> (received ...)`` with exit code 2; a
database, bootstrap, config-store or OS error is one ``error:`` line with exit code 1.

The launcher sits in ``api`` because it serves the application that ``api`` builds;
``manager`` (below ``api``) never imports it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Literal

import uvicorn
from uvicorn.config import LOGGING_CONFIG

from accelshare.common import CommonValueError
from accelshare.config import ConfigFileError, ConfigStoreError
from accelshare.logs import configure_logging
from accelshare.manager.assembly import SchemaError
from accelshare.manager.bootstrap import BootstrapError
from accelshare.manager.config import load_manager_config, parse_host_port
from accelshare.manager.gc_tuning import tune_gc

from .app import create_manager_app
from .stream import close_streams

__all__ = ["launch_manager"]

log = logging.getLogger("accelshare.manager")


KEEP_ALIVE_S = 30
"""How long an idle keep-alive connection is held open: Backend.AI's manager holds them
30 s.  Clients pool idle connections for a while (aiohttp's pool keeps them 15 s, so the
official SDK does); a server that closed them sooner (uvicorn's default: 5 s) broke the
next request of an SDK session that had sat idle with "Broken pipe"."""


class _Server(uvicorn.Server):
    """uvicorn's server, but a SIGTERM/SIGINT stop exits 0 after the graceful shutdown
    (uvicorn re-raises the signal afterwards, so the process would die by it)."""

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True  # a second Ctrl-C: do not wait any longer
        else:
            self.should_exit = True
        close_streams(self.config.app)  # open event streams would hold the shutdown


class _Listener(uvicorn.Server):
    """A second listener of the same application: the main server owns the signals
    (and stops this one when it stops)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def _serve(config_path: Path | None, log_level: str, *, json_logs: bool = False) -> None:
    config = load_manager_config(config_path)
    app = await create_manager_app(config)
    tune_gc()  # the long-lived heap: fewer, cheaper full collections (see the module)
    host, port = config.manager.service_host_port

    def server_config(host: str, port: int, *, lifespan: Literal["on", "off"]) -> uvicorn.Config:
        return uvicorn.Config(
            app,
            host=host,
            port=port,
            lifespan=lifespan,
            log_level=log_level.lower(),
            # --json: no config of uvicorn's own, its records reach the root's JSON handler
            log_config=None if json_logs else LOGGING_CONFIG,
            access_log=False,
            timeout_graceful_shutdown=10,
            timeout_keep_alive=KEEP_ALIVE_S,
        )

    server = _Server(server_config(host, port, lifespan="on"))
    log.info("accelshare manager listening on http://%s:%d", host, port)
    if config.apps.listen_addr is None:
        if config.apps.origin is None:
            log.warning(
                "app pages are served on the console's origin ([apps] is not set): an app's "
                "page can use the user's login; see docs/manager.md, 'App pages'"
            )
        await server.serve()
        return
    # [apps] listen-addr: the same application on a second listener, the apps origin
    # (the middleware tells the two apart by the listener's port).
    apps_host, apps_port = parse_host_port(config.apps.listen_addr)
    apps_server = _Listener(server_config(apps_host, apps_port, lifespan="off"))
    log.info("app pages (the apps origin) on http://%s:%d", apps_host, apps_port)
    apps_task = asyncio.create_task(apps_server.serve(), name="apps-listener")
    try:
        await server.serve()
    finally:
        apps_server.should_exit = True
        await apps_task


def launch_manager(
    config_path: Path | None, *, log_level: str = "info", json_logs: bool = False
) -> int:
    """Run the manager until SIGTERM/SIGINT (blocking); returns the process's exit code.
    ``log_level`` is one of :data:`accelshare.logs.LOG_LEVELS` (the caller checks it)."""
    configure_logging(log_level, as_json=json_logs)
    try:
        asyncio.run(_serve(config_path, log_level, json_logs=json_logs))
    except (CommonValueError, ConfigFileError) as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
    except (SchemaError, BootstrapError, ConfigStoreError, OSError) as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:  # pragma: no cover - uvicorn handles SIGINT itself
        pass
    return 0
