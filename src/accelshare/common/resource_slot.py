"""``ResourceSlot``: an immutable mapping slot name -> ``Decimal`` amount.

Missing keys are zero in every operation, which lets agents with different plugin
sets live in one cluster::

    ResourceSlot({"cpu": 1}) == ResourceSlot({"cpu": 1, "cuda.shares": 0})      # True
    ResourceSlot({"a": 4, "b": 100}) <= ResourceSlot({"a": 3, "b": 200})        # False
    ResourceSlot({"a": 3, "b": 200}) <= ResourceSlot({"a": 4, "b": 100})        # False too

No operation mutates an operand: ``a + b`` returns a new slot.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, ItemsView, Iterable, Iterator, KeysView, Mapping, ValuesView
from decimal import Decimal, InvalidOperation
from typing import Any

from .amounts import COUNT_QUANTUM, MAX_AMOUNT_EXPONENT, check_on_grid, parse_amount
from .binary_size import BinarySize
from .errors import (
    CommonValueError,
    SlotValueError,
    UnknownResourceSlotType,
)
from .slot import SlotTypes

__all__ = [
    "COUNT_QUANTUM",
    "MAX_AMOUNT_EXPONENT",
    "DefaultForUnspecified",
    "ResourceSlot",
    "canonical_decimal",
    "normalize_amount",
]

_ZERO = Decimal(0)
_INFINITY = Decimal("Infinity")


class DefaultForUnspecified(enum.StrEnum):
    """What a resource policy grants for slots it does not list."""

    LIMITED = "LIMITED"  # nothing (0)
    UNLIMITED = "UNLIMITED"  # everything (Infinity)


def canonical_decimal(value: Decimal) -> str:
    """Fixed-point text without trailing zeros: ``"1"``, ``"1.5"``, ``"Infinity"``; one
    text per amount (``-0`` is ``"0"``), so equal amounts are stored alike."""
    if not value:
        return "0"
    if value.is_infinite():
        return "Infinity" if value > 0 else "-Infinity"
    if value == value.to_integral_value():
        return str(value.quantize(Decimal(1)))
    return format(value.normalize(), "f")


def _guess_slot_type(slot: str) -> SlotTypes:
    return SlotTypes.BYTES if "mem" in slot else SlotTypes.COUNT


def _to_decimal(slot: str, value: Any, expected: str) -> Decimal:
    """Convert one user-supplied amount; refuse booleans, NaN and junk by name."""
    if isinstance(value, bool) or value is None:
        raise SlotValueError(slot, value, expected)
    try:
        if isinstance(value, float):
            number = Decimal(repr(value))  # the digits the user wrote, not binary noise
        elif isinstance(value, int | str | Decimal):
            number = Decimal(value.strip() if isinstance(value, str) else value)
        else:
            raise SlotValueError(slot, value, expected)
    except (InvalidOperation, ValueError) as e:
        raise SlotValueError(slot, value, expected) from e
    if number.is_nan():
        raise SlotValueError(slot, value, expected)
    return number


def normalize_amount(
    slot: str, value: Any, slot_type: SlotTypes | str, *, quantum: Decimal | None = None
) -> Decimal:
    """Parse one amount of ``slot`` according to its type (see spec 01), exactly.

    :func:`~accelshare.common.amounts.parse_amount` on the slot's grid: ``quantum``
    when given, else :data:`COUNT_QUANTUM` for a count; bytes must be whole.
    """
    slot_type = SlotTypes(slot_type)
    if slot_type is not SlotTypes.BYTES and quantum is None:
        quantum = COUNT_QUANTUM
    return parse_amount(slot, value, slot_type, quantum=quantum)


def _user_amount(
    slot: str, raw: Any, slot_type: SlotTypes | str, steps: Collection[Decimal] | None
) -> Decimal:
    """One requested amount on its grid: a multiple of one of ``steps`` (the slot's
    plugins' quanta) when there are any, else :func:`normalize_amount`'s grid."""
    if not steps or SlotTypes(slot_type) is SlotTypes.BYTES:
        return normalize_amount(slot, raw, slot_type)
    amount = parse_amount(slot, raw, slot_type)
    check_on_grid(slot, amount, steps, raw)
    return amount


class ResourceSlot(Mapping[str, Decimal]):
    """Immutable slot -> Decimal mapping with zero-filled arithmetic and partial order."""

    __slots__ = ("_data",)

    _data: dict[str, Decimal]

    def __init__(self, data: Mapping[str, Decimal | int | str] | None = None) -> None:
        values: dict[str, Decimal] = {}
        for key, value in (data or {}).items():
            number = value if isinstance(value, Decimal) else _to_decimal(key, value, "a number")
            if number.is_nan():
                raise SlotValueError(key, value, "a number")
            values[str(key)] = number
        object.__setattr__(self, "_data", values)

    # -- Mapping protocol ---------------------------------------------------------------
    def __getitem__(self, key: str) -> Decimal:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    # The Mapping mixins walk ``__iter__`` + ``__getitem__`` in Python; the dict's own
    # (read-only) views and lookups are several times faster, and the scheduler calls
    # these for every pending session of every pass.
    def __contains__(self, key: object) -> bool:
        return key in self._data

    def keys(self) -> KeysView[str]:
        return self._data.keys()

    def values(self) -> ValuesView[Decimal]:
        return self._data.values()

    def items(self) -> ItemsView[str, Decimal]:
        return self._data.items()

    def get(self, key: str, default: Any = None) -> Any:
        return self._data.get(key, default)

    @classmethod
    def _trusted(cls, values: dict[str, Decimal]) -> ResourceSlot:
        """A slot over ``values`` as they are: Decimals computed from valid slots.

        Arithmetic on valid amounts cannot produce NaN (the default context traps the
        invalid operation), so its results skip the constructor's per-value checks.
        """
        slot = object.__new__(cls)
        object.__setattr__(slot, "_data", values)
        return slot

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("ResourceSlot is immutable")

    def get_amount(self, key: str) -> Decimal:
        """The amount of ``key``, zero when missing."""
        return self._data.get(key, _ZERO)

    def __repr__(self) -> str:
        inner = ", ".join(f"{k!r}: {canonical_decimal(v)}" for k, v in self._data.items())
        return f"ResourceSlot({{{inner}}})"

    # -- arithmetic (missing keys are zero; operands are never mutated) -----------------
    @staticmethod
    def _coerce(other: object) -> ResourceSlot | None:
        if isinstance(other, ResourceSlot):
            return other
        if isinstance(other, Mapping):
            return ResourceSlot(other)
        return None

    def _keys_with(self, other: ResourceSlot) -> list[str]:
        return list(dict.fromkeys([*self._data, *other._data]))

    def __add__(self, other: Mapping[str, Decimal]) -> ResourceSlot:
        rhs = self._coerce(other)
        if rhs is None:
            return NotImplemented
        mine, theirs = self._data, rhs._data
        return ResourceSlot._trusted(
            {k: mine.get(k, _ZERO) + theirs.get(k, _ZERO) for k in self._keys_with(rhs)}
        )

    def __sub__(self, other: Mapping[str, Decimal]) -> ResourceSlot:
        rhs = self._coerce(other)
        if rhs is None:
            return NotImplemented
        mine, theirs = self._data, rhs._data
        return ResourceSlot._trusted(
            {k: mine.get(k, _ZERO) - theirs.get(k, _ZERO) for k in self._keys_with(rhs)}
        )

    @classmethod
    def sum_of(cls, terms: Iterable[tuple[ResourceSlot, int]]) -> ResourceSlot:
        """The sum of each slot taken ``count`` times: ``sum_of([(a, 2), (b, 1)]) == a + a + b``.

        For totals over many rows holding few distinct amounts (kernels of one shape):
        one multiplication per distinct amount instead of one addition per row, and no
        intermediate slots.  Keys keep the order of their first appearance; a count of
        zero contributes zero (also for an infinite amount).

        >>> ResourceSlot.sum_of([(ResourceSlot({"cpu": "0.5"}), 3)])
        ResourceSlot({'cpu': 1.5})
        """
        total: dict[str, Decimal] = {}
        for slot, count in terms:
            if not isinstance(count, int) or isinstance(count, bool) or count < 0:
                raise ValueError(f"count: expected an integer >= 0, got {count!r}")
            for key, amount in slot._data.items():
                total[key] = total.get(key, _ZERO) + (amount * count if count else _ZERO)
        return cls._trusted(total)

    def __neg__(self) -> ResourceSlot:
        return ResourceSlot._trusted({k: -v for k, v in self._data.items()})

    # -- comparison ---------------------------------------------------------------------
    def __eq__(self, other: object) -> bool:
        rhs = self._coerce(other)
        if rhs is None:
            return NotImplemented
        mine, theirs = self._data, rhs._data
        return all(mine.get(k, _ZERO) == theirs.get(k, _ZERO) for k in self._keys_with(rhs))

    def __ne__(self, other: object) -> bool:
        result = self.__eq__(other)
        return result if result is NotImplemented else not result

    def __hash__(self) -> int:
        return hash(frozenset((k, v) for k, v in self._data.items() if v != 0))

    def __le__(self, other: Mapping[str, Decimal]) -> bool:
        rhs = self._coerce(other)
        if rhs is None:
            return NotImplemented
        mine, theirs = self._data, rhs._data
        return all(mine.get(k, _ZERO) <= theirs.get(k, _ZERO) for k in self._keys_with(rhs))

    def __lt__(self, other: Mapping[str, Decimal]) -> bool:
        rhs = self._coerce(other)
        if rhs is None:
            return NotImplemented
        return self <= rhs and self != rhs

    def __ge__(self, other: Mapping[str, Decimal]) -> bool:
        rhs = self._coerce(other)
        if rhs is None:
            return NotImplemented
        return rhs <= self

    def __gt__(self, other: Mapping[str, Decimal]) -> bool:
        rhs = self._coerce(other)
        if rhs is None:
            return NotImplemented
        return rhs < self

    def eq_contains(self, other: Mapping[str, Decimal]) -> bool:
        """Common keys are equal and keys only in ``other`` are zero."""
        rhs = ResourceSlot(other)
        common = self._data.keys() & rhs._data.keys()
        only_other = rhs._data.keys() - self._data.keys()
        return all(self._data[k] == rhs._data[k] for k in common) and all(
            rhs._data[k] == 0 for k in only_other
        )

    def eq_contained(self, other: Mapping[str, Decimal]) -> bool:
        """Common keys are equal and keys only in ``self`` are zero."""
        return ResourceSlot(other).eq_contains(self)

    # -- helpers --------------------------------------------------------------------------
    def nonzero(self) -> ResourceSlot:
        """A copy without zero entries."""
        return ResourceSlot._trusted({k: v for k, v in self._data.items() if v != 0})

    def filter_keys(self, keys: Mapping[str, Any] | set[str] | frozenset[str]) -> ResourceSlot:
        """A copy holding only ``keys`` (missing ones are filled with zero)."""
        return ResourceSlot({k: self.get_amount(k) for k in keys})

    # -- parsing and serialisation ------------------------------------------------------
    @classmethod
    def from_user_input(
        cls,
        values: Mapping[str, Any],
        known_slot_types: Mapping[str, SlotTypes | str] | None,
        *,
        quanta: Mapping[str, Collection[Decimal]] | None = None,
    ) -> ResourceSlot:
        """Parse a user's request (see spec 01, "Parsing user input"), every amount
        exactly as written (:func:`~accelshare.common.amounts.parse_amount`).

        Zero entries are dropped (so asking for ``cuda.shares=0`` is fine anywhere);
        with ``known_slot_types`` an unknown non-zero slot raises
        :class:`UnknownResourceSlotType` and missing known slots are filled with 0.
        ``quanta``: slot -> the quanta its plugins use (a count amount must be a
        multiple of one of them); a count slot without any must be a multiple of
        :data:`COUNT_QUANTUM`.  Off the grid: ``NotMultipleOfQuantum`` /
        ``BelowOneQuantum``, never rounded.
        """
        data: dict[str, Decimal] = {}
        steps_of = quanta or {}
        for key, raw in values.items():
            slot = str(key)
            amount: Decimal | None
            if known_slot_types is None:
                amount = _user_amount(slot, raw, _guess_slot_type(slot), steps_of.get(slot))
            elif slot in known_slot_types:
                amount = _user_amount(slot, raw, known_slot_types[slot], steps_of.get(slot))
            else:
                try:
                    amount = normalize_amount(slot, raw, _guess_slot_type(slot))
                except CommonValueError:
                    amount = None
                if amount is None or amount != 0:
                    raise UnknownResourceSlotType(slot, list(known_slot_types))
            if amount != 0:
                data[slot] = amount
        if known_slot_types is not None:
            for slot in known_slot_types:
                data.setdefault(str(slot), _ZERO)
        return cls(data)

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> ResourceSlot:
        """Inverse of :meth:`to_json`; values are decimal strings (``"Infinity"`` allowed)."""
        if not isinstance(obj, Mapping):
            raise SlotValueError("<root>", obj, "a JSON object of slot -> decimal string")
        return cls({str(k): _to_decimal(str(k), v, "a decimal string") for k, v in obj.items()})

    def to_json(self) -> dict[str, str]:
        """Values as fixed-point strings without trailing zeros; infinity as ``"Infinity"``."""
        return {k: canonical_decimal(v) for k, v in self._data.items()}

    def to_humanized(self, slot_types: Mapping[str, SlotTypes | str]) -> dict[str, str]:
        """Bytes as short binary sizes (``"2g"``), counts as plain numbers."""
        result: dict[str, str] = {}
        for key, value in self._data.items():
            slot_type = SlotTypes(slot_types.get(key, _guess_slot_type(key)))
            if slot_type is SlotTypes.BYTES and value.is_finite():
                result[key] = format(BinarySize(int(value)), "s")
            elif value.is_infinite():
                result[key] = "inf" if value > 0 else "-inf"
            else:
                result[key] = canonical_decimal(value)
        return result

    @classmethod
    def from_policy(
        cls, policy: Mapping[str, Any], slot_types: Mapping[str, SlotTypes | str]
    ) -> ResourceSlot:
        """A quota from a resource policy's ``total_resource_slots``.

        Known slots the policy does not list get Infinity when
        ``default_for_unspecified`` is UNLIMITED, else 0.  Slots the policy lists but
        the cluster does not know are ignored.
        """
        default = DefaultForUnspecified(str(policy.get("default_for_unspecified", "LIMITED")))
        fill = _INFINITY if default is DefaultForUnspecified.UNLIMITED else _ZERO
        total = policy.get("total_resource_slots") or {}
        data: dict[str, Decimal] = {}
        for key, raw in total.items():
            if key in slot_types and raw is not None:
                if isinstance(raw, str) and raw.lower() in {"infinity", "inf"}:
                    data[key] = _INFINITY
                else:
                    data[key] = normalize_amount(key, raw, slot_types[key])
        for key in slot_types:
            data.setdefault(key, fill)
        return cls(data)
