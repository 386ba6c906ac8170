"""sessions.tag: Backend.AI's free-text annotation of a session (``--tag``)

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-28 22:40:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0010"
down_revision: str | Sequence[str] | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Plain ALTER TABLE (a batch rebuild of ``sessions`` would drop its triggers).
    op.add_column("sessions", sa.Column("tag", sa.String(length=64), nullable=True))


def downgrade() -> None:
    op.drop_column("sessions", "tag")
