"""The allocated amounts and request pipeline shared by discrete and fractional maps.

A map knows each device's slot and capacity and how much of it is allocated.  Every
public call validates everything first and only then touches the allocated amounts, so a call
that raises leaves the allocated amounts exactly as they were.  ``allocate`` is ``plan`` (a pure
dry run) followed by a commit.

Contract for callers: a map is not thread-safe; the agent calls it under its lock.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Mapping
from decimal import Decimal
from types import MappingProxyType
from typing import Any, Self

from accelshare.common import Allocation, SlotTypes

from .affinity import AffinityHint, affinity_tiers, most_free_first, numa_groups, walk_order
from .amounts import MAPPINGS, check_amount, check_exclusive, to_units, validate_request
from .errors import (
    AllocMapConfigError,
    InsufficientResource,
    InvalidResourceArgument,
    PlanConflict,
    ResourceError,
    UnsupportedResource,
    format_amount,
)
from .model import AllocationStrategy, DeviceSlotInfo, Fit, MapSnapshot

__all__ = ["DEFAULT_MIN_MEMORY", "AbstractAllocMap"]

DEFAULT_MIN_MEMORY = Decimal("0.01")
_ZERO = Decimal(0)
_ONE = Decimal(1)


class AbstractAllocMap(abc.ABC):
    """Per-device allocated amounts of one plugin's slots.  See the subclasses for the algorithms."""

    #: the size of one unit the algorithms count in (1, or the quantum)
    _unit: Decimal = _ONE

    def __init__(
        self,
        device_slots: Mapping[str, DeviceSlotInfo],
        *,
        allocation_strategy: AllocationStrategy | str = AllocationStrategy.EVENLY,
        exclusive_slot_types: Iterable[str] = (),
        numa_nodes: Mapping[str, int | None] | None = None,
    ) -> None:
        self.allocation_strategy = AllocationStrategy.parse(allocation_strategy)
        self._devices: dict[str, DeviceSlotInfo] = {}
        self._slot_devices: dict[str, list[str]] = {}
        self._slot_types: dict[str, SlotTypes] = {}
        for device_id, info in device_slots.items():
            self._add_device(device_id, info)
        if isinstance(exclusive_slot_types, str):  # a lone name, not its characters
            exclusive_slot_types = (exclusive_slot_types,)
        self._exclusive = tuple(str(pattern) for pattern in exclusive_slot_types)
        self._numa: dict[str, int | None] = dict.fromkeys(self._devices)
        for device_id, node in (numa_nodes or {}).items():
            self._set_numa_node(device_id, node)
        self._numa_members: dict[str, dict[int | None, list[str]]] = {}  # slot -> node -> devices
        self._allocated = dict.fromkeys(self._devices, _ZERO)
        # Free units per device and per slot, kept in step with the allocated amounts.
        self._spare: dict[str, int] = {}
        self._slot_spare: dict[str, int] = {}
        self._reset_spares()

    def _add_device(self, device_id: str, info: DeviceSlotInfo) -> None:
        if not isinstance(device_id, str) or not device_id:
            raise AllocMapConfigError(
                f"invalid device id {device_id!r}: expected a non-empty string",
                field="device_id",
                received=device_id,
            )
        if not isinstance(info, DeviceSlotInfo):
            raise AllocMapConfigError(
                f"device {device_id}: expected a DeviceSlotInfo, got {info!r}",
                field=device_id,
                received=info,
            )
        known = self._slot_types.setdefault(info.slot_name, info.slot_type)
        if known is not info.slot_type:
            raise AllocMapConfigError(
                f"device {device_id}: slot {info.slot_name} is {known.value} on other devices,"
                f" not {info.slot_type.value}",
                field=device_id,
                received=info.slot_type,
            )
        self._devices[device_id] = info
        self._slot_devices.setdefault(info.slot_name, []).append(device_id)

    def _set_numa_node(self, device_id: str, node: int | None) -> None:
        if device_id not in self._devices:
            raise AllocMapConfigError(
                f"NUMA node given for unknown device {device_id!r}"
                f" (devices: {', '.join(self._devices) or 'none'})",
                field="numa_nodes",
                received=device_id,
            )
        if node is not None and (not isinstance(node, int) or isinstance(node, bool)):
            raise AllocMapConfigError(
                f"NUMA node of {device_id} must be an int or None, got {node!r}",
                field="numa_nodes",
                received=node,
            )
        self._numa[device_id] = node

    @classmethod
    def from_state(
        cls,
        capacities: Mapping[str, Mapping[str, Decimal]],
        allocations: Allocation | None = None,
        *,
        slot_types: Mapping[str, SlotTypes | str] | None = None,
        **options: Any,
    ) -> Self:
        """A map rebuilt from reported state, for dry runs (the manager's placement check).

        ``capacities`` and ``allocations`` are plain dicts ``slot -> device -> amount``
        (the agent's heartbeat); ``slot_types`` defaults to ``count``; ``options`` are
        the constructor's (strategy, quantum, exclusive set, NUMA nodes)::

            m = FractionAllocMap.from_state(
                {"cuda.shares": {"GPU1": Decimal(1), "GPU2": Decimal(1)}},
                {"cuda.shares": {"GPU1": Decimal("0.6"), "GPU2": Decimal("0.2")}},
                quantum_size=Decimal("0.1"),
            )
            m.check({"cuda.shares": Decimal("1.5")}).fits      # False (1.2 free)
            m.plan({"cuda.shares": Decimal("1.2")})            # {GPU1: 0.4, GPU2: 0.8}
            m.largest_fit("cuda.shares")                       # Decimal('1.2')
        """
        types = slot_types or {}
        device_slots = {
            device: DeviceSlotInfo(SlotTypes(types.get(slot, SlotTypes.COUNT)), slot, amount)
            for slot, per_device in capacities.items()
            for device, amount in per_device.items()
        }
        alloc_map = cls(device_slots, **options)
        alloc_map.apply_allocation(allocations or {})
        return alloc_map

    # -- read-only views ------------------------------------------------------------------
    @property
    def device_slots(self) -> Mapping[str, DeviceSlotInfo]:
        return MappingProxyType(self._devices)

    @property
    def slot_types(self) -> Mapping[str, SlotTypes]:
        """Slot name -> slot type, in declaration order."""
        return MappingProxyType(self._slot_types)

    @property
    def exclusive_slot_types(self) -> tuple[str, ...]:
        return self._exclusive

    @property
    def numa_nodes(self) -> Mapping[str, int | None]:
        return MappingProxyType(self._numa)

    @property
    def allocations(self) -> Allocation:
        """A copy of the allocated amounts: slot -> device -> allocated, every device, zeros included."""
        return {
            slot: {d: self._allocated[d] for d in devices}
            for slot, devices in self._slot_devices.items()
        }

    def free_per_device(self, slot_name: str) -> dict[str, Decimal]:
        """Capacity minus allocated for each device of ``slot_name`` (declaration order)."""
        return {
            d: self._devices[d].amount - self._allocated[d] for d in self._devices_of(slot_name)
        }

    def __repr__(self) -> str:
        slots = ", ".join(f"{s}: {len(d)} devices" for s, d in self._slot_devices.items())
        return f"{type(self).__name__}({self.allocation_strategy.name}, {{{slots}}})"

    # -- allocation -----------------------------------------------------------------------
    def allocate(
        self,
        slots: Mapping[str, Decimal],
        *,
        affinity_hint: AffinityHint | None = None,
        context_tag: str | None = None,
        min_memory: Decimal = DEFAULT_MIN_MEMORY,
        allow_resource_fragmentation: bool = True,
    ) -> Allocation:
        """Take ``slots`` from the devices and return what was taken (zeros left out).

        Raises a :class:`ResourceError` and changes nothing when any slot fails.
        ``min_memory`` and ``allow_resource_fragmentation`` only matter for fractional
        maps (whole units never fragment); discrete maps check and ignore them.
        """
        units = self._plan_units(
            slots, affinity_hint, context_tag, min_memory, allow_resource_fragmentation
        )
        return self._take(units)

    def _take(self, units: Mapping[str, Mapping[str, int]]) -> Allocation:
        """Put ``units`` (slot -> device -> whole units) on the allocated amounts; their amounts."""
        placement: Allocation = {}
        allocated, spare, slot_spare, unit = (
            self._allocated,
            self._spare,
            self._slot_spare,
            self._unit,
        )
        for slot, per_device in units.items():
            amounts = placement[slot] = {}
            for device, n in per_device.items():
                amount = amounts[device] = unit * n
                # Taking n whole units lowers floor(free / unit) by exactly n: no division.
                allocated[device] += amount
                spare[device] -= n
                slot_spare[slot] -= n
        return placement

    def plan(
        self,
        slots: Mapping[str, Decimal],
        *,
        affinity_hint: AffinityHint | None = None,
        context_tag: str | None = None,
        min_memory: Decimal = DEFAULT_MIN_MEMORY,
        allow_resource_fragmentation: bool = True,
    ) -> Allocation:
        """Dry run: what :meth:`allocate` would return, without touching the allocated amounts."""
        return self._amounts(
            self._plan_units(
                slots, affinity_hint, context_tag, min_memory, allow_resource_fragmentation
            )
        )

    def _plan_units(
        self,
        slots: Mapping[str, Decimal],
        affinity_hint: AffinityHint | None,
        context_tag: str | None,
        min_memory: Decimal,
        allow_resource_fragmentation: bool,
    ) -> dict[str, dict[str, int]]:
        """Validate everything, then place each slot: slot -> device -> units.

        The checks run in the order of spec 02 over *all* slots (amounts, exclusivity,
        known slots, unique, then whole units or quantum), so the error a request gets
        does not depend on the order of its slots' failures.
        """
        needs = self._request_units(slots, context_tag)
        if not needs:
            return {}
        if min_memory is not DEFAULT_MIN_MEMORY:
            min_memory = check_amount("min_memory", min_memory, what="min_memory")
        placement: dict[str, dict[str, int]] = {}
        for slot, need in needs.items():
            taken = self._place(
                slot, need, affinity_hint, min_memory, allow_resource_fragmentation, context_tag
            )
            if len(taken) > 1:  # report devices in declaration order
                taken = {d: taken[d] for d in self._slot_devices[slot] if d in taken}
            placement[slot] = taken
        return placement

    def _request_units(
        self, slots: Mapping[str, Decimal], context_tag: str | None
    ) -> dict[str, int]:
        """Validate a request (amounts, exclusivity, known slots, unique, then whole units
        or quantum) and count each slot in units: slot -> units needed."""
        request = validate_request(slots, context_tag=context_tag)
        if not request:
            return {}
        if self._exclusive:
            check_exclusive(request, self._exclusive, context_tag=context_tag)
        slot_types = self._slot_types
        for slot, amount in request.items():
            slot_type = slot_types.get(slot)
            if slot_type is None:
                raise UnsupportedResource(slot, amount, list(slot_types), context_tag=context_tag)
            if slot_type is SlotTypes.UNIQUE and amount != _ONE:
                raise self._not_unique(slot, amount, context_tag)
        return {slot: self._units_of(slot, amount, context_tag) for slot, amount in request.items()}

    def _amounts(self, units: dict[str, dict[str, int]]) -> Allocation:
        unit = self._unit
        return {slot: {d: unit * n for d, n in taken.items()} for slot, taken in units.items()}

    def allocate_planned(
        self,
        slots: Mapping[str, Decimal],
        placement: Allocation,
        *,
        context_tag: str | None = None,
        allow_resource_fragmentation: bool = True,
    ) -> Allocation:
        """Take exactly ``placement`` (slot -> device -> amount, a plan made elsewhere) for
        the request ``slots``, without running the placement strategy; what was taken.

        The request is checked as :meth:`allocate` checks it; then the placement: it
        names exactly the request's slots (zero amounts left out), each device is one
        of that slot's, each amount is on the map's grid (:meth:`_units_of`: whole
        units, or the quantum), the amounts add up to the request, a fractional slot
        refused fragmentation gets a single device or an even split over whole devices,
        and each device has the amount free.  Every check runs before the allocated amounts are
        touched: a refusal changes nothing.  A device that is not there or has less
        free than the plan puts on it raises :class:`PlanConflict` (the plan no longer
        fits); any other refusal is an :class:`InvalidResourceArgument` (a wrong plan).
        """
        needs = self._request_units(slots, context_tag)
        units = self._placement_units(needs, placement, context_tag, allow_resource_fragmentation)
        return self._take(units)

    def _placement_units(
        self,
        needs: Mapping[str, int],
        placement: Allocation,
        context_tag: str | None,
        allow_fragmentation: bool,
    ) -> dict[str, dict[str, int]]:
        """Check a plan against a checked request (see :meth:`allocate_planned`): slot ->
        device -> units, or raise.  Conflicts (a device gone or short) are raised after
        every other check, so a wrong plan is never reported as a conflict."""
        if not isinstance(placement, MAPPINGS):
            raise _wrong_plan(
                f"expected slot -> device -> amount, got {placement!r}",
                None,
                placement,
                context_tag,
            )
        placed = {slot: per for slot, per in placement.items() if _any_positive(slot, per)}
        extra = [slot for slot in placed if slot not in needs]
        if extra:
            raise _wrong_plan(
                f"it places {extra[0]}, which the request does not ask for",
                extra[0],
                placement,
                context_tag,
            )
        units: dict[str, dict[str, int]] = {}
        gone: list[tuple[str, str, Decimal]] = []
        for slot, need in needs.items():
            per_device = placed.get(slot)
            if per_device is None:
                raise _wrong_plan(f"it places nothing of {slot}", slot, placement, context_tag)
            taken: dict[str, int] = {}
            for device, value in per_device.items():
                amount = check_amount(slot, value, what="planned amount", context_tag=context_tag)
                if not amount:
                    continue
                info = self._devices.get(device)
                if info is None or info.slot_name != slot:
                    gone.append((slot, str(device), amount))
                    continue
                taken[device] = self._units_of(slot, amount, context_tag)
            total = sum(taken.values()) + sum(
                self._units_of(slot, a, context_tag) for s, _, a in gone if s == slot
            )
            if total != need:
                raise _wrong_plan(
                    f"it places {format_amount(self._unit * total)} of {slot}, the request"
                    f" asks for {format_amount(self._unit * need)}",
                    slot,
                    placement,
                    context_tag,
                )
            if not gone:
                self._check_planned_shape(slot, taken, need, allow_fragmentation, context_tag)
            units[slot] = taken
        if gone:
            slot, device, amount = gone[0]
            raise PlanConflict(
                slot,
                amount,
                {device: _ZERO},
                why=f"{device} is not a device of {slot} here"
                f" (devices: {', '.join(self._slot_devices[slot])})",
                context_tag=context_tag,
            )
        for slot, taken in units.items():
            short = {d: n for d, n in taken.items() if n > self._spare[d]}
            if short:
                device, n = next(iter(short.items()))
                free = self._devices[device].amount - self._allocated[device]
                raise PlanConflict(
                    slot,
                    self._unit * n,
                    {device: free},
                    why=f"{device} has {format_amount(free)} free",
                    context_tag=context_tag,
                )
        return units

    def _check_planned_shape(
        self,
        slot: str,
        taken: Mapping[str, int],
        need: int,
        allow_fragmentation: bool,
        context_tag: str | None,
    ) -> None:
        """Refuse a plan the map's own rules would never make (whole units never
        fragment: nothing to check here; fractional maps check the guard's shape)."""
        return None

    def check(self, slots: Mapping[str, Decimal], **options: Any) -> Fit:
        """Dry run that returns a :class:`Fit` instead of raising for a request that does not fit.

        Any :class:`ResourceError` (insufficient, fragmented, but also an amount that is
        off this map's quantum) is the reason it does not fit here.
        """
        try:
            return Fit(self.plan(slots, **options))
        except ResourceError as e:
            return Fit(None, e)

    def largest_fit(
        self,
        slot_name: str,
        *,
        min_memory: Decimal = DEFAULT_MIN_MEMORY,
        allow_resource_fragmentation: bool = True,
    ) -> Decimal:
        """The largest amount of ``slot_name`` one :meth:`allocate` call would place now."""
        self._devices_of(slot_name)
        min_memory = check_amount("min_memory", min_memory, what="min_memory")
        if self._slot_types[slot_name] is SlotTypes.UNIQUE:
            return (
                _ONE
                if any(self._spare[d] * self._unit >= 1 for d in self._slot_devices[slot_name])
                else _ZERO
            )
        return self._unit * self._largest(slot_name, min_memory, allow_resource_fragmentation)

    # -- restoring, freeing, rolling back -------------------------------------------------
    def apply_allocation(self, alloc: Allocation) -> None:
        """Add a known allocation (restart recovery); refuses to exceed any capacity."""
        entries = self._validate_existing(alloc, "apply")
        for slot, device, amount in entries:
            free = self._devices[device].amount - self._allocated[device]
            if amount > free:
                raise InsufficientResource(
                    slot,
                    amount,
                    free,
                    {device: free},
                    note=f"; applying a recorded allocation would exceed {device}'s capacity",
                )
        self._commit(entries, negate=False)

    def free(self, alloc: Allocation) -> None:
        """Subtract an allocation; freeing more than is allocated is refused."""
        entries = self._validate_existing(alloc, "free")
        for slot, device, amount in entries:
            held = self._allocated[device]
            if amount > held:
                raise InvalidResourceArgument(
                    f"cannot free {format_amount(amount)} of {slot} from {device}:"
                    f" only {format_amount(held)} allocated",
                    slot=slot,
                    requested=amount,
                    expected=f"at most {format_amount(held)}",
                    device=device,
                )
        self._commit(entries, negate=True)

    def clear(self) -> None:
        """Zero the allocated amounts."""
        for device in self._allocated:
            self._allocated[device] = _ZERO
        self._reset_spares()

    def copy(self) -> Self:
        """An independent map with the same devices and options and a copy of the allocated amounts.

        Nothing is validated again (the devices are this map's), so copying a map is
        much cheaper than building one: the scheduler builds each device layout once
        and copies it for every agent that has it.  The device table and options are
        immutable after construction and shared, and so are the caches of what follows
        from them alone (NUMA groups, a fractional map's minimum units); the allocated amounts are
        not.
        """
        new = type(self).__new__(type(self))
        new.__dict__.update(self.__dict__)
        new._allocated = dict(self._allocated)
        new._spare = dict(self._spare)
        new._slot_spare = dict(self._slot_spare)
        return new

    def snapshot(self) -> MapSnapshot:
        """A copy of the allocated amounts to :meth:`restore` when a multi-map allocation fails."""
        return MapSnapshot(tuple(self._allocated.items()))

    def restore(self, snapshot: MapSnapshot) -> None:
        """Put back the allocated amounts taken by :meth:`snapshot` on a map with the same devices."""
        values = snapshot.as_dict() if isinstance(snapshot, MapSnapshot) else None
        if (
            values is None
            or list(values) != list(self._allocated)
            or any(not 0 <= v <= self._devices[d].amount for d, v in values.items())
        ):
            raise InvalidResourceArgument(
                "cannot restore a snapshot of another map (different devices or capacities)",
                slot=None,
                requested=snapshot,
                expected="a MapSnapshot taken from a map with the same devices",
            )
        self._allocated.update(values)
        self._reset_spares()

    # -- helpers for subclasses -----------------------------------------------------------
    def _commit(self, entries: list[tuple[str, str, Decimal]], *, negate: bool) -> None:
        """Add (or subtract) validated amounts, keeping the free units in step."""
        devices, allocated, spare, unit = self._devices, self._allocated, self._spare, self._unit
        for slot, device, amount in entries:
            value = allocated[device] - amount if negate else allocated[device] + amount
            allocated[device] = value
            units = int((devices[device].amount - value) // unit)  # amounts may be off-grid
            self._slot_spare[slot] += units - spare[device]
            spare[device] = units

    def _reset_spares(self) -> None:
        for slot, devices in self._slot_devices.items():
            for device in devices:
                free = self._devices[device].amount - self._allocated[device]
                self._spare[device] = to_units(free, self._unit)
            self._slot_spare[slot] = sum(self._spare[d] for d in devices)

    def _devices_of(self, slot_name: str) -> list[str]:
        try:
            return self._slot_devices[slot_name]
        except KeyError:
            raise UnsupportedResource(slot_name, None, list(self._slot_types)) from None

    def _walk_order(self, slot: str, hint: AffinityHint | None) -> list[str]:
        """Device order for FILL and discrete EVENLY (the last affinity tier)."""
        devices = self._slot_devices[slot]
        if hint is None:
            return most_free_first(devices, self._spare)
        members = self._members(slot)
        return walk_order(devices, self._spare, self._allocated, self._numa, hint, members)

    def _tiers(self, slot: str, hint: AffinityHint | None) -> list[list[str]]:
        devices = self._slot_devices[slot]
        members = self._members(slot)
        return affinity_tiers(devices, self._spare, self._allocated, self._numa, hint, members)

    def _members(self, slot: str) -> dict[int | None, list[str]]:
        members = self._numa_members.get(slot)
        if members is None:  # the devices and their nodes never change: worked out once
            members = self._numa_members[slot] = numa_groups(self._slot_devices[slot], self._numa)
        return members

    @staticmethod
    def _not_unique(slot: str, amount: Decimal, context_tag: str | None) -> ResourceError:
        return InvalidResourceArgument(
            f"cannot allocate {format_amount(amount)} of {slot}: it is a unique slot"
            " (a device taken whole), request exactly 1",
            slot=slot,
            requested=amount,
            expected="exactly 1",
            context_tag=context_tag,
        )

    def _insufficient(
        self, slot: str, need: int, context_tag: str | None, note: str = ""
    ) -> InsufficientResource:
        per_device = self.free_per_device(slot)
        return InsufficientResource(
            slot,
            self._unit * need,
            sum(per_device.values(), _ZERO),
            per_device,
            context_tag=context_tag,
            note=note,
        )

    def _validate_existing(self, alloc: Allocation, action: str) -> list[tuple[str, str, Decimal]]:
        """Check a recorded allocation names this map's slots and devices; drop zeros."""
        entries: list[tuple[str, str, Decimal]] = []
        what = "amount to " + action
        if not isinstance(alloc, MAPPINGS):
            raise InvalidResourceArgument(
                f"cannot {action} {alloc!r}: expected slot -> device -> amount",
                slot=None,
                requested=alloc,
                expected="a mapping of slot -> device -> Decimal",
            )
        for slot, per_device in alloc.items():
            if slot not in self._slot_devices:
                self._devices_of(slot)  # raises UnsupportedResource
            if not isinstance(per_device, MAPPINGS):
                raise InvalidResourceArgument(
                    f"cannot {action} {per_device!r} of {slot}: expected device -> amount",
                    slot=slot,
                    requested=per_device,
                    expected="a mapping of device -> Decimal",
                )
            for device, value in per_device.items():
                amount = check_amount(slot, value, what=what)
                info = self._devices.get(device)
                if info is None or info.slot_name != slot:
                    devices = self._slot_devices[slot]
                    raise InvalidResourceArgument(
                        f"cannot {action} {format_amount(amount)} of {slot} on {device!r}:"
                        f" not a device of {slot} (devices: {', '.join(devices)})",
                        slot=slot,
                        requested=amount,
                        expected=f"one of {', '.join(devices)}",
                        device=str(device),
                    )
                if amount > 0:
                    entries.append((slot, device, amount))
        return entries

    # -- what a map kind decides ----------------------------------------------------------
    @abc.abstractmethod
    def _units_of(self, slot: str, amount: Decimal, context_tag: str | None) -> int:
        """Validate one requested amount (unique, whole, quantum) and count it in units."""

    @abc.abstractmethod
    def _place(
        self,
        slot: str,
        need: int,
        hint: AffinityHint | None,
        min_memory: Decimal,
        allow_fragmentation: bool,
        context_tag: str | None,
    ) -> dict[str, int]:
        """Units to take per device for one slot, or raise; never touches the allocated amounts."""

    @abc.abstractmethod
    def _largest(self, slot: str, min_memory: Decimal, allow_fragmentation: bool) -> int:
        """The largest number of units one allocate call would place for ``slot``."""


def _any_positive(slot: str, per_device: Any) -> bool:
    """Whether a plan's entry for ``slot`` places anything (an entry of zeros is none)."""
    if not isinstance(per_device, MAPPINGS):
        raise _wrong_plan(
            f"expected device -> amount for {slot}, got {per_device!r}", slot, per_device
        )
    return any(check_amount(slot, v, what="planned amount") for v in per_device.values())


def _wrong_plan(
    why: str, slot: str | None, received: Any, context_tag: str | None = None
) -> InvalidResourceArgument:
    return InvalidResourceArgument(
        f"the plan does not match the request: {why}",
        slot=slot,
        requested=received,
        expected="a plan placing exactly the requested amounts",
        context_tag=context_tag,
    )
