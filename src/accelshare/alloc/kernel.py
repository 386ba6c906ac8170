"""Allocating one kernel over several maps (cuda, then cpu, then mem), all or nothing.

The agent keeps one map per plugin, keyed by the plugin key (the *device name*:
``cuda``, ``cpu``, ``mem``).  A kernel's request mentions slots of several maps;
:func:`allocate_kernel` allocates them kind by kind in the agent's
``allocation-order`` and steers each kind towards the NUMA nodes the previous kind
got.  If any kind fails, every map is rolled back from a snapshot and the error is
raised unchanged.  Pure and synchronous: the agent calls it under its lock.

Example, two NUMA nodes, GPUs and cores on both::

    allocate_kernel({"cuda": gpus, "cpu": cores, "mem": memory},
                    {"cuda.shares": Decimal("0.5"), "cpu": Decimal(2), "mem": Decimal(2**30)})
    # cuda first (grouped by NUMA node), say GPU3 on node 1;
    # cpu next with AffinityHint((1,)): cores on node 1 first;
    # mem last, steered by the nodes of the cores chosen.
    # -> {"cuda": {"cuda.shares": {...}}, "cpu": {"cpu": {...}}, "mem": {"mem": {...}}}
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal

from accelshare.common import Allocation

from .affinity import AffinityHint, AffinityPolicy
from .amounts import validate_request
from .base import DEFAULT_MIN_MEMORY, AbstractAllocMap
from .errors import InvalidResourceArgument, UnsupportedResource
from .model import AllocationByMap

__all__ = [
    "DEFAULT_ALLOCATION_ORDER",
    "allocate_kernel",
    "allocate_planned_kernel",
    "apply_kernel",
    "free_kernel",
]

DEFAULT_ALLOCATION_ORDER: tuple[str, ...] = ("cuda", "rocm", "tpu", "cpu", "mem")


def _group_by_kind(
    maps: Mapping[str, AbstractAllocMap],
    request: Mapping[str, Decimal],
    context_tag: str | None,
) -> dict[str, dict[str, Decimal]]:
    """Split a request by the map that owns each slot; unknown slots are unsupported."""
    owner = {slot: kind for kind, alloc_map in maps.items() for slot in alloc_map.slot_types}
    grouped: dict[str, dict[str, Decimal]] = {}
    for slot, amount in request.items():
        if slot not in owner:
            raise UnsupportedResource(slot, amount, list(owner), context_tag=context_tag)
        grouped.setdefault(owner[slot], {})[slot] = amount
    return grouped


def _kind_order(maps: Mapping[str, AbstractAllocMap], order: Sequence[str]) -> list[str]:
    """Kinds in ``order`` first, then any other map in its declaration order."""
    return [k for k in order if k in maps] + [k for k in maps if k not in order]


def allocate_kernel(
    maps: Mapping[str, AbstractAllocMap],
    slots: Mapping[str, Decimal],
    *,
    allocation_order: Sequence[str] = DEFAULT_ALLOCATION_ORDER,
    affinity_policy: AffinityPolicy | str = AffinityPolicy.INTERLEAVED,
    context_tag: str | None = None,
    min_memory: Decimal = DEFAULT_MIN_MEMORY,
    allow_resource_fragmentation: bool = True,
) -> AllocationByMap:
    """Allocate one kernel's ``slots`` over ``maps`` (device name -> map), all or nothing.

    Returns ``{device name: {slot: {device id: amount}}}`` for the kinds that got
    something.  The first kind gets ``AffinityHint()`` (NUMA grouping by ``affinity_policy``);
    each later kind gets the NUMA nodes of the devices the previous allocating kind got.
    """
    request = validate_request(slots, context_tag=context_tag)
    grouped = _group_by_kind(maps, request, context_tag)
    policy = AffinityPolicy.parse(affinity_policy)
    kinds = [k for k in _kind_order(maps, allocation_order) if k in grouped]
    snapshots = {kind: maps[kind].snapshot() for kind in kinds}
    result: AllocationByMap = {}
    hint = AffinityHint((), policy)
    try:
        for kind in kinds:
            alloc_map = maps[kind]
            result[kind] = alloc_map.allocate(
                grouped[kind],
                affinity_hint=hint,
                context_tag=context_tag,
                min_memory=min_memory,
                allow_resource_fragmentation=allow_resource_fragmentation,
            )
            nodes = tuple(
                alloc_map.numa_nodes[device]
                for per_device in result[kind].values()
                for device in per_device
            )
            hint = AffinityHint(nodes, policy)
    except BaseException:
        # Roll every map back, whatever went wrong, before the caller sees the error.
        for kind, snapshot in snapshots.items():
            maps[kind].restore(snapshot)
        raise
    return result


def allocate_planned_kernel(
    maps: Mapping[str, AbstractAllocMap],
    slots: Mapping[str, Decimal],
    plan: Allocation,
    *,
    context_tag: str | None = None,
    allow_resource_fragmentation: bool = True,
) -> AllocationByMap:
    """Take exactly ``plan`` (slot -> device -> amount, placed by the manager) for one
    kernel's ``slots`` over ``maps``, all or nothing; no placement strategy runs.

    Each map checks its part with :meth:`~AbstractAllocMap.allocate_planned` (the
    request as :func:`allocate_kernel` checks it, then the plan's devices, grid, totals,
    fragmentation shape and free amounts); a plan slot no map owns, or one the request
    does not ask for, is refused.  On any refusal every map is rolled back before the
    error is raised: :class:`~accelshare.alloc.errors.PlanConflict` when the plan no
    longer fits (a device gone or short), another ``ResourceError`` when it is wrong.

    Example: ``allocate_planned_kernel(maps, {"cpu": 2, ...}, {"cpu": {"0": 1, "3": 1}, ...})``
    -> ``{"cpu": {"cpu": {"0": 1, "3": 1}}, ...}``.
    """
    request = validate_request(slots, context_tag=context_tag)
    grouped = _group_by_kind(maps, request, context_tag)
    owner = {slot: kind for kind, alloc_map in maps.items() for slot in alloc_map.slot_types}
    placed: AllocationByMap = {}
    for slot, per_device in plan.items():
        kind = owner.get(slot)
        if kind is None or kind not in grouped:
            # a slot the request does not ask for: the kind's own check names it
            kind = kind if kind is not None else next(iter(grouped), None)
            if kind is None:
                raise InvalidResourceArgument(
                    f"the plan does not match the request: it places {slot}, which the"
                    " request does not ask for",
                    slot=slot,
                    requested=dict(plan),
                    expected="a plan placing exactly the requested amounts",
                    context_tag=context_tag,
                )
            grouped.setdefault(kind, {})
        placed.setdefault(kind, {})[slot] = per_device
    snapshots = {kind: maps[kind].snapshot() for kind in grouped}
    result: AllocationByMap = {}
    try:
        for kind, kind_slots in grouped.items():
            result[kind] = maps[kind].allocate_planned(
                kind_slots,
                placed.get(kind, {}),
                context_tag=context_tag,
                allow_resource_fragmentation=allow_resource_fragmentation,
            )
    except BaseException:
        for kind, snapshot in snapshots.items():
            maps[kind].restore(snapshot)
        raise
    return {kind: per_slot for kind, per_slot in result.items() if per_slot}


def _each_map(
    maps: Mapping[str, AbstractAllocMap],
    allocation: AllocationByMap,
    action: Callable[[AbstractAllocMap, Allocation], None],
) -> None:
    unknown = [kind for kind in allocation if kind not in maps]
    if unknown:
        raise UnsupportedResource(unknown[0], None, list(maps))
    snapshots = {kind: maps[kind].snapshot() for kind in allocation}
    try:
        for kind, per_slot in allocation.items():
            action(maps[kind], per_slot)
    except BaseException:
        for kind, snapshot in snapshots.items():
            maps[kind].restore(snapshot)
        raise


def free_kernel(maps: Mapping[str, AbstractAllocMap], allocation: AllocationByMap) -> None:
    """Free what :func:`allocate_kernel` returned, on every map or on none."""
    _each_map(maps, allocation, AbstractAllocMap.free)


def apply_kernel(maps: Mapping[str, AbstractAllocMap], allocation: AllocationByMap) -> None:
    """Re-apply a kernel's recorded allocation (restart recovery), on every map or on none."""
    _each_map(maps, allocation, AbstractAllocMap.apply_allocation)
