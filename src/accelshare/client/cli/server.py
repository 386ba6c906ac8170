"""``accelshare server ...``: run the daemons.

``accelshare server agent [--config agent.toml] [--dev]`` runs an agent until SIGTERM or
SIGINT (kernels keep running and are re-adopted by the next agent, unless
``--end-kernels-on-exit``).  The manager's ``server manager`` command joins this group
in ``cli/__init__.py``.  ``accelshare server storage --config storage.toml`` runs a
storage proxy (:mod:`accelshare.storage.serve`).  ``--json`` logs one JSON object per line (:mod:`accelshare.logs`).

This module parses the command line only: the launch lives next to each server
(:mod:`accelshare.agent.serve`, :mod:`accelshare.api.serve`) and is imported when the
command runs, so the rest of the CLI never loads a daemon.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from accelshare.logs import LOG_LEVELS

from .common import EXIT_USAGE, fail

server_app = typer.Typer(help="Run accelshare daemons.", no_args_is_help=True)

LogJsonOption = Annotated[
    bool, typer.Option("--json", help="Log one JSON object per line (for log collectors).")
]


@server_app.callback()
def _group() -> None:
    """Run accelshare daemons."""


@server_app.command("agent")
def agent_command(
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            "-f",
            help="agent.toml (default: ./agent.toml, ~/.config/accelshare/agent.toml, "
            "/etc/accelshare/agent.toml)",
        ),
    ] = None,
    dev: Annotated[
        bool,
        typer.Option(
            "--dev",
            help="Allow running without a cluster secret (only on a loopback rpc-listen-addr).",
        ),
    ] = False,
    log_level: Annotated[
        str, typer.Option("--log-level", help=f"One of {', '.join(LOG_LEVELS)}.")
    ] = "info",
    end_kernels: Annotated[
        bool,
        typer.Option(
            "--end-kernels-on-exit",
            help="On SIGTERM/SIGINT, destroy this agent's kernels before exiting (what"
            " `accelshare dev up` runs its agents with). Default: they keep running and"
            " the next agent re-adopts them.",
        ),
    ] = False,
    as_json: LogJsonOption = False,
) -> None:
    """Run an agent: kernels, allocation maps, RPC for the manager, heartbeats."""
    from accelshare.agent.serve import launch_agent  # the daemon's imports are heavy

    if log_level.lower() not in LOG_LEVELS:
        fail(f"--log-level {log_level!r}: expected one of {', '.join(LOG_LEVELS)}", code=EXIT_USAGE)
    code = launch_agent(
        config, dev=dev, end_kernels_on_exit=end_kernels, log_level=log_level, json_logs=as_json
    )
    raise typer.Exit(code=code)


@server_app.command("storage")
def storage_command(
    config: Annotated[
        Path,
        typer.Option(
            "--config",
            "-f",
            help="storage.toml (docs/storage.md)",
            exists=True,
            dir_okay=False,
            readable=True,
        ),
    ],
    log_level: Annotated[
        str, typer.Option("--log-level", help=f"One of {', '.join(LOG_LEVELS)}.")
    ] = "info",
    as_json: LogJsonOption = False,
) -> None:
    """Run a storage proxy: volumes, folders, uploads and downloads (docs/storage.md)."""
    from accelshare.storage.serve import launch_storage  # the daemon's imports are heavy

    if log_level.lower() not in LOG_LEVELS:
        fail(f"--log-level {log_level!r}: expected one of {', '.join(LOG_LEVELS)}", code=EXIT_USAGE)
    code = launch_storage(config, log_level=log_level, json_logs=as_json)
    raise typer.Exit(code=code)
