"""Declarative base and column types shared by every table.

* :class:`UTCDateTime` — timezone-aware UTC in and out on both databases (SQLite
  stores no offset; we store UTC and put the offset back on read).
* :class:`ResourceSlotJSON` — a :class:`~accelshare.common.ResourceSlot` stored as a JSON
  object of decimal *strings* (``{"cpu": "1", "cuda.shares": "0.2"}``); never floats.
* :data:`JSONDocument` — JSON on SQLite, JSONB on PostgreSQL.
* :func:`str_enum` — a ``StrEnum`` stored as its value in a VARCHAR (no native enum type:
  adding a status later needs no ALTER TYPE).

JSON columns are replaced, never mutated in place (no mutation tracking): assign a
new dict/``ResourceSlot``.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase
from sqlalchemy.types import TypeDecorator

from accelshare.common import ResourceSlot

__all__ = [
    "NAMING_CONVENTION",
    "Base",
    "JSONDocument",
    "ResourceSlotJSON",
    "UTCDateTime",
    "str_enum",
]

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

_NOTHING = object()  # equal to no value
_BOUND_SLOTS_MAX = 1024  # ResourceSlotJSON: request shapes remembered per dialect

JSONDocument = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


class Base(DeclarativeBase):
    metadata = sa.MetaData(naming_convention=NAMING_CONVENTION)


class UTCDateTime(TypeDecorator[datetime]):
    """Aware datetimes only; stored in UTC; returned aware (UTC)."""

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: pass a timezone-aware UTC datetime")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def bind_processor(self, dialect: Dialect) -> Callable[[Any], Any] | None:
        """The processor, remembering its last value: a bulk statement binds the same
        ``now`` in every row (several times), and SQLite's own ``DATETIME`` processor
        formats a string each time (~4 us).  Equal aware datetimes are the same instant,
        so they bind the same UTC value; a naive one never equals an aware one and still
        fails in :meth:`process_bind_param`."""
        process = super().bind_processor(dialect)
        if process is None:  # pragma: no cover - a TypeDecorator always has one
            return None
        last: tuple[Any, Any] = (_NOTHING, None)

        def remembered(value: Any) -> Any:
            nonlocal last
            seen, bound = last
            if value == seen and value is not None:
                return bound
            bound = process(value)
            last = (value, bound)
            return bound

        return remembered

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class ResourceSlotJSON(TypeDecorator[ResourceSlot]):
    """``ResourceSlot`` <-> ``{"slot": "decimal string"}``.

    A plain mapping is accepted on write (``{"cpu": 1}``) and normalised through
    ``ResourceSlot`` so the stored form is always canonical strings::

        {"cpu": Decimal("1.50"), "mem": 1073741824}  ->  {"cpu": "1.5", "mem": "1073741824"}
    """

    impl = JSONDocument
    cache_ok = True

    def process_bind_param(
        self, value: Mapping[str, Any] | None, dialect: Dialect
    ) -> dict[str, str] | None:
        if value is None:
            return None
        slot = value if isinstance(value, ResourceSlot) else ResourceSlot(value)
        return slot.to_json()

    def bind_processor(self, dialect: Dialect) -> Callable[[Any], Any] | None:
        """The processor, remembering what it bound for each slot's exact items (in
        order, so the stored text is the same): a bulk apply binds a few request shapes
        thousands of times, each a ``to_json`` and a JSON encode (~3.5 us; the key
        ~0.3 us).  Only ``ResourceSlot`` values (immutable); at most
        ``_BOUND_SLOTS_MAX`` shapes, forgotten together when full."""
        process = super().bind_processor(dialect)
        if process is None:  # pragma: no cover - a TypeDecorator always has one
            return None
        bound: dict[tuple[tuple[str, Decimal], ...], Any] = {}

        def remembered(value: Any) -> Any:
            if not isinstance(value, ResourceSlot):
                return process(value)
            key = tuple(value.items())
            try:
                return bound[key]
            except KeyError:
                pass
            result = process(value)
            if len(bound) >= _BOUND_SLOTS_MAX:
                bound.clear()
            bound[key] = result
            return result

        return remembered

    def process_result_value(self, value: Any, dialect: Dialect) -> ResourceSlot | None:
        if value is None:
            return None
        return ResourceSlot.from_json(value)


def str_enum(enum_type: type[enum.StrEnum], length: int = 32) -> sa.Enum:
    """A VARCHAR column holding the enum's *values* (validated on write)."""
    return sa.Enum(
        enum_type,
        native_enum=False,
        create_constraint=False,
        length=length,
        validate_strings=True,
        values_callable=lambda members: [m.value for m in members],
    )
