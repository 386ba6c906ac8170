"""The one strict parser of resource amounts (spec 01, "Parsing user input").

Every layer that reads an amount a person or a program wrote (the CLI, the SDK, the
REST body, the admin API, the agent's create request) calls :func:`parse_amount`, so an
amount is read exactly as written or refused by name — never rounded, never guessed::

    parse_amount("cuda.shares", "0.25")                        -> Decimal('0.25')
    parse_amount("cuda.shares", "0.25", quantum=Decimal("0.1"))
        -> NotMultipleOfQuantum (nearest valid amounts: 0.2 and 0.3)
    parse_amount("cuda.shares", "0.005", quantum=Decimal("0.01"))
        -> BelowOneQuantum (the smallest amount is 0.01)
    parse_amount("cpu", True)       -> SlotValueError (a boolean is not an amount)
    parse_amount("cpu", "1_0")      -> SlotValueError (no '_' separators)
    parse_amount("cpu", "１")        -> SlotValueError (ASCII digits only)
    parse_amount("mem", "1.1k", SlotTypes.BYTES)
        -> SlotValueError (1126.4 bytes is not a whole number of bytes)

Accepted texts: ASCII decimal numerals with an optional sign and exponent (``"2"``,
``"0.5"``, ``"1e3"``), ``"inf"``/``"infinity"`` (any case), and for ``bytes`` slots a
size with a scale suffix (``"512m"``, ``"2 GiB"``).  A ``float`` is read by its
shortest text (``repr``): the number a JSON document or a Python literal wrote.  The
REST API parses JSON numbers as ``Decimal`` so that no float is involved at all.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal, InvalidOperation
from typing import Any

from .errors import (
    BelowOneQuantum,
    InvalidResourceSlotQuantity,
    NotMultipleOfQuantum,
    SlotValueError,
)
from .slot import SlotTypes

__all__ = [
    "COUNT_QUANTUM",
    "MAX_AMOUNT_EXPONENT",
    "check_on_grid",
    "grid_neighbours",
    "parse_amount",
]

COUNT_QUANTUM = Decimal("0.001")
"""The grid of a count amount no plugin gives a quantum of (``cpu``, a slot whose agents
are not known yet): three decimal places."""

MAX_AMOUNT_EXPONENT = 21  # finite amounts stay below 10**21 (about 867 EiB)

_INFINITY = Decimal("Infinity")
_INFINITY_WORDS = frozenset({"inf", "infinity"})
_NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_SIZE = re.compile(
    r"(?P<num>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))[ ]?"
    r"(?P<scale>[kmgtpe])?(?P<unit>ibytes|ibyte|ib|bytes|byte|b)?",
    re.IGNORECASE,
)
_MULTIPLIER = {s: 1024**i for i, s in enumerate(("", "k", "m", "g", "t", "p", "e"))}
_COUNT_EXPECTED = "a decimal number written with the ASCII digits 0-9, such as 2 or 0.5"
_BYTES_EXPECTED = (
    "a byte size written with the ASCII digits 0-9, such as 1073741824, '512m' or '2g'"
)


def grid_neighbours(amount: Decimal, quantum: Decimal) -> tuple[Decimal, Decimal]:
    """The multiples of ``quantum`` at or below and at or above ``amount``.

    >>> grid_neighbours(Decimal("0.25"), Decimal("0.1"))
    (Decimal('0.2'), Decimal('0.3'))
    """
    units = amount / quantum
    lower = units.to_integral_value(rounding=ROUND_FLOOR) * quantum
    upper = units.to_integral_value(rounding=ROUND_CEILING) * quantum
    return lower, upper


def check_on_grid(
    field: str, amount: Decimal, quanta: Collection[Decimal], received: Any = None
) -> None:
    """Refuse a positive finite ``amount`` that is not a multiple of any of ``quanta``.

    Below the smallest quantum: :class:`BelowOneQuantum`; otherwise
    :class:`NotMultipleOfQuantum` naming the nearest multiples of the smallest quantum
    (valid wherever that quantum is used).  Zero, infinity and an empty
    ``quanta`` pass.
    """
    if not quanta or not amount.is_finite() or amount <= 0:
        return
    if any(amount % q == 0 for q in quanta):
        return
    quantum = min(quanta)
    shown = amount if received is None else received
    if amount < quantum:
        raise BelowOneQuantum(field, shown, amount, quantum)
    lower, upper = grid_neighbours(amount, quantum)
    raise NotMultipleOfQuantum(field, shown, amount, quantum, lower=lower, upper=upper)


def _text_of(field: str, value: Any, expected: str) -> str | Decimal:
    """``value`` as the text to parse, or as a Decimal when it is one (or an int)."""
    if isinstance(value, bool) or value is None:
        raise SlotValueError(field, value, expected)
    if isinstance(value, Decimal):
        return value
    if isinstance(value, int):
        return Decimal(value)
    if isinstance(value, float):
        return Decimal(repr(value))  # the digits the user wrote, not binary noise
    if not isinstance(value, str):
        raise SlotValueError(field, value, expected)
    text = value.strip(" \t")
    if "_" in text:
        raise SlotValueError(field, value, expected + " (no '_' separators)")
    if not text.isascii():
        raise SlotValueError(field, value, expected + " (ASCII digits only)")
    return text


def _infinity(text: str) -> Decimal | None:
    """``inf`` / ``-Infinity`` ... as a signed infinite Decimal (refused later as an
    amount, with the field named); None for anything else."""
    if text.lower().lstrip("+-") in _INFINITY_WORDS:
        return -_INFINITY if text.startswith("-") else _INFINITY
    return None


def _count(field: str, value: Any) -> Decimal:
    text = _text_of(field, value, _COUNT_EXPECTED)
    if isinstance(text, Decimal):
        number = text
    elif (infinite := _infinity(text)) is not None:
        number = infinite
    elif _NUMBER.fullmatch(text):
        number = Decimal(text)
    else:
        raise SlotValueError(field, value, _COUNT_EXPECTED)
    if number.is_nan():
        raise SlotValueError(field, value, _COUNT_EXPECTED)
    return number


def _bytes(field: str, value: Any) -> Decimal:
    text = _text_of(field, value, _BYTES_EXPECTED)
    if isinstance(text, Decimal):
        number = text
    elif (infinite := _infinity(text)) is not None:
        number = infinite
    else:
        match = _SIZE.fullmatch(text)
        if match is None:
            raise SlotValueError(field, value, _BYTES_EXPECTED)
        scale = (match["scale"] or "").lower()
        try:
            number = Decimal(match["num"]) * _MULTIPLIER[scale]
        except InvalidOperation:  # pragma: no cover - the regex admits only numerals
            raise SlotValueError(field, value, _BYTES_EXPECTED) from None
    if number.is_nan():
        raise SlotValueError(field, value, _BYTES_EXPECTED)
    return number


def parse_amount(
    field: str,
    value: Any,
    slot_type: SlotTypes | str = SlotTypes.COUNT,
    *,
    quantum: Decimal | None = None,
) -> Decimal:
    """One amount of the slot ``field``, exactly as written (see the module docstring).

    ``quantum``: the grid the amount must be on (:func:`check_on_grid`); None checks
    none.  Raises a :class:`~accelshare.common.errors.SlotValueError` (bad text, a
    boolean, too large), :class:`InvalidResourceSlotQuantity` (negative) or
    :class:`NotMultipleOfQuantum` / :class:`BelowOneQuantum` (off the grid), each
    naming the field, the expected and the received value.
    """
    kind = SlotTypes(slot_type)
    number = _bytes(field, value) if kind is SlotTypes.BYTES else _count(field, value)
    if number.is_finite() and number.adjusted() >= MAX_AMOUNT_EXPONENT:
        # beyond the decimal context's 28 digits arithmetic raises (docs/reliability.md)
        raise SlotValueError(field, value, f"an amount below 10^{MAX_AMOUNT_EXPONENT}")
    if number < 0:
        raise InvalidResourceSlotQuantity(field, value)
    if kind is SlotTypes.BYTES:
        if number.is_finite() and number != number.to_integral_value():
            lower, upper = grid_neighbours(number, Decimal(1))
            raise SlotValueError(
                field,
                value,
                f"a whole number of bytes (this is {number.normalize():f} bytes;"
                f" nearest: {lower:f} or {upper:f})",
            )
        return number
    if quantum is not None:
        check_on_grid(field, number, (quantum,), value)
    return number
