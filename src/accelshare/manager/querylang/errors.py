"""The one error the query language raises: bad syntax, unknown field, wrong value type,
operator not allowed, too long or too deep.  A :class:`ValueError`, so the API answers it
as the caller's mistake (a GraphQL error / 400), never as a server error."""

from __future__ import annotations

__all__ = ["QueryError"]


class QueryError(ValueError):
    """``argument`` is ``filter`` or ``order``; ``column`` is 1-based (None: the whole
    expression)."""

    def __init__(
        self,
        argument: str,
        message: str,
        *,
        column: int | None,
        expected: str,
        received: str,
    ) -> None:
        self.argument = argument
        self.column = column
        self.expected = expected
        self.received = received
        where = f" at column {column}" if column is not None else ""
        super().__init__(f"{argument}{where}: {message}; expected {expected}, received {received}")
