"""Checking amounts at the allocation boundary and moving them on and off a grid.

Amounts reach a map already parsed (``ResourceSlot.from_user_input`` does that at the
edge), so here only ``Decimal`` and ``int`` are accepted.  A ``float`` is refused
rather than converted: ``0.1`` as a float is not 0.1, and a map must be exact.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from decimal import ROUND_CEILING, Decimal
from fnmatch import fnmatchcase
from functools import lru_cache
from typing import Any

from .errors import InvalidResourceArgument, InvalidResourceCombination

__all__ = [
    "MAPPINGS",
    "ceil_to",
    "check_amount",
    "check_exclusive",
    "to_units",
    "validate_request",
]

# isinstance() tries these in order: a plain dict is answered before the (slow) ABC check.
MAPPINGS = (dict, Mapping)
_EXPECTED = "a finite Decimal >= 0 (for example Decimal('0.5'))"


def check_amount(
    slot: str | None,
    value: Any,
    *,
    what: str = "amount",
    context_tag: str | None = None,
) -> Decimal:
    """``value`` as a finite, non-negative Decimal, or :class:`InvalidResourceArgument`.

    >>> check_amount("cpu", 2)
    Decimal('2')
    >>> check_amount("cpu", 0.5)
    Traceback (most recent call last):
    ...
    accelshare.alloc.errors.InvalidResourceArgument: InvalidResourceArgument: invalid amount 0.5 for cpu: expected a finite Decimal >= 0 (for example Decimal('0.5')), got a float
    """
    if type(value) is Decimal and value.is_finite() and value >= 0:
        return value  # the common case, checked cheaply
    if isinstance(value, Decimal):
        number = value
    elif isinstance(value, int) and not isinstance(value, bool):
        number = Decimal(value)
    else:
        kind = "a float" if isinstance(value, float) else f"a {type(value).__name__}"
        raise _invalid(slot, value, what, f"got {kind}", context_tag)
    if number.is_nan():
        raise _invalid(slot, value, what, "got NaN", context_tag)
    if number.is_infinite():
        raise _invalid(slot, value, what, "got an infinite amount", context_tag)
    if number < 0:
        raise _invalid(slot, value, what, "got a negative amount", context_tag)
    return number


def _invalid(
    slot: str | None, value: Any, what: str, why: str, context_tag: str | None
) -> InvalidResourceArgument:
    target = f" for {slot}" if slot else ""
    return InvalidResourceArgument(
        f"invalid {what} {value!r}{target}: expected {_EXPECTED}, {why}",
        slot=slot,
        requested=value,
        expected=_EXPECTED,
        context_tag=context_tag,
    )


def validate_request(
    slots: Mapping[str, Any], *, context_tag: str | None = None
) -> dict[str, Decimal]:
    """Check every amount of a request and drop the zero ones (request order is kept).

    >>> validate_request({"cpu": Decimal(2), "cuda.shares": Decimal(0)})
    {'cpu': Decimal('2')}
    """
    if not isinstance(slots, MAPPINGS):
        raise InvalidResourceArgument(
            f"invalid request {slots!r}: expected a mapping of slot name -> Decimal",
            slot=None,
            requested=slots,
            expected="a mapping of slot name -> Decimal",
            context_tag=context_tag,
        )
    request: dict[str, Decimal] = {}
    for slot, value in slots.items():
        amount = value
        if type(amount) is not Decimal or not amount.is_finite() or amount < 0:
            amount = check_amount(str(slot), value, context_tag=context_tag)  # int, or raise
        if amount:  # zero (and -0) is dropped
            request[str(slot)] = amount
    return request


def check_exclusive(
    slots: Iterable[str], exclusive: tuple[str, ...], *, context_tag: str | None = None
) -> None:
    """Refuse two *different* requested slots that both match the exclusive set.

    Entries are slot names or ``fnmatch`` patterns (``cuda.device:*-mig``); an empty
    set matches nothing, so every request passes.

    >>> check_exclusive(["cuda.device:1g-mig", "cpu"], ("cuda.device", "cuda.device:*-mig"))
    >>> check_exclusive(["cuda.shares", "cpu"], ())
    >>> check_exclusive(["cuda.device:1g-mig", "cuda.device:2g-mig"], ("cuda.device:*-mig",))
    Traceback (most recent call last):
    ...
    accelshare.alloc.errors.InvalidResourceCombination: InvalidResourceCombination: cuda.device:1g-mig and cuda.device:2g-mig cannot be allocated together (mutually exclusive slots: cuda.device:*-mig)
    """
    matched = _exclusive_slots(tuple(slots), exclusive)
    if len(matched) >= 2:
        raise InvalidResourceCombination(list(matched[:2]), exclusive, context_tag=context_tag)


@lru_cache(maxsize=1024)
def _exclusive_slots(slots: tuple[str, ...], exclusive: tuple[str, ...]) -> tuple[str, ...]:
    """The slots that match the exclusive set, remembered: a map checks the same few
    request shapes over and over, and ``fnmatchcase`` per slot and pattern need not be
    repeated for each."""
    return tuple(slot for slot in slots if any(fnmatchcase(slot, pat) for pat in exclusive))


def ceil_to(amount: Decimal, step: Decimal) -> Decimal:
    """The smallest multiple of ``step`` not below ``amount`` (``ceil_to(0.25, 0.1) == 0.3``)."""
    return (amount / step).to_integral_value(rounding=ROUND_CEILING) * step


def to_units(amount: Decimal, unit: Decimal) -> int:
    """How many whole ``unit`` fit in ``amount`` (floor); amounts here are never negative."""
    return int(amount // unit)
