"""Launching the agent daemon: its log output, then :func:`accelshare.agent.daemon.run_agent`.

``accelshare server agent`` (and ``python -m accelshare.agent``) parse the command line
and call :func:`launch_agent`; the daemon itself (config, plugins, RPC server,
signals, exit codes) is :mod:`accelshare.agent.daemon`.
"""

from __future__ import annotations

from pathlib import Path

from accelshare.logs import configure_logging

from .daemon import run_agent

__all__ = ["launch_agent"]


def launch_agent(
    config_path: Path | None,
    *,
    dev: bool = False,
    end_kernels_on_exit: bool = False,
    log_level: str = "info",
    json_logs: bool = False,
) -> int:
    """Run an agent until SIGTERM/SIGINT (blocking); returns the process's exit code.
    ``log_level`` is one of :data:`accelshare.logs.LOG_LEVELS` (the caller checks it)."""
    configure_logging(log_level, as_json=json_logs)
    return run_agent(
        str(config_path) if config_path is not None else None,
        dev=dev,
        end_kernels_on_exit=end_kernels_on_exit,
    )
