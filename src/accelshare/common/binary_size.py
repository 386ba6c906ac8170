"""``BinarySize``: byte amounts with human-friendly parsing and formatting.

Parsing (case-insensitive, ``_`` separators and spaces allowed)::

    "1 byte" -> 1          "12345 B" -> 12345        "2 KiBytes" -> 2048
    "0.5m"   -> 524288     "1.1k"    -> 1126 (floor)  "40G"      -> 42949672960
    "inf"    -> Decimal("Infinity")   (refused by ``finite_from_str``)

A fraction needs a scale suffix: ``"1.1"`` or ``"1.5 bytes"`` are errors, never rounded.
A negative size (``"-1k"``, ``-5``) is refused with :class:`NegativeBinarySize`.

Formatting::

    str(BinarySize(1))       == "1 byte"        str(BinarySize(105933)) == "103.45 KiB"
    str(BinarySize(3 * 2**29)) == "1.5 GiB"     str(BinarySize(1000 * 2**20)) == "1000 MiB"
    format(BinarySize(524288), "s") == "512k"   (shortest exact short form)
    format(BinarySize(524288), "m") == "0.5m"   (that scale, exact)
    format(BinarySize(524288), " ") == "524288"
"""

from __future__ import annotations

import re
from decimal import ROUND_DOWN, ROUND_FLOOR, Decimal
from typing import Any

from .errors import InvalidBinarySize, NegativeBinarySize

__all__ = ["BinarySize"]

_SCALES = ("", "k", "m", "g", "t", "p", "e")
_MULTIPLIER = {s: 1024**i for i, s in enumerate(_SCALES)}
_INFINITY_WORDS = frozenset({"inf", "infinity", "infinite"})
_PATTERN = re.compile(
    r"""^\s*
    (?P<num>[+-]?(?:\d+(?:\.\d*)?|\.\d+))
    \s*
    (?P<scale>[kmgtpe])?
    (?P<unit>ibytes|ibyte|ib|bytes|byte|b)?
    \s*$""",
    re.IGNORECASE | re.VERBOSE,
)


def _plain(value: Decimal) -> str:
    """Fixed-point text of a finite Decimal without trailing zeros (never ``1E+3``)."""
    if value == value.to_integral_value():
        return str(value.quantize(Decimal(1)))
    return format(value.normalize(), "f")


class BinarySize(int):
    """An ``int`` that counts bytes; see the module docstring for the accepted forms.

    Parsing (:meth:`from_str`) is the edge where user input comes in, and it refuses
    negative sizes.  The constructor does not: the class also formats computed
    amounts, and a difference of two sizes may be negative (``"-2k"``).
    """

    @classmethod
    def from_str(cls, expr: Any) -> BinarySize | Decimal:
        """Parse a size; ``"inf"`` gives ``Decimal("Infinity")``.  Ints >= 0 pass through.

        A negative size raises :class:`NegativeBinarySize` (an :class:`InvalidBinarySize`).
        """
        if isinstance(expr, bool):
            raise InvalidBinarySize(expr, "a boolean is not a size")
        if isinstance(expr, int):
            if expr < 0:
                raise NegativeBinarySize(expr)
            return expr if isinstance(expr, BinarySize) else cls(expr)
        if isinstance(expr, Decimal):
            if expr.is_infinite() and expr > 0:
                return expr
            if expr.is_finite() and expr == expr.to_integral_value():
                if expr < 0:
                    raise NegativeBinarySize(expr)
                return cls(int(expr))
            raise InvalidBinarySize(expr, "not a whole number of bytes")
        if not isinstance(expr, str):
            raise InvalidBinarySize(expr, f"unsupported type {type(expr).__name__}")
        text = expr.strip().replace("_", "")
        if text.lower() in _INFINITY_WORDS:
            return Decimal("Infinity")
        match = _PATTERN.match(text)
        if match is None:
            raise InvalidBinarySize(expr)
        number = Decimal(match["num"])  # the regex admits only numerals Decimal accepts
        if number < 0:  # "-0" is zero and passes
            raise NegativeBinarySize(expr)
        scale = (match["scale"] or "").lower()
        if not scale and number != number.to_integral_value():
            raise InvalidBinarySize(expr, "a fraction needs a scale suffix such as k, m or g")
        value = (number * _MULTIPLIER[scale]).to_integral_value(rounding=ROUND_FLOOR)
        return cls(int(value))

    @classmethod
    def finite_from_str(cls, expr: Any) -> BinarySize:
        """Like :meth:`from_str` but refuses infinity."""
        value = cls.from_str(expr)
        if isinstance(value, Decimal):
            raise InvalidBinarySize(expr, "infinity is not allowed here")
        return value

    def _scale_index(self) -> int:
        index, scaled = 0, abs(int(self))
        while scaled >= 1024 and index < len(_SCALES) - 1:
            scaled //= 1024
            index += 1
        return index

    def _at_scale(self, scale: str) -> Decimal:
        return Decimal(int(self)) / Decimal(_MULTIPLIER[scale])

    def __str__(self) -> str:
        index = self._scale_index()
        if index == 0:
            return f"{int(self)} byte" if int(self) == 1 else f"{int(self)} bytes"
        scale = _SCALES[index]
        # At most two decimals, truncated (towards zero, so -x prints as -(x)), and
        # trailing zeros stripped like every other form here: "1.5 GiB", "1000 MiB".
        value = self._at_scale(scale).quantize(Decimal("0.01"), rounding=ROUND_DOWN)
        return f"{_plain(value)} {scale.upper()}iB"

    def __repr__(self) -> str:
        return f"BinarySize({int(self)})"

    def __format__(self, spec: str) -> str:
        if spec == "":
            return str(self)
        if spec == " ":
            return str(int(self))
        if spec == "s":
            candidates = [
                _plain(self._at_scale(scale)) + scale
                for scale in _SCALES[: self._scale_index() + 1]
            ]
            # Shortest text wins; on a tie prefer a form without a decimal point,
            # then the smaller scale ("512k" over "0.5m").
            return min(candidates, key=lambda c: (len(c), "." in c))
        if len(spec) == 1 and spec.lower() in _MULTIPLIER:
            scale = spec.lower()
            return _plain(self._at_scale(scale)) + scale
        raise ValueError(
            f"Unsupported format spec {spec!r} for BinarySize: expected 's', ' ' or one of "
            f"{', '.join(repr(s) for s in _SCALES[1:])}"
        )
