"""Backend.AI's filter and order expressions -> :mod:`.nodes` (lark, LALR; no I/O).

Filter (``compute_session_list(filter: ...)``)::

    status == "RUNNING" & (name ilike "%train%" | image contains "cuda") & !priority < 5

* comparisons ``FIELD OP VALUE`` with ``==  !=  <  <=  >  >=  like  ilike  contains  in
  not in  is  isnot``; values: double-quoted strings (``\\"`` and ``\\\\`` escapes),
  numbers, ``true`` / ``false`` / ``null``, lists ``[v, ...]`` (for ``in`` / ``not in``);
* ``&`` (and), ``|`` (or), ``!`` (not), parentheses.  As in Backend.AI, ``&`` and ``|``
  have the same precedence and group to the right (``a & b | c`` is ``a & (b | c)``), and
  ``!`` applies to everything to its right (``!a & b`` is ``!(a & b)``): write
  parentheses where it matters.

Order (``order: "-created_at"``): comma-separated field names, each with an optional
``+`` (ascending, the default) or ``-`` (descending).
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

from lark import Lark, Token, Tree
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from .errors import QueryError
from .nodes import And, Compare, Expr, ListLiteral, Literal, Not, Op, Or, OrderItem, Scalar, Value

__all__ = ["MAX_DEPTH", "MAX_LENGTH", "parse_filter", "parse_order"]

MAX_LENGTH = 4096
"""Characters of one filter or order expression."""
MAX_DEPTH = 32
"""Nesting of alternating ``&`` / ``|`` / ``!`` groups in one filter."""

_FILTER_GRAMMAR = r"""
    ?start: expr
    ?expr: NOT expr              -> not_expr
         | term COMBINE expr     -> combine_expr
         | term
    ?term: compare
         | "(" expr ")"
    compare: CNAME OP value
           | CNAME NOT_IN value
    ?value: scalar
          | array
    array: "[" [scalar ("," scalar)*] "]"
    ?scalar: ESCAPED_STRING      -> string
           | SIGNED_NUMBER       -> number
           | ATOM                -> atom
    ATOM: "null" | "true" | "false"
    COMBINE: "&" | "|"
    NOT: "!"
    NOT_IN.2: /not\s+in(?![A-Za-z0-9_])/
    OP: "==" | "!=" | ">=" | "<=" | ">" | "<"
      | "contains" | "ilike" | "isnot" | "like" | "in" | "is"
    %import common.CNAME
    %import common.ESCAPED_STRING
    %import common.SIGNED_NUMBER
    %import common.WS
    %ignore WS
"""

_ORDER_GRAMMAR = r"""
    ?start: order
    order: [item ("," item)*]
    item: SIGN? CNAME
    SIGN: "+" | "-"
    %import common.CNAME
    %import common.WS
    %ignore WS
"""

_filter_parser = Lark(
    _FILTER_GRAMMAR, parser="lalr", maybe_placeholders=False, propagate_positions=True
)
_order_parser = Lark(_ORDER_GRAMMAR, parser="lalr", maybe_placeholders=False)

_TERMINALS = {
    "CNAME": "a field name",
    "OP": "an operator (== != < <= > >= like ilike contains in is isnot)",
    "NOT_IN": "not in",
    "ESCAPED_STRING": "a quoted string",
    "SIGNED_NUMBER": "a number",
    "ATOM": "true, false or null",
    "COMBINE": "& or |",
    "NOT": "!",
    "LPAR": "(",
    "RPAR": ")",
    "LSQB": "[",
    "RSQB": "]",
    "COMMA": ",",
    "SIGN": "+ or -",
    "$END": "the end of the expression",
}


def _expected(names: set[str] | frozenset[str] | None) -> str:
    words = sorted({_TERMINALS.get(n, n) for n in names or ()})
    return " or ".join(words) if words else "nothing more"


def _syntax_error(argument: str, text: str, e: UnexpectedInput) -> QueryError:
    if isinstance(e, UnexpectedCharacters):
        return QueryError(
            argument,
            "bad syntax",
            column=(e.pos_in_stream or 0) + 1,
            expected=_expected(e.allowed),
            received=repr(e.char),
        )
    if isinstance(e, UnexpectedToken):
        token = e.token
        at_end = token.type == "$END"
        column = len(text) + 1 if at_end or token.start_pos is None else token.start_pos + 1
        received = "the end of the expression" if at_end else repr(str(token))
        return QueryError(
            argument,
            "bad syntax",
            column=column,
            expected=_expected(e.expected),
            received=received,
        )
    if isinstance(e, UnexpectedEOF):
        return QueryError(
            argument,
            "bad syntax",
            column=len(text) + 1,
            expected=_expected(set(e.expected)),
            received="the end of the expression",
        )
    return QueryError(
        argument, "bad syntax", column=None, expected="a valid expression", received=repr(text)
    )


def _check_length(argument: str, text: str) -> None:
    if len(text) > MAX_LENGTH:
        raise QueryError(
            argument,
            "too long",
            column=MAX_LENGTH + 1,
            expected=f"at most {MAX_LENGTH} characters",
            received=f"{len(text)} characters",
        )


def parse_filter(text: str) -> Expr:
    """The tree of one filter expression; :class:`QueryError` when it is not one."""
    _check_length("filter", text)
    try:
        tree = _filter_parser.parse(text)
    except UnexpectedInput as e:
        raise _syntax_error("filter", text, e) from None
    return _Converter(text).expr(tree, 0)


def parse_order(text: str) -> tuple[OrderItem, ...]:
    """The items of one order expression (empty text: no order)."""
    _check_length("order", text)
    try:
        tree = _order_parser.parse(text)
    except UnexpectedInput as e:
        raise _syntax_error("order", text, e) from None
    items = []
    for item in tree.children:
        assert isinstance(item, Tree)
        tokens = [t for t in item.children if isinstance(t, Token)]
        sign = tokens[0] if len(tokens) == 2 else None
        name = tokens[-1]
        items.append(
            OrderItem(
                field=str(name),
                descending=sign is not None and str(sign) == "-",
                column=_column(sign if sign is not None else name),
            )
        )
    return tuple(items)


def _column(token: Token) -> int:
    """1-based character position in the whole expression (newlines count as one)."""
    return token.start_pos + 1 if token.start_pos is not None else 1


def _unquote(raw: str) -> str:
    """``"a\\"b"`` -> ``a"b``: ``\\"`` and ``\\\\`` are escapes; other backslashes stay."""
    body = raw[1:-1]
    out: list[str] = []
    i = 0
    while i < len(body):
        ch = body[i]
        if ch == "\\" and i + 1 < len(body) and body[i + 1] in '"\\':
            out.append(body[i + 1])
            i += 2
        else:
            out.append(ch)
            i += 1
    return "".join(out)


class _Converter:
    """lark's tree -> :mod:`.nodes`; ``&`` / ``|`` chains and ``!`` runs are walked in
    loops, so only alternating groups nest (up to :data:`MAX_DEPTH`)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def _too_deep(self, column: int) -> QueryError:
        return QueryError(
            "filter",
            "nested too deeply",
            column=column,
            expected=f"at most {MAX_DEPTH} nested groups",
            received="more",
        )

    def expr(self, tree: Tree[Token] | Token, depth: int) -> Expr:
        if depth > MAX_DEPTH:
            raise self._too_deep(_first_column(tree))
        assert isinstance(tree, Tree)
        if tree.data == "not_expr":
            negations = 0
            node: Tree[Token] | Token = tree
            while isinstance(node, Tree) and node.data == "not_expr":
                negations += 1
                node = node.children[1]
            inner = self.expr(node, depth + 1)
            return Not(inner) if negations % 2 else inner
        if tree.data == "combine_expr":
            op = str(tree.children[1])
            operands: list[Expr] = []
            node = tree
            while (
                isinstance(node, Tree)
                and node.data == "combine_expr"
                and str(node.children[1]) == op
            ):
                operands.append(self.expr(node.children[0], depth + 1))
                node = node.children[2]
            operands.append(self.expr(node, depth + 1))
            return And(tuple(operands)) if op == "&" else Or(tuple(operands))
        if tree.data == "compare":
            name, op_token, value = tree.children
            assert isinstance(name, Token)
            assert isinstance(op_token, Token)
            op = Op.NOT_IN if op_token.type == "NOT_IN" else Op(str(op_token))
            return Compare(field=str(name), op=op, value=self.value(value), column=_column(name))
        raise AssertionError(f"unknown filter node {tree.data!r}")  # pragma: no cover

    def value(self, tree: Tree[Token] | Token) -> Value:
        assert isinstance(tree, Tree)
        if tree.data == "array":
            items = tuple(self.scalar(c) for c in tree.children)
            start = getattr(tree.meta, "start_pos", None)
            return ListLiteral(items, start + 1 if start is not None else _first_column(tree))
        return self.scalar(tree)

    def scalar(self, tree: Tree[Token] | Token) -> Literal:
        assert isinstance(tree, Tree)
        token = tree.children[0]
        assert isinstance(token, Token)
        raw = str(token)
        value: Scalar
        if tree.data == "string":
            value = _unquote(raw)
            _check_text(value, _column(token))
        elif tree.data == "number":
            value = _number(raw, _column(token))
        else:
            value = {"null": None, "true": True, "false": False}[raw]
        return Literal(value, _column(token))


def _check_text(value: str, column: int) -> None:
    """Databases take no NUL in text, and nothing that is not UTF-8 (a lone surrogate)."""
    bad = "\x00" in value
    if not bad:
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            bad = True
    if bad:
        raise QueryError(
            "filter",
            "unusable character in a string",
            column=column,
            expected="text without NUL characters or lone surrogates",
            received=ascii(value[:40]),
        )


def _number(raw: str, column: int) -> int | Decimal:
    try:
        number = Decimal(raw)
    except InvalidOperation:  # pragma: no cover - SIGNED_NUMBER is a decimal literal
        raise QueryError(
            "filter", "bad number", column=column, expected="a number", received=raw
        ) from None
    if not number.is_finite() or abs(number.adjusted()) > 1000:
        raise QueryError(
            "filter",
            "number out of range",
            column=column,
            expected="a number of at most 1000 digits",
            received=raw[:40],
        )
    if number == number.to_integral_value() and "." not in raw and "e" not in raw.lower():
        return int(number)
    return number


def _first_column(tree: Tree[Token] | Token) -> int:
    if isinstance(tree, Token):
        return _column(tree)
    for token in tree.scan_values(lambda v: isinstance(v, Token)):
        return _column(token)
    return 1
