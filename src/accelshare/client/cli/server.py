"""``accelshare server ...``: run the daemons.

``accelshare server agent [--config agent.toml] [--dev]`` runs an agent until SIGTERM or
SIGINT (kernels keep running and are re-adopted by the next agent, unless
``--end-kernels-on-exit``).  The manager's ``server manager`` command joins this group
in ``cli/__init__.py``.  ``--json`` logs one JSON object per line (``logs.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .common import EXIT_USAGE, fail
from .logs import LOG_LEVELS, configure_logging

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
    from accelshare.agent.daemon import run_agent  # the daemon's imports are heavy

    if log_level.lower() not in LOG_LEVELS:
        fail(f"--log-level {log_level!r}: expected one of {', '.join(LOG_LEVELS)}", code=EXIT_USAGE)
    configure_logging(log_level, as_json=as_json)
    code = run_agent(
        str(config) if config is not None else None, dev=dev, end_kernels_on_exit=end_kernels
    )
    raise typer.Exit(code=code)
