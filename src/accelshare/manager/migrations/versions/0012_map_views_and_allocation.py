"""agents.device_allocs -> agents.map_views, kernels.device_allocs -> kernels.allocation

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-29 12:00:00

One word per concept: an agent's column holds the alloc-map views of its heartbeat, a
kernel's column its allocation.  A rename keeps every value; the triggers over these
columns are dropped first and made again over the new names (a PostgreSQL trigger
function's body names its columns as text, which ``RENAME COLUMN`` does not rewrite).
"""

from collections.abc import Sequence

from alembic import op

from accelshare.manager.models.triggers import HeldRevisionTriggers, RevisionTrigger

# revision identifiers, used by Alembic.
revision: str = "0012"
down_revision: str | Sequence[str] | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# (table, name before, name after)
RENAMES = (
    ("agents", "device_allocs", "map_views"),
    ("kernels", "device_allocs", "allocation"),
)


def _views(allocs: str) -> RevisionTrigger:
    return RevisionTrigger(
        "agents",
        "views_revision",
        ("available_slots", "runtime", "architecture", "images", allocs),
    )


def _held(allocs: str) -> HeldRevisionTriggers:
    return HeldRevisionTriggers(
        "kernels",
        "agent_held_revisions",
        ("id", "agent_id", "status", "occupied_slots", allocs),
    )


BEFORE = (_views("device_allocs"), _held("device_allocs"))
AFTER = (_views("map_views"), _held("allocation"))


def _rename(
    drop: Sequence[RevisionTrigger | HeldRevisionTriggers],
    renames: Sequence[tuple[str, str, str]],
    create: Sequence[RevisionTrigger | HeldRevisionTriggers],
) -> None:
    dialect = op.get_bind().dialect.name
    for trigger in drop:
        for statement in trigger.drop_ddl(dialect):
            op.execute(statement)
    # plain ALTER TABLE ... RENAME COLUMN on both databases (no table rebuild)
    for table, old, new in renames:
        op.alter_column(table, old, new_column_name=new)
    for trigger in create:
        for statement in trigger.create_ddl(dialect):
            op.execute(statement)


def upgrade() -> None:
    _rename(BEFORE, RENAMES, AFTER)


def downgrade() -> None:
    _rename(AFTER, [(table, new, old) for table, old, new in RENAMES], BEFORE)
