"""Database triggers the models rely on (created by ``create_all`` and by migrations 0005
and 0006).

Two revisions the scheduler's snapshot keys its caches by, bumped by the database
whenever an UPDATE changes one of the columns they stand for:

* ``agents.views_revision``: ``available_slots``, ``runtime``, ``architecture``,
  ``images``, ``device_allocs`` (what the snapshot parses of an agent: 13 kB of
  heartbeat views for an agent of 8 GPUs and 64 cores);
* ``sessions.sched_revision``: the columns the snapshot reads of a pending session
  (its request, owner, times, priority, options, image; set at enqueue and, today,
  never changed afterwards).

The snapshot reads every row's revision each pass and the columns themselves only where
the revision moved, so a writer that forgets to bump one cannot exist: the database
does it, for ORM and Core writes, in the writer's own statement and row (no other row
is locked).  On SQLite the trigger fires only for UPDATEs that set one of the columns;
on PostgreSQL ``BEFORE UPDATE OF <columns>`` likewise.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import sqlalchemy as sa

__all__ = ["AGENT_VIEWS", "SESSION_SCHED", "RevisionTrigger"]


@dataclass(frozen=True)
class RevisionTrigger:
    table: str
    revision: str
    columns: tuple[str, ...]
    key: str = "id"

    @property
    def name(self) -> str:
        return f"{self.table}_{self.revision}"

    def create_ddl(self, dialect: str) -> Iterable[str]:
        """The statements that create the trigger on ``dialect`` (in order)."""
        cols = self.columns
        if dialect == "sqlite":
            changed = " OR ".join(f"NEW.{c} IS NOT OLD.{c}" for c in cols)
            return (
                f"CREATE TRIGGER {self.name} AFTER UPDATE OF {', '.join(cols)} ON {self.table}"
                f" FOR EACH ROW WHEN {changed} BEGIN"
                f" UPDATE {self.table} SET {self.revision} = OLD.{self.revision} + 1"
                f" WHERE {self.key} = NEW.{self.key}; END",
            )
        if dialect == "postgresql":
            new = ", ".join(f"NEW.{c}" for c in cols)
            old = ", ".join(f"OLD.{c}" for c in cols)
            return (
                f"CREATE OR REPLACE FUNCTION {self.name}() RETURNS trigger LANGUAGE plpgsql AS $$"
                f" BEGIN IF ({new}) IS DISTINCT FROM ({old}) THEN"
                f" NEW.{self.revision} := OLD.{self.revision} + 1; END IF; RETURN NEW; END $$",
                f"CREATE TRIGGER {self.name} BEFORE UPDATE OF {', '.join(cols)} ON {self.table}"
                f" FOR EACH ROW EXECUTE FUNCTION {self.name}()",
            )
        raise ValueError(f"no {self.name} trigger for the {dialect!r} dialect")

    def drop_ddl(self, dialect: str) -> Iterable[str]:
        if dialect == "postgresql":
            return (
                f"DROP TRIGGER IF EXISTS {self.name} ON {self.table}",
                f"DROP FUNCTION IF EXISTS {self.name}()",
            )
        return (f"DROP TRIGGER IF EXISTS {self.name}",)

    def install(self, table: sa.Table) -> None:
        """Create the trigger with the table (``create_all``)."""

        @sa.event.listens_for(table, "after_create")
        def _create(target: sa.Table, connection: sa.Connection, **_: object) -> None:
            for statement in self.create_ddl(connection.dialect.name):
                connection.exec_driver_sql(statement)


AGENT_VIEWS = RevisionTrigger(
    "agents",
    "views_revision",
    ("available_slots", "runtime", "architecture", "images", "device_allocs"),
)
SESSION_SCHED = RevisionTrigger(
    "sessions",
    "sched_revision",
    (
        "access_key",
        "requested_slots",
        "created_at",
        "user_id",
        "group_id",
        "domain_name",
        "name",
        "priority",
        "session_type",
        "starts_at",
        "resource_opts",
        "designated_agent_id",
        "image",
        "scaling_group",
    ),
)
