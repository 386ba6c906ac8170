"""Opening the manager's store for the process that serves the API.

:func:`open_database` is what :func:`accelshare.api.app.create_manager_app` calls before
it builds the control plane: the database named by ``manager.toml``, its schema created
or upgraded to head (:func:`~.schema.ensure_schema`), and the first-start defaults and
superadmin (:func:`~.bootstrap.bootstrap`).  The API layer holds the result as an opaque
handle (health checks, the control plane's constructor); it never queries it.  A schema
this manager cannot work with raises :class:`SchemaError` (the server's launcher reports
it and exits).
"""

from __future__ import annotations

from .app_tokens import DbUsedTokens
from .bootstrap import bootstrap
from .clock import Clock, utcnow
from .config import ManagerConfig
from .db import Database
from .schema import SchemaError, ensure_schema

__all__ = ["SchemaError", "open_database", "shared_used_tokens"]


async def open_database(
    config: ManagerConfig, *, clock: Clock = utcnow, auto_upgrade: bool = True
) -> Database:
    """The database with its schema at head and the defaults bootstrapped (disposed
    again when either step fails)."""
    db = Database.from_config(config)
    try:
        await ensure_schema(db, auto_upgrade=auto_upgrade)
        await bootstrap(db, config, clock=clock)
    except BaseException:
        await db.dispose()
        raise
    return db


def shared_used_tokens(db: Database) -> DbUsedTokens:
    """The used app hand-off tokens, recorded in the database the replicas share."""
    return DbUsedTokens(db)
