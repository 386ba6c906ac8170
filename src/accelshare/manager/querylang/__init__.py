"""Backend.AI's filter / order mini-language (``ps --filter 'status == "RUNNING"'``,
``order: "-created_at"``): :mod:`.parser` (lark) -> :mod:`.nodes`, checked against a
per-list :class:`~.spec.ListSpec`, compiled to SQLAlchemy (:mod:`.compile_sql`) or to a
Python predicate (:mod:`.compile_py`).  Every mistake is a :class:`QueryError` naming
the column.  No I/O here; see docs/manager.md, "Filter and order expressions"."""

from .errors import QueryError
from .nodes import And, Compare, Expr, ListLiteral, Literal, Not, Op, Or, OrderItem
from .parser import MAX_DEPTH, MAX_LENGTH, parse_filter, parse_order
from .spec import UNMATCHED, Condition, Field, FieldType, ListSpec, allowed_ops, resolve

__all__ = [
    "MAX_DEPTH",
    "MAX_LENGTH",
    "UNMATCHED",
    "And",
    "Compare",
    "Condition",
    "Expr",
    "Field",
    "FieldType",
    "ListLiteral",
    "ListSpec",
    "Literal",
    "Not",
    "Op",
    "Or",
    "OrderItem",
    "QueryError",
    "allowed_ops",
    "parse_filter",
    "parse_order",
    "resolve",
]
