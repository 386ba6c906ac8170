"""``accelshare server manager [--config manager.toml]``: run the manager daemon.

Mounted by ``server.py`` next to ``server agent``::

    from .server_manager import manager_command
    server_app.command("manager")(manager_command)

Also runnable as ``python -m accelshare.client.cli.server_manager [--config FILE]``.

At start the database schema is created or upgraded and the defaults are bootstrapped
(the superadmin's credentials go to ``<data-dir>/admin-credentials.env`` once); then
the API (REST, GraphQL, agent endpoints, ``/metrics``) listens on
``[manager] service-addr`` with uvicorn.  SIGINT / SIGTERM stop it gracefully: new
requests are refused, the scheduler and the LOST sweep stop, binds in flight get a
few seconds, and the database engine is closed.  A configuration error is printed as
``error: <file>: <key>: <what was expected> (received ...)`` with exit code 2.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Annotated, Any, Literal

import typer

from accelshare.common import CommonValueError

__all__ = ["main", "manager_command"]

log = logging.getLogger("accelshare.manager")


def _server_class() -> type[Any]:
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server, but a SIGTERM/SIGINT stop exits 0 after the graceful shutdown
        (uvicorn re-raises the signal afterwards, so the process would die by it)."""

        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            if self.should_exit and sig == signal.SIGINT:
                self.force_exit = True  # a second Ctrl-C: do not wait any longer
            else:
                self.should_exit = True
            from accelshare.api.stream import close_streams

            close_streams(self.config.app)  # open event streams would hold the shutdown

    return Server


def _listener_class() -> type[Any]:
    import uvicorn

    class Listener(uvicorn.Server):
        """A second listener of the same application: the main server owns the signals
        (and stops this one when it stops)."""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    return Listener


async def _serve(config_path: Path | None, log_level: str, *, json_logs: bool = False) -> None:
    import uvicorn
    from uvicorn.config import LOGGING_CONFIG

    from accelshare.api.app import create_manager_app
    from accelshare.manager.config import load_manager_config, parse_host_port
    from accelshare.manager.gc_tuning import tune_gc

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
        )

    server = _server_class()(server_config(host, port, lifespan="on"))
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
    apps_server = _listener_class()(server_config(apps_host, apps_port, lifespan="off"))
    log.info("app pages (the apps origin) on http://%s:%d", apps_host, apps_port)
    apps_task = asyncio.create_task(apps_server.serve(), name="apps-listener")
    try:
        await server.serve()
    finally:
        apps_server.should_exit = True
        await apps_task


def manager_command(
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            "-f",
            help="manager.toml (default: embedded SQLite and config store in ./.accelshare).",
            exists=True,
            dir_okay=False,
            readable=True,
        ),
    ] = None,
    log_level: Annotated[
        str, typer.Option("--log-level", help="debug, info, warning or error.")
    ] = "info",
    as_json: Annotated[
        bool, typer.Option("--json", help="Log one JSON object per line (for log collectors).")
    ] = False,
) -> None:
    """Run the manager: REST + GraphQL API, scheduler, agent registry."""
    from accelshare.config import ConfigFileError, ConfigStoreError
    from accelshare.manager.bootstrap import BootstrapError
    from accelshare.manager.schema import SchemaError

    from .common import EXIT_USAGE, fail
    from .logs import LOG_LEVELS, configure_logging

    if log_level.lower() not in LOG_LEVELS:
        fail(f"--log-level {log_level!r}: expected one of {', '.join(LOG_LEVELS)}", code=EXIT_USAGE)
    configure_logging(log_level, as_json=as_json)
    try:
        asyncio.run(_serve(config, log_level, json_logs=as_json))
    except (CommonValueError, ConfigFileError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    except (SchemaError, BootstrapError, ConfigStoreError, OSError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None
    except KeyboardInterrupt:  # pragma: no cover - uvicorn handles SIGINT itself
        pass


def main() -> None:
    typer.run(manager_command)


if __name__ == "__main__":
    main()
