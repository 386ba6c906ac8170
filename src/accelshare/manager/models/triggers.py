"""Database triggers the models rely on (created by ``create_all`` and by migration 0005).

``agents.views_revision`` is bumped by the database whenever an UPDATE changes one of
the columns the scheduler's snapshot parses (``available_slots``, ``runtime``,
``architecture``, ``images``, ``device_allocs``).  The snapshot reads every agent's
revision each pass and the columns themselves only for agents whose revision moved, so
a writer that forgets to bump it cannot exist: the database does it, for ORM and Core
writes, in the writer's own statement and row (no other row is locked).
"""

from __future__ import annotations

from collections.abc import Iterable

import sqlalchemy as sa

__all__ = ["VIEWS_REVISION_COLUMNS", "views_revision_ddl"]

VIEWS_REVISION_COLUMNS = ("available_slots", "runtime", "architecture", "images", "device_allocs")

_SQLITE = f"""
CREATE TRIGGER agents_views_revision
AFTER UPDATE OF {", ".join(VIEWS_REVISION_COLUMNS)} ON agents
FOR EACH ROW WHEN {" OR ".join(f"NEW.{c} IS NOT OLD.{c}" for c in VIEWS_REVISION_COLUMNS)}
BEGIN
    UPDATE agents SET views_revision = OLD.views_revision + 1 WHERE id = NEW.id;
END
"""

_POSTGRESQL_FUNCTION = f"""
CREATE OR REPLACE FUNCTION agents_views_revision() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF ({", ".join(f"NEW.{c}" for c in VIEWS_REVISION_COLUMNS)})
       IS DISTINCT FROM ({", ".join(f"OLD.{c}" for c in VIEWS_REVISION_COLUMNS)}) THEN
        NEW.views_revision := OLD.views_revision + 1;
    END IF;
    RETURN NEW;
END
$$
"""

_POSTGRESQL_TRIGGER = """
CREATE TRIGGER agents_views_revision BEFORE UPDATE ON agents
FOR EACH ROW EXECUTE FUNCTION agents_views_revision()
"""


def views_revision_ddl(dialect: str) -> Iterable[str]:
    """The statements that create the trigger on ``dialect`` (in order)."""
    if dialect == "postgresql":
        return (_POSTGRESQL_FUNCTION, _POSTGRESQL_TRIGGER)
    if dialect == "sqlite":
        return (_SQLITE,)
    raise ValueError(f"no agents_views_revision trigger for the {dialect!r} dialect")


def views_revision_drop_ddl(dialect: str) -> Iterable[str]:
    if dialect == "postgresql":
        return (
            "DROP TRIGGER IF EXISTS agents_views_revision ON agents",
            "DROP FUNCTION IF EXISTS agents_views_revision()",
        )
    return ("DROP TRIGGER IF EXISTS agents_views_revision",)


def install(table: sa.Table) -> None:
    """Create the trigger with the table (``create_all``)."""

    @sa.event.listens_for(table, "after_create")
    def _create(target: sa.Table, connection: sa.Connection, **_: object) -> None:
        for statement in views_revision_ddl(connection.dialect.name):
            connection.exec_driver_sql(statement)
