"""Errors of the pure common core.

Hierarchy (every class is also a ``ValueError`` because each one reports bad input)::

    ValueError
     └── CommonValueError              base of this module, carries ``field``/``expected``/``received``
          ├── InvalidSlotName          a slot name that does not parse as <device>[.<major>[:<minor>]]
          ├── SlotValueError           a slot amount that cannot be converted to a Decimal
          │    ├── InvalidResourceSlotQuantity   a negative amount
          │    └── NotMultipleOfQuantum           an amount off its slot's quantum grid
          │         └── BelowOneQuantum           a positive amount below one quantum
          ├── UnknownResourceSlotType  a slot that is not in the known set
          └── InvalidBinarySize        a byte-size expression that does not parse
               └── NegativeBinarySize  a byte size below zero

Each message names the field, what was expected and what was received, so that an
operator can fix a request or a configuration file from the message alone.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

__all__ = [
    "BelowOneQuantum",
    "CommonValueError",
    "InvalidBinarySize",
    "InvalidResourceSlotQuantity",
    "InvalidSlotName",
    "NegativeBinarySize",
    "NotMultipleOfQuantum",
    "SlotValueError",
    "UnknownResourceSlotType",
]


class CommonValueError(ValueError):
    """Bad input with structured details: the field, what was expected and what came."""

    def __init__(self, message: str, *, field: str, expected: str, received: Any) -> None:
        super().__init__(message)
        self.field = field
        self.expected = expected
        self.received = received


class InvalidSlotName(CommonValueError):
    def __init__(self, received: Any) -> None:
        expected = "a slot name like 'cpu', 'cuda.shares' or 'cuda.device:10g-mig'"
        super().__init__(
            f"Invalid slot name {received!r}: expected {expected}",
            field="slot",
            expected=expected,
            received=received,
        )


class SlotValueError(CommonValueError):
    def __init__(self, slot: str, received: Any, expected: str) -> None:
        super().__init__(
            f"Cannot convert the slot {slot!r} to decimal: expected {expected}, got {received!r}",
            field=slot,
            expected=expected,
            received=received,
        )


class InvalidResourceSlotQuantity(SlotValueError):
    def __init__(self, slot: str, received: Any) -> None:
        CommonValueError.__init__(
            self,
            f"The quantity of the slot {slot!r} cannot be negative: got {received!r}",
            field=slot,
            expected="an amount >= 0",
            received=received,
        )


def _plain(value: Decimal) -> str:
    """A finite Decimal as fixed-point text (``0.01``, never ``1E-2``)."""
    return format(value.normalize(), "f") if value else "0"


class NotMultipleOfQuantum(SlotValueError):
    """An amount off its slot's quantum grid, never rounded: ``lower`` and ``upper`` are
    the nearest valid amounts (multiples of ``quantum``) below and above it."""

    def __init__(
        self,
        slot: str,
        received: Any,
        amount: Decimal,
        quantum: Decimal,
        *,
        lower: Decimal,
        upper: Decimal,
    ) -> None:
        q = _plain(quantum)
        CommonValueError.__init__(
            self,
            f"{slot}={_plain(amount)} is not a multiple of the quantum {q}"
            f" (nearest valid amounts: {_plain(lower)} and {_plain(upper)})",
            field=slot,
            expected=f"a multiple of {q}",
            received=received,
        )
        self.amount = amount
        self.quantum = quantum
        self.lower = lower
        self.upper = upper


class BelowOneQuantum(NotMultipleOfQuantum):
    """A positive amount smaller than one quantum: it would be no device at all."""

    def __init__(self, slot: str, received: Any, amount: Decimal, quantum: Decimal) -> None:
        q = _plain(quantum)
        CommonValueError.__init__(
            self,
            f"{slot}={_plain(amount)} is below one quantum ({q}): ask for at least {q},"
            f" or leave {slot} out (nearest valid amounts: 0 and {q})",
            field=slot,
            expected=f"0 or a multiple of {q} (at least {q})",
            received=received,
        )
        self.amount = amount
        self.quantum = quantum
        self.lower = Decimal(0)
        self.upper = quantum


class UnknownResourceSlotType(CommonValueError):
    def __init__(self, slot: str, known: list[str] | None = None) -> None:
        hint = ""
        if slot == "shmem":
            hint = (
                " (shmem is a resource option: put it in 'resource_opts' in the API,"
                " or use '--resource-opts shmem=...' in the CLI)"
            )
        expected = "one of " + ", ".join(sorted(known)) if known else "a known slot"
        super().__init__(
            f"Unknown slot type: {slot!r}{hint}",
            field=slot,
            expected=expected,
            received=slot,
        )
        self.slot = slot


class InvalidBinarySize(CommonValueError):
    def __init__(self, received: Any, reason: str = "") -> None:
        expected = "a byte size such as 1024, '512m', '2 GiB' or '1.5g'"
        extra = f" ({reason})" if reason else ""
        super().__init__(
            f"Invalid binary size {received!r}{extra}: expected {expected}",
            field="size",
            expected=expected,
            received=received,
        )


class NegativeBinarySize(InvalidBinarySize):
    """A byte amount below zero: parsed fine, but no size can be negative."""

    def __init__(self, received: Any) -> None:
        super().__init__(received, "a byte size cannot be negative")
