"""``accelshare dev up``: run a local cluster in the foreground until Ctrl-C / SIGTERM.

Prints where everything is once the manager is healthy and the agents have
registered, then watches the daemons: if one of them exits, the others are stopped and
``dev up`` exits 1 with the end of that daemon's log.  Ctrl-C (SIGINT) or SIGTERM stop
the agents, then the manager, killing any that do not exit within the grace period.
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

from rich.console import Console
from rich.markup import escape

from accelshare.accel import PluginError
from accelshare.client.sync import SyncAccelshareClient
from accelshare.common import BinarySize, CommonValueError
from accelshare.config import ConfigFileError, ConfigStoreError

from .cluster import ClusterStartError, LocalCluster
from .layout import DevClusterOptions

__all__ = ["run_dev_up", "shown_path"]

START_ERRORS = (ClusterStartError, PluginError, CommonValueError, ConfigFileError, ConfigStoreError)


def shown_path(path: Path) -> str:
    """Relative to the working directory when inside it (shorter to copy)."""
    with contextlib.suppress(ValueError):
        return str(path.relative_to(Path.cwd())) or "."
    return str(path)


def _raise_interrupt(signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def _signals_interrupt() -> Iterator[None]:
    """SIGTERM behaves like Ctrl-C (KeyboardInterrupt) inside the block."""
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def _signals_ignored() -> Iterator[None]:
    """A second Ctrl-C must not interrupt the (bounded) shutdown."""
    saved = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)


def _banner(out: Console, cluster: LocalCluster) -> None:
    options, layout, mock = cluster.options, cluster.layout, cluster.mock
    assert cluster.manager is not None
    assert cluster.credentials is not None
    assert mock is not None
    devices = f"{len(mock.devices)} × {mock.slot_name} ({options.allocation_mode})"
    env_file = shown_path(layout.client_env)
    out.print("[bold green]accelshare local cluster is running[/bold green] (Ctrl-C stops it)")
    out.print()
    rows = [
        (
            "manager",
            f"{cluster.endpoint}  (pid {cluster.manager.pid}, log {shown_path(cluster.manager.log)})",
        ),
        ("console", f"{cluster.endpoint}/"),
    ]
    for daemon in cluster.agents:
        rows.append(
            (
                "agent",
                f"{daemon.name}: {options.cpus} CPUs, {BinarySize(options.mem_bytes)}, {devices}"
                f"  (pid {daemon.pid})",
            )
        )
    rows += [
        ("data dir", f"{shown_path(layout.root)}  (kept between runs)"),
        (
            "superadmin",
            f"{cluster.credentials.email}  (password in {shown_path(layout.credentials)})",
        ),
        ("client env", env_file),
    ]
    for key, value in rows:
        out.print(f"  [bold]{key:<11}[/bold]{escape(value)}")
    first = cluster.agent_ids[0]
    out.print()
    out.print("Use the CLI from another shell:")
    for line in (
        f"source {env_file}",
        "accelshare agent list",
        f"accelshare session create -r cpu=1 -r mem=1g -r {mock.slot_name}.shares=0.2 python",
        f"accelshare agent alloc-map {first}",
        "accelshare session list",
    ):
        out.print(f"  {escape(line)}")


def _live_sessions(cluster: LocalCluster) -> int | None:
    try:
        with SyncAccelshareClient(cluster.client_config(), timeout_s=3.0) as client:
            return len(client.sessions.list_all())
    except Exception:
        return None


def _shutdown(out: Console, cluster: LocalCluster) -> None:
    with _signals_ignored():
        live = _live_sessions(cluster) if cluster.credentials else None
        out.print("stopping the agents and the manager...")
        killed = cluster.stop()
    if killed:
        out.print(f"[yellow]killed after the grace period:[/yellow] {', '.join(killed)}")
    if live:
        out.print(
            f"{live} session(s) keep running; the next `accelshare dev up --data-dir"
            f" {shown_path(cluster.layout.root)}` finds them again (destroy them with"
            " `accelshare session destroy`)."
        )
    out.print("stopped.")


def run_dev_up(options: DevClusterOptions, *, out: Console | None = None) -> int:
    """Run until interrupted; returns the exit code (0 after Ctrl-C/SIGTERM)."""
    out = out or Console(highlight=False, soft_wrap=True)
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    cluster = LocalCluster(options, progress=lambda msg: out.print(f"[dim]{escape(msg)}[/dim]"))
    with _signals_interrupt():
        try:
            with err.status("Starting the local cluster..."):
                cluster.start()
        except KeyboardInterrupt:
            err.print("interrupted while starting; stopped.")
            return 130
        except START_ERRORS as e:
            err.print(f"[red]error:[/red] {escape(str(e))}")
            return 1
        _banner(out, cluster)
        try:
            while True:
                time.sleep(0.5)
                dead = cluster.exited()
                if dead is not None:
                    err.print(
                        f"[red]error:[/red] {dead.name} exited with status {dead.exit_code()}"
                        f" (log {shown_path(dead.log)}):\n{escape(dead.tail())}"
                    )
                    _shutdown(out, cluster)
                    return 1
        except KeyboardInterrupt:
            out.print()
    _shutdown(out, cluster)
    return 0
