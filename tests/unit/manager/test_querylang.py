"""Backend.AI's filter / order mini-language: parser, checks, SQL and Python compilers.

The SQL compiler runs on an in-memory SQLite table; a Hypothesis property checks that it
selects exactly what the Python predicate selects, for random well-formed filters."""

from __future__ import annotations

import contextlib
import enum
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accelshare.manager.querylang import (
    MAX_DEPTH,
    MAX_LENGTH,
    And,
    Compare,
    Field,
    FieldType,
    ListLiteral,
    ListSpec,
    Literal,
    Not,
    Op,
    Or,
    OrderItem,
    QueryError,
    parse_filter,
    parse_order,
)
from accelshare.manager.querylang.compile_py import filter_items, predicate, sort_items
from accelshare.manager.querylang.compile_sql import apply_filter_and_order, filter_clause
from accelshare.manager.querylang.like import like_to_glob, like_to_regex


class Color(enum.StrEnum):
    RED = "RED"
    GREEN = "GREEN"


@dataclass
class Row:
    id: int
    name: str
    note: str | None
    size: int
    ok: bool
    color: Color
    at: datetime
    ref: uuid.UUID


metadata = sa.MetaData()
table = sa.Table(
    "things",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("name", sa.String(64), nullable=False),
    sa.Column("note", sa.String(64)),
    sa.Column("size", sa.Integer, nullable=False),
    sa.Column("ok", sa.Boolean, nullable=False),
    sa.Column("color", sa.String(16), nullable=False),
    sa.Column("at", sa.DateTime(), nullable=False),
    sa.Column("ref", sa.Uuid(), nullable=False),
)
c = table.c
SPEC = ListSpec(
    name="thing_list",
    fields={
        "id": Field(FieldType.INTEGER, c.id, lambda r: r.id),
        "name": Field(FieldType.STRING, c.name, lambda r: r.name),
        "note": Field(FieldType.STRING, c.note, lambda r: r.note, nullable=True),
        "size": Field(FieldType.INTEGER, c.size, lambda r: r.size),
        "ok": Field(FieldType.BOOLEAN, c.ok, lambda r: r.ok),
        "color": Field(
            FieldType.ENUM,
            c.color,
            lambda r: r.color,
            enum_type=Color,
            unmatched=frozenset({"BLUE"}),
        ),
        "at": Field(FieldType.DATETIME, c.at, lambda r: r.at),
        "ref": Field(FieldType.UUID, c.ref, lambda r: r.ref),
        "hidden": Field(FieldType.STRING, c.name, lambda r: r.name, filterable=False),
    },
    tiebreak=("id",),
)

NAMES = ["alpha", "Alpha", "beta_1", "b%ta", "gamma", "ALPHA-x", "delta*", "e?[x]"]
ROWS = [
    Row(
        id=i,
        name=NAMES[i % len(NAMES)],
        note=None if i % 3 == 0 else f"note {i % 4}",
        size=i * 7 % 11,
        ok=i % 2 == 0,
        color=Color.RED if i % 3 else Color.GREEN,
        at=datetime(2025, 1, 1 + i % 5, 12, tzinfo=UTC),
        ref=uuid.UUID(int=i),
    )
    for i in range(1, 25)
]


@pytest.fixture(scope="module")
def engine() -> Any:
    eng = sa.create_engine("sqlite://")
    metadata.create_all(eng)
    with eng.begin() as conn:
        conn.execute(
            table.insert(),
            [
                {
                    "id": r.id,
                    "name": r.name,
                    "note": r.note,
                    "size": r.size,
                    "ok": r.ok,
                    "color": r.color.value,
                    "at": r.at.replace(tzinfo=None),
                    "ref": r.ref,
                }
                for r in ROWS
            ],
        )
    return eng


def sql_ids(engine: Any, text: str | None, order: str | None = None) -> list[int]:
    stmt = apply_filter_and_order(sa.select(c.id), text, order, SPEC)
    with engine.connect() as conn:
        return [row[0] for row in conn.execute(stmt)]


def py_ids(text: str | None, order: str | None = None) -> list[int]:
    return [r.id for r in sort_items(filter_items(ROWS, text, SPEC), order, SPEC)]


# -- parser ---------------------------------------------------------------------------------
def test_a_filter_parses_to_its_tree() -> None:
    tree = parse_filter('status == "RUNNING" & name ilike "%x%"')
    assert tree == And(
        (
            Compare("status", Op.EQ, Literal("RUNNING", 11), 1),
            Compare("name", Op.ILIKE, Literal("%x%", 34), 23),
        )
    )


def test_and_or_group_to_the_right_and_not_takes_the_rest_as_in_backend_ai() -> None:
    a, b, cc = (Compare(n, Op.EQ, Literal(1, 0), 0) for n in "abc")

    def strip(e: Any) -> Any:  # columns aside
        if isinstance(e, Compare):
            return Compare(e.field, e.op, Literal(e.value.value, 0), 0)  # type: ignore[union-attr]
        if isinstance(e, Not):
            return Not(strip(e.operand))
        return type(e)(tuple(strip(o) for o in e.operands))

    assert strip(parse_filter("a == 1 & b == 1 | c == 1")) == And((a, Or((b, cc))))
    assert strip(parse_filter("a == 1 | b == 1 & c == 1")) == Or((a, And((b, cc))))
    assert strip(parse_filter("(a == 1 & b == 1) | c == 1")) == Or((And((a, b)), cc))
    assert strip(parse_filter("!a == 1 & b == 1")) == Not(And((a, b)))
    assert strip(parse_filter("!!a == 1")) == a
    assert strip(parse_filter("a == 1 & b == 1 & c == 1")) == And((a, b, cc))


def test_values() -> None:
    def value(text: str) -> Any:
        tree = parse_filter(f"x == {text}")
        assert isinstance(tree, Compare)
        assert isinstance(tree.value, Literal)
        return tree.value.value

    assert value("12") == 12
    assert value("-3") == -3
    assert value("1.50") == Decimal("1.50")
    assert value("1e3") == Decimal("1E+3")
    assert value("true") is True
    assert value("false") is False
    assert value("null") is None
    assert value(r'"a\"b\\c\d"') == 'a"b\\c\\d'
    tree = parse_filter('x not  in ["a", 2]')
    assert tree == Compare("x", Op.NOT_IN, ListLiteral((Literal("a", 12), Literal(2, 17)), 11), 1)
    assert parse_filter("x in []") == Compare("x", Op.IN, ListLiteral((), 6), 1)


@pytest.mark.parametrize(
    ("text", "column", "expected"),
    [
        ("name == ", 9, "a quoted string"),
        ("name = 1", 6, "an operator"),
        ("name == 1 &", 12, "a field name"),
        ("name == 1 & & x == 2", 13, "a field name"),
        ('(name == "x"', 13, ")"),
        ('name == "x" )', 13, "the end of the expression"),
        ('name == "x', 9, "a quoted string"),
        ("name == 1 $", 11, "& or |"),
        ("== 1", 1, "a field name"),
        ("", 1, "a field name"),
        ("x in [[1]]", 7, "a number"),
    ],
)
def test_syntax_errors_name_the_column_and_what_was_expected(
    text: str, column: int, expected: str
) -> None:
    with pytest.raises(QueryError) as info:
        parse_filter(text)
    assert info.value.column == column, str(info.value)
    assert expected in info.value.expected
    assert str(info.value).startswith(f"filter at column {column}: bad syntax")


def test_length_and_depth_are_bounded() -> None:
    with pytest.raises(QueryError, match="too long"):
        parse_filter("x == 1 & " * (MAX_LENGTH // 9) + "x == 1")
    deep = "x == 1"
    for i in range(MAX_DEPTH + 2):
        deep = f"x == 1 {'&|'[i % 2]} ({deep})"
    with pytest.raises(QueryError, match="nested too deeply"):
        parse_filter(deep)
    long_chain = " & ".join(["x == 1"] * 300)  # one level: fine
    assert len(parse_filter(long_chain).operands) == 300  # type: ignore[union-attr]
    assert parse_filter("!" * 1001 + "x == 1") == Not(Compare("x", Op.EQ, Literal(1, 1007), 1002))


def test_order() -> None:
    assert parse_order("-created_at") == (OrderItem("created_at", True, 1),)
    assert parse_order(" +name , -created_at,id") == (
        OrderItem("name", False, 2),
        OrderItem("created_at", True, 10),
        OrderItem("id", False, 22),
    )
    assert parse_order("") == ()
    with pytest.raises(
        QueryError, match=r"order at column 6: bad syntax; expected ,, received 'desc'"
    ):
        parse_order("name desc")
    with pytest.raises(QueryError, match="order at column 2"):
        parse_order("--x")


# -- checks -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "column", "message", "expected"),
    [
        ('nmae == "x"', 1, "unknown field of thing_list", "one of at, color, id, name"),
        ('hidden == "x"', 1, "unknown field", "one of"),
        ("name == 1", 9, "wrong value for name", "a quoted string"),
        ('size == "3"', 9, "wrong value for size", "an integer"),
        ("size == 1.5", 9, "wrong value for size", "an integer"),
        ('ok == "yes"', 7, "wrong value for ok", "true or false"),
        ('color == "PURPLE"', 10, "wrong value for color", "one of RED, GREEN, BLUE"),
        ('at < "yesterday"', 6, "wrong value for at", "ISO 8601"),
        ('ref == "not-a-uuid"', 8, "wrong value for ref", "UUID"),
        ('color like "R%"', 1, "operator not allowed for color (enum)", "== != in not in"),
        ("ok < true", 1, "operator not allowed for ok", "== != is isnot"),
        ("name is null", 1, "operator not allowed for name", "=="),
        ('name in "x"', 9, "in takes a list", "a list"),
        ('name == ["x"]', 9, "== takes a single value", "a single value"),
        ("note < null", 8, "wrong value for note", "null goes with"),
        ('note is "x"', 9, "wrong value for note", "null"),
        ('name in ["a", 1]', 15, "wrong value for name", "a quoted string"),
    ],
)
def test_check_errors(engine: Any, text: str, column: int, message: str, expected: str) -> None:
    for compile_ in (lambda t: filter_clause(t, SPEC), lambda t: predicate(t, SPEC)):
        with pytest.raises(QueryError) as info:
            compile_(text)
        assert info.value.column == column, str(info.value)
        assert message in str(info.value)
        assert expected in info.value.expected


def test_unknown_order_field() -> None:
    with pytest.raises(QueryError, match=r"order at column 8: unknown field .*received 'nope'"):
        apply_filter_and_order(sa.select(c.id), None, "+name, nope", SPEC)


# -- semantics: SQL and Python agree ------------------------------------------------------------
CASES: list[tuple[str, set[int] | None]] = [
    ('name == "alpha"', {8, 16, 24}),
    ('name like "alpha"', {8, 16, 24}),  # case-sensitive, also on SQLite
    ('name ilike "alpha"', {1, 8, 9, 16, 17, 24}),
    ('name like "b\\%ta"', {3, 11, 19}),  # escaped %
    ('name like "b_ta"', {3, 11, 19}),
    ('name like "beta\\_%"', {2, 10, 18}),
    ('name like "delta*"', {6, 14, 22}),  # GLOB metacharacters are literal
    ('name like "e?[x]"', {7, 15, 23}),
    ('name contains "%"', {3, 11, 19}),
    ('name contains "lph"', {1, 8, 9, 16, 17, 24}),
    ("note is null", {3, 6, 9, 12, 15, 18, 21, 24}),
    ("note == null", {3, 6, 9, 12, 15, 18, 21, 24}),
    ('note != "note 1"', None),
    ('!(note == "note 1")', None),  # unknown stays unknown
    ('color == "green"', {3, 6, 9, 12, 15, 18, 21, 24}),
    ('color == "BLUE"', set()),
    ('color != "BLUE"', set(range(1, 25))),
    ('color in ["BLUE", "RED"] & size > 8', None),
    ('color not in ["RED"]', {3, 6, 9, 12, 15, 18, 21, 24}),
    ('at >= "2025-01-04T12:00:00Z"', None),
    ('at < "2025-01-02"', None),
    ('ref == "00000000-0000-0000-0000-000000000005"', {5}),
    ("ok is true & size in [0, 1, 2]", None),
    ("ok isnot false | size < 3", None),
    ("id in []", set()),
    ("id not in []", set(range(1, 25))),
]


@pytest.mark.parametrize(("text", "expected"), CASES)
def test_sql_and_python_select_the_same_rows(
    engine: Any, text: str, expected: set[int] | None
) -> None:
    from_sql = sql_ids(engine, text)
    assert from_sql == py_ids(text)
    if expected is not None:
        assert set(from_sql) == expected


@pytest.mark.parametrize(
    "order", ["-size", "size,-id", "note", "-note", "+name", "-at, name", "color"]
)
def test_sql_and_python_order_the_same(engine: Any, order: str) -> None:
    assert sql_ids(engine, None, order) == py_ids(None, order)


def test_nulls_sort_last_ascending_and_first_descending(engine: Any) -> None:
    ascending = sql_ids(engine, None, "note")
    assert ascending[-8:] == [3, 6, 9, 12, 15, 18, 21, 24]
    assert sql_ids(engine, None, "-note")[:8] == [3, 6, 9, 12, 15, 18, 21, 24]


def test_values_are_bound_parameters_never_sql_text() -> None:
    clause = filter_clause('name == "x\'; DROP TABLE things; --"', SPEC)
    assert clause is not None
    compiled = clause.compile()
    assert "DROP" not in str(compiled)
    assert "x'; DROP TABLE things; --" in compiled.params.values()


def test_like_translations() -> None:
    assert like_to_glob("a%b_c\\%d*e?[f") == "a*b?c%d[*]e[?][[]f"
    assert like_to_regex("a%b_", ignore_case=True).fullmatch("AxxBy")
    assert not like_to_regex("a%b_", ignore_case=False).fullmatch("AxxBy")
    assert like_to_regex("trailing\\", ignore_case=False).fullmatch("trailing\\")


# -- fuzz ---------------------------------------------------------------------------------------
FIELDS = sorted(SPEC.fields)
scalars = st.one_of(
    st.text(max_size=8),
    st.integers(-5, 30),
    st.decimals(-10, 10, places=2, allow_nan=False),
    st.booleans(),
    st.none(),
    st.sampled_from(["RED", "green", "BLUE", "2025-01-03", "00000000-0000-0000-0000-000000000002"]),
)
values = st.one_of(scalars, st.lists(scalars, max_size=3))


def render_value(v: Any) -> str:
    if isinstance(v, list):
        return "[" + ", ".join(render_value(i) for i in v) + "]"
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return str(v)


exprs = st.recursive(
    st.builds(
        lambda f, op, v: f"{f} {op.value} {render_value(v)}",
        st.sampled_from([*FIELDS, "nope"]),
        st.sampled_from(list(Op)),
        values,
    ),
    lambda inner: st.one_of(
        st.builds(lambda e: f"!({e})", inner),
        st.builds(lambda a, op, b: f"({a}) {op} ({b})", inner, st.sampled_from("&|"), inner),
    ),
    max_leaves=6,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.text(alphabet=st.sampled_from(list('ab_=!<>&|()[]," \\%0.-9 likenotisnull')), max_size=40)
)
def test_random_text_raises_only_query_errors(text: str) -> None:
    for compile_ in (lambda t: filter_clause(t, SPEC), lambda t: predicate(t, SPEC)):
        with contextlib.suppress(QueryError):
            compile_(text)
    with contextlib.suppress(QueryError):
        parse_order(text)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=60))
def test_random_unicode_raises_only_query_errors(text: str) -> None:
    with contextlib.suppress(QueryError):
        filter_clause(text, SPEC)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(exprs)
def test_well_formed_filters_agree_or_fail_the_same(engine: Any, text: str) -> None:
    """Either both compilers refuse it with the same QueryError, or SQL (on SQLite) and
    Python select exactly the same rows."""
    refused: str | None = None
    try:
        expected = py_ids(text)
    except QueryError as e:
        refused = str(e)
    if refused is not None:
        with pytest.raises(QueryError) as info:
            sql_ids(engine, text)
        assert str(info.value) == refused
    else:
        assert sql_ids(engine, text) == expected
