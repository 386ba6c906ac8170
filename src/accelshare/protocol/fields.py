"""The protocol's field types and base models, and the checks at the manager's edge.

What the manager stores from an agent is checked here, at the edge, so that a bad
heartbeat or event batch is a ``400`` naming the field and nothing of it is written
(docs/reliability.md): ids are 1-64 printable characters (the columns' width), URLs
http(s), capacities and allocations finite decimals >= 0 below 10^21, slot names valid,
exit codes 32-bit, no string anywhere holds NUL and no number is NaN or infinite
(PostgreSQL cannot store either).
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping, Sequence
from decimal import Decimal, InvalidOperation
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from accelshare.common import SlotName
from accelshare.common.errors import InvalidSlotName
from accelshare.common.resource_slot import MAX_AMOUNT_EXPONENT

__all__ = [
    "INT32_MAX",
    "AgentId",
    "Amount",
    "CheckedModel",
    "EventId",
    "ExitCode",
    "HeldAllocation",
    "HeldAmount",
    "HttpUrl",
    "KernelId",
    "Label",
    "SlotAllocationWire",
    "SlotKey",
    "WireModel",
]

Amount = str  # a decimal string; parse with Decimal(), never float()
INT32_MAX = 2**31 - 1


def _invalid(expected: str, value: Any) -> PydanticCustomError:
    return PydanticCustomError("wire", "expected {expected}",
                               {"expected": expected, "received": repr(value)[:100]})  # fmt: skip


_HELD_EXPECTED = f'a decimal string >= 0 and below 10^{MAX_AMOUNT_EXPONENT}, such as "0.6"'


@functools.lru_cache(maxsize=4096)
def _held_amount(value: str) -> str:
    """A finite decimal >= 0 below 10^21 (what ResourceSlot accepts), kept as sent.

    Remembered per text (a refused one is not: it raises): an agent's heartbeat
    carries ~150 amounts, mostly the same few texts ("1", "0", a GPU's capacity)."""
    try:
        number = Decimal(value)
    except (InvalidOperation, ValueError):
        raise _invalid(_HELD_EXPECTED, value) from None
    if not number.is_finite() or number < 0 or number.adjusted() >= MAX_AMOUNT_EXPONENT:
        raise _invalid(_HELD_EXPECTED, value)
    return value


def _ident(width: int) -> Any:
    """1..width characters, not blank, no control characters (an id column's width)."""

    def check(value: str) -> str:
        if (
            not value.strip()
            or len(value) > width
            or any(ord(c) < 0x20 or ord(c) == 0x7F for c in value)
        ):
            expected = f"a non-empty id of at most {width} printable characters"
            raise _invalid(expected, value)
        return value

    return check


def _slot_name(value: str) -> str:
    try:
        SlotName(value)
    except InvalidSlotName:
        raise _invalid('a slot name such as "cpu", "mem" or "cuda.shares"', value) from None
    return value


def _http_url(value: str) -> str:
    if (
        not value.startswith(("http://", "https://"))
        or len(value) > 256
        or not value[7:].strip("/")
    ):
        raise _invalid('an http(s) URL of at most 256 characters such as "http://10.0.0.5:6001"',
                       value)  # fmt: skip
    return value


def _escaped(text: str) -> str:
    return text.encode("unicode_escape").decode("ascii")


def _surely_storable(data: Any) -> bool:
    """True when the C JSON encoder finds no non-finite number and writes no NUL (it
    writes ``\\u0000`` for one); False when it cannot tell (a type it does not encode, or
    that text, which an escaped backslash can also produce): then :func:`_storable`
    walks the data.  Encoding is an order of magnitude cheaper than walking a large
    heartbeat."""
    try:
        text = json.dumps(data, allow_nan=False)
    except (TypeError, ValueError):  # not plain JSON data, or NaN / Infinity
        return False
    return "\\u0000" not in text


def _storable(data: Any, where: str = "body") -> None:
    """Refuse what PostgreSQL cannot store, naming where it is (``slots.cpu``): NUL in
    any string (key or value) and non-finite numbers (``NaN``, ``Infinity``: not JSON,
    though Python's parser reads them)."""
    if isinstance(data, str):
        if "\x00" in data:
            raise PydanticCustomError(
                "wire", "{where}: expected text without NUL characters", {"where": where}
            )
    elif isinstance(data, float):
        if not math.isfinite(data):
            raise PydanticCustomError(
                "wire", "{where}: expected a finite number, received {value}",
                {"where": where, "value": str(data)},
            )  # fmt: skip
    elif isinstance(data, Mapping):
        for key, value in data.items():
            # a key with control characters is named escaped (\r, \x00), readable
            shown = key if not isinstance(key, str) or key.isprintable() else _escaped(key)
            path = f"{where}.{shown}".removeprefix("body.")
            _storable(key, path)
            _storable(value, path)
    elif isinstance(data, Sequence) and not isinstance(data, bytes | bytearray):
        for index, value in enumerate(data):
            _storable(value, f"{where}.{index}".removeprefix("body."))


HeldAmount = Annotated[str, AfterValidator(_held_amount)]
AgentId = Annotated[str, AfterValidator(_ident(64))]
KernelId = Annotated[str, AfterValidator(_ident(64))]
EventId = Annotated[str, AfterValidator(_ident(128))]  # unique; an event is applied once
SlotKey = Annotated[str, AfterValidator(_slot_name)]
HttpUrl = Annotated[str, AfterValidator(_http_url)]
Label = Annotated[str, Field(max_length=64)]
ExitCode = Annotated[int, Field(ge=-INT32_MAX - 1, le=INT32_MAX)]
# The wire forms of an ``accelshare.common.Allocation`` (slot -> device -> amount):
# SlotAllocationWire as the agent sends it, HeldAllocation as the manager checks and
# stores it (amounts kept as the decimal strings received).  The JSON contract: keep them.
SlotAllocationWire = dict[str, dict[str, Amount]]  # slot -> device -> amount
HeldAllocation = dict[SlotKey, dict[Annotated[str, Field(max_length=256)], HeldAmount]]


class WireModel(BaseModel):
    """A protocol message: frozen; unknown fields are ignored so that a newer agent can
    talk to an older manager."""

    model_config = ConfigDict(extra="ignore", frozen=True)


class CheckedModel(WireModel):
    """A message the manager stores: NUL and NaN anywhere are refused before field checks."""

    @model_validator(mode="before")
    @classmethod
    def _refuse_unstorable(cls, data: Any) -> Any:
        if not _surely_storable(data):
            _storable(data)  # raises, naming where
        return data
