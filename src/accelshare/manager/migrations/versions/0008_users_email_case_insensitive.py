"""users: e-mail addresses unique regardless of case (a unique index on lower(email))

Before this revision ``USERA@x`` and ``usera@x`` could be two accounts.  The upgrade
first looks for such addresses (the same ``lower(email)`` on more than one row, deleted
users included: their rows keep the address) and, if it finds any, refuses: nothing is
changed, and the error names every clashing address with its user's id, status and
creation time, so that the operator decides which account keeps the address (rename
the others, e.g. ``UPDATE users SET email = 'usera+old@x' WHERE id = '...'``) and runs
the upgrade again.  No account is merged or renamed automatically: which one a person
uses is not something a migration can know.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-28 16:30:00
"""

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

from accelshare.manager.schema import SchemaError

# revision identifiers, used by Alembic.
revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INDEX = "uq_users_email_lower"

_CLASHES = sa.text(
    "SELECT email, id, status, created_at FROM users WHERE lower(email) IN"
    " (SELECT lower(email) FROM users GROUP BY lower(email) HAVING count(*) > 1)"
    " ORDER BY lower(email), created_at, email"
)


class EmailClash(SchemaError):
    """Two or more users whose e-mail addresses differ only in case."""


def clash_report(rows: Sequence[Sequence[Any]]) -> str:
    groups: dict[str, list[str]] = {}
    for email, user_id, status, created_at in rows:
        groups.setdefault(str(email).lower(), []).append(
            f"{email!r} (user {user_id}, {status}, created {created_at})"
        )
    lines = [f"  {folded}: " + "; ".join(users) for folded, users in groups.items()]
    return (
        "Cannot upgrade to revision 0008: e-mail addresses become unique regardless of"
        f" case, and {len(groups)} address(es) are used by more than one user:\n"
        + "\n".join(lines)
        + "\nGive each of these users a distinct address (e.g. UPDATE users SET email ="
        " '<new address>' WHERE id = '<user id>'), then run the upgrade again; nothing"
        " was changed."
    )


def upgrade() -> None:
    rows = op.get_bind().execute(_CLASHES).all()
    if rows:
        raise EmailClash(clash_report(rows))
    with op.batch_alter_table("users", schema=None) as batch_op:
        batch_op.create_index(INDEX, [sa.text("lower(email)")], unique=True)


def downgrade() -> None:
    with op.batch_alter_table("users", schema=None) as batch_op:
        batch_op.drop_index(INDEX)
