"""Columns read as stored: JSON as its text, other values as the driver returns them."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from accelshare.common import ResourceSlot

__all__ = ["json_text", "parse_slots", "raw"]


def json_text(column: Any) -> sa.ColumnElement[str]:
    """A JSON column as its stored text (PostgreSQL: ``jsonb::text``, canonical)."""
    return sa.cast(column, sa.Text())


def raw(column: Any) -> sa.ColumnElement[Any]:
    """A UUID column as the driver returns it (SQLite: hex text; no ``uuid.UUID`` built)."""
    return sa.type_coerce(column, sa.String())


def parse_slots(obj: Any) -> ResourceSlot:
    return ResourceSlot.from_json(obj or {})
