"""Create and migrate the manager's database schema (Alembic, shipped in the package).

* :func:`create_schema_oneshot` — an empty database: ``create_all`` from the models, then
  stamp the Alembic head (as Backend.AI's ``mgr schema oneshot``);
* :func:`upgrade_schema` — run the migrations up to the head;
* :func:`ensure_schema` — what the manager does at start: oneshot when empty, upgrade
  when behind (or refuse, when ``auto_upgrade`` is off);
* :func:`autogenerate_revision` — developer tool: diff the models against a scratch
  SQLite database at the head and write a new revision file.

All of them run inside one transaction (DDL is transactional on both databases).
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection

from .db import Database
from .models import Base

__all__ = [
    "SchemaError",
    "SchemaState",
    "alembic_config",
    "autogenerate_revision",
    "create_schema_oneshot",
    "ensure_schema",
    "get_schema_state",
    "head_revision",
    "upgrade_schema",
]

SCRIPT_LOCATION = "accelshare.manager:migrations"
VERSION_TABLE = "alembic_version"


class SchemaError(RuntimeError):
    """The database is not in a state this operation can work with."""


@dataclass(frozen=True, slots=True)
class SchemaState:
    current: str | None  # the stamped Alembic revision, None when unstamped
    head: str
    tables: frozenset[str]  # application tables present (without alembic_version)

    @property
    def is_empty(self) -> bool:
        return self.current is None and not self.tables

    @property
    def is_current(self) -> bool:
        return self.current == self.head


def alembic_config() -> Config:
    """An in-memory Alembic configuration pointing at the packaged migrations."""
    cfg = Config()
    cfg.set_main_option("script_location", SCRIPT_LOCATION)
    return cfg


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None, "the packaged migrations have no head revision"
    return head


def _state(connection: Connection) -> SchemaState:
    current = MigrationContext.configure(connection).get_current_revision()
    tables = frozenset(sa.inspect(connection).get_table_names()) - {VERSION_TABLE}
    return SchemaState(current=current, head=head_revision(), tables=tables)


def _with_connection(cfg: Config, connection: Connection) -> Config:
    cfg.attributes["connection"] = connection
    return cfg


async def get_schema_state(db: Database) -> SchemaState:
    async with db.connect() as conn:
        return await conn.run_sync(_state)


# pg_advisory_xact_lock key of schema changes: two replicas (or a replica and
# `mgr dbschema upgrade`) starting on one database at once change it one after the other;
# the second then finds the schema current.  SQLite serialises writers by itself.
SCHEMA_LOCK_KEY = 0x61636365_6C736368  # "accelsch"


def _lock(connection: Connection) -> None:
    if connection.dialect.name == "postgresql":
        connection.execute(sa.select(sa.func.pg_advisory_xact_lock(SCHEMA_LOCK_KEY)))


def _oneshot(connection: Connection) -> SchemaState:
    _lock(connection)
    state = _state(connection)
    if state.current is not None:
        raise SchemaError(
            f"The database already has a schema (revision {state.current}); "
            "use 'accelshare mgr dbschema upgrade' to migrate it."
        )
    if state.tables:
        raise SchemaError(
            "The database holds tables that no migration created: "
            + ", ".join(sorted(state.tables))
            + ". Use an empty database."
        )
    Base.metadata.create_all(connection)
    command.stamp(_with_connection(alembic_config(), connection), "head")
    return _state(connection)


async def create_schema_oneshot(db: Database) -> SchemaState:
    """Create every table of an empty database and stamp the head revision."""
    async with db.connect(write=True) as conn:
        return await conn.run_sync(_oneshot)


def _upgrade(connection: Connection, target: str) -> SchemaState:
    _lock(connection)
    state = _state(connection)
    if state.current is None and state.tables:
        raise SchemaError(
            "The database has tables but no Alembic revision; it was not created by "
            "accelshare (or was created without stamping). Refusing to migrate it."
        )
    command.upgrade(_with_connection(alembic_config(), connection), target)
    return _state(connection)


async def upgrade_schema(db: Database, target: str = "head") -> SchemaState:
    """Run the migrations from the current revision (or from nothing) up to ``target``."""
    async with db.connect(write=True) as conn:
        return await conn.run_sync(_upgrade, target)


def _ensure(connection: Connection, auto_upgrade: bool) -> SchemaState:
    _lock(connection)  # the state is read under the lock: no two replicas both see "empty"
    state = _state(connection)
    if state.is_empty:
        return _oneshot(connection)
    if state.is_current:
        return state
    if not auto_upgrade:
        raise SchemaError(
            f"The database schema is at {state.current}, the manager needs {state.head}; "
            "run 'accelshare mgr dbschema upgrade' first."
        )
    return _upgrade(connection, "head")


async def ensure_schema(db: Database, *, auto_upgrade: bool = True) -> SchemaState:
    """At manager start: create an empty schema, upgrade an old one (or refuse); one
    transaction under the schema lock."""
    state = await get_schema_state(db)
    if state.is_current:
        return state  # the usual case: no write transaction, no lock
    async with db.connect(write=True) as conn:
        return await conn.run_sync(_ensure, auto_upgrade)


def _revision(connection: Connection, message: str, rev_id: str | None) -> None:
    command.upgrade(_with_connection(alembic_config(), connection), "head")
    command.revision(
        _with_connection(alembic_config(), connection),
        message=message,
        autogenerate=True,
        rev_id=rev_id,
    )


async def autogenerate_revision(message: str, rev_id: str | None = None) -> None:
    """Write a new revision into ``migrations/versions`` (a source checkout only)."""
    with tempfile.TemporaryDirectory() as tmp:
        db = Database.from_url(f"sqlite+aiosqlite:///{Path(tmp) / 'scratch.db'}")
        try:
            async with db.connect(write=True) as conn:
                await conn.run_sync(_revision, message, rev_id)
        finally:
            await db.dispose()
