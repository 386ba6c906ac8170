"""The syntax tree of Backend.AI's filter and order expressions (no I/O, no SQL).

Columns are 1-based character positions in the expression, for error messages."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from decimal import Decimal
from typing import TypeAlias

__all__ = [
    "And",
    "Compare",
    "Expr",
    "ListLiteral",
    "Literal",
    "Not",
    "Op",
    "Or",
    "OrderItem",
    "Scalar",
    "Value",
]

Scalar: TypeAlias = str | int | Decimal | bool | None


class Op(enum.StrEnum):
    EQ = "=="
    NE = "!="
    LT = "<"
    LE = "<="
    GT = ">"
    GE = ">="
    LIKE = "like"
    ILIKE = "ilike"
    CONTAINS = "contains"
    IN = "in"
    NOT_IN = "not in"
    IS = "is"
    IS_NOT = "isnot"


@dataclass(frozen=True, slots=True)
class Literal:
    value: Scalar
    column: int


@dataclass(frozen=True, slots=True)
class ListLiteral:
    items: tuple[Literal, ...]
    column: int


Value: TypeAlias = Literal | ListLiteral


@dataclass(frozen=True, slots=True)
class Compare:
    """``field op value``; ``column`` is the field's."""

    field: str
    op: Op
    value: Value
    column: int


@dataclass(frozen=True, slots=True)
class Not:
    operand: Expr


@dataclass(frozen=True, slots=True)
class And:
    operands: tuple[Expr, ...]


@dataclass(frozen=True, slots=True)
class Or:
    operands: tuple[Expr, ...]


Expr: TypeAlias = Compare | Not | And | Or


@dataclass(frozen=True, slots=True)
class OrderItem:
    field: str
    descending: bool
    column: int
