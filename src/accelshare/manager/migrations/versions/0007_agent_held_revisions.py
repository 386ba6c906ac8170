"""agent_held_revisions and, on SQLite, the kernels triggers that bump it

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-27 22:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from accelshare.manager.models.triggers import HeldRevisionTriggers

# revision identifiers, used by Alembic.
revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# the triggers as this revision made them (0012 renamed ``device_allocs`` to
# ``allocation`` and made them again)
KERNEL_HELD = HeldRevisionTriggers(
    "kernels",
    "agent_held_revisions",
    ("id", "agent_id", "status", "occupied_slots", "device_allocs"),
)


def upgrade() -> None:
    op.create_table(
        "agent_held_revisions",
        sa.Column("agent_id", sa.String(length=64), nullable=False),
        sa.Column("revision", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("agent_id", name=op.f("pk_agent_held_revisions")),
    )
    # (no rows to fill in: an agent without one reads as revision 0, and a scheduler
    # starts with an empty cache, so it reads every agent's kernels once anyway)
    for statement in KERNEL_HELD.create_ddl(op.get_bind().dialect.name):
        op.execute(statement)


def downgrade() -> None:
    for statement in KERNEL_HELD.drop_ddl(op.get_bind().dialect.name):
        op.execute(statement)
    op.drop_table("agent_held_revisions")
