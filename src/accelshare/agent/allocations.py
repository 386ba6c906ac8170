"""The agent's allocations: one allocation map per plugin plus who holds what (pure, synchronous).

:class:`AgentAllocations` wraps the plugins' allocation maps (:mod:`accelshare.alloc`) and
remembers, per kernel, what it holds, so that freeing happens exactly once and the
allocation-map views (full and compatible forms) can be served from memory::

    allocations = AgentAllocations({"cpu": cpu_map, "mem": mem_map, "cuda": cuda_map}, models)
    allocations.allocate("k1", {"cpu": 1, "mem": 2**30, "cuda.shares": Decimal("0.2")})
    allocations.allocate("k2", {"cpu": 1, "mem": 2**30, "cuda.shares": Decimal("1.2")})
    allocations.compat_view()   # {"...2d01": "0.60", "...2d02": "0.80"}
    allocations.allocate_planned("k3", {"cpu": 1, ...}, {"cpu": {"3": 1}, ...})  # the manager's plan
    allocations.release("k1")   # True; a second release is a no-op (False)

Restart recovery (:meth:`restore`) clears every map and re-applies each live kernel's
recorded allocation (``resource.txt``).  A recorded entry whose slot the current plugin
set does not know (the plugin was removed, or its mode changed) becomes a *legacy
holding*: the kernel keeps it, and when its device still exists under another slot
(spec 04 "Renamed slots") that device is reserved in the new map in proportion to what
the old kernels hold, rounded *up* to the map's unit, until they end.  Example, the
mock switched from fractional (1.0 share per GPU) to discrete::

    k-old holds cuda.shares {GPU1: 0.5}          (recorded; GPU1 had 1.0 share)
    new map: cuda.device {GPU1: 1, GPU2: 1}
    -> GPU1 reserved: ceil(0.5 / 1.0 * 1) = 1 whole GPU; GPU2 free
    -> view: GPU1 allocated 1, kernels {k-old: 0.5}; legacy_allocations
       {"cuda.shares": {"GPU1": "0.5"}}
    allocations.release("k-old") -> GPU1 free again

``old_capacities`` (slot -> device -> capacity, as the agent last saw them) turn an old
amount into a proportion; without it a device with any old use is reserved whole.  An
entry of a known slot that no longer fits (capacity shrank) is kept the same way,
reserving what is still free.

Views are cached and rebuilt only after a change (:attr:`version`), so queries cost a
dictionary lookup however many kernels run.  After a change only the devices it touched
are rebuilt: :meth:`view` (objects, for heartbeats) and :meth:`view_json` (the bytes the
alloc-map query answers, equal to ``view().model_dump_json()``) each keep per-device
parts in device order and re-assemble the rest by joining; a device's holders are kept
sorted with their JSON as kernels come and go (:class:`_Holders`).  What a rebuilt
answer costs is measured by bench/agent_bench.py (docs/performance.md, *Agent*).
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import ROUND_CEILING, ROUND_HALF_UP, Decimal

import pydantic_core

from accelshare.alloc import (
    AbstractAllocMap,
    AllocationByMap,
    FractionAllocMap,
    ResourceError,
    allocate_kernel,
    allocate_planned_kernel,
    apply_kernel,
    free_kernel,
)
from accelshare.common import Allocation, SlotTypes, canonical_decimal
from accelshare.protocol import AllocMapView, DeviceView, PluginMapView

__all__ = [
    "COMPAT_PLUGIN_KEY",
    "AgentAllocations",
    "DeviceDetails",
    "LegacyHolding",
    "RestoreReport",
    "flatten_allocation",
    "plugin_key_of",
]

log = logging.getLogger(__name__)

COMPAT_PLUGIN_KEY = "cuda"
_ZERO = Decimal(0)
_ONE = Decimal(1)
_HUNDREDTH = Decimal("0.01")
Target = tuple[str, str]  # (plugin key, device id)


def plugin_key_of(slot: str) -> str:
    """``cuda.shares`` -> ``cuda``; ``cpu`` -> ``cpu`` (as ``ResourceTxt.allocations_by_plugin``)."""
    return slot.split(".", 1)[0]


def flatten_allocation(allocation: Mapping[str, Allocation]) -> Allocation:
    """``{key: {slot: {device: amount}}}`` -> ``{slot: {device: amount}}`` (slots are unique)."""
    return {
        slot: dict(per_device)
        for per_slot in allocation.values()
        for slot, per_device in per_slot.items()
        if per_device
    }


@dataclass(frozen=True, slots=True)
class DeviceDetails:
    """What the views show of a device besides the map's own data."""

    model_name: str = ""


@dataclass(frozen=True, slots=True)
class LegacyHolding:
    """A recorded entry the current maps cannot hold as such.

    ``target`` is the device in the current maps it still occupies (None: gone), and
    ``share`` its contribution to that device's reservation in the target slot's units.
    """

    kernel_id: str
    slot: str
    device_id: str
    amount: Decimal
    target: Target | None
    share: Decimal


@dataclass(frozen=True, slots=True)
class RestoreReport:
    restored: tuple[str, ...]  # kernels whose allocation is back in the maps as recorded
    legacy: tuple[str, ...]  # kernels with at least one legacy holding
    messages: tuple[str, ...] = ()


@dataclass(slots=True)
class _Cache:
    version: int = -1
    view: AllocMapView | None = None
    json: bytes | None = None
    compat: dict[str, str] | None = None
    agent_id: str = ""
    extra: dict[str, object] = field(default_factory=dict)


@dataclass(slots=True)
class _Holders:
    """Who holds one device: kernel -> amount, plus an index of the same kept sorted by
    kernel id with each holder's JSON (``"k1":"0.5"``), so that the device's JSON after a
    change is a join, not a sort and a serialisation of every holder (the ``mem`` device
    of an agent with 1,000 kernels has 1,000 holders)."""

    amounts: dict[str, Decimal] = field(default_factory=dict)
    shown: dict[str, str] = field(default_factory=dict)  # the amounts as view strings
    order: list[str] = field(default_factory=list)  # kernel ids, sorted
    fragments: list[bytes] = field(default_factory=list)  # aligned with order

    def put(self, kernel_id: str, amount: Decimal) -> None:
        text = _share_text(amount)
        fragment = _to_json(kernel_id) + b":" + _to_json(text)
        index = bisect.bisect_left(self.order, kernel_id)
        if kernel_id in self.amounts:
            self.fragments[index] = fragment
        else:
            self.order.insert(index, kernel_id)
            self.fragments.insert(index, fragment)
        self.amounts[kernel_id] = amount
        self.shown[kernel_id] = text

    def remove(self, kernel_id: str) -> bool:
        """Drop a holder; False when none is left."""
        if self.amounts.pop(kernel_id, None) is not None:
            del self.shown[kernel_id]
            index = bisect.bisect_left(self.order, kernel_id)
            del self.order[index]
            del self.fragments[index]
        return bool(self.amounts)

    def texts(self) -> dict[str, str]:
        return {k: self.shown[k] for k in self.order}

    def json(self) -> bytes:
        return b",".join(self.fragments)


class AgentAllocations:
    """Allocation maps by plugin key + per-kernel holdings.  Not thread-safe: the agent
    calls it from its event loop, allocation under its asyncio lock."""

    def __init__(
        self,
        maps: Mapping[str, AbstractAllocMap],
        details: Mapping[Target, DeviceDetails] | None = None,
    ) -> None:
        self._maps: dict[str, AbstractAllocMap] = dict(maps)
        self._details = dict(details or {})
        self._slot_types: dict[str, SlotTypes] = {}
        self._slot_owner: dict[str, str] = {}
        for key, alloc_map in self._maps.items():
            for slot, slot_type in alloc_map.slot_types.items():
                self._slot_types[slot] = slot_type
                self._slot_owner[slot] = key
        self._held: dict[str, AllocationByMap] = {}
        self._holders: dict[Target, _Holders] = {}
        self._legacy: dict[str, list[LegacyHolding]] = {}
        self._reserved: dict[Target, Decimal] = {}
        self.version = 0
        self._cache = _Cache()
        # Per-device views (for heartbeats) and per-device JSON (for the alloc-map query),
        # each rebuilt only for the devices a change touched since that form was last
        # asked for (an allocation touches a handful of devices; a view has one entry per
        # core), kept in device order per plugin so that a plugin's part is re-assembled
        # without visiting every device (see _refresh).
        self._device_index: dict[Target, int] = {}
        self._devices: dict[str, list[DeviceView]] = {}
        self._device_json: dict[str, list[bytes]] = {}
        self._dirty_views: set[Target] = set()
        self._dirty_json: set[Target] = set()
        self._plugin_views: dict[str, PluginMapView] = {}
        self._plugin_json: dict[str, tuple[bytes, bytes]] = {}  # JSON around "devices"

    # -- read-only ------------------------------------------------------------------------
    @property
    def maps(self) -> Mapping[str, AbstractAllocMap]:
        return self._maps

    @property
    def slot_types(self) -> Mapping[str, SlotTypes]:
        """Every known slot (the agent's, fixed at start) -> its type, in plugin order."""
        return self._slot_types

    def holds(self, kernel_id: str) -> bool:
        return kernel_id in self._held or kernel_id in self._legacy

    def kernel_ids(self) -> list[str]:
        return sorted(set(self._held) | set(self._legacy))

    def held_by_plugin(self, kernel_id: str) -> AllocationByMap:
        """What the kernel holds in the current maps: ``{key: {slot: {device: amount}}}``."""
        return {
            key: {slot: dict(per) for slot, per in per_slot.items()}
            for key, per_slot in self._held.get(kernel_id, {}).items()
        }

    def recorded(self, kernel_id: str) -> Allocation:
        """Everything the kernel holds as recorded, legacy holdings included: slot -> device."""
        result = flatten_allocation(self._held.get(kernel_id, {}))
        for holding in self._legacy.get(kernel_id, ()):
            per = result.setdefault(holding.slot, {})
            per[holding.device_id] = per.get(holding.device_id, _ZERO) + holding.amount
        return result

    def legacy_holdings(self) -> list[LegacyHolding]:
        return [h for kernel_id in sorted(self._legacy) for h in self._legacy[kernel_id]]

    # -- allocate / release ---------------------------------------------------------------
    def allocate(
        self,
        kernel_id: str,
        request: Mapping[str, Decimal],
        *,
        allocation_order: Sequence[str],
        affinity_policy: str,
        allow_fragmentation: bool = True,
    ) -> AllocationByMap:
        """Allocate ``request`` over every involved map, all or nothing (raises ResourceError)."""
        if self.holds(kernel_id):
            raise ValueError(f"kernel {kernel_id} already holds an allocation")
        allocation = allocate_kernel(
            self._maps,
            request,
            allocation_order=allocation_order,
            affinity_policy=affinity_policy,
            context_tag=kernel_id,
            allow_resource_fragmentation=allow_fragmentation,
        )
        self._record(kernel_id, allocation)
        return allocation

    def allocate_planned(
        self,
        kernel_id: str,
        request: Mapping[str, Decimal],
        plan: Allocation,
        *,
        allow_fragmentation: bool = True,
    ) -> AllocationByMap:
        """Take exactly ``plan`` (slot -> device -> amount, the manager's placement) for
        ``request``, all or nothing, without the placement strategy: raises
        ``PlanConflict`` when it no longer fits, another ResourceError when it is wrong
        (:func:`accelshare.alloc.allocate_planned_kernel`)."""
        if self.holds(kernel_id):
            raise ValueError(f"kernel {kernel_id} already holds an allocation")
        allocation = allocate_planned_kernel(
            self._maps,
            request,
            plan,
            context_tag=kernel_id,
            allow_resource_fragmentation=allow_fragmentation,
        )
        self._record(kernel_id, allocation)
        return allocation

    def _record(self, kernel_id: str, allocation: AllocationByMap) -> None:
        held = {key: per_slot for key, per_slot in allocation.items() if per_slot}
        if held:
            self._held[kernel_id] = held
        for key, per_slot in held.items():
            for per_device in per_slot.values():
                for device, amount in per_device.items():
                    self._holders.setdefault((key, device), _Holders()).put(kernel_id, amount)
                    self._touch((key, device))
        self.version += 1

    def _touch(self, target: Target) -> None:
        self._dirty_views.add(target)
        self._dirty_json.add(target)

    def release(self, kernel_id: str) -> bool:
        """Free everything the kernel holds; False (and nothing done) if it holds nothing."""
        held = self._held.pop(kernel_id, None)
        legacy = self._legacy.pop(kernel_id, None)
        if held is None and legacy is None:
            return False
        if held:
            free_kernel(self._maps, held)
            for key, per_slot in held.items():
                for per_device in per_slot.values():
                    for device in per_device:
                        holders = self._holders.get((key, device))
                        if holders is not None and not holders.remove(kernel_id):
                            del self._holders[(key, device)]
                        self._touch((key, device))
        if legacy:
            targets = {h.target for h in legacy if h.target is not None}
            for target in sorted(targets):
                self._apply_reservation(target)
                log.info(
                    "device %s of %s: legacy kernel %s ended, reservation now %s",
                    target[1],
                    target[0],
                    kernel_id,
                    canonical_decimal(self._reserved.get(target, _ZERO)),
                )
        self.version += 1
        return True

    # -- restart recovery -----------------------------------------------------------------
    def restore(
        self,
        kernels: Iterable[tuple[str, Allocation]],
        *,
        old_capacities: Mapping[str, Mapping[str, Decimal]] | None = None,
    ) -> RestoreReport:
        """Clear every map and re-apply the recorded allocations (see the module docstring).

        ``kernels`` are ``(kernel_id, {slot: {device: amount}})``; they are applied in
        kernel-id order, so the result does not depend on the order given.
        """
        for alloc_map in self._maps.values():
            alloc_map.clear()
        self._held.clear()
        self._holders.clear()
        self._legacy.clear()
        self._reserved.clear()
        self._forget_views()
        old = old_capacities or {}
        restored: list[str] = []
        messages: list[str] = []
        for kernel_id, recorded in sorted(kernels, key=lambda item: item[0]):
            direct, leftover = self._split(recorded)
            try:
                apply_kernel(self._maps, direct)
            except ResourceError as e:
                messages.append(
                    f"kernel {kernel_id}: its recorded allocation no longer fits ({e}); "
                    "kept as a legacy holding"
                )
                direct, leftover = (
                    {},
                    [
                        (slot, device, amount)
                        for slot, per in recorded.items()
                        for device, amount in per.items()
                        if amount > 0
                    ],
                )
            self._record(kernel_id, direct)
            if leftover:
                self._legacy[kernel_id] = [
                    self._legacy_holding(kernel_id, slot, device, amount, old)
                    for slot, device, amount in leftover
                ]
            else:
                restored.append(kernel_id)
        targets = {h.target for h in self.legacy_holdings() if h.target is not None}
        for target in sorted(targets):
            self._apply_reservation(target)
        for holding in self.legacy_holdings():
            where = (
                f"reserving {canonical_decimal(self._reserved.get(holding.target, _ZERO))} of "
                f"device {holding.target[1]} in the {holding.target[0]} map"
                if holding.target is not None
                else "its device is not in any current map"
            )
            messages.append(
                f"kernel {holding.kernel_id} holds {canonical_decimal(holding.amount)} of "
                f"{holding.slot} on {holding.device_id}, which the current plugin set does not "
                f"allocate as such; kept until it ends ({where})"
            )
        self.version += 1
        return RestoreReport(tuple(restored), tuple(sorted(self._legacy)), tuple(messages))

    def _split(
        self, recorded: Allocation
    ) -> tuple[AllocationByMap, list[tuple[str, str, Decimal]]]:
        """Entries the current maps hold as such (by plugin key), and the rest."""
        direct: AllocationByMap = {}
        leftover: list[tuple[str, str, Decimal]] = []
        for slot, per_device in recorded.items():
            key = self._slot_owner.get(slot)
            for device, amount in per_device.items():
                if amount <= 0:
                    continue
                info = self._maps[key].device_slots.get(device) if key is not None else None
                if key is not None and info is not None and info.slot_name == slot:
                    direct.setdefault(key, {}).setdefault(slot, {})[device] = amount
                else:
                    leftover.append((slot, device, amount))
        return direct, leftover

    def _legacy_holding(
        self,
        kernel_id: str,
        slot: str,
        device: str,
        amount: Decimal,
        old: Mapping[str, Mapping[str, Decimal]],
    ) -> LegacyHolding:
        key = plugin_key_of(slot)
        alloc_map = self._maps.get(key)
        info = alloc_map.device_slots.get(device) if alloc_map is not None else None
        if info is None:
            return LegacyHolding(kernel_id, slot, device, amount, None, _ZERO)
        if info.slot_name == slot:  # same slot, it just does not fit any more
            share = amount
        else:
            old_capacity = old.get(slot, {}).get(device)
            fraction = (
                min(_ONE, amount / old_capacity)
                if old_capacity is not None and old_capacity > 0
                else _ONE  # unknown: any old use occupies the whole device
            )
            share = fraction * info.amount
        return LegacyHolding(kernel_id, slot, device, amount, (key, device), share)

    @staticmethod
    def _unit_of(alloc_map: AbstractAllocMap) -> Decimal:
        if isinstance(alloc_map, FractionAllocMap):
            return alloc_map.quantum_size
        return _ONE

    def _apply_reservation(self, target: Target) -> None:
        """(Re)compute the reservation of one device from the legacy holdings on it."""
        key, device = target
        alloc_map = self._maps[key]
        info = alloc_map.device_slots[device]
        self._touch(target)
        previous = self._reserved.pop(target, _ZERO)
        if previous > 0:
            alloc_map.free({info.slot_name: {device: previous}})
        total = sum(
            (h.share for h in self.legacy_holdings() if h.target == target),
            _ZERO,
        )
        if total <= 0:
            return
        if info.slot_type is SlotTypes.UNIQUE:
            wanted = info.amount
        else:
            unit = self._unit_of(alloc_map)
            wanted = (total / unit).to_integral_value(rounding=ROUND_CEILING) * unit
        free = info.amount - alloc_map.allocations[info.slot_name][device]
        reservation = min(wanted, info.amount, free)
        if reservation > 0:
            alloc_map.apply_allocation({info.slot_name: {device: reservation}})
            self._reserved[target] = reservation

    # -- views ----------------------------------------------------------------------------
    def view(self, agent_id: str) -> AllocMapView:
        """The full allocation-map view (cached until the next change)."""
        cache = self._current_cache(agent_id)
        if cache.view is None:
            self._refresh(as_json=False)
            # Built from values this class produced: no need to validate them again.
            cache.view = AllocMapView.model_construct(
                agent_id=agent_id, maps={key: self._plugin_views[key] for key in self._maps}
            )
        return cache.view

    def view_json(self, agent_id: str) -> bytes:
        """``view(agent_id).model_dump_json()``, byte for byte, as bytes (cached until the
        next change).  After a change only the touched devices are serialised again (a
        device's holders from an index kept sorted as kernels come and go); the rest is
        joined from cached fragments, so the cost hardly grows with the number of cores
        or kernels that did not change (the alloc-map query's hot path)."""
        cache = self._current_cache(agent_id)
        if cache.json is None:
            self._refresh(as_json=True)
            shell = _to_json(AllocMapView.model_construct(agent_id=agent_id, maps={}))
            head, tail = _split(shell, b'"maps":{', b"}")
            parts = [head]
            for n, key in enumerate(self._maps):
                plugin_head, plugin_tail = self._plugin_json[key]
                parts += [b"," if n else b"", _to_json(key), b":", plugin_head]
                parts += [b",".join(self._device_json[key]), plugin_tail]
            parts.append(tail)
            cache.json = b"".join(parts)  # one copy of the whole answer
        return cache.json

    def _current_cache(self, agent_id: str) -> _Cache:
        cache = self._cache
        if cache.version != self.version or cache.agent_id != agent_id:
            self._cache = cache = _Cache(self.version, agent_id=agent_id)
        return cache

    def _forget_views(self) -> None:
        self._device_index.clear()
        self._devices.clear()
        self._device_json.clear()
        self._dirty_views.clear()
        self._dirty_json.clear()
        self._plugin_views.clear()
        self._plugin_json.clear()

    def _refresh(self, *, as_json: bool) -> None:
        """Bring one form (view objects, or JSON fragments) up to date with the maps.

        Rebuilt: the devices a change touched since that form was last refreshed,
        devices holding legacy shares (recomputed each time: cheap, and rare), and the
        plugin-level part of a plugin with such a device.  Example: kernel k7 (1 core,
        1 GiB, 0.1 share) ends and k8 starts on 1,000 cores -> a few devices are
        rebuilt (k7's and k8's cores, mem root, their GPUs) and every other fragment is
        reused as is.
        """
        legacy_devices: dict[str, dict[str, dict[str, Decimal]]] = {}
        legacy_slots: dict[str, dict[str, dict[str, Decimal]]] = {}
        for holding in self.legacy_holdings():
            if holding.target is not None:
                key, device = holding.target
                per = legacy_devices.setdefault(key, {}).setdefault(device, {})
                per[holding.kernel_id] = per.get(holding.kernel_id, _ZERO) + holding.share
            per = legacy_slots.setdefault(plugin_key_of(holding.slot), {}).setdefault(
                holding.slot, {}
            )
            per[holding.device_id] = per.get(holding.device_id, _ZERO) + holding.amount
        dirty_set = self._dirty_json if as_json else self._dirty_views
        dirty: dict[str, set[str]] = {}
        for key, device in dirty_set:
            dirty.setdefault(key, set()).add(device)
        dirty_set.clear()
        done = self._plugin_json if as_json else self._plugin_views
        for key, alloc_map in self._maps.items():
            shares = legacy_devices.get(key, {})
            touched = dirty.get(key, set()) | set(shares)
            if key in done and not touched and not self._legacy:
                continue
            self._refresh_devices(key, alloc_map, touched, shares, as_json=as_json)
            self._plugin_part(key, alloc_map, legacy_slots.get(key, {}), as_json=as_json)

    def _refresh_devices(
        self,
        key: str,
        alloc_map: AbstractAllocMap,
        touched: set[str],
        legacy_shares: Mapping[str, Mapping[str, Decimal]],
        *,
        as_json: bool,
    ) -> None:
        built: list[DeviceView] | list[bytes] | None = (
            self._device_json.get(key) if as_json else self._devices.get(key)
        )
        if built is not None and not touched:
            return
        allocations = alloc_map.allocations  # a copy: taken once, only when needed

        def shell(device: str) -> DeviceView:
            info = alloc_map.device_slots[device]
            capacity, allocated = info.amount, allocations[info.slot_name][device]
            return DeviceView.model_construct(
                device_id=device,
                slot_name=info.slot_name,
                slot_type=info.slot_type,
                capacity=canonical_decimal(capacity),
                allocated=canonical_decimal(allocated),
                free=canonical_decimal(capacity - allocated),
                numa_node=alloc_map.numa_nodes.get(device),
                model_name=self._details.get((key, device), DeviceDetails()).model_name,
                kernels={},
            )

        def device_view(device: str) -> DeviceView:
            kernels = self._kernel_texts((key, device), legacy_shares.get(device, {}))
            return shell(device).model_copy(update={"kernels": kernels})

        def device_json(device: str) -> bytes:
            holders = self._holders.get((key, device))
            if device in legacy_shares:  # rare: merged with the legacy shares, whole
                return _to_json(device_view(device))
            head, tail = _split(_to_json(shell(device)), b'"kernels":{', b"}")
            return head + (holders.json() if holders is not None else b"") + tail

        if built is None:  # the first view, or after restore()
            for index, device in enumerate(alloc_map.device_slots):
                self._device_index[(key, device)] = index
            if as_json:
                self._device_json[key] = [device_json(d) for d in alloc_map.device_slots]
            else:
                self._devices[key] = [device_view(d) for d in alloc_map.device_slots]
            return
        for device in touched:
            index = self._device_index[(key, device)]
            if as_json:
                self._device_json[key][index] = device_json(device)
            else:
                self._devices[key][index] = device_view(device)

    def _kernel_texts(self, target: Target, legacy_shares: Mapping[str, Decimal]) -> dict[str, str]:
        """A device's holders as the view shows them: kernel id (sorted) -> amount."""
        holders = self._holders.get(target)
        if not legacy_shares:
            return holders.texts() if holders is not None else {}
        amounts = dict(holders.amounts) if holders is not None else {}
        for kernel_id, share in legacy_shares.items():
            amounts[kernel_id] = amounts.get(kernel_id, _ZERO) + share
        return {k: _share_text(amounts[k]) for k in sorted(amounts)}

    def _plugin_part(
        self,
        key: str,
        alloc_map: AbstractAllocMap,
        legacy_slots: Mapping[str, Mapping[str, Decimal]],
        *,
        as_json: bool,
    ) -> None:
        fractional = isinstance(alloc_map, FractionAllocMap)
        shell = PluginMapView.model_construct(
            key=key,
            kind="fractional" if fractional else "discrete",
            strategy=alloc_map.allocation_strategy.name,
            quantum=canonical_decimal(alloc_map.quantum_size)
            if isinstance(alloc_map, FractionAllocMap)
            else None,
            exclusive_slot_types=sorted(alloc_map.exclusive_slot_types),
            devices=[],
            legacy_allocations={
                slot: {d: canonical_decimal(a) for d, a in sorted(per.items())}
                for slot, per in sorted(legacy_slots.items())
            },
        )
        if as_json:
            self._plugin_json[key] = _split(_to_json(shell), b'"devices":[', b"]")
        else:
            devices = list(self._devices[key])
            self._plugin_views[key] = shell.model_copy(update={"devices": devices})

    def compat_view(self, plugin_key: str = COMPAT_PLUGIN_KEY) -> dict[str, str]:
        """Backend.AI's ``gpu_alloc_map``: ``{device: "0.80"}`` over ``<key>.shares`` and
        ``<key>.device`` devices, two decimals, a leading ``GPU-`` stripped."""
        cache = self._cache
        if cache.version != self.version:
            self._cache = cache = _Cache(self.version, agent_id=cache.agent_id)
        if cache.compat is None:
            result: dict[str, str] = {}
            alloc_map = self._maps.get(plugin_key)
            if alloc_map is not None:
                slots = {f"{plugin_key}.shares", f"{plugin_key}.device"}
                allocations = alloc_map.allocations
                for device, info in alloc_map.device_slots.items():
                    if info.slot_name not in slots:
                        continue
                    shown = device.removeprefix("GPU-")
                    amount = allocations[info.slot_name][device]
                    total = Decimal(result[shown]) + amount if shown in result else amount
                    result[shown] = str(total.quantize(_HUNDREDTH, rounding=ROUND_HALF_UP))
            cache.compat = result
        return dict(cache.compat)

    def totals(self) -> dict[str, tuple[Decimal, Decimal]]:
        """Slot -> (capacity, allocated) summed over devices (for metrics)."""
        result: dict[str, tuple[Decimal, Decimal]] = {}
        for alloc_map in self._maps.values():
            allocations = alloc_map.allocations
            for device, info in alloc_map.device_slots.items():
                capacity, allocated = result.get(info.slot_name, (_ZERO, _ZERO))
                result[info.slot_name] = (
                    capacity + info.amount,
                    allocated + allocations[info.slot_name][device],
                )
        return result


def _share_text(value: Decimal) -> str:
    """A holder's amount; proportional legacy shares are cut to 6 decimals (rounded up)."""
    if value == value.quantize(Decimal("0.000001")):
        return canonical_decimal(value)
    return canonical_decimal(value.quantize(Decimal("0.000001"), rounding=ROUND_CEILING))


def _to_json(value: object) -> bytes:
    """Compact JSON exactly as ``model_dump_json`` writes it (one serializer for all)."""
    return pydantic_core.to_json(value)


def _split(shell: bytes, opening: bytes, closing: bytes) -> tuple[bytes, bytes]:
    """``shell`` (a view serialised with an empty list/table) cut inside its first
    ``opening + closing``: ``(b'...,"devices":[', b'],...')``, the fragments go between.

    The first occurrence is that field: the fields before it are strings, in which a
    quote would be escaped, so they cannot contain the raw bytes.
    """
    head, found, tail = shell.partition(opening + closing)
    if not found:
        raise AssertionError(f"{opening + closing!r} not in {shell[:200]!r}")
    return head + opening, closing + tail
