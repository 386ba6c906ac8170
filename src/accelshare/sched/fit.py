"""Does a session fit an agent?  Totals first, then a dry run on the agent's devices.

The manager knows every agent's per-device state (capacity and allocated amount per
device, as the agent's allocation maps report it in each heartbeat) and checks a
placement with the *same* allocation algorithm the agent will run (spec 00,
deliberate difference 8), so a session it schedules does not fail on the agent with
InsufficientResource or FractionalResourceFragmented.

Pure and synchronous; the manager turns the heartbeat's ``PluginMapView``\\ s into
:class:`MapState` (plain data) and the pass builds a :class:`TrialMaps` per agent from them.

A pass keeps one :class:`TrialMaps` per agent (built lazily, from the frozen snapshot) and
places sessions on it one after another, Nomad style: :meth:`TrialMaps.place`
runs :func:`~accelshare.alloc.allocate_kernel`, which snapshots every map before the
attempt and restores them when any map fails, so a failed attempt leaves the maps as
they were and a successful one stays committed for the rest of the pass.

Worked example (two GPUs of 1.0 share, quantum 0.1, EVENLY; GPU1 holds 0.6 and GPU2
0.2 already)::

    trial.place({"cuda.shares": Decimal("1.5")})
    # -> FitFailure("cuda.shares needs 1.5, largest placement 1.2 (GPU1 0.4, GPU2 0.8 free)")
    trial.place({"cuda.shares": Decimal("1.2")})
    # -> {"cuda": {"cuda.shares": {"GPU1": 0.4, "GPU2": 0.8}}}, committed

Reasons read ``<agent>: <why>``, e.g. ``i-node01: cuda.shares needs 1.2, largest
placement 0.8 (GPU1 0.4, GPU2 0.8 free)`` or ``i-node02: no cuda.shares slot``.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal

from accelshare.alloc import (
    DEFAULT_ALLOCATION_ORDER,
    AbstractAllocMap,
    AllocationByMap,
    AllocationStrategy,
    DiscreteAllocMap,
    FractionAllocMap,
    FractionalResourceFragmented,
    InsufficientResource,
    NotMultipleOfQuantum,
    ResourceError,
    allocate_kernel,
)
from accelshare.common import Allocation, AllocationMode, ResourceSlot, SlotTypes, canonical_decimal

__all__ = [
    "DeviceState",
    "FitFailure",
    "MapLayouts",
    "MapState",
    "TrialMaps",
    "device_allocation",
    "device_taken_amount",
    "fits_capacity",
    "format_slot_amount",
    "largest_placements",
    "sum_allocations",
    "totals_shortfall",
]

_ZERO = Decimal(0)


@dataclass(frozen=True, slots=True)
class DeviceState:
    """One device of one map: its slot, capacity and what is allocated on it."""

    device_id: str
    slot_name: str
    slot_type: SlotTypes
    capacity: Decimal
    allocated: Decimal = _ZERO
    numa_node: int | None = None


@dataclass(frozen=True, slots=True)
class MapState:
    """One plugin's allocation map as reported (enough to rebuild it for a dry run)."""

    key: str
    kind: AllocationMode
    devices: tuple[DeviceState, ...]
    strategy: str = "EVENLY"
    quantum: Decimal | None = None  # fractional maps only
    exclusive_slot_types: tuple[str, ...] = ()

    @property
    def slot_names(self) -> frozenset[str]:
        return frozenset(d.slot_name for d in self.devices)

    @property
    def layout(self) -> tuple[object, ...]:
        """Everything of the map but its allocated amounts: devices (id, slot, type, capacity, NUMA
        node) and options.  Two maps of one layout behave alike when empty."""
        return (
            self.kind,
            self.strategy,
            self.quantum,
            self.exclusive_slot_types,
            tuple(
                (d.device_id, d.slot_name, d.slot_type, d.capacity, d.numa_node)
                for d in self.devices
            ),
        )

    def build(self, layouts: MapLayouts | None = None, *, empty: bool = False) -> AbstractAllocMap:
        """A live map with this state's allocated amounts (``empty``: nothing allocated), copied
        from the empty map ``layouts`` keeps for its device layout (built here without).

        An allocated amount above a device's capacity (possible while reports and the
        manager's own accounting disagree) is clamped to the capacity: the device is full.
        """
        devices = self.devices
        alloc_map = self.build_empty() if layouts is None else layouts.empty_map(self)
        if not empty:
            allocations: Allocation = {}
            for d in devices:
                if d.allocated > 0:
                    allocations.setdefault(d.slot_name, {})[d.device_id] = min(
                        d.allocated, d.capacity
                    )
            if allocations:
                alloc_map.apply_allocation(allocations)
        return alloc_map

    def build_empty(self) -> AbstractAllocMap:
        """A new map of this state's devices and options with nothing allocated."""
        capacities: dict[str, dict[str, Decimal]] = {}
        types: dict[str, SlotTypes] = {}
        for d in self.devices:
            capacities.setdefault(d.slot_name, {})[d.device_id] = d.capacity
            types[d.slot_name] = d.slot_type
        numa = {d.device_id: d.numa_node for d in self.devices}
        strategy = AllocationStrategy.parse(self.strategy)
        if self.kind is AllocationMode.FRACTIONAL:
            return FractionAllocMap.from_state(
                capacities,
                slot_types=types,
                allocation_strategy=strategy,
                quantum_size=self.quantum if self.quantum is not None else Decimal("0.01"),
                exclusive_slot_types=self.exclusive_slot_types,
                numa_nodes=numa,
            )
        return DiscreteAllocMap.from_state(
            capacities,
            slot_types=types,
            allocation_strategy=strategy,
            exclusive_slot_types=self.exclusive_slot_types,
            numa_nodes=numa,
        )


_EmptyFitKey = tuple[int, tuple[tuple[str, Decimal], ...], bool]


@dataclass(slots=True)
class MapLayouts:
    """What the planner learns of device layouts (a map's devices, slots, types,
    capacities, NUMA nodes and options; :attr:`MapState.layout`), for as long as its
    owner keeps it: the manager's scheduler holds one across passes and scaling groups
    (:class:`~accelshare.sched.memo.PlanMemo`), the session service one for its
    creation-time checks; a pass given none starts with an empty one.

    * **Empty maps** (:meth:`empty_map`): built once per layout and copied
      (:meth:`AbstractAllocMap.copy`): a cluster's agents mostly share a few layouts,
      and building a map validates every device (a copy costs a small fraction of
      that).  Capacities are compared by value: the maps' texts are normalised.
    * **Empty-map verdicts** (:meth:`verdict`, :meth:`remember`): whether a request part fits an
      *empty* map of a layout.  A pass asks it for every request shape (``could_fit``),
      and an empty map's answer depends on its layout alone.

    Both are bounded (cleared when full: layouts are few, so a bound, not an LRU).  The
    planner's threads may share one: single dict reads and writes, a lost entry is
    worked out again."""

    max_layouts: int = 256
    max_verdicts: int = 65_536
    _templates: dict[tuple[object, ...], AbstractAllocMap] = field(default_factory=dict)
    # a small int per layout seen (never reused), so that verdicts are keyed without
    # hashing a layout's devices again
    _ids: dict[tuple[object, ...], int] = field(default_factory=dict)
    _counter: Iterator[int] = field(default_factory=itertools.count)
    _verdicts: dict[_EmptyFitKey, bool] = field(default_factory=dict)

    @property
    def kept(self) -> tuple[int, int]:
        """How many layouts' empty maps and how many verdicts are kept."""
        return len(self._templates), len(self._verdicts)

    def empty_map(self, state: MapState) -> AbstractAllocMap:
        """A new empty map of ``state``'s layout (a copy of the one kept)."""
        layout = state.layout
        template = self._templates.get(layout)
        if template is None:
            template = state.build_empty()
            if len(self._templates) >= self.max_layouts:
                self._templates.clear()
            self._templates[layout] = template
        return template.copy()

    def layout_id(self, state: MapState) -> int:
        layout = state.layout
        found = self._ids.get(layout)
        if found is None:
            if len(self._ids) >= self.max_layouts:
                self._ids.clear()  # ids are never reused: old verdicts just go unread
            found = self._ids.setdefault(layout, next(self._counter))
        return found

    def verdict(self, key: _EmptyFitKey) -> bool | None:
        """Whether a request part fits an empty map of a layout, if kept: ``key`` is
        (:meth:`layout_id`, the part's items, allow_fragmentation)."""
        return self._verdicts.get(key)

    def remember(self, key: _EmptyFitKey, fits: bool) -> bool:
        if len(self._verdicts) >= self.max_verdicts:
            self._verdicts.clear()
        self._verdicts[key] = fits
        return fits


def device_taken_amount(
    reported_allocated: Decimal,
    reported_by_kernel: Mapping[str, Decimal],
    manager_amount: Decimal,
    known_kernels: Iterable[str] | frozenset[str],
) -> Decimal:
    """The amount of one device the scheduler must treat as taken.

    ``manager_amount`` is what the manager's own resource-occupying kernels hold there
    (authoritative, and already includes kernels the agent has not heard of yet).  On
    top of it comes what the agent reports that the manager does not account for:
    kernels it does not know (or legacy holdings), i.e. ``reported_allocated`` minus
    the amounts of ``known_kernels`` (every kernel id the manager has a row for,
    ended ones included: those are freed or about to be).

    >>> device_taken_amount(Decimal("0.8"), {"k1": Decimal("0.2"), "x": Decimal("0.6")},
    ...                     Decimal("0.2"), {"k1"})
    Decimal('0.8')
    """
    known = frozenset(known_kernels)
    attributed = sum((v for k, v in reported_by_kernel.items() if k in known), _ZERO)
    foreign = max(_ZERO, reported_allocated - attributed)
    return manager_amount + foreign


def format_slot_amount(slot: str, amount: Decimal, slot_type: SlotTypes | None = None) -> str:
    """``2147483648`` of ``mem`` -> ``2g``; counts as plain decimals."""
    if (
        slot_type is SlotTypes.BYTES or (slot_type is None and slot == "mem")
    ) and amount.is_finite():
        return ResourceSlot({slot: amount}).to_humanized({slot: SlotTypes.BYTES})[slot]
    return canonical_decimal(amount)


def totals_shortfall(
    available: ResourceSlot, occupied: ResourceSlot, requested: ResourceSlot
) -> list[str]:
    """Why the agent's remaining totals cannot cover ``requested`` (empty: they can)."""
    reasons: list[str] = []
    for slot, amount in requested.items():
        if amount <= 0:
            continue
        total = available.get_amount(slot)
        if slot not in available or total <= 0:
            reasons.append(f"no {slot} slot")
            continue
        free = total - occupied.get_amount(slot)
        if free < amount:
            reasons.append(
                f"{slot} needs {format_slot_amount(slot, amount)},"
                f" {format_slot_amount(slot, max(free, _ZERO))} free"
                f" of {format_slot_amount(slot, total)}"
            )
    return reasons


@dataclass(frozen=True, slots=True)
class FitFailure:
    """Why a request does not fit an agent's devices right now."""

    reason: str
    error: ResourceError | None = None


def _device_label(slot: str, device: str) -> str:
    """CPU cores are numbered ``0``, ``1``...: say ``cpu0`` so that "0 0 free" reads well."""
    return f"{slot.split('.', 1)[0]}{device}" if device.isdigit() else device


def _free_list(slot: str, devices: Mapping[str, Decimal]) -> str:
    return ", ".join(f"{_device_label(slot, d)} {canonical_decimal(v)}" for d, v in devices.items())


@dataclass(slots=True)
class TrialMaps:
    """One agent's allocation maps during a pass (mutable; see the module docstring)."""

    agent_id: str
    states: tuple[MapState, ...]
    # the layouts' empty maps and verdicts, shared with the other trials of the owner
    # (a pass, the session service); a trial given none keeps its own
    layouts: MapLayouts = field(default_factory=MapLayouts, repr=False)
    _maps: dict[str, AbstractAllocMap] | None = field(default=None, repr=False)
    _empty_maps: dict[str, AbstractAllocMap] | None = field(default=None, repr=False)
    _slot_owner: dict[str, str] = field(default_factory=dict, repr=False)
    _kind_of: dict[str, str] = field(default_factory=dict, repr=False)
    _kinds: tuple[str, ...] = field(default=(), repr=False)
    _placed: bool = field(default=False, repr=False)
    _part_refusals: dict[tuple[str, tuple[tuple[str, Decimal], ...], bool], str | None] = field(
        default_factory=dict, repr=False
    )
    _refusals: dict[tuple[tuple[tuple[str, Decimal], ...], bool], str | None] = field(
        default_factory=dict, repr=False
    )
    _layout_ids: dict[str, int] | None = field(default=None, repr=False)
    # hole_loss's answers until the maps change: accelerator part -> loss
    _losses: dict[tuple[tuple[str, Decimal], ...], Decimal] = field(
        default_factory=dict, repr=False
    )

    def _index(self) -> None:
        """Which map owns which slot, and the maps' allocation order (worked out on first
        use: a pass builds a trial for every agent and uses few of them on a full
        cluster)."""
        if self._kinds:
            return
        for state in self.states:
            for slot in state.slot_names:
                self._slot_owner.setdefault(slot, state.key)
                self._kind_of[slot] = state.key  # allocate_kernel's owner: the last map wins
        keys = list(dict.fromkeys(s.key for s in self.states))
        first = [k for k in DEFAULT_ALLOCATION_ORDER if k in keys]
        self._kinds = (*first, *(k for k in keys if k not in first))

    @property
    def slots(self) -> frozenset[str]:
        """Slots this agent reports per device (the rest is checked by totals only)."""
        self._index()
        return frozenset(self._slot_owner)

    @property
    def maps(self) -> dict[str, AbstractAllocMap]:
        if self._maps is None:
            self._maps = {s.key: s.build(self.layouts) for s in self.states}
        return self._maps

    def _device_request(self, requested: Mapping[str, Decimal]) -> dict[str, Decimal]:
        self._index()
        return {s: v for s, v in requested.items() if v > 0 and s in self._slot_owner}

    def place(
        self, requested: Mapping[str, Decimal], *, allow_fragmentation: bool = True
    ) -> AllocationByMap | FitFailure:
        """Allocate on the trial (kept on success, rolled back on failure)."""
        request = self._device_request(requested)
        if not request:
            return {}
        try:
            placed = allocate_kernel(
                self.maps, request, allow_resource_fragmentation=allow_fragmentation
            )
        except ResourceError as e:
            return FitFailure(self._explain(e, allow_fragmentation), e)
        self._refusals.clear()  # the maps changed
        self._part_refusals.clear()
        self._losses.clear()
        self._placed = True
        return placed

    def hole_loss(self, request: Sequence[tuple[str, Decimal]], slots: Iterable[str]) -> Decimal:
        """How much placing ``request`` (which fits) would shrink the *hole score* of
        ``slots``: the sum over their devices of free² before minus free² after, that is
        ``a * (2 * free - a)`` for ``a`` taken from a device with ``free`` free.  The
        least loss keeps the largest holes whole (``alloc.strategies.pack_unfragmented``
        scores the devices of one agent alike).  Each map's part is dry-run on its own,
        fragmentation refused, without the NUMA hint of the maps placed before it (a
        ranking estimate: :meth:`place` makes the placement).  Exact ``Decimal``."""
        self._index()
        wanted = set(slots)
        parts = tuple((s, v) for s, v in request if s in wanted and s in self._kind_of)
        loss = self._losses.get(parts)
        if loss is not None:
            return loss
        grouped: dict[str, dict[str, Decimal]] = {}
        for slot, amount in parts:
            grouped.setdefault(self._kind_of[slot], {})[slot] = amount
        loss = Decimal(0)
        maps = self.maps
        for kind, part in grouped.items():
            alloc_map = maps[kind]
            planned = alloc_map.plan(part, allow_resource_fragmentation=False)
            for slot, taken in planned.items():
                free = alloc_map.free_per_device(slot)
                for device, amount in taken.items():
                    loss += amount * (2 * free[device] - amount)
        self._losses[parts] = loss
        return loss

    @property
    def fingerprint(self) -> object:
        """Equal for two trials whose dry runs and reasons are the same: the reported
        maps while nothing was placed on them in the pass (else this trial only)."""
        return ("placed", self.agent_id) if self._placed else self.states

    def _parts(self, request: Mapping[str, Decimal]) -> list[tuple[str, dict[str, Decimal]]]:
        """The request split by map, in :func:`~accelshare.alloc.allocate_kernel`'s order."""
        grouped: dict[str, dict[str, Decimal]] = {}
        for slot, amount in request.items():
            grouped.setdefault(self._kind_of[slot], {})[slot] = amount
        return [(kind, grouped[kind]) for kind in self._kinds if kind in grouped]

    def refusal(
        self, request: Sequence[tuple[str, Decimal]], *, allow_fragmentation: bool = True
    ) -> str | None:
        """The reason :meth:`check` would give for ``request`` (positive amounts; None: it
        fits), map by map and remembered until the maps change.

        Exact because whether one map can hold its part of a request, and the error it
        raises when it cannot, do not depend on the NUMA hint
        :func:`~accelshare.alloc.allocate_kernel` passes from the maps before it (the
        hint orders devices; the last affinity tier is always every device): the first
        map in allocation order that refuses its part alone is the one that fails the
        kernel.  Requests that share a part (say every request for 1.2 shares) share
        the dry run of that map.
        """
        whole = (tuple(request), allow_fragmentation)
        if whole in self._refusals:
            return self._refusals[whole]
        self._index()
        grouped: dict[str, dict[str, Decimal]] = {}
        for slot, amount in request:
            kind = self._kind_of.get(slot)
            if kind is not None and amount > 0:
                grouped.setdefault(kind, {})[slot] = amount
        reason: str | None = None
        maps = self.maps
        for kind in self._kinds:
            part = grouped.get(kind)
            if part is None:
                continue
            key = (kind, tuple(part.items()), allow_fragmentation)
            if key in self._part_refusals:
                reason = self._part_refusals[key]
            else:
                fit = maps[kind].check(part, allow_resource_fragmentation=allow_fragmentation)
                reason = (
                    None if fit.error is None else self._explain(fit.error, allow_fragmentation)
                )
                self._part_refusals[key] = reason
            if reason is not None:
                break
        self._refusals[whole] = reason
        return reason

    def check(
        self, requested: Mapping[str, Decimal], *, allow_fragmentation: bool = True
    ) -> AllocationByMap | FitFailure:
        """A dry run: what :meth:`place` would return, leaving the trial unchanged."""
        request = self._device_request(requested)
        if not request:
            return {}
        maps = self.maps
        snapshots = {key: m.snapshot() for key, m in maps.items()}
        try:
            return allocate_kernel(maps, request, allow_resource_fragmentation=allow_fragmentation)
        except ResourceError as e:
            return FitFailure(self._explain(e, allow_fragmentation), e)
        finally:
            for key, snapshot in snapshots.items():
                maps[key].restore(snapshot)

    def devices_of(self, slot: str) -> tuple[tuple[str, Decimal, Decimal], ...]:
        """``(device, free, capacity)`` of each device reporting ``slot``, in the map's
        declaration order (the order the agents page lists them in); empty when no map
        reports ``slot`` per device."""
        self._index()
        owner = self._slot_owner.get(slot)
        if owner is None:
            return ()
        alloc_map = self.maps[owner]
        devices = alloc_map.device_slots
        return tuple(
            (device, free, devices[device].amount)
            for device, free in alloc_map.free_per_device(slot).items()
        )

    def fits_when_empty(
        self, requested: Mapping[str, Decimal], *, allow_fragmentation: bool = True
    ) -> bool:
        """Could the request fit these devices if nothing were allocated on them?"""
        request = self._device_request(requested)
        if not request:
            return True
        layouts = self.layouts
        layout_ids = self._layout_ids
        if layout_ids is None:
            layout_ids = self._layout_ids = {s.key: layouts.layout_id(s) for s in self.states}
        for kind, part in self._parts(request):  # map by map, as in refusal()
            key = (layout_ids[kind], tuple(part.items()), allow_fragmentation)
            fits = layouts.verdict(key)
            if fits is None:
                fit = self._empty_map(kind).check(
                    part, allow_resource_fragmentation=allow_fragmentation
                )
                fits = layouts.remember(key, fit.error is None)
            if not fits:
                return False
        return True

    def _empty_map(self, kind: str) -> AbstractAllocMap:
        if self._empty_maps is None:
            self._empty_maps = {s.key: s.build(self.layouts, empty=True) for s in self.states}
        return self._empty_maps[kind]

    def largest_when_empty(self, slot: str, *, allow_fragmentation: bool = True) -> Decimal | None:
        """The most of ``slot`` one kernel could get here if nothing were allocated
        (for fractional GPUs: what an empty agent could give one kernel); None when no
        map reports ``slot`` per device (its totals are all there is)."""
        self._index()
        owner = self._slot_owner.get(slot)
        if owner is None:
            return None
        return self._empty_map(owner).largest_fit(
            slot, allow_resource_fragmentation=allow_fragmentation
        )

    def _explain(self, error: ResourceError, allow_fragmentation: bool) -> str:
        slot = error.slot
        if isinstance(error, InsufficientResource | FractionalResourceFragmented) and slot:
            owner = self.maps.get(self._slot_owner.get(slot, ""))
            largest = (
                owner.largest_fit(slot, allow_resource_fragmentation=allow_fragmentation)
                if owner is not None
                else _ZERO
            )
            needs = f"{slot} needs {format_slot_amount(slot, error.requested)}"
            place = f"largest placement {format_slot_amount(slot, largest)}"
            if isinstance(error, FractionalResourceFragmented):
                return (
                    f"{needs}, {place} without fragmentation"
                    f" (fragmented: {_free_list(slot, error.devices)} free)"
                )
            if slot == "mem":
                return (
                    f"{needs}, {place} ({format_slot_amount(slot, error.available or _ZERO)} free)"
                )
            return f"{needs}, {place} ({_free_list(slot, error.devices)} free)"
        if isinstance(error, NotMultipleOfQuantum):
            return (
                f"{slot} {canonical_decimal(error.requested)} is not a multiple of this agent's"
                f" quantum {canonical_decimal(error.quantum)}"
            )
        return error.detail


def fits_capacity(
    available: ResourceSlot,
    trial: TrialMaps,
    requested: ResourceSlot,
    *,
    allow_fragmentation: bool = True,
) -> bool:
    """Could the agent ever hold the request (everything else gone)?"""
    if totals_shortfall(available, ResourceSlot(), requested):
        return False
    return trial.fits_when_empty(requested, allow_fragmentation=allow_fragmentation)


def largest_placements(
    agents: Sequence[tuple[ResourceSlot, TrialMaps]],
    requested: ResourceSlot,
    *,
    allow_fragmentation: bool = True,
) -> dict[str, Decimal] | None:
    """None when some agent could hold ``requested`` if it were empty (the planner's
    :func:`fits_capacity` verdict, as for its ``could_fit``); else, for each requested
    slot, the largest single placement on any of ``agents`` (``(available totals,
    trial)``) when empty: what the biggest agent could give one kernel.  No agents:
    None (nothing to judge by).

    >>> two_gpus = TrialMaps("a", (MapState("cuda", AllocationMode.FRACTIONAL, tuple(
    ...     DeviceState(f"GPU{i}", "cuda.shares", SlotTypes.COUNT, Decimal(1))
    ...     for i in (1, 2)), quantum=Decimal("0.1")),))
    >>> largest_placements([(ResourceSlot({"cuda.shares": 2}), two_gpus)],
    ...                    ResourceSlot({"cuda.shares": 3}))
    {'cuda.shares': Decimal('2.0')}
    """
    if not agents or any(
        fits_capacity(available, trial, requested, allow_fragmentation=allow_fragmentation)
        for available, trial in agents
    ):
        return None
    largest: dict[str, Decimal] = {}
    for slot, amount in requested.items():
        if amount <= 0:
            continue
        best = _ZERO
        for available, trial in agents:
            total = max(available.get_amount(slot), _ZERO)
            per_device = trial.largest_when_empty(slot, allow_fragmentation=allow_fragmentation)
            best = max(best, total if per_device is None else min(per_device, total))
        largest[slot] = best
    return largest


def device_allocation(allocation: AllocationByMap) -> Allocation:
    """Flatten ``{plugin: {slot: {device: amount}}}`` to ``{slot: {device: amount}}``."""
    flat: Allocation = {}
    for per_slot in allocation.values():
        for slot, per_device in per_slot.items():
            flat.setdefault(slot, {}).update(per_device)
    return flat


def sum_allocations(
    allocations: Sequence[Allocation],
) -> Allocation:
    """Add several ``{slot: {device: amount}}`` allocations."""
    total: Allocation = {}
    for alloc in allocations:
        for slot, per_device in alloc.items():
            bucket = total.setdefault(slot, {})
            for device, amount in per_device.items():
                bucket[device] = bucket.get(device, _ZERO) + amount
    return total
