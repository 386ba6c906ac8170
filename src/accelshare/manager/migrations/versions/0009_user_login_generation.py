"""users.login_generation: console logins end at logout, password change, deactivation

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-28 16:20:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0009"
down_revision: str | Sequence[str] | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Plain ALTER TABLE (SQLite >= 3.35 adds and drops columns itself): a batch rebuild of
    # ``users`` would lose 0008's expression index on lower(email).
    op.add_column(
        "users",
        sa.Column("login_generation", sa.Integer(), server_default=sa.text("0"), nullable=False),
    )


def downgrade() -> None:
    op.drop_column("users", "login_generation")
