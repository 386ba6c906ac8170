"""Rendering helpers of the CLI (pure: data in, rich renderables or text out).

Allocation bars, one line per device and slot::

    c59395cd-…2d01  cuda.shares  ██████░░░░  0.60 / 1.00
    root            mem          ██░░░░░░░░  2 GiB / 16 GiB

Who holds each accelerator device (``accelshare agent info``)::

    c59395cd-…2d01  cuda.shares  train-1 (kernel 5f0c…)  0.50 / 1.00  50 %
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from rich.table import Table
from rich.text import Text

from accelshare.common import BinarySize, canonical_decimal
from accelshare.protocol import PluginMapView

__all__ = [
    "BAR_WIDTH",
    "alloc_table",
    "amount_text",
    "bar",
    "device_share_percent",
    "holders_table",
    "short_id",
    "slots_text",
]

BAR_WIDTH = 10
_HUNDREDTH = Decimal("0.01")


def short_id(device_id: str, *, full: bool = False) -> str:
    """``c59395cd-ac91-4cd3-a1b0-3d2568aa2d01`` -> ``c59395cd-…2d01`` (ids over 16 chars)."""
    if full or len(device_id) <= 16:
        return device_id
    return f"{device_id[:9]}…{device_id[-4:]}"


def amount_text(amount: Decimal, slot_type: str, *, fractional: bool = False) -> str:
    if slot_type == "bytes":
        return str(BinarySize(int(amount))) if amount else "0"
    if fractional:
        return str(amount.quantize(_HUNDREDTH, rounding=ROUND_HALF_UP))
    return canonical_decimal(amount)


def bar(allocated: Decimal, capacity: Decimal, width: int = BAR_WIDTH) -> str:
    """``██████░░░░`` for 0.6 of 1.0; anything above zero shows, only full is full."""
    if capacity <= 0:
        return "·" * width
    filled = int((allocated / capacity * width).to_integral_value(rounding=ROUND_HALF_UP))
    if allocated > 0:
        filled = max(filled, 1)
    if allocated < capacity:
        filled = min(filled, width - 1)
    filled = max(0, min(filled, width))
    return "█" * filled + "░" * (width - filled)


def _bar_style(allocated: Decimal, capacity: Decimal) -> str:
    if capacity > 0 and allocated >= capacity:
        return "red"
    return "yellow" if allocated > 0 else "green"


def alloc_table(
    maps: Mapping[str, PluginMapView], *, full_ids: bool = False, plugins: Iterable[str] = ()
) -> Table:
    """Per device and slot: ``device  slot  bar  allocated / capacity  kernels``."""
    wanted = set(plugins)
    table = Table(box=None, pad_edge=False, show_header=True, header_style="bold")
    table.add_column("device", no_wrap=True)
    table.add_column("slot", no_wrap=True)
    table.add_column("allocation", no_wrap=True)
    table.add_column("allocated / capacity", no_wrap=True, justify="right")
    table.add_column("kernels", justify="right")
    for key, view in maps.items():
        if wanted and key not in wanted:
            continue
        fractional = view.kind == "fractional"
        for device in view.devices:
            allocated, capacity = Decimal(device.allocated), Decimal(device.capacity)
            slot_type = device.slot_type.value
            text = (
                f"{amount_text(allocated, slot_type, fractional=fractional)} / "
                f"{amount_text(capacity, slot_type, fractional=fractional)}"
            )
            table.add_row(
                short_id(device.device_id, full=full_ids),
                device.slot_name,
                Text(bar(allocated, capacity), style=_bar_style(allocated, capacity)),
                text,
                str(len(device.kernels)) if device.kernels else "",
            )
    return table


INTRINSIC_PLUGINS = frozenset({"cpu", "mem"})


def device_share_percent(amount: Decimal, capacity: Decimal) -> Decimal:
    """How much of the device ``amount`` is, in whole percent (half up): 0.25 of 1.00 -> 25."""
    if capacity <= 0:
        return Decimal(0)
    return (amount / capacity * 100).quantize(Decimal(1), rounding=ROUND_HALF_UP)


def holders_table(
    maps: Mapping[str, PluginMapView],
    sessions: Mapping[str, str],
    *,
    full_ids: bool = False,
    plugins: Iterable[str] = (),
) -> Table | None:
    """One row per accelerator device and kernel holding it, with the part of the device.

    ``sessions`` maps kernel id -> session name (kernels it does not name, e.g. another
    domain's ``hidden-N``, are shown by id).  None when no accelerator device is held.
    """
    wanted = set(plugins)
    table = Table(box=None, pad_edge=False, show_header=True, header_style="bold")
    for name, justify in (
        ("device", "left"),
        ("slot", "left"),
        ("session (kernel)", "left"),
        ("holds", "right"),
        ("of the device", "right"),
    ):
        table.add_column(name, no_wrap=True, justify=justify)  # type: ignore[arg-type]
    rows = 0
    for key, view in maps.items():
        if key in INTRINSIC_PLUGINS or (wanted and key not in wanted):
            continue
        fractional = view.kind == "fractional"
        for device in view.devices:
            capacity = Decimal(device.capacity)
            slot_type = device.slot_type.value
            for kernel_id, raw in sorted(device.kernels.items()):
                amount = Decimal(raw)
                session = sessions.get(kernel_id)
                who = (
                    f"{session} (kernel {short_id(kernel_id, full=full_ids)})"
                    if session
                    else kernel_id
                )
                table.add_row(
                    short_id(device.device_id, full=full_ids),
                    device.slot_name,
                    who,
                    f"{amount_text(amount, slot_type, fractional=fractional)} / "
                    f"{amount_text(capacity, slot_type, fractional=fractional)}",
                    f"{device_share_percent(amount, capacity)} %",
                )
                rows += 1
    return table if rows else None


def slots_text(slots: Mapping[str, Any], types: Mapping[str, str] | None = None) -> str:
    """``cpu=1 mem=1 GiB cuda.shares=0.2`` (mem in binary units)."""
    parts = []
    for slot, raw in slots.items():
        amount = Decimal(str(raw))
        slot_type = (types or {}).get(slot, "bytes" if slot == "mem" else "count")
        shown = (
            amount_text(amount, slot_type) if slot_type == "bytes" else canonical_decimal(amount)
        )
        parts.append(f"{slot}={shown}")
    return " ".join(parts)
