"""What the API layer needs to know of the store's failures, without importing it.

* :data:`DATABASE_ERRORS` — the exception classes the store raises (the API maps them to
  503 when :func:`is_database_unavailable`, else to a 500);
* :func:`is_database_unavailable` — a lost or refused connection rather than a bug.
"""

from __future__ import annotations

from sqlalchemy import exc as sa_exc
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

__all__ = ["DATABASE_ERRORS", "is_database_unavailable"]

DATABASE_ERRORS: tuple[type[Exception], ...] = (SQLAlchemyError,)
"""The store's errors (SQLAlchemy's, which wrap the drivers')."""

# SQLSTATEs of a lost or refused connection: class 08 (connection exception),
# 57P01-57P03 (admin/crash shutdown, cannot connect now), 53300 (too many connections).
_UNAVAILABLE_SQLSTATES = ("08", "57P01", "57P02", "57P03", "53300")


def _driver_errors(exc: DBAPIError) -> list[BaseException]:
    """The DBAPI error and the driver's own (asyncpg's is the adapter's ``__cause__``)."""
    found: list[BaseException] = []
    error: BaseException | None = exc.orig
    while error is not None and len(found) < 3:
        found.append(error)
        error = error.__cause__
    return found


def is_database_unavailable(exc: BaseException) -> bool:
    """Is ``exc`` the database being unreachable, rather than a bug or bad data?

    True for: a connection SQLAlchemy found dropped (``connection_invalidated``, e.g.
    ``pg_terminate_backend`` mid-query); ``OperationalError`` / ``InterfaceError``
    (SQLite's "database is locked" too); a driver error whose SQLSTATE says the
    connection failed (class 08, 57P01-57P03, 53300) or whose severity is FATAL/PANIC
    (the server ended the session, e.g. "database is not accepting connections");
    the pool's ``TimeoutError`` and ``DisconnectionError``; and a socket
    ``ConnectionError`` (asyncpg raises ``ConnectionRefusedError`` as it is).
    An ``IntegrityError`` or a syntax error stays a 500.
    """
    if isinstance(exc, ConnectionError | sa_exc.DisconnectionError | sa_exc.TimeoutError):
        return True
    if not isinstance(exc, DBAPIError):
        return False
    if exc.connection_invalidated or isinstance(
        exc, sa_exc.OperationalError | sa_exc.InterfaceError
    ):
        return True
    for error in _driver_errors(exc):
        sqlstate = getattr(error, "sqlstate", None)
        if isinstance(sqlstate, str) and sqlstate.startswith(_UNAVAILABLE_SQLSTATES):
            return True
        if getattr(error, "severity", None) in ("FATAL", "PANIC"):
            return True
    return False
