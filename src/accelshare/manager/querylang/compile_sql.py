"""Filter and order trees -> SQLAlchemy expressions (bound parameters only).

:func:`apply_filter_and_order` is what a list's service calls::

    stmt = apply_filter_and_order(sa.select(Session).where(visible), filter, order, SESSIONS)
    total = await db.scalar(sa.select(sa.func.count()).select_from(stmt.order_by(None).subquery()))

``like`` is case-sensitive on every database (SQLite's LIKE is not: it runs as GLOB
there), ``ilike`` is not; ``\\`` escapes ``%`` and ``_`` in both.
"""

from __future__ import annotations

from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql import ColumnElement
from sqlalchemy.sql.compiler import SQLCompiler

from .like import escape_like, like_to_glob, normalize_like
from .nodes import And, Compare, Expr, Not, Op
from .parser import parse_filter, parse_order
from .spec import UNMATCHED, Condition, ListSpec, resolve, resolve_order

__all__ = ["apply_filter_and_order", "filter_clause", "order_clauses"]

_S = TypeVar("_S", bound=sa.Select[Any])


class _CaseSensitiveLike(ColumnElement[bool]):
    """``column LIKE pattern ESCAPE '\\'``, case-sensitive on every dialect."""

    inherit_cache = False
    type = sa.Boolean()

    def __init__(self, column: ColumnElement[Any], pattern: str) -> None:
        self.column = column
        self.pattern = pattern


@compiles(_CaseSensitiveLike)
def _like_default(element: _CaseSensitiveLike, compiler: SQLCompiler, **kw: Any) -> str:
    like = element.column.like(normalize_like(element.pattern), escape="\\")
    return compiler.process(like, **kw)


@compiles(_CaseSensitiveLike, "sqlite")
def _like_sqlite(element: _CaseSensitiveLike, compiler: SQLCompiler, **kw: Any) -> str:
    glob = element.column.op("GLOB", is_comparison=True)(
        sa.bindparam(None, like_to_glob(element.pattern), type_=sa.String())
    )
    return compiler.process(glob, **kw)


def _condition(cond: Condition) -> ColumnElement[bool]:
    col: ColumnElement[Any] = cond.field.sql
    if col is None:
        raise AssertionError(f"field {cond.name} has no SQL column")  # pragma: no cover
    op, value = cond.op, cond.value
    if value is UNMATCHED:
        # a value no row has: == matches nothing, != every row with a value
        return sa.false() if op is Op.EQ else col.is_not(None)
    if op in (Op.IN, Op.NOT_IN):
        real = [v for v in value if v is not UNMATCHED]
        return col.in_(real) if op is Op.IN else col.not_in(real)
    if op is Op.IS:
        return col.is_(None) if value is None else sa.and_(col.is_not(None), col == value)
    if op is Op.IS_NOT:
        return col.is_not(value) if value is None else (col != value) | col.is_(None)
    if op is Op.LIKE:
        return _CaseSensitiveLike(col, value)
    if op is Op.ILIKE:
        return col.ilike(normalize_like(value), escape="\\")
    if op is Op.CONTAINS:
        return _CaseSensitiveLike(col, f"%{escape_like(value)}%")
    comparisons = {
        Op.EQ: col.__eq__,
        Op.NE: col.__ne__,
        Op.LT: col.__lt__,
        Op.LE: col.__le__,
        Op.GT: col.__gt__,
        Op.GE: col.__ge__,
    }
    result: ColumnElement[bool] = comparisons[op](value)
    return result


def compile_filter(expr: Expr, spec: ListSpec) -> ColumnElement[bool]:
    """The WHERE clause of a parsed filter (iterative over ``&`` / ``|`` operands)."""
    if isinstance(expr, Compare):
        return _condition(resolve(spec, expr))
    if isinstance(expr, Not):
        return sa.not_(compile_filter(expr.operand, spec))
    parts = [compile_filter(e, spec) for e in expr.operands]
    return sa.and_(*parts) if isinstance(expr, And) else sa.or_(*parts)


def filter_clause(text: str | None, spec: ListSpec) -> ColumnElement[bool] | None:
    """The WHERE clause of ``text`` (None or blank: no filter)."""
    if text is None or not text.strip():
        return None
    return compile_filter(parse_filter(text), spec)


def order_clauses(text: str | None, spec: ListSpec) -> list[Any]:
    """ORDER BY terms of ``text`` (or the spec's default order), then the tiebreak
    fields; NULLs sort last ascending and first descending on every database."""
    items = parse_order(text) if text is not None and text.strip() else spec.default_order
    terms: list[Any] = []
    seen: set[str] = set()
    for item in items:
        f = resolve_order(spec, item)
        seen.add(item.field)
        col = f.sql
        if item.descending:
            terms.append(col.desc().nulls_first() if f.nullable else col.desc())
        else:
            terms.append(col.asc().nulls_last() if f.nullable else col.asc())
    for name in spec.tiebreak:
        if name not in seen:
            terms.append(spec.fields[name].sql.asc())
    return terms


def apply_filter_and_order(stmt: _S, filter: str | None, order: str | None, spec: ListSpec) -> _S:
    """``stmt`` with the filter's WHERE and the order's ORDER BY (replacing any order it
    had); :class:`~.errors.QueryError` for a bad expression."""
    where = filter_clause(filter, spec)
    if where is not None:
        stmt = stmt.where(where)
    return stmt.order_by(None).order_by(*order_clauses(order, spec))
