"""Pure common core: slot names, ``ResourceSlot``, ``BinarySize`` and their errors.

No I/O happens here (a test checks that no I/O library is imported).
"""

from .binary_size import BinarySize
from .errors import (
    CommonValueError,
    InvalidBinarySize,
    InvalidResourceSlotQuantity,
    InvalidSlotName,
    NegativeBinarySize,
    SlotValueError,
    UnknownResourceSlotType,
)
from .resource_slot import DefaultForUnspecified, ResourceSlot, canonical_decimal, normalize_amount
from .slot import ACCELERATOR_MAJOR_TYPES, INTRINSIC_SLOTS, SlotName, SlotTypes

__all__ = [
    "ACCELERATOR_MAJOR_TYPES",
    "INTRINSIC_SLOTS",
    "BinarySize",
    "CommonValueError",
    "DefaultForUnspecified",
    "InvalidBinarySize",
    "InvalidResourceSlotQuantity",
    "InvalidSlotName",
    "NegativeBinarySize",
    "ResourceSlot",
    "SlotName",
    "SlotTypes",
    "SlotValueError",
    "UnknownResourceSlotType",
    "canonical_decimal",
    "normalize_amount",
]
