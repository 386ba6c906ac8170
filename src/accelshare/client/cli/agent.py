"""``accelshare agent ...``: agent inspection commands.

``accelshare agent list|info|alloc-map`` ask the manager (superadmin) about the
cluster's agents; ``info`` and ``alloc-map`` draw a bar per device and slot::

    c59395cd-…2d01  cuda.shares  ██████░░░░  0.60 / 1.00

and ``info`` adds who holds each accelerator device, and how much of it::

    c59395cd-…2d01  cuda.shares  train-1 (kernel 5f0c1a2b-…9e1d)  0.50 / 1.00  50 %

``accelshare agent plugins [--config agent.toml] [--json]`` loads the compute plugins
exactly as the agent does at start (agent.toml discovery, allow/block lists, the
configuration store for accelerator options, mock-accelerator.toml) and prints what
they declare, without starting the daemon.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Mapping, Sequence
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from accelshare.accel import (
    LoadedPlugins,
    PluginContext,
    PluginError,
    describe_plugins,
    load_compute_plugins,
)
from accelshare.client.client import AccelshareClient
from accelshare.client.models import AgentInfo, AllocMap
from accelshare.common import BinarySize
from accelshare.config import ConfigFileError, ConfigStore, ConfigStoreError, open_config_store
from accelshare.config.agent_file import AgentConfig, AgentConfigError, load_agent_config
from accelshare.config.settings import load_config_store_settings

from .common import JsonOption, call_api, console, print_json
from .render import alloc_table, amount_text, holders_table

agent_app = typer.Typer(help="Inspect agents and their compute plugins.", no_args_is_help=True)


async def _load(agent_config: AgentConfig, *, use_store: bool) -> dict[str, Any]:
    """Open the store the agent would use, load the plugins, describe them, close all."""
    store: ConfigStore | None = None
    if use_store:
        settings = load_config_store_settings(agent_config.source_path)
        store = await open_config_store(
            settings,
            scaling_group=agent_config.agent.scaling_group,
            node_id=agent_config.agent.id,
        )
    loaded: LoadedPlugins | None = None
    try:
        loaded = await load_compute_plugins(PluginContext(agent_config, store))
        return describe_plugins(
            {key: plugin.inventory for key, plugin in loaded.plugins.items()},
            origins=loaded.origins,
            skipped=loaded.skipped,
        )
    finally:
        if loaded is not None:
            await loaded.close()
        if store is not None:
            await store.close()


def _human_bytes(value: int) -> str:
    return str(BinarySize(value)) if value else "-"


def _render(console: Console, doc: dict[str, Any], agent_config: AgentConfig) -> None:
    source = agent_config.source_path or "built-in defaults (no agent.toml found)"
    console.print(f"[bold]agent[/bold] {agent_config.agent.id}  config: {source}")
    if agent_config.unknown_keys:
        console.print(
            f"[yellow]unknown keys ignored:[/yellow] {', '.join(agent_config.unknown_keys)}"
        )
    for key, plugin in doc["plugins"].items():
        quantum = plugin["quantum_size"] or "-"
        console.print()
        console.rule(
            f"[bold]{key}[/bold]  (entry point {plugin['entry_point']}, version {plugin['version']})"
        )
        console.print(
            f"allocation mode: {plugin['allocation_mode']}   strategy: {plugin['strategy']}   "
            f"quantum: {quantum}   exclusive: {', '.join(plugin['exclusive_slot_types']) or '-'}"
        )
        slots = Table("slot", "type", "capacity", "shown as", box=None, pad_edge=False)
        for slot, info in plugin["slots"].items():
            meta = plugin["metadata"].get(slot, {})
            capacity = info["capacity"]
            if info["type"] == "bytes":
                capacity = f"{capacity} ({_human_bytes(int(Decimal(capacity)))})"
            shown = escape(
                f"{meta.get('human_readable_name', '')} [{meta.get('display_unit', '')}]"
            )
            slots.add_row(slot, info["type"], capacity, shown)
        console.print(slots)
        shown_devices = plugin["devices"]
        id_width = max((len(d["device_id"]) for d in shown_devices), default=6)
        devices = Table(box=None, pad_edge=False)
        devices.add_column("device", no_wrap=True, min_width=id_width)
        devices.add_column("model", overflow="fold")
        for name in ("numa", "memory", "processors"):
            devices.add_column(name, no_wrap=True)
        devices.add_column("slot", overflow="fold")
        devices.add_column("capacity (shares)", no_wrap=True)
        devices.add_column("hw location", overflow="fold")
        for device in shown_devices[:64]:
            devices.add_row(
                device["device_id"],
                device["model_name"],
                str(device["numa_node"]),
                _human_bytes(device["memory_bytes"]),
                str(device["processors"]),
                device["slot"],
                device["capacity"],
                device["hw_location"],
            )
        console.print(devices)
        if len(shown_devices) > 64:
            console.print(f"... and {len(shown_devices) - 64} more devices (see --json)")
        if plugin["settings"]:
            settings = ", ".join(f"{k}={v}" for k, v in plugin["settings"].items())
            console.print(f"settings: {escape(settings)}")
        if plugin["extra_info"]:
            console.print(f"extra info: {escape(json.dumps(plugin['extra_info'], sort_keys=True))}")
    for name, reason in doc["skipped"].items():
        console.print(f"\n[yellow]skipped[/yellow] {escape(name)}: {escape(reason)}")


@agent_app.command("plugins")
def plugins_command(
    config: Annotated[
        Path | None,
        typer.Option("--config", "-f", help="agent.toml (default: the agent's discovery order)"),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON document.")] = False,
    no_store: Annotated[
        bool,
        typer.Option(
            "--no-config-store",
            help="Do not read accelerator options from the config store (use defaults).",
        ),
    ] = False,
) -> None:
    """Load the compute plugins as the agent would and show what they declare."""
    err = Console(stderr=True)
    try:
        agent_config = load_agent_config(config)
        doc = asyncio.run(_load(agent_config, use_store=not no_store))
    except (AgentConfigError, ConfigFileError, PluginError, ConfigStoreError) as e:
        err.print(f"[red]error:[/red] {escape(str(e))}", highlight=False)
        raise typer.Exit(code=1) from None
    if as_json:
        typer.echo(json.dumps(doc, indent=2))
        return
    # Piped output keeps whole lines (device ids are long); a terminal uses its width.
    width = None if sys.stdout.isatty() else 200
    _render(Console(highlight=False, width=width), doc, agent_config)


# -- the cluster's agents, through the manager's API (superadmin) ------------------------------

_AGENT_NOT_FOUND = "list the agents with `accelshare agent list`"


def _slot_usage(agent: AgentInfo) -> str:
    parts = []
    for slot, available in agent.available_slots.items():
        occupied = agent.occupied_slots.get(slot, Decimal(0))
        slot_type = "bytes" if slot == "mem" else "count"
        parts.append(
            f"{slot} {amount_text(occupied, slot_type)}/{amount_text(available, slot_type)}"
        )
    return ", ".join(parts)


@agent_app.command("list")
def list_command(
    status: Annotated[
        str | None, typer.Option("--status", help="ALIVE, LOST or TERMINATED (default: all).")
    ] = None,
    scaling_group: Annotated[
        str | None, typer.Option("--scaling-group", "-s", help="Only this scaling group.")
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """List the cluster's agents with their occupied / available slots (superadmin)."""
    agents = call_api(lambda c: c.agents.list(status=status, scaling_group=scaling_group))
    if as_json:
        print_json([a.to_json() for a in agents])
        return
    if not agents:
        typer.echo("No agents have registered.")
        return
    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in (
        "agent",
        "status",
        "scaling group",
        "address",
        "occupied / available",
        "last heartbeat",
    ):
        table.add_column(column, overflow="fold")
    for a in agents:
        table.add_row(
            a.id,
            a.status,
            a.scaling_group or "",
            a.address or "",
            _slot_usage(a),
            a.last_heartbeat or "",
        )
    console().print(table)


PluginOption = Annotated[
    list[str] | None,
    typer.Option("--plugin", "-p", help="Only these plugins' devices (e.g. -p cuda)."),
]
FullIdsOption = Annotated[
    bool, typer.Option("--full-ids", help="Show whole device ids (default: shortened).")
]


@agent_app.command("info")
def info_command(
    agent_id: Annotated[str, typer.Argument(help="Agent id (see `accelshare agent list`).")],
    plugin: PluginOption = None,
    full_ids: FullIdsOption = False,
    as_json: JsonOption = False,
) -> None:
    """Show an agent: status, slots, a bar per device and slot (live allocation), and
    which session holds how much of each accelerator device."""

    async def work(client: AccelshareClient) -> tuple[AgentInfo, AllocMap, dict[str, str]]:
        agent = await client.agents.get(agent_id)
        amap = await client.agents.alloc_map(agent_id)
        return agent, amap, await _session_names(client, agent_id)

    agent, amap, sessions = call_api(work, not_found_hint=_AGENT_NOT_FOUND)
    if as_json:
        print_json({**agent.to_json(), "allocMap": amap.to_json(), "kernelSessions": sessions})
        return
    out = console()
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column(overflow="fold")
    for key, value in (
        ("agent", agent.id),
        ("status", agent.status),
        ("scaling group", agent.scaling_group or "-"),
        ("address", agent.address or "-"),
        ("version", agent.version or "-"),
        ("plugins", ", ".join(agent.compute_plugins) or "-"),
        *_plugin_status_rows(agent.compute_plugins),
        ("slots", _slot_usage(agent) or "-"),
        ("last heartbeat", agent.last_heartbeat or "-"),
    ):
        grid.add_row(key, value)
    out.print(grid)
    out.print()
    _print_map(out, amap, full_ids=full_ids, plugins=plugin or ())
    holders = holders_table(amap.maps, sessions, full_ids=full_ids, plugins=plugin or ())
    if holders is not None:
        out.print()
        out.print("[bold]who holds the devices[/bold]")
        out.print(holders)


def _plugin_status_rows(plugins: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``cuda enforcement: mps`` / ``cuda mps: running (pid 1234, 0 restarts)`` /
    ``cuda shim: ready (...)``: what the plugins report about themselves (fraction
    enforcement, their daemons, the memory interposer)."""
    rows: list[tuple[str, str]] = []
    for key, summary in plugins.items():
        status = summary.get("status") if isinstance(summary, Mapping) else None
        if not isinstance(status, Mapping):
            continue
        for name in ("enforcement", "mps", "shim"):
            if status.get(name):
                rows.append((f"{key} {name}", str(status[name])))
    return rows


async def _session_names(client: AccelshareClient, agent_id: str) -> dict[str, str]:
    """kernel id -> session name, for the live sessions on ``agent_id`` the caller may see.

    The session listing carries no kernel ids, so each session placed on this agent is
    read once (an agent holds few sessions; this is an inspection command).
    """
    names: dict[str, str] = {}
    for listed in await client.sessions.list_all():
        if listed.agent_id != agent_id:
            continue
        session = await client.sessions.get(listed.session_id)
        names.update({k.kernel_id: session.name for k in session.kernels})
    return names


def _print_map(out: Console, amap: AllocMap, *, full_ids: bool, plugins: Sequence[str]) -> None:
    if amap.source == "heartbeat":
        out.print(
            f"[yellow]the agent did not answer ({escape(amap.error or '?')}); showing its last"
            " heartbeat[/yellow]"
        )
    out.print(alloc_table(amap.maps, full_ids=full_ids, plugins=plugins))


@agent_app.command("alloc-map")
def alloc_map_command(
    agent_id: Annotated[str, typer.Argument(help="Agent id (see `accelshare agent list`).")],
    compat: Annotated[
        bool,
        typer.Option(
            "--compat",
            help="Backend.AI's form: {device: allocated} over the accelerator slots.",
        ),
    ] = False,
    plugin: PluginOption = None,
    full_ids: FullIdsOption = False,
    as_json: JsonOption = False,
) -> None:
    """Show the agent's live allocation map: allocated / capacity per device and slot."""
    if compat:
        answer = call_api(
            lambda c: c.agents.alloc_map_compat(agent_id), not_found_hint=_AGENT_NOT_FOUND
        )
        if as_json:
            print_json(answer.to_json())
            return
        for device, amount in answer.alloc_map.items():
            typer.echo(f"{device}  {amount}")
        return
    amap = call_api(lambda c: c.agents.alloc_map(agent_id), not_found_hint=_AGENT_NOT_FOUND)
    if as_json:
        print_json(amap.to_json())
        return
    _print_map(console(), amap, full_ids=full_ids, plugins=plugin or ())
