"""Fractional maps: fGPU shares handed out on a quantum grid.

Every amount is a multiple of ``quantum_size``; a request off the grid is refused
with :class:`NotMultipleOfQuantum` naming the nearest valid amounts, and a valid one
is split so that the parts add up *exactly* (Backend.AI silently gives 1.4 for 1.5
over two GPUs at quantum 0.1; here it is 0.8 + 0.7).  Internally amounts are counted
in whole quanta (``int``), so no rounding can creep in.

**FILL** packs like the discrete FILL.  **EVENLY** prefers even splits, then fewer
devices, then the smallest fitting hole.  The canonical example, two GPUs of 1.0
share, quantum 0.1, EVENLY:

* 0.2 -> GPU2 (both hold it; best fit scans from the least-free end).  Allocated 0 / 0.2.
* 1.2 -> GPU1 0.6 + GPU2 0.6.  Allocated 0.6 / 0.8.
* with FILL instead: 0.2 -> GPU1; 1.2 -> GPU2 1.0 + GPU1 0.2; allocated amounts 0.4 / 1.0.

With ``allow_resource_fragmentation=False`` the anti-fragmentation guard runs first:
a request up to one device's capacity must fit on one device, a larger one must be an
even split over whole devices (:func:`~accelshare.alloc.strategies.fits_unfragmented`).
The guard's verdict is the same as without packing; where it admits the request, EVENLY
then *packs*: it places the guard's shape where the free share left stays in the largest
holes (:func:`~accelshare.alloc.strategies.pack_unfragmented`).  Capacities 1, 1.5, 2, 3,
3, 4, 4.5, 5, 5, request 11, ``min_memory`` 0.84: 2.75 on each of the devices of 3, 3, 4
and 4.5, both devices of 5 left whole (fragmentation allowed, EVENLY takes the devices of
4, 4.5, 5, 5, whose leftovers are all above ``min_memory``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from decimal import Decimal

from .affinity import AffinityHint, most_free_first
from .amounts import ceil_to, to_units
from .base import AbstractAllocMap
from .errors import (
    AllocMapConfigError,
    FractionalResourceFragmented,
    InvalidResourceArgument,
    NotMultipleOfQuantum,
    format_amount,
)
from .model import AllocationStrategy, DeviceSlotInfo
from .strategies import (
    best_fit,
    fill,
    fits_unfragmented,
    is_unfragmented_split,
    largest_unfragmented,
    pack_unfragmented,
    split_over_windows,
)

__all__ = ["DEFAULT_QUANTUM", "FractionAllocMap"]

DEFAULT_QUANTUM = Decimal("0.01")


def _check_quantum(quantum: Decimal) -> Decimal:
    if isinstance(quantum, int) and not isinstance(quantum, bool):
        quantum = Decimal(quantum)
    if not isinstance(quantum, Decimal) or not quantum.is_finite() or quantum <= 0:
        raise AllocMapConfigError(
            f"invalid quantum_size {quantum!r}: expected a finite Decimal > 0 such as"
            " Decimal('0.01')",
            field="quantum_size",
            received=quantum,
        )
    return quantum


class FractionAllocMap(AbstractAllocMap):
    """Fractional allocation map on a quantum grid (FILL or EVENLY, default EVENLY).

    >>> from accelshare.common import SlotTypes
    >>> gpus = {g: DeviceSlotInfo(SlotTypes.COUNT, "cuda.shares", Decimal(1))
    ...         for g in ("GPU1", "GPU2")}
    >>> m = FractionAllocMap(gpus, quantum_size=Decimal("0.1"))
    >>> m.allocate({"cuda.shares": Decimal("0.2")})
    {'cuda.shares': {'GPU2': Decimal('0.2')}}
    >>> m.allocate({"cuda.shares": Decimal("1.2")})
    {'cuda.shares': {'GPU1': Decimal('0.6'), 'GPU2': Decimal('0.6')}}
    """

    def __init__(
        self,
        device_slots: Mapping[str, DeviceSlotInfo],
        *,
        allocation_strategy: AllocationStrategy | str = AllocationStrategy.EVENLY,
        quantum_size: Decimal = DEFAULT_QUANTUM,
        exclusive_slot_types: Iterable[str] = (),
        numa_nodes: Mapping[str, int | None] | None = None,
    ) -> None:
        self.quantum_size = _check_quantum(quantum_size)
        self._unit = self.quantum_size  # the base class counts spare in units of this
        super().__init__(
            device_slots,
            allocation_strategy=allocation_strategy,
            exclusive_slot_types=exclusive_slot_types,
            numa_nodes=numa_nodes,
        )
        self._min_units_cache: dict[Decimal, int] = {}
        # The guard's C ("homogeneous devices assumed"): the largest device, in quanta.
        self._capacity_units = {
            slot: max(to_units(self._devices[d].amount, self._unit) for d in devices)
            for slot, devices in self._slot_devices.items()
        }

    def _units_of(self, slot: str, amount: Decimal, context_tag: str | None) -> int:
        units, remainder = divmod(amount, self._unit)
        if remainder:
            raise NotMultipleOfQuantum(
                slot,
                amount,
                self._unit,
                lower=units * self._unit,
                upper=(units + 1) * self._unit,
                context_tag=context_tag,
            )
        return int(units)

    def _min_units(self, min_memory: Decimal) -> int:
        # A device is usable by EVENLY when its spare (on the grid) is >= min_memory.
        units = self._min_units_cache.get(min_memory)
        if units is None:
            units = max(1, to_units(ceil_to(min_memory, self._unit), self._unit))
            self._min_units_cache[min_memory] = units
        return units

    def _place(
        self,
        slot: str,
        need: int,
        hint: AffinityHint | None,
        min_memory: Decimal,
        allow_fragmentation: bool,
        context_tag: str | None,
    ) -> dict[str, int]:
        spare = self._spare
        devices = self._slot_devices[slot]
        if self._slot_spare[slot] < need:
            # Not enough at all: say so, even when fragmentation was also refused.
            raise self._insufficient(slot, need, context_tag)
        if not allow_fragmentation and not fits_unfragmented(
            [spare[d] for d in devices], self._capacity_units[slot], need
        ):
            per_device = self.free_per_device(slot)
            raise FractionalResourceFragmented(
                slot,
                self._unit * need,
                sum(per_device.values(), Decimal(0)),
                per_device,
                context_tag=context_tag,
            )
        if self.allocation_strategy is AllocationStrategy.FILL:
            return fill(self._walk_order(slot, hint), spare, need)
        min_units = self._min_units(min_memory)
        tiers = self._tiers(slot, hint) if hint is not None else [devices]
        for tier in tiers:
            ordered = most_free_first(tier, spare)
            if spare[ordered[-1]] < min_units:  # most free first: the usable ones are a prefix
                ordered = [d for d in ordered if spare[d] >= min_units]
                usable = sum([spare[d] for d in ordered])
            else:
                usable = self._slot_spare[slot] if tier is devices else sum(spare[d] for d in tier)
            if usable >= need:
                if not allow_fragmentation:
                    packed = self._packed(slot, ordered, need, min_units)
                    if packed is not None:
                        return packed
                return self._evenly(ordered, need, min_units)
        raise self._insufficient(
            slot,
            need,
            context_tag,
            note=f"; devices with less than {min_memory} free are not used (min_memory)",
        )

    def _evenly(self, ordered: list[str], need: int, min_units: int) -> dict[str, int]:
        """EVENLY over ``ordered`` (most free first, total spare covers ``need``)."""
        device = best_fit(ordered, self._spare, need)
        if device is not None:
            return {device: need}
        amounts = split_over_windows([self._spare[d] for d in ordered], need, min_units)
        return {d: a for d, a in zip(ordered, amounts, strict=True) if a}

    def _packed(
        self, slot: str, ordered: list[str], need: int, min_units: int
    ) -> dict[str, int] | None:
        """With fragmentation refused: the guard's shape on the devices that keep the
        largest holes (:func:`~accelshare.alloc.strategies.pack_unfragmented`), inside
        the tier found (``ordered``: most free first, all above ``min_units``), else over
        every usable device of the slot; None when neither admits it (only when the
        guard's even part is below ``min_memory``)."""
        spare = self._spare
        if need <= self._capacity_units[slot]:  # best fit, as EVENLY does anyway
            device = best_fit(ordered, spare, need)
            if device is not None:
                return {device: need}
        for candidates in (ordered, self._slot_devices[slot]):
            devices = [d for d in most_free_first(candidates, spare) if spare[d] >= min_units]
            amounts = pack_unfragmented(
                [spare[d] for d in devices], self._capacity_units[slot], need
            )
            if amounts is not None:
                return {d: a for d, a in zip(devices, amounts, strict=True) if a}
        return None

    def _check_planned_shape(
        self,
        slot: str,
        taken: Mapping[str, int],
        need: int,
        allow_fragmentation: bool,
        context_tag: str | None,
    ) -> None:
        """With fragmentation refused, a plan must have the guard's shape: up to one
        device's capacity on a single device, more as an even split over whole devices."""
        if allow_fragmentation or is_unfragmented_split(
            list(taken.values()), self._capacity_units[slot], need
        ):
            return
        raise InvalidResourceArgument(
            f"the plan does not match the request: it splits {format_amount(self._unit * need)}"
            f" of {slot} as {', '.join(f'{d} {format_amount(self._unit * n)}' for d, n in taken.items())},"
            " a fragmented placement the request refuses",
            slot=slot,
            requested=dict(taken),
            expected="a single device, or an even split over whole devices",
            context_tag=context_tag,
        )

    def _largest(self, slot: str, min_memory: Decimal, allow_fragmentation: bool) -> int:
        spares = [self._spare[d] for d in self._slot_devices[slot]]
        if self.allocation_strategy is AllocationStrategy.FILL:
            usable = sum(spares)
        else:
            min_units = self._min_units(min_memory)
            usable = sum(s for s in spares if s >= min_units)
        if allow_fragmentation:
            return usable
        # The guard's accepted amounts are closed downwards on each side of C, and so
        # is "total usable >= R", so capping each side's best by ``usable`` is exact.
        capacity = self._capacity_units[slot]
        single, above = largest_unfragmented(spares, capacity)
        capped_above = min(above, usable)
        return max(min(single, usable), capped_above if capped_above > capacity else 0)
