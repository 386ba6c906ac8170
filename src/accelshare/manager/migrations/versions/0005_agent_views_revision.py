"""agents.views_revision and the trigger that bumps it

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-27 09:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from accelshare.manager.models.triggers import RevisionTrigger

# revision identifiers, used by Alembic.
revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# the trigger as this revision made it (0012 renamed ``device_allocs`` to ``map_views``
# and made it again)
AGENT_VIEWS = RevisionTrigger(
    "agents",
    "views_revision",
    ("available_slots", "runtime", "architecture", "images", "device_allocs"),
)


def upgrade() -> None:
    with op.batch_alter_table("agents", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column(
                "views_revision", sa.BigInteger(), server_default=sa.text("0"), nullable=False
            )
        )
    for statement in AGENT_VIEWS.create_ddl(op.get_bind().dialect.name):
        op.execute(statement)


def downgrade() -> None:
    for statement in AGENT_VIEWS.drop_ddl(op.get_bind().dialect.name):
        op.execute(statement)
    with op.batch_alter_table("agents", schema=None) as batch_op:
        batch_op.drop_column("views_revision")
