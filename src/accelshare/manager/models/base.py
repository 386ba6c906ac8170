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
from collections.abc import Mapping
from datetime import UTC, datetime
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
