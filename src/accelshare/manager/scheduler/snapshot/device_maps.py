"""An agent's per-device maps as the scheduler's pass sees them.

An agent's last heartbeat stores one ``PluginMapView`` per allocation map
(``agents.map_views``).  A device counts, by
:func:`~accelshare.sched.fit.device_taken_amount`, what the manager's own kernels hold
there (planned placements of kernels the agent has not created yet included) plus what
the agent reports for kernels the manager has no row for (and legacy holdings: a device
held under a renamed slot is full until freed).  The parts that depend on the report
only (:class:`ReportedViews`) are parsed once per heartbeat; :func:`map_states`
recomputes only the devices where a kernel is reported or the manager holds something.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from pydantic import TypeAdapter, ValidationError

from accelshare.common import Allocation, AllocationMode
from accelshare.protocol import PluginMapView
from accelshare.sched.fit import DeviceState, MapState, device_taken_amount

__all__ = [
    "ReportedViews",
    "add_alloc",
    "map_states",
    "map_states_from_views",
    "parse_alloc",
    "parse_views",
    "parse_views_text",
    "reported_map_states",
]

_ZERO = Decimal(0)


def parse_views(map_views: Mapping[str, Any] | None) -> dict[str, PluginMapView]:
    """The stored heartbeat views (``agents.map_views``); broken entries are skipped."""
    views: dict[str, PluginMapView] = {}
    for key, raw in (map_views or {}).items():
        try:
            views[key] = PluginMapView.model_validate(raw)
        except ValidationError:
            continue
    return views


def reported_map_states(map_views: Mapping[str, Any] | None) -> tuple[MapState, ...]:
    """An agent's maps as its last heartbeat reported them (``agents.map_views``),
    as the scheduler's pass reads them: what the enqueue judges "could an empty agent
    hold this?" by (:func:`accelshare.sched.fit.largest_placements`)."""
    return tuple(m.alone for m in _reported_maps(parse_views(map_views)))


_VIEWS = TypeAdapter(dict[str, PluginMapView])


def parse_views_text(text: str | None) -> dict[str, PluginMapView]:
    """:func:`parse_views` of the stored JSON text: validated from the text in one go
    (cheaper than decoding it first); when that fails (a broken entry, or not an object
    at all), entry by entry as :func:`parse_views` does, so the same entries are
    skipped."""
    if not text or text == "null":
        return {}
    try:
        return _VIEWS.validate_json(text)
    except ValidationError:
        decoded = json.loads(text)
        return parse_views(decoded if isinstance(decoded, Mapping) else None)


def map_states_from_views(
    views: Mapping[str, PluginMapView],
    manager_allocs: Allocation,
    known_kernels: frozenset[str],
) -> tuple[MapState, ...]:
    """Per-device state for the dry run (see the module docstring): :func:`map_states`
    of the parsed ``views``."""
    return map_states(_reported_maps(views), manager_allocs, known_kernels)


@dataclass(frozen=True, slots=True)
class _ReportedDevice:
    """One device of a stored heartbeat view, parsed once per ``views_revision``."""

    alone: DeviceState  # its state when the manager holds nothing there
    reported: Decimal  # allocated, as reported
    kernels: tuple[tuple[str, Decimal], ...]  # what the agent says each kernel holds
    legacy: bool  # held under a renamed slot: full until freed


@dataclass(frozen=True, slots=True)
class _ReportedMap:
    alone: MapState  # the map when the manager holds nothing on it
    devices: tuple[_ReportedDevice, ...]


@dataclass(frozen=True, slots=True)
class ReportedViews:
    """An agent's stored heartbeat views, parsed, and the kernel ids they report."""

    views: dict[str, PluginMapView]
    kernels: frozenset[str]
    maps: tuple[_ReportedMap, ...]

    @classmethod
    def parse(cls, text: str | None) -> ReportedViews:
        """Of the stored text of ``agents.map_views``."""
        views = parse_views_text(text)
        return cls(
            views,
            frozenset(k for view in views.values() for d in view.devices for k in d.kernels),
            _reported_maps(views),
        )


def _reported_maps(views: Mapping[str, PluginMapView]) -> tuple[_ReportedMap, ...]:
    """The views' parts that depend on the report only (a view of an unknown kind is
    left out)."""
    maps: list[_ReportedMap] = []
    # the amounts' texts repeat ("1", "0", a GPU's capacity): each parsed once
    amounts: dict[str, Decimal] = {}

    def amount(text: str) -> Decimal:
        value = amounts.get(text)
        if value is None:
            value = amounts[text] = Decimal(text)
        return value

    for key, view in views.items():
        try:
            kind = AllocationMode(view.kind)
        except ValueError:
            continue
        legacy = {
            device
            for per_device in view.legacy_allocations.values()
            for device, held in per_device.items()
            if amount(held) > 0
        }
        devices = []
        for d in view.devices:
            capacity = amount(d.capacity)
            reported = amount(d.allocated)
            kernels = tuple((k, amount(v)) for k, v in d.kernels.items()) if d.kernels else ()
            is_legacy = d.device_id in legacy
            alone = capacity if is_legacy else min(max(_ZERO, reported), capacity)
            # d.slot_type is a SlotTypes already (validated)
            state = DeviceState(d.device_id, d.slot_name, d.slot_type, capacity, alone, d.numa_node)
            devices.append(_ReportedDevice(state, reported, kernels, is_legacy))
        map_state = MapState(
            key,
            kind,
            tuple(d.alone for d in devices),
            strategy=view.strategy,
            quantum=Decimal(view.quantum) if view.quantum else None,
            exclusive_slot_types=tuple(view.exclusive_slot_types),
        )
        maps.append(_ReportedMap(map_state, tuple(devices)))
    return tuple(maps)


def map_states(
    maps: Sequence[_ReportedMap],
    manager_allocs: Allocation,
    known_kernels: frozenset[str],
) -> tuple[MapState, ...]:
    """Each device: :func:`device_taken_amount` of the report and the manager's kernels
    (capped at the capacity); a device without reported kernels and without the
    manager's keeps its parsed state, a map with no such device its parsed map."""
    states: list[MapState] = []
    for reported_map in maps:
        devices: list[DeviceState] | None = None
        for index, device in enumerate(reported_map.devices):
            state = device.alone
            manager = manager_allocs.get(state.slot_name, _NO_AMOUNTS).get(state.device_id)
            if not device.kernels and not manager:
                if devices is not None:
                    devices.append(state)
                continue
            if device.legacy:
                allocated = state.capacity
            else:
                allocated = device_taken_amount(
                    device.reported,
                    # only the amounts it can attribute (a kernel it has a row for)
                    {k: v for k, v in device.kernels if k in known_kernels},
                    manager or _ZERO,
                    known_kernels,
                )
            if devices is None:
                devices = [d.alone for d in reported_map.devices[:index]]
            devices.append(
                state
                if allocated == state.allocated
                else DeviceState(
                    state.device_id,
                    state.slot_name,
                    state.slot_type,
                    state.capacity,
                    min(allocated, state.capacity),
                    state.numa_node,
                )
            )
        alone = reported_map.alone
        if devices is None:
            states.append(alone)
        else:
            states.append(
                MapState(
                    alone.key,
                    alone.kind,
                    tuple(devices),
                    strategy=alone.strategy,
                    quantum=alone.quantum,
                    exclusive_slot_types=alone.exclusive_slot_types,
                )
            )
    return tuple(states)


_NO_AMOUNTS: Mapping[str, Decimal] = {}


def parse_alloc(obj: Any) -> Allocation:
    total: Allocation = {}
    add_alloc(total, obj if isinstance(obj, Mapping) else {})
    return total


def add_alloc(total: Allocation, alloc: Mapping[str, Mapping[str, Any]], count: int = 1) -> None:
    """Adds ``alloc`` (per slot, per device) ``count`` times into ``total``."""
    for slot, per_device in (alloc or {}).items():
        bucket = total.setdefault(slot, {})
        for device, amount in per_device.items():
            bucket[device] = bucket.get(device, _ZERO) + Decimal(str(amount)) * count
