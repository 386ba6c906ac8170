"""``accelshare server manager [--config manager.toml]``: run the manager daemon.

Mounted next to ``server agent`` in ``cli/__init__.py``::

    server_app.command("manager")(manager_command)

Also runnable as ``python -m accelshare.client.cli.server_manager [--config FILE]``.

This module parses the command line only; the launch (schema, bootstrap, uvicorn,
graceful stop, exit codes) is :func:`accelshare.api.serve.launch_manager`, imported when
the command runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from accelshare.logs import LOG_LEVELS

from .common import EXIT_USAGE, fail

__all__ = ["main", "manager_command"]


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
    from accelshare.api.serve import launch_manager  # the manager's imports are heavy

    if log_level.lower() not in LOG_LEVELS:
        fail(f"--log-level {log_level!r}: expected one of {', '.join(LOG_LEVELS)}", code=EXIT_USAGE)
    code = launch_manager(config, log_level=log_level, json_logs=as_json)
    if code:
        raise typer.Exit(code)


def main() -> None:
    typer.run(manager_command)


if __name__ == "__main__":
    main()
