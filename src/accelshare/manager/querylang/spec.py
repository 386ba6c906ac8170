"""Per-list field specs and the checking of one comparison against them (no I/O).

A :class:`ListSpec` names the public fields of one list (Backend.AI's names), each with
its type, where the value is read (a SQLAlchemy column expression for lists served from
the database, a getter for lists served from memory) and whether it may be filtered and
ordered on.  :func:`resolve` checks one ``field op value`` and converts the value to the
field's type (enum member, aware datetime, UUID...) or raises :class:`QueryError`.
"""

from __future__ import annotations

import builtins
import enum
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from .errors import QueryError
from .nodes import Compare, ListLiteral, Literal, Op, OrderItem, Scalar

__all__ = [
    "UNMATCHED",
    "Condition",
    "Field",
    "FieldType",
    "ListSpec",
    "allowed_ops",
    "resolve",
    "resolve_order",
]


class FieldType(enum.StrEnum):
    STRING = "string"
    INTEGER = "integer"
    BOOLEAN = "boolean"
    DATETIME = "datetime"
    UUID = "uuid"
    ENUM = "enum"


_ORDERED = frozenset({Op.EQ, Op.NE, Op.LT, Op.LE, Op.GT, Op.GE})
_OPS: dict[FieldType, frozenset[Op]] = {
    FieldType.STRING: _ORDERED | {Op.LIKE, Op.ILIKE, Op.CONTAINS, Op.IN, Op.NOT_IN},
    FieldType.INTEGER: _ORDERED | {Op.IN, Op.NOT_IN},
    FieldType.BOOLEAN: frozenset({Op.EQ, Op.NE, Op.IS, Op.IS_NOT}),
    FieldType.DATETIME: _ORDERED,
    FieldType.UUID: frozenset({Op.EQ, Op.NE, Op.IN, Op.NOT_IN}),
    FieldType.ENUM: frozenset({Op.EQ, Op.NE, Op.IN, Op.NOT_IN}),
}
_NULL_OPS = frozenset({Op.EQ, Op.NE, Op.IS, Op.IS_NOT})


class _Unmatched:
    """An enum value the list accepts but no row has (Backend.AI's statuses accelshare
    never uses): ``== it`` matches nothing, ``!= it`` everything that has a value."""

    def __repr__(self) -> str:
        return "UNMATCHED"


UNMATCHED = _Unmatched()


@dataclass(frozen=True)
class Field:
    type: FieldType
    sql: Any = None
    """A SQLAlchemy column expression (lists served from the database)."""
    get: Callable[[Any], Any] | None = None
    """Reads the value from an item (lists served from memory)."""
    nullable: bool = False
    enum_type: builtins.type[enum.Enum] | None = None
    unmatched: frozenset[str] = frozenset()
    """Enum values accepted that match nothing (compared upper-cased)."""
    filterable: bool = True
    orderable: bool = True
    bounds: tuple[int, int] = (-(2**31), 2**31 - 1)
    """Integers the column holds (SQL's INTEGER by default): others are refused."""


@dataclass(frozen=True)
class ListSpec:
    """The fields of one list; ``tiebreak`` fields end every order (stable pages)."""

    name: str
    fields: Mapping[str, Field]
    tiebreak: tuple[str, ...] = ()
    default_order: tuple[OrderItem, ...] = field(default=())


def allowed_ops(f: Field) -> frozenset[Op]:
    ops = _OPS[f.type]
    return ops | _NULL_OPS if f.nullable else ops


@dataclass(frozen=True, slots=True)
class Condition:
    """A checked comparison: ``value`` is of the field's type (a tuple for ``in``),
    ``None`` for null, or :data:`UNMATCHED`."""

    name: str
    field: Field
    op: Op
    value: Any


def _field(spec: ListSpec, name: str, column: int, argument: str) -> Field:
    f = spec.fields.get(name)
    usable = f is not None and (f.filterable if argument == "filter" else f.orderable)
    if f is None or not usable:
        names = sorted(
            n
            for n, fl in spec.fields.items()
            if (fl.filterable if argument == "filter" else fl.orderable)
        )
        raise QueryError(
            argument,
            f"unknown field of {spec.name}",
            column=column,
            expected=f"one of {', '.join(names)}",
            received=repr(name),
        )
    return f


def _type_error(c: Compare, lit: Literal, expected: str) -> QueryError:
    return QueryError(
        "filter",
        f"wrong value for {c.field}",
        column=lit.column,
        expected=expected,
        received=_show(lit.value),
    )


def _show(value: Scalar) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return repr(value)
    return str(value)


def _convert(c: Compare, f: Field, lit: Literal) -> Any:
    """One non-null literal -> the field's type."""
    v = lit.value
    match f.type:
        case FieldType.STRING:
            if isinstance(v, str):
                return v
            raise _type_error(c, lit, "a quoted string")
        case FieldType.INTEGER:
            low, high = f.bounds
            expected = f"an integer from {low} to {high}"
            if isinstance(v, Decimal) and v == v.to_integral_value() and abs(v.adjusted()) < 20:
                v = int(v)
            if isinstance(v, int) and not isinstance(v, bool) and low <= v <= high:
                return v
            raise _type_error(c, lit, expected)
        case FieldType.BOOLEAN:
            if isinstance(v, bool):
                return v
            raise _type_error(c, lit, "true or false")
        case FieldType.DATETIME:
            return _datetime(c, lit)
        case FieldType.UUID:
            if isinstance(v, str):
                try:
                    return uuid.UUID(v)
                except ValueError:
                    pass
            raise _type_error(c, lit, "a quoted UUID")
        case FieldType.ENUM:
            return _enum(c, f, lit)
    raise AssertionError(f"unknown field type {f.type}")  # pragma: no cover


def _datetime(c: Compare, lit: Literal) -> datetime:
    expected = 'a quoted ISO 8601 date or time ("2025-01-31" or "2025-01-31T12:00:00Z")'
    if not isinstance(lit.value, str):
        raise _type_error(c, lit, expected)
    try:
        when = datetime.fromisoformat(lit.value)
        return when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)
    except (ValueError, OverflowError):  # OverflowError: "0001-01-01T00:00+01:00"
        raise _type_error(c, lit, expected) from None


def _enum(c: Compare, f: Field, lit: Literal) -> Any:
    assert f.enum_type is not None
    members = list(f.enum_type)
    if isinstance(lit.value, str):
        wanted = lit.value.casefold()
        for m in members:
            if wanted in (str(m.value).casefold(), m.name.casefold()):
                return m
        if lit.value.upper() in f.unmatched:
            return UNMATCHED
    names = [str(m.value) for m in members] + sorted(f.unmatched)
    raise _type_error(c, lit, f"one of {', '.join(names)} (quoted)")


def resolve(spec: ListSpec, c: Compare) -> Condition:
    """Check ``c`` against the spec: a known filterable field, an operator its type
    allows, values of its type."""
    f = _field(spec, c.field, c.column, "filter")
    ops = allowed_ops(f)
    if c.op not in ops:
        raise QueryError(
            "filter",
            f"operator not allowed for {c.field} ({f.type.value})",
            column=c.column,
            expected=f"one of {' '.join(o.value for o in _OP_ORDER if o in ops)}",
            received=c.op.value,
        )
    value = c.value
    if c.op in (Op.IN, Op.NOT_IN):
        if not isinstance(value, ListLiteral):
            raise QueryError(
                "filter",
                f"{c.op.value} takes a list",
                column=value.column,
                expected='a list, e.g. ["A", "B"]',
                received=_show(value.value),
            )
        return Condition(c.field, f, c.op, tuple(_convert(c, f, i) for i in value.items))
    if isinstance(value, ListLiteral):
        raise QueryError(
            "filter",
            f"{c.op.value} takes a single value",
            column=value.column,
            expected="a single value (lists go with in / not in)",
            received="a list",
        )
    if c.op in (Op.IS, Op.IS_NOT):
        if value.value is None or (f.type is FieldType.BOOLEAN and isinstance(value.value, bool)):
            return Condition(c.field, f, c.op, value.value)
        also = ", true or false" if f.type is FieldType.BOOLEAN else ""
        raise _type_error(c, value, f"null{also}")
    if value.value is None:
        if c.op in (Op.EQ, Op.NE):
            return Condition(c.field, f, Op.IS if c.op is Op.EQ else Op.IS_NOT, None)
        raise _type_error(c, value, "a value (null goes with ==, !=, is, isnot)")
    return Condition(c.field, f, c.op, _convert(c, f, value))


_OP_ORDER = tuple(Op)


def resolve_order(spec: ListSpec, item: OrderItem) -> Field:
    return _field(spec, item.field, item.column, "order")
