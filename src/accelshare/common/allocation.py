"""What one kernel holds on one agent: slot name -> device id -> exact amount.

    {"cuda.shares": {"GPU1": Decimal("0.6"), "GPU2": Decimal("0.6")}}

An allocation map's ``allocate()`` returns one, ``free()`` takes one back, a compute
plugin turns one into a kernel's environment, and a scheduling plan is one.  The wire
form (``accelshare.protocol.fields``: ``HeldAllocation``, ``PlannedAllocation``...) is
the same shape with the amounts as decimal strings.
"""

from __future__ import annotations

import enum
from decimal import Decimal
from typing import TypeAlias

__all__ = ["Allocation", "AllocationMode"]

Allocation: TypeAlias = dict[str, dict[str, Decimal]]
"""Slot name -> device id -> amount (Backend.AI's ``device_allocs`` / ``alloc_map``)."""


class AllocationMode(enum.StrEnum):
    """How a plugin shares its devices: fractional shares (``<key>.shares``) or whole
    units (``<key>.device``).  The CLI lists the members in this order."""

    FRACTIONAL = "fractional"
    DISCRETE = "discrete"
