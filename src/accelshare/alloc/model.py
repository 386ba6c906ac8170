"""Plain data of the allocation maps: devices, strategies, results, snapshots.

Device ids and slot names are plain strings; amounts are exact ``Decimal``::

    DeviceSlotInfo(SlotTypes.COUNT, "cuda.shares", Decimal("1.0"))   # one GPU, 1.0 share
    allocation = {"cuda.shares": {"GPU1": Decimal("0.6"), "GPU2": Decimal("0.6")}}
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, TypeAlias

from accelshare.common import Allocation, SlotTypes

from .errors import AllocMapConfigError, parse_enum_member

if TYPE_CHECKING:
    from .errors import ResourceError

__all__ = [
    "AllocationByMap",
    "AllocationStrategy",
    "DeviceSlotInfo",
    "Fit",
    "MapSnapshot",
]

AllocationByMap: TypeAlias = dict[str, Allocation]
"""One kernel over several maps: device name (plugin key) -> its :data:`Allocation`
(what ``allocate()`` of that map returned)."""


class AllocationStrategy(enum.Enum):
    """FILL packs (most-free device onward); EVENLY spreads (prefers even splits)."""

    FILL = "fill"
    EVENLY = "evenly"

    @classmethod
    def parse(cls, value: AllocationStrategy | str) -> AllocationStrategy:
        """Accept a member, its name (``"EVENLY"``) or its value (``"evenly"``)."""
        return parse_enum_member(
            cls, value, field="allocation_strategy", what="allocation strategy"
        )


@dataclass(frozen=True, slots=True)
class DeviceSlotInfo:
    """One device's slot and capacity (``amount``), positional in this order."""

    slot_type: SlotTypes
    slot_name: str
    amount: Decimal

    def __post_init__(self) -> None:
        try:
            slot_type = SlotTypes(self.slot_type)
        except ValueError as e:
            raise AllocMapConfigError(
                f"unknown slot type {self.slot_type!r}: expected one of"
                f" {', '.join(t.value for t in SlotTypes)}",
                field="slot_type",
                received=self.slot_type,
            ) from e
        if not isinstance(self.slot_name, str) or not self.slot_name:
            raise AllocMapConfigError(
                f"invalid slot name {self.slot_name!r}: expected a non-empty string",
                field="slot_name",
                received=self.slot_name,
            )
        amount = self.amount
        if isinstance(amount, int) and not isinstance(amount, bool):
            amount = Decimal(amount)
        if not isinstance(amount, Decimal) or not amount.is_finite() or amount < 0:
            raise AllocMapConfigError(
                f"invalid capacity {self.amount!r} for slot {self.slot_name}:"
                " expected a finite Decimal >= 0",
                field="amount",
                received=self.amount,
            )
        object.__setattr__(self, "slot_type", slot_type)
        object.__setattr__(self, "slot_name", str(self.slot_name))
        object.__setattr__(self, "amount", amount)


@dataclass(frozen=True, slots=True)
class MapSnapshot:
    """An opaque copy of a map's allocated amounts (device id -> allocated), for :meth:`restore`."""

    allocated: tuple[tuple[str, Decimal], ...]

    def as_dict(self) -> dict[str, Decimal]:
        return dict(self.allocated)


@dataclass(frozen=True, slots=True)
class Fit:
    """The answer of a dry run: the placement that would be made, or why there is none.

    "Does not fit" is an expected outcome here, not an exception: ``error`` keeps the
    structured reason (slot, requested, available, per-device free) for explanations.
    """

    allocation: Allocation | None
    error: ResourceError | None = None

    @property
    def fits(self) -> bool:
        return self.error is None

    @property
    def reason(self) -> str:
        """Empty when it fits, else the error message."""
        return "" if self.error is None else str(self.error)
