"""Discrete maps: whole units (CPU cores, whole GPUs, MIG slices, memory bytes).

**FILL** takes ``min(still needed, free)`` from each device in order (most free
first).  **EVENLY** spreads in rounds: every device with free units gets
``needed // n``, the first ``needed % n`` one more, capped by what it has free.

Examples (spec 02): two devices of 100, EVENLY: 130 -> 65 + 65, then 15 -> 8 + 7.
Four CPUs of 2: 4 -> 1 each; 2 -> cpu0, cpu1; 3 -> InsufficientResource; 2 -> cpu2, cpu3.

Unlike Backend.AI, a non-whole amount is refused (it would silently truncate 1.5 to 1
or hand out half a device) and a unique slot must be requested as exactly 1.
"""

from __future__ import annotations

from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal

from .affinity import AffinityHint
from .base import AbstractAllocMap
from .errors import InvalidResourceArgument, format_amount
from .model import AllocationStrategy
from .strategies import fill, spread_evenly

__all__ = ["DiscreteAllocMap"]


class DiscreteAllocMap(AbstractAllocMap):
    """Whole-unit allocation map (FILL or EVENLY, default EVENLY).

    >>> from accelshare.common import SlotTypes
    >>> from accelshare.alloc.model import DeviceSlotInfo
    >>> m = DiscreteAllocMap({f"cpu{i}": DeviceSlotInfo(SlotTypes.COUNT, "cpu", Decimal(2))
    ...                       for i in range(4)})
    >>> m.allocate({"cpu": Decimal(4)})
    {'cpu': {'cpu0': Decimal('1'), 'cpu1': Decimal('1'), 'cpu2': Decimal('1'), 'cpu3': Decimal('1')}}
    >>> m.allocate({"cpu": Decimal(2)})
    {'cpu': {'cpu0': Decimal('1'), 'cpu1': Decimal('1')}}
    """

    def _units_of(self, slot: str, amount: Decimal, context_tag: str | None) -> int:
        whole = amount.to_integral_value()
        if amount != whole:
            lower = amount.to_integral_value(rounding=ROUND_FLOOR)
            upper = amount.to_integral_value(rounding=ROUND_CEILING)
            raise InvalidResourceArgument(
                f"cannot allocate {format_amount(amount)} of {slot}: it is counted in whole"
                f" units (nearest whole amounts: {format_amount(lower)} and"
                f" {format_amount(upper)})",
                slot=slot,
                requested=amount,
                expected="a whole number",
                context_tag=context_tag,
            )
        return int(whole)

    def _place(
        self,
        slot: str,
        need: int,
        hint: AffinityHint | None,
        min_memory: Decimal,
        allow_fragmentation: bool,
        context_tag: str | None,
    ) -> dict[str, int]:
        if self._slot_spare[slot] < need:
            raise self._insufficient(slot, need, context_tag)
        order = self._walk_order(slot, hint)
        if self.allocation_strategy is AllocationStrategy.FILL:
            return fill(order, self._spare, need)
        return spread_evenly(order, self._spare, need)

    def _largest(self, slot: str, min_memory: Decimal, allow_fragmentation: bool) -> int:
        # Both strategies place any amount up to the total free units.
        return self._slot_spare[slot]
