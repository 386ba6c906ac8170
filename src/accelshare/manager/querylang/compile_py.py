"""Filter and order trees -> Python, for lists served from memory (same semantics as
:mod:`.compile_sql`, SQL's three-valued logic included: a comparison with a missing
value is unknown, and ``!unknown`` is still unknown)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import cmp_to_key
from typing import Any, TypeVar

from .like import like_to_regex
from .nodes import And, Compare, Expr, Not, Op
from .parser import parse_filter, parse_order
from .spec import UNMATCHED, Condition, ListSpec, resolve, resolve_order

__all__ = ["compile_predicate", "filter_items", "predicate", "sort_items"]

_T = TypeVar("_T")
_Truth = bool | None  # None: unknown (SQL's NULL)
_Test = Callable[[Any], _Truth]


def _condition(cond: Condition) -> _Test:
    get = cond.field.get
    if get is None:
        raise AssertionError(f"field {cond.name} has no getter")  # pragma: no cover
    op, value = cond.op, cond.value

    def norm(v: Any) -> Any:
        return v.value if hasattr(v, "value") and not isinstance(v, bool) else v

    if op is Op.IS:
        return lambda item: get(item) is None if value is None else get(item) == value
    if op is Op.IS_NOT:
        return lambda item: get(item) is not None if value is None else get(item) != value
    if op in (Op.IN, Op.NOT_IN):
        wanted = {norm(v) for v in value if v is not UNMATCHED}
        inside = op is Op.IN

        def member(item: Any) -> _Truth:
            v = get(item)
            return None if v is None else (norm(v) in wanted) == inside

        return member
    if value is UNMATCHED:
        return lambda item: None if get(item) is None else op is Op.NE
    if op in (Op.LIKE, Op.ILIKE, Op.CONTAINS):
        regex = like_to_regex(value, ignore_case=op is Op.ILIKE) if op is not Op.CONTAINS else None

        def matches(s: str) -> bool:
            return value in s if regex is None else regex.fullmatch(s) is not None

        def like(item: Any) -> _Truth:
            v = get(item)
            return None if v is None else matches(str(v))

        return like
    target = norm(value)
    compare: dict[Op, Callable[[Any, Any], bool]] = {
        Op.EQ: lambda a, b: a == b,
        Op.NE: lambda a, b: a != b,
        Op.LT: lambda a, b: a < b,
        Op.LE: lambda a, b: a <= b,
        Op.GT: lambda a, b: a > b,
        Op.GE: lambda a, b: a >= b,
    }
    fn = compare[op]

    def cmp(item: Any) -> _Truth:
        v = get(item)
        return None if v is None else fn(norm(v), target)

    return cmp


def compile_predicate(expr: Expr, spec: ListSpec) -> _Test:
    if isinstance(expr, Compare):
        return _condition(resolve(spec, expr))
    if isinstance(expr, Not):
        inner = compile_predicate(expr.operand, spec)
        return lambda item: None if (r := inner(item)) is None else not r
    tests = [compile_predicate(e, spec) for e in expr.operands]
    if isinstance(expr, And):

        def all_of(item: Any) -> _Truth:
            unknown = False
            for t in tests:
                r = t(item)
                if r is False:
                    return False
                unknown = unknown or r is None
            return None if unknown else True

        return all_of

    def any_of(item: Any) -> _Truth:
        unknown = False
        for t in tests:
            r = t(item)
            if r is True:
                return True
            unknown = unknown or r is None
        return None if unknown else False

    return any_of


def predicate(text: str | None, spec: ListSpec) -> Callable[[Any], bool]:
    """True for the items ``text`` selects (None or blank: every item)."""
    if text is None or not text.strip():
        return lambda _item: True
    test = compile_predicate(parse_filter(text), spec)
    return lambda item: test(item) is True


def filter_items(items: Iterable[_T], text: str | None, spec: ListSpec) -> list[_T]:
    keep = predicate(text, spec)
    return [i for i in items if keep(i)]


def sort_items(items: Iterable[_T], text: str | None, spec: ListSpec) -> list[_T]:
    """Sorted by ``text`` (or the default order), then the tiebreak; missing values last
    ascending, first descending (as :func:`~.compile_sql.order_clauses`)."""
    order = parse_order(text) if text is not None and text.strip() else spec.default_order
    keys: list[tuple[Callable[[Any], Any], bool]] = []
    seen = set()
    for item in order:
        f = resolve_order(spec, item)
        assert f.get is not None
        keys.append((f.get, item.descending))
        seen.add(item.field)
    for name in spec.tiebreak:
        if name not in seen:
            getter = spec.fields[name].get
            assert getter is not None
            keys.append((getter, False))

    def compare(a: Any, b: Any) -> int:
        for get, descending in keys:
            x, y = get(a), get(b)
            if x == y:
                continue
            if x is None or y is None:  # None is the greatest
                result = 1 if x is None else -1
            elif x < y:
                result = -1
            else:
                result = 1
            return -result if descending else result
        return 0

    return sorted(items, key=cmp_to_key(compare))
