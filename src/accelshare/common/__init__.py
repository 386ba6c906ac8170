"""Pure common core: slot names, ``ResourceSlot``, ``BinarySize``, ``Allocation`` and
the allocation mode, and their errors.

No I/O happens here (a test checks that no I/O library is imported).
"""

from .allocation import Allocation, AllocationMode
from .amounts import COUNT_QUANTUM, check_on_grid, grid_neighbours, parse_amount
from .binary_size import BinarySize
from .errors import (
    BelowOneQuantum,
    CommonValueError,
    InvalidBinarySize,
    InvalidResourceSlotQuantity,
    InvalidSlotName,
    NegativeBinarySize,
    NotMultipleOfQuantum,
    SlotValueError,
    UnknownResourceSlotType,
)
from .resource_slot import DefaultForUnspecified, ResourceSlot, canonical_decimal, normalize_amount
from .slot import ACCELERATOR_MAJOR_TYPES, INTRINSIC_SLOTS, SlotName, SlotTypes

__all__ = [
    "ACCELERATOR_MAJOR_TYPES",
    "COUNT_QUANTUM",
    "INTRINSIC_SLOTS",
    "Allocation",
    "AllocationMode",
    "BelowOneQuantum",
    "BinarySize",
    "CommonValueError",
    "DefaultForUnspecified",
    "InvalidBinarySize",
    "InvalidResourceSlotQuantity",
    "InvalidSlotName",
    "NegativeBinarySize",
    "NotMultipleOfQuantum",
    "ResourceSlot",
    "SlotName",
    "SlotTypes",
    "SlotValueError",
    "UnknownResourceSlotType",
    "canonical_decimal",
    "check_on_grid",
    "grid_neighbours",
    "normalize_amount",
    "parse_amount",
]
