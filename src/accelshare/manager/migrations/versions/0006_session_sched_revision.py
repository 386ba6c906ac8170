"""sessions.sched_revision, the trigger that bumps it, and the pending-read index covering it

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-27 10:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from accelshare.manager.models.triggers import SESSION_SCHED

# revision identifiers, used by Alembic.
revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("sessions", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column(
                "sched_revision", sa.BigInteger(), server_default=sa.text("0"), nullable=False
            )
        )
        batch_op.drop_index("ix_sessions_sgroup_status_created")
        batch_op.create_index(
            "ix_sessions_sgroup_status_created",
            ["scaling_group", "status", "created_at", "id", "sched_revision"],
            unique=False,
        )
    for statement in SESSION_SCHED.create_ddl(op.get_bind().dialect.name):
        op.execute(statement)


def downgrade() -> None:
    for statement in SESSION_SCHED.drop_ddl(op.get_bind().dialect.name):
        op.execute(statement)
    with op.batch_alter_table("sessions", schema=None) as batch_op:
        batch_op.drop_index("ix_sessions_sgroup_status_created")
        batch_op.create_index(
            "ix_sessions_sgroup_status_created",
            ["scaling_group", "status", "created_at"],
            unique=False,
        )
        batch_op.drop_column("sched_revision")
