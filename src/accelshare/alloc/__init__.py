"""Allocation maps: which physical devices a kernel gets (spec 02-alloc-maps.md).

Pure, synchronous and exact (``Decimal`` outside, whole units inside); no I/O.

* :class:`DiscreteAllocMap` hands out whole units, :class:`FractionAllocMap` fractions
  on a quantum grid; both with :class:`AllocationStrategy` FILL or EVENLY.
* ``allocate`` / ``allocate_planned`` (a placement decided elsewhere, checked) /
  ``plan`` (dry run) / ``check`` (dry run returning a :class:`Fit`) /
  ``largest_fit`` / ``apply_allocation`` / ``free`` / ``clear`` / ``snapshot`` /
  ``restore``; ``from_state`` rebuilds a map from reported capacities and allocations.
* :func:`allocate_kernel` allocates one kernel over several maps in the agent's
  allocation order with NUMA :class:`AffinityHint`\\ s, rolling every map back on failure;
  :func:`allocate_planned_kernel` takes a placement planned elsewhere, all or nothing.

Errors (all :class:`ResourceError`, see :mod:`accelshare.alloc.errors`):
:class:`InsufficientResource`, :class:`PlanConflict`, :class:`FractionalResourceFragmented`,
:class:`InvalidResourceArgument` (and :class:`NotMultipleOfQuantum`),
:class:`InvalidResourceCombination`, :class:`UnsupportedResource`,
:class:`AllocMapConfigError`.
"""

from .affinity import AffinityHint, AffinityPolicy
from .base import DEFAULT_MIN_MEMORY, AbstractAllocMap
from .discrete import DiscreteAllocMap
from .errors import (
    AllocMapConfigError,
    FractionalResourceFragmented,
    InsufficientResource,
    InvalidResourceArgument,
    InvalidResourceCombination,
    NotMultipleOfQuantum,
    PlanConflict,
    ResourceError,
    UnsupportedResource,
)
from .fraction import DEFAULT_QUANTUM, FractionAllocMap
from .kernel import (
    DEFAULT_ALLOCATION_ORDER,
    allocate_kernel,
    allocate_planned_kernel,
    apply_kernel,
    free_kernel,
)
from .model import (
    AllocationByMap,
    AllocationStrategy,
    DeviceSlotInfo,
    Fit,
    MapSnapshot,
)

__all__ = [
    "DEFAULT_ALLOCATION_ORDER",
    "DEFAULT_MIN_MEMORY",
    "DEFAULT_QUANTUM",
    "AbstractAllocMap",
    "AffinityHint",
    "AffinityPolicy",
    "AllocMapConfigError",
    "AllocationByMap",
    "AllocationStrategy",
    "DeviceSlotInfo",
    "DiscreteAllocMap",
    "Fit",
    "FractionAllocMap",
    "FractionalResourceFragmented",
    "InsufficientResource",
    "InvalidResourceArgument",
    "InvalidResourceCombination",
    "MapSnapshot",
    "NotMultipleOfQuantum",
    "PlanConflict",
    "ResourceError",
    "UnsupportedResource",
    "allocate_kernel",
    "allocate_planned_kernel",
    "apply_kernel",
    "free_kernel",
]
