"""Database triggers the models rely on (created by ``create_all`` and by the migrations:
0005, 0006 and 0007 made them, 0012 made those of ``agents`` and ``kernels`` again over the
renamed columns).

Two revisions the scheduler's snapshot keys its caches by, bumped by the database
whenever an UPDATE changes one of the columns they stand for:

* ``agents.views_revision``: ``available_slots``, ``runtime``, ``architecture``,
  ``images``, ``map_views`` (what the snapshot parses of an agent: 13 kB of
  heartbeat views for an agent of 8 GPUs and 64 cores);
* ``sessions.sched_revision``: the columns the snapshot reads of a pending session
  (its request, owner, times, priority, options, image; set at enqueue and, today,
  never changed afterwards).

The snapshot reads every row's revision each pass and the columns themselves only where
the revision moved, so a writer that forgets to bump one cannot exist: the database
does it, for ORM and Core writes, in the writer's own statement and row (no other row
is locked).  On SQLite the trigger fires only for UPDATEs that set one of the columns;
on PostgreSQL ``BEFORE UPDATE OF <columns>`` likewise.

A third, SQLite only (:data:`KERNEL_HELD`): ``agent_held_revisions.revision`` of an
agent, bumped whenever a kernel row on it (before or after the write) is inserted,
deleted, or changes its id, agent, status, occupied slots or allocation — what
the snapshot's per-agent *held kernels* text is made of, so that text is read only for
agents whose revision moved.  It writes a row of its own small table (not the agent's
13 kB row, which SQLite would rewrite whole), and SQLite has one writer at a time, so
it locks nothing that was not locked.  PostgreSQL reads the kernels' row versions
(``xmin``) instead: a trigger there would lock the revision row of every agent a
kernel write touches until the writer's commit, and writers touching several agents
in different orders (bulk status moves, the scheduler's apply) could deadlock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import sqlalchemy as sa

__all__ = ["AGENT_VIEWS", "KERNEL_HELD", "SESSION_SCHED", "HeldRevisionTriggers", "RevisionTrigger"]


def _after_create(target: sa.Table | sa.MetaData, ddl: Callable[[str], Iterable[str]]) -> None:
    """Run ``ddl(dialect)``'s statements right after ``create_all`` created ``target``."""

    @sa.event.listens_for(target, "after_create")
    def _create(_: object, connection: sa.Connection, **__: object) -> None:
        for statement in ddl(connection.dialect.name):
            connection.exec_driver_sql(statement)


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
        _after_create(table, self.create_ddl)


AGENT_VIEWS = RevisionTrigger(
    "agents",
    "views_revision",
    ("available_slots", "runtime", "architecture", "images", "map_views"),
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


@dataclass(frozen=True)
class HeldRevisionTriggers:
    """SQLite: bump ``<target>.revision`` of the agent of every ``<table>`` row (its
    agent before and after the write) inserted, deleted or changed in ``columns`` (see
    the module docstring; nothing on PostgreSQL).

    Any status change bumps, also one within the resource-holding statuses (SCHEDULED
    -> ... -> RUNNING), after which the next pass reads that agent's text again for
    nothing: telling the two apart in the trigger (``status IN (...)`` twice a row) costs
    more than it saves (measured on bulk status moves)."""

    table: str
    target: str
    columns: tuple[str, ...]

    @property
    def names(self) -> tuple[str, str, str]:
        return (
            f"{self.table}_held_insert",
            f"{self.table}_held_update",
            f"{self.table}_held_delete",
        )

    def _bump(self, row: str, also: str = "") -> str:
        # INSERT ... SELECT needs its WHERE before ON CONFLICT (SQLite's parsing rule)
        return (
            f"INSERT INTO {self.target} (agent_id, revision) SELECT {row}.agent_id, 1"
            f" WHERE {row}.agent_id IS NOT NULL{also}"
            " ON CONFLICT (agent_id) DO UPDATE SET revision = revision + 1;"
        )

    def create_ddl(self, dialect: str) -> Iterable[str]:
        if dialect == "postgresql":
            return ()
        if dialect != "sqlite":
            raise ValueError(f"no {self.table} held-revision triggers for the {dialect!r} dialect")
        insert, update, delete = self.names
        changed = " OR ".join(f"NEW.{c} IS NOT OLD.{c}" for c in self.columns)
        return (
            f"CREATE TRIGGER {insert} AFTER INSERT ON {self.table} FOR EACH ROW"
            f" BEGIN {self._bump('NEW')} END",
            f"CREATE TRIGGER {update} AFTER UPDATE OF {', '.join(self.columns)} ON {self.table}"
            f" FOR EACH ROW WHEN {changed} BEGIN {self._bump('OLD')}"
            f" {self._bump('NEW', ' AND NEW.agent_id IS NOT OLD.agent_id')} END",
            f"CREATE TRIGGER {delete} AFTER DELETE ON {self.table} FOR EACH ROW"
            f" BEGIN {self._bump('OLD')} END",
        )

    def drop_ddl(self, dialect: str) -> Iterable[str]:
        if dialect == "postgresql":
            return ()
        return tuple(f"DROP TRIGGER IF EXISTS {name}" for name in self.names)

    def install(self, metadata: sa.MetaData) -> None:
        """Create the triggers once every table exists (``create_all``)."""
        _after_create(metadata, self.create_ddl)


KERNEL_HELD = HeldRevisionTriggers(
    "kernels",
    "agent_held_revisions",
    ("id", "agent_id", "status", "occupied_slots", "allocation"),
)
