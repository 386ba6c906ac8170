"""``accelshare dev up``: run a local cluster in the foreground until Ctrl-C / SIGTERM.

Prints where everything is once the manager is healthy and the agents have
registered, then watches the daemons: if one of them exits, the others are stopped and
``dev up`` exits 1 with the end of that daemon's log.  Ctrl-C (SIGINT) or SIGTERM stop
the agents (each ends its kernels first), then the manager, killing any that do not
exit within the grace period; no process it started survives it.

With ``--json`` the banner is one JSON line (``{"event": "running", "endpoint": ...}``)
and the stop another (``{"event": "stopped", ...}``); progress goes to stderr.
"""

from __future__ import annotations

import contextlib
import json
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from rich.console import Console
from rich.markup import escape

from accelshare.accel import PluginError
from accelshare.client.sync import SyncAccelshareClient
from accelshare.common import BinarySize, CommonValueError
from accelshare.config import ConfigFileError, ConfigStoreError

from .cluster import ClusterStartError, LocalCluster
from .layout import DevClusterOptions

__all__ = ["SessionCounts", "run_dev_up", "shown_path"]

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
    """SIGINT and SIGTERM stop the cluster (KeyboardInterrupt) inside the block.

    SIGINT gets a handler of its own too: a shell starts a background job (``dev up
    &``) with SIGINT ignored, and ``kill -INT`` must stop it all the same."""
    saved = {s: signal.signal(s, _raise_interrupt) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)


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
    if cluster.storage is not None and cluster.storage_ports is not None:
        manager_port, client_port = cluster.storage_ports
        rows.append(
            (
                "storage",
                f"local:volume1 in {shown_path(layout.volume_dir())}, clients"
                f" http://127.0.0.1:{client_port}, manager http://127.0.0.1:{manager_port}"
                f"  (pid {cluster.storage.pid}, log {shown_path(cluster.storage.log)})",
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
    out.print("Use the CLI from another shell (client.env also puts `accelshare` on PATH):")
    for line in (
        f"source {env_file}",
        "accelshare agent list",
        f"accelshare session create -r cpu=1 -r mem=1g -r {mock.slot_name}.shares=0.2 python",
        f"accelshare agent alloc-map {first}",
        "accelshare session list",
    ):
        out.print(f"  {escape(line)}")


def _running_doc(cluster: LocalCluster) -> dict[str, Any]:
    """The banner as one JSON document (``--json``)."""
    assert cluster.manager is not None
    assert cluster.credentials is not None
    layout = cluster.layout
    return {
        "event": "running",
        "endpoint": cluster.endpoint,
        "console": f"{cluster.endpoint}/",
        "data_dir": str(layout.root),
        "client_env": str(layout.client_env),
        "superadmin": cluster.credentials.email,
        "credentials": str(layout.credentials),
        "manager": {"pid": cluster.manager.pid, "log": str(cluster.manager.log)},
        "agents": [{"id": d.name, "pid": d.pid, "log": str(d.log)} for d in cluster.agents],
    }


@dataclass(frozen=True, slots=True)
class SessionCounts:
    """Live sessions when ``dev up`` stops: those with a kernel (ended by the stop) and
    those still waiting (kept queued for the next run)."""

    started: int
    pending: int


def _session_counts(cluster: LocalCluster) -> SessionCounts | None:
    try:
        with SyncAccelshareClient(cluster.client_config(), timeout_s=3.0) as client:
            live = client.sessions.list_all()
    except Exception:
        return None
    pending = sum(1 for s in live if s.status == "PENDING")
    return SessionCounts(started=len(live) - pending, pending=pending)


def _shutdown(out: Console, cluster: LocalCluster, *, as_json: bool = False) -> None:
    with _signals_ignored():
        counts = _session_counts(cluster) if cluster.credentials else None
        if not as_json:
            out.print(
                "stopping the agents (and their sessions' kernels), the manager and the storage proxy..."
            )
        killed = cluster.stop()
    if as_json:
        doc = {
            "event": "stopped",
            "ended_sessions": counts.started if counts else None,
            "pending_sessions": counts.pending if counts else None,
            "killed": killed,
            "reaped_processes": cluster.reaped,
        }
        out.print(json.dumps(doc), markup=False, highlight=False)
        return
    if killed:
        out.print(f"[yellow]killed after the grace period:[/yellow] {', '.join(killed)}")
    if cluster.reaped:
        out.print(f"[yellow]killed {cluster.reaped} leftover kernel process(es)[/yellow]")
    again = f"`accelshare dev up --data-dir {shown_path(cluster.layout.root)}`"
    if counts and counts.started:
        out.print(
            f"{counts.started} running session(s) ended with it; the next {again} reports"
            " them TERMINATED."
        )
    if counts and counts.pending:
        out.print(f"{counts.pending} PENDING session(s) stay queued for the next {again}.")
    out.print("stopped.")


def run_dev_up(
    options: DevClusterOptions, *, out: Console | None = None, as_json: bool = False
) -> int:
    """Run until interrupted; returns the exit code (0 after Ctrl-C/SIGTERM)."""
    out = out or Console(highlight=False, soft_wrap=True)
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    shown = err if as_json else out  # --json: stdout holds only the JSON lines
    cluster = LocalCluster(options, progress=lambda msg: shown.print(f"[dim]{escape(msg)}[/dim]"))
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
        if as_json:
            out.print(json.dumps(_running_doc(cluster)), markup=False, highlight=False)
        else:
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
                    _shutdown(out, cluster, as_json=as_json)
                    return 1
        except KeyboardInterrupt:
            if not as_json:
                out.print()
    _shutdown(out, cluster, as_json=as_json)
    return 0
