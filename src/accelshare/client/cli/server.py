"""``accelshare server ...``: run the daemons.

``accelshare server agent [--config agent.toml] [--dev]`` runs an agent until SIGTERM or
SIGINT (kernels keep running and are re-adopted by the next agent).  The manager's
``server manager`` command joins this group later.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer

server_app = typer.Typer(help="Run accelshare daemons.", no_args_is_help=True)

_LOG_LEVELS = ("debug", "info", "warning", "error")


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
        str, typer.Option("--log-level", help=f"One of {', '.join(_LOG_LEVELS)}.")
    ] = "info",
) -> None:
    """Run an agent: kernels, allocation maps, RPC for the manager, heartbeats."""
    from accelshare.agent.daemon import run_agent  # the daemon's imports are heavy

    if log_level.lower() not in _LOG_LEVELS:
        raise typer.BadParameter(
            f"expected one of {', '.join(_LOG_LEVELS)}", param_hint="--log-level"
        )
    logging.basicConfig(
        level=log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    code = run_agent(str(config) if config is not None else None, dev=dev)
    raise typer.Exit(code=code)
