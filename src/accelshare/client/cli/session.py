"""``accelshare session ...``: create, list, inspect, follow and destroy sessions.

A session is named by its id (UUID) or by its name (your own sessions).  See
docs/cli.md for examples.
"""

from __future__ import annotations

import json
import re
import shlex
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, cast

import typer
from rich.table import Table

from accelshare.client.client import AccelshareClient
from accelshare.client.models import SessionInfo
from accelshare.client.sessions import SessionType

from .args import (
    ArgumentError,
    parse_environ,
    parse_json_pairs,
    parse_resources,
    parse_services,
)
from .common import EXIT_USAGE, JsonOption, call_api, console, fail, print_json, spinner
from .render import amount_text, slots_text

session_app = typer.Typer(
    help="Create, list, inspect, follow and destroy compute sessions.", no_args_is_help=True
)

_NOT_FOUND = "list your sessions with `accelshare session list --all`"
_STARTED = {"SCHEDULED", "PREPARING", "PULLING", "PREPARED", "CREATING"}
_DURATION_RE = re.compile(r"^\+(\d+)([smhd])$")
_START_WAIT_S = 120.0

RefArg = Annotated[
    str, typer.Argument(help="Session id or name.", show_default=False, metavar="REF")
]


def _starts_at(raw: str | None) -> str | None:
    """ISO 8601 (``2030-01-01T09:00:00+09:00``; no offset = UTC) or ``+30s``/``+5m``/``+2h``."""
    if raw is None:
        return None
    match = _DURATION_RE.match(raw.strip())
    if match:
        unit = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}[match[2]]
        when = datetime.now(UTC) + timedelta(**{unit: int(match[1])})
        return when.isoformat()
    try:
        parsed = datetime.fromisoformat(raw)
    except ValueError:
        fail(
            f"--starts-at {raw!r}: expected an ISO 8601 time (2030-01-01T09:00:00+00:00) or a"
            " delay such as +30s, +5m, +2h",
            code=EXIT_USAGE,
        )
    return (parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)).isoformat()


def _outcome(info: SessionInfo) -> str:
    sid = info.session_id
    if info.status == "RUNNING":
        return f"Session ID {sid} is created and ready."
    if info.status == "PENDING":
        return f"Session ID {sid} is enqueued (PENDING: {info.pending_reason})"
    if info.status == "TERMINATED":
        code = "" if info.exit_code is None else f", exit code {info.exit_code}"
        return f"Session ID {sid} is created and has finished (TERMINATED{code})."
    return (
        f"Session ID {sid} is created ({info.status}); follow it with"
        f" `accelshare session events {sid}`"
    )


def startup_command_line(words: list[str]) -> str | None:
    """The ``startupCommand`` for the words after ``--``: a whole command line, which the
    agent runs with ``/bin/sh -c`` in the session's environment (as ``docker run IMAGE
    CMD...``).  One word is already a command line (``python -- 'echo hi; exit 3'``) and
    goes as is; several are shell-quoted and joined (``python -- python -c 'print(1)'``
    -> ``python -c 'print(1)'``), so the shell gets the same words back.  None without
    words."""
    if not words:
        return None
    return words[0] if len(words) == 1 else shlex.join(words)


@session_app.command("create")
def create_command(
    image: Annotated[
        str | None,
        typer.Argument(
            help="Image to run: a catalogue reference or alias (`accelshare image list`:"
            " python, demo-lib:1.0...), resolved by the manager; a name outside the catalogue"
            " is passed to the agents as it is (`shell`, a docker image).",
            show_default=False,
            metavar="IMAGE",
        ),
    ] = None,
    command: Annotated[
        list[str] | None,
        typer.Argument(
            help="What to run, after `--`: a command line, run by /bin/sh in the"
            " session's work dir with its environment, the image's interpreter first on"
            " PATH (`python -- python -c 'print(1)'`, `python -- 'echo hi; exit 3'`). One"
            " argument is sent as the command line as is, several are quoted and joined."
            " A command makes a batch session unless --type says otherwise.",
            show_default=False,
            metavar="COMMAND",
        ),
    ] = None,
    resources: Annotated[
        list[str] | None,
        typer.Option(
            "--resources",
            "-r",
            help="KEY=VALUE per slot: -r cpu=1 -r mem=1g -r cuda.shares=0.2 (a bare mem"
            " number is MiB). Missing cpu/mem get the scaling group's defaults.",
        ),
    ] = None,
    name: Annotated[
        str | None, typer.Option("--name", "-n", help="Session name (default: generated).")
    ] = None,
    session_type: Annotated[
        str | None,
        typer.Option(
            "--type",
            "-t",
            help="interactive or batch (default: batch with a COMMAND, else interactive).",
        ),
    ] = None,
    priority: Annotated[
        int | None,
        typer.Option("--priority", min=0, max=100, help="0..100 (default 10); higher goes first."),
    ] = None,
    starts_at: Annotated[
        str | None,
        typer.Option(
            "--starts-at",
            help="Batch sessions only: start no earlier than this (ISO 8601, or a delay such"
            " as +30s, +5m, +2h); PENDING with 'Before start time' until then.",
        ),
    ] = None,
    resource_opts: Annotated[
        list[str] | None,
        typer.Option(
            "--resource-opts",
            help="K=V resource options, e.g. allow_fractional_resource_fragmentation=false.",
        ),
    ] = None,
    enqueue_only: Annotated[
        bool, typer.Option("--enqueue-only", help="Return at once, without waiting.")
    ] = False,
    wait_for_agents: Annotated[
        bool,
        typer.Option(
            "--wait-for-agents",
            help="Queue the session even when no agent of the scaling group could hold it"
            " when empty (it is refused otherwise), for agents yet to join.",
        ),
    ] = False,
    max_wait: Annotated[
        int,
        typer.Option(
            "--max-wait",
            min=0,
            max=3600,
            help="Seconds the server waits for RUNNING before answering (0: only for the"
            " scheduler's first verdict, so PENDING comes back at once with its reason).",
        ),
    ] = 0,
    environ: Annotated[
        list[str] | None, typer.Option("--env", "-e", help="NAME=VALUE for the session.")
    ] = None,
    scaling_group: Annotated[
        str | None, typer.Option("--scaling-group", "-s", help="Scaling group (default: default).")
    ] = None,
    depends_on: Annotated[
        list[str] | None,
        typer.Option("--depends-on", help="Start only after this session (id or name) ended."),
    ] = None,
    services: Annotated[
        list[str] | None,
        typer.Option(
            "--service",
            help="NAME=PORT of an HTTP app the session serves: it listens on"
            " $BACKENDAI_SERVICE_PORT_<NAME> (the agent's host port for it, or PORT in a"
            " docker bridge container); see `accelshare session apps`.",
        ),
    ] = None,
    mounts: Annotated[
        list[str] | None,
        typer.Option(
            "--mount",
            "-m",
            help="A storage folder to mount: NAME (at /home/work/NAME), NAME:/PATH, or"
            " NAME:/PATH:ro (read-only); repeat for more. See `accelshare vfolder`.",
        ),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Create a session: it is queued, placed on an agent and started.

    Prints `Session ID <uuid> is created and ready.` once it runs, or
    `Session ID <uuid> is enqueued (PENDING: <reason>)` when it has to wait; a
    PENDING session starts by itself when resources free up.
    """
    if not image:
        fail(
            "missing IMAGE: say what to run, e.g. `accelshare session create -r cpu=1 python`",
            code=EXIT_USAGE,
        )
    if session_type is not None and session_type not in ("interactive", "batch"):
        fail(f"--type {session_type!r}: expected interactive or batch", code=EXIT_USAGE)
    try:
        slots = parse_resources(resources or [])
        opts = parse_json_pairs(
            resource_opts or [], "--resource-opts", "allow_fractional_resource_fragmentation=false"
        )
        env = parse_environ(environ or [])
        ports = parse_services(services or [])
    except ArgumentError as e:
        fail(str(e), code=EXIT_USAGE)
    startup = startup_command_line(command or [])
    kind = cast(SessionType | None, session_type or ("batch" if startup else None))
    if starts_at is not None and kind != "batch":
        # Spec 05: a reserved start time is a batch session's (an interactive session
        # is wanted now, by someone waiting for it).
        fail(
            "--starts-at is for batch sessions: give the COMMAND to run after `--`"
            " (or --type batch)",
            code=EXIT_USAGE,
        )
    when = _starts_at(starts_at)

    async def work(client: AccelshareClient) -> tuple[dict[str, Any], SessionInfo]:
        with spinner("Creating the session...", enabled=not as_json):
            created = await client.sessions.create(
                image,
                resources=slots,
                name=name,
                type=kind,
                priority=priority,
                starts_at=when,
                resource_opts=opts,
                environ=env,
                startup_command=startup,
                scaling_group=scaling_group,
                dependencies=depends_on or (),
                enqueue_only=enqueue_only,
                max_wait_s=max_wait,
                service_ports=ports,
                wait_for_agents=wait_for_agents,
                mounts=mounts or (),
            )
            info = created.session
            if not enqueue_only and info.status in _STARTED:
                try:
                    info = await client.sessions.wait(
                        info.session_id, ("RUNNING", "ERROR"), timeout_s=_START_WAIT_S
                    )
                except TimeoutError:
                    info = await client.sessions.get(info.session_id)
        answer = created.to_json()
        answer.update(status=info.status, statusInfo=info.status_info, session=info.to_json())
        return answer, info

    answer, info = call_api(work)
    if as_json:
        print_json(answer)
    if info.status in ("CANCELLED", "ERROR"):
        fail(
            f"Session ID {info.session_id} could not start ({info.status}):"
            f" {info.status_info or 'no reason recorded'}; see `accelshare session info"
            f" {info.session_id}`"
        )
    if not as_json:
        typer.echo(_outcome(info))
        for service in answer.get("servicePorts") or []:
            typer.echo(
                f"  service {service['name']} ({service['protocol']}, port {service['port']}):"
                f" `accelshare session apps {info.session_id}` prints its URL"
            )


def _sessions_table(items: list[SessionInfo]) -> Table:
    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in ("session id", "name", "status", "image", "requested", "agent", "info"):
        table.add_column(column, overflow="fold")
    for s in items:
        reason = s.pending_reason if s.status == "PENDING" else (s.status_info or "")
        table.add_row(
            s.session_id,
            s.name,
            s.status,
            s.image,
            slots_text(s.requested_slots),
            s.agent_id or "",
            reason,
        )
    return table


@session_app.command("list")
def list_command(
    status: Annotated[
        str | None,
        typer.Option(
            "--status", help="Comma-separated statuses (RUNNING,PENDING...); default: live ones."
        ),
    ] = None,
    show_all: Annotated[
        bool, typer.Option("--all", "-a", help="Every status, ended sessions included.")
    ] = False,
    access_key: Annotated[
        str | None, typer.Option("--access-key", help="Admins: only this keypair's sessions.")
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """List sessions (yours; an admin's domain; everything for a superadmin)."""
    wanted = "all" if show_all else status
    items = call_api(lambda c: c.sessions.list_all(wanted, access_key=access_key))
    if as_json:
        print_json([s.to_json() for s in items])
        return
    if not items:
        typer.echo("No sessions." + ("" if show_all else " (`--all` shows ended ones)"))
        return
    console().print(_sessions_table(items))


def _kernel_lines(info: SessionInfo) -> list[str]:
    lines = []
    for kernel in info.kernels:
        lines.append(f"kernel {kernel.kernel_id} on {kernel.agent_id or '-'}: {kernel.status}")
        for slot, devices in kernel.device_allocs.items():
            slot_type = "bytes" if slot == "mem" else "count"
            held = ", ".join(
                f"{device}={amount_text(amount, slot_type)}" for device, amount in devices.items()
            )
            lines.append(f"  {slot}: {held}")
    return lines


@session_app.command("info")
def info_command(ref: RefArg, as_json: JsonOption = False) -> None:
    """Show one session: status, resources, devices held, status history."""
    info = call_api(lambda c: c.sessions.get(ref), not_found_hint=_NOT_FOUND)
    if as_json:
        print_json(info.to_json())
        return
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column(overflow="fold")
    rows = [
        ("session id", info.session_id),
        ("name", info.name),
        ("type", info.type),
        ("status", info.status + (f" ({info.status_info})" if info.status_info else "")),
        ("image", info.image),
        ("requested", slots_text(info.requested_slots)),
        ("occupied", slots_text(info.occupied_slots) or "-"),
        ("agent", info.agent_id or "-"),
        ("scaling group", info.scaling_group or "-"),
        ("priority", str(info.priority)),
        ("created", info.created_at or "-"),
        ("started", info.started_at or "-"),
        ("terminated", info.terminated_at or "-"),
    ]
    if info.exit_code is not None:
        rows.append(("exit code", str(info.exit_code)))
    for key, value in rows:
        grid.add_row(key, value)
    out = console()
    out.print(grid)
    for line in _kernel_lines(info):
        out.print(line)
    if info.service_ports:
        out.print("[bold]apps[/bold]")
        for service in info.service_ports:
            host_port = service.get("hostPort")
            out.print(
                f"  {service.get('name')} ({service.get('protocol', 'http')}, port"
                f" {service.get('port')}, host port {host_port if host_port else '-'})",
                markup=False,
            )
    if info.status_history:
        out.print("[bold]history[/bold]")
        for change in info.status_history:
            out.print(
                f"  {change.at}  {change.from_status or '-'} -> {change.to}  {change.reason or ''}"
            )


@session_app.command("destroy")
def destroy_command(
    refs: Annotated[list[str], typer.Argument(help="Session ids or names.", show_default=False)],
    forced: Annotated[
        bool,
        typer.Option("--forced", "-f", help="End it even if its agent does not confirm."),
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Destroy sessions (a PENDING one is cancelled, a running one terminated)."""

    async def work(client: AccelshareClient) -> list[dict[str, Any]]:
        return [(await client.sessions.destroy(ref, forced=forced)).to_json() for ref in refs]

    results = call_api(work, not_found_hint=_NOT_FOUND)
    if as_json:
        print_json(results)
        return
    for result in results:
        status = result["status"]
        note = " (the agent has not confirmed yet)" if status == "TERMINATING" else ""
        typer.echo(f"Session ID {result['sessionId']} is {status.lower()}{note}.")


@session_app.command("logs")
def logs_command(ref: RefArg, as_json: JsonOption = False) -> None:
    """Print the session's output (stdout and stderr of its kernel).

    With --json: {"session_id": ..., "session_name": ..., "logs": "..."}.
    """
    if as_json:

        async def both(client: AccelshareClient) -> tuple[SessionInfo, str]:
            info = await client.sessions.get(ref)
            return info, await client.sessions.logs(info.session_id)

        info, text = call_api(both, not_found_hint=_NOT_FOUND)
        print_json({"session_id": info.session_id, "session_name": info.name, "logs": text})
        return
    text = call_api(lambda c: c.sessions.logs(ref), not_found_hint=_NOT_FOUND)
    typer.echo(text, nl=not text.endswith("\n") and bool(text))


@session_app.command("upload")
def upload_command(
    ref: RefArg,
    files: Annotated[
        list[Path],
        typer.Argument(help="Local files to upload.", show_default=False, metavar="FILE..."),
    ],
    base_dir: Annotated[
        Path | None,
        typer.Option(
            "--base-dir",
            help="Each file goes to its path relative to this folder, under /home/work"
            " (default: the current folder).",
        ),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Upload files into a RUNNING session's working folder (/home/work).

    `accelshare session upload s1 data/train.csv` puts it at /home/work/data/train.csv.
    With --json: {"uploaded": ["/home/work/data/train.csv", ...]}.
    """
    base = (base_dir or Path.cwd()).resolve()
    pairs: list[tuple[str, Path]] = []
    for given in files:
        local = given.resolve()
        if not local.is_file():
            fail(
                f"{given}: not a file (upload files one by one; folders are not walked)",
                code=EXIT_USAGE,
            )
        if not local.is_relative_to(base):
            fail(
                f"{given} is outside the base folder {base}: run from a folder above it or"
                " pass --base-dir",
                code=EXIT_USAGE,
            )
        pairs.append((local.relative_to(base).as_posix(), local))
    call_api(lambda c: c.session_files.upload(ref, pairs), not_found_hint=_NOT_FOUND)
    uploaded = [f"/home/work/{remote}" for remote, _ in pairs]
    if as_json:
        print_json({"uploaded": uploaded})
        return
    for remote_path in uploaded:
        typer.echo(f"uploaded {remote_path}")


@session_app.command("download")
def download_command(
    ref: RefArg,
    paths: Annotated[
        list[str],
        typer.Argument(
            help="Files or folders in the session (relative to /home/work, or absolute under it).",
            show_default=False,
            metavar="PATH...",
        ),
    ],
    dest: Annotated[
        Path, typer.Option("--dest", help="Where to put them (created when missing).")
    ] = Path("."),
    as_json: JsonOption = False,
) -> None:
    """Download files or folders from a RUNNING session's working folder.

    With --json: {"downloaded": ["DEST/NAME", ...]}.
    """
    names = call_api(
        lambda c: c.session_files.download(ref, paths, dest), not_found_hint=_NOT_FOUND
    )
    written = [str(dest / name) for name in names]
    if as_json:
        print_json({"downloaded": written})
        return
    for local in written:
        typer.echo(local)


@session_app.command("ls")
def ls_command(
    ref: RefArg,
    path: Annotated[
        str, typer.Argument(help="A folder in the session.", metavar="PATH")
    ] = "/home/work",
    as_json: JsonOption = False,
) -> None:
    """List a folder of a RUNNING session (default: its working folder, /home/work)."""
    entries = call_api(lambda c: c.session_files.list_files(ref, path), not_found_hint=_NOT_FOUND)
    if as_json:
        print_json(entries)
        return
    table = Table("Mode", "Size", "Modified", "Name", box=None)
    for entry in entries:
        modified = datetime.fromtimestamp(float(entry["mtime"]), tz=UTC)
        table.add_row(
            str(entry["mode"]),
            str(entry["size"]),
            modified.strftime("%Y-%m-%d %H:%M:%S"),
            str(entry["filename"]),
        )
    console().print(table)


@session_app.command("apps")
def apps_command(ref: RefArg, as_json: JsonOption = False) -> None:
    """Print the URLs of the session's app services (proxied by the manager) and of its
    web terminal."""
    answer = call_api(lambda c: c.sessions.apps(ref), not_found_hint=_NOT_FOUND)
    if as_json:
        print_json(answer)
        return
    apps = answer.get("apps") or []
    if not apps:
        typer.echo(f"Session ID {answer.get('sessionId')} declares no app services.")
    for app in apps:
        typer.echo(f"{app['name']}\t{app['url']}")
    if answer.get("terminal"):
        typer.echo(f"terminal\t{answer['terminal']} (WebSocket; the console's Terminal button)")


@session_app.command("why")
def why_command(ref: RefArg, as_json: JsonOption = False) -> None:
    """Explain why a session is (still) PENDING: failed checks and, per agent, why it
    does not fit."""
    why = call_api(lambda c: c.sessions.why(ref), not_found_hint=_NOT_FOUND)
    if as_json:
        print_json(why.to_json())
        return
    typer.echo(f"Session ID {why.session_id} ({why.session_name}): {why.status}")
    typer.echo(why.explanation)


@session_app.command("events")
def events_command(ref: RefArg, as_json: JsonOption = False) -> None:
    """Follow the session's status changes (history first) until it ends."""

    async def work(client: AccelshareClient) -> None:
        async for event in client.sessions.events(ref):
            if as_json:
                typer.echo(json.dumps(event.to_json()))
            else:
                typer.echo(
                    f"{event.at}  {event.from_status or '-'} -> {event.status}  {event.reason or ''}"
                )

    try:
        call_api(work, not_found_hint=_NOT_FOUND)
    except KeyboardInterrupt:
        raise typer.Exit(130) from None


@session_app.command("wait")
def wait_command(
    ref: RefArg,
    status: Annotated[
        str, typer.Option("--status", help="Comma-separated statuses to wait for.")
    ] = "RUNNING",
    timeout: Annotated[float, typer.Option("--timeout", min=0, help="Seconds.")] = 60.0,
    as_json: JsonOption = False,
) -> None:
    """Wait until the session reaches a status (or ends); exits 1 on a timeout or when
    it ended in another status."""
    wanted = {s.strip().upper() for s in status.split(",") if s.strip()}

    async def work(client: AccelshareClient) -> SessionInfo:
        with spinner(f"Waiting for {', '.join(sorted(wanted))}...", enabled=not as_json):
            try:
                return await client.sessions.wait(ref, wanted, timeout_s=timeout)
            except TimeoutError:
                return await client.sessions.get(ref)

    info = call_api(work, not_found_hint=_NOT_FOUND)
    if as_json:
        print_json(info.to_json())
    if info.status not in wanted:
        fail(
            f"Session ID {info.session_id} is {info.status}, not {', '.join(sorted(wanted))}"
            f" (waited up to {timeout:g} s)"
        )
    if not as_json:
        typer.echo(f"Session ID {info.session_id} is {info.status}.")
