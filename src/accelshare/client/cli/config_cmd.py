"""``accelshare config ...``: what the cluster offers (slot types and how to show them)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from .common import JsonOption, call_api, console, print_json

config_app = typer.Typer(help="The cluster's resource slots.", no_args_is_help=True)


@config_app.command("slots")
def slots_command(
    details: Annotated[
        bool, typer.Option("--details", help="With each slot's display name and unit.")
    ] = False,
    scaling_group: Annotated[
        str | None, typer.Option("--scaling-group", "-s", help="With --details: one group's.")
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """List the resource slots sessions can ask for (-r SLOT=AMOUNT) and their types."""
    if details:
        meta = call_api(lambda c: c.config.resource_slot_details(scaling_group=scaling_group))
        if as_json:
            print_json(meta)
            return
        table = Table("slot", "name", "unit", "description", box=None, pad_edge=False)
        for slot, info in meta.items():
            table.add_row(
                slot,
                str(info.get("human_readable_name", "")),
                str(info.get("display_unit", "")),
                str(info.get("description", "")),
            )
        console().print(table)
        return
    slots = call_api(lambda c: c.config.resource_slots())
    if as_json:
        print_json(slots)
        return
    table = Table("slot", "type", box=None, pad_edge=False)
    for slot, slot_type in slots.items():
        table.add_row(slot, slot_type)
    console().print(table)
