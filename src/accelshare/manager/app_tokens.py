"""Single use of the apps origin's hand-off tokens across manager replicas.

A hand-off token (:mod:`accelshare.api.app_origin`) may be redeemed once.  Each replica
remembers the tokens it redeemed, but a token replayed to *another* replica sharing the
database must be refused too, so the redeeming replica records the token's random id in
``used_app_tokens`` (primary key: a second insert of the same id fails on every replica,
PostgreSQL's concurrent ones included).  Rows are kept until the token has expired (plus
:data:`CLOCK_SLACK_S` for the replicas' clocks) and pruned by the next redemption.

    used = DbUsedTokens(db)
    await used.claim(nonce, expires_at)   # True the first time, False after
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from .clock import utcnow
from .db import Database
from .models import UsedAppToken

__all__ = ["CLOCK_SLACK_S", "DbUsedTokens"]

#: Rows outlive their token by this much, so a replica whose clock is behind still
#: finds a token another replica redeemed (it would take it for unexpired).
CLOCK_SLACK_S = 60.0


class DbUsedTokens:
    """The used hand-off tokens, in the manager's database (shared by its replicas)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def claim(self, nonce: str, expires_at: float) -> bool:
        """Record ``nonce`` as used; False if it already was (here or on another replica)."""
        keep_until = datetime.fromtimestamp(expires_at, UTC) + timedelta(seconds=CLOCK_SLACK_S)
        try:
            async with self.db.begin(write=True) as db:
                await db.execute(sa.delete(UsedAppToken).where(UsedAppToken.expires_at < utcnow()))
                db.add(UsedAppToken(nonce=nonce, expires_at=keep_until))
                await db.flush()
        except IntegrityError:
            return False
        return True

    async def count(self) -> int:
        """The rows kept (for tests and checks)."""
        async with self.db.begin() as db:
            return int(await db.scalar(sa.select(sa.func.count()).select_from(UsedAppToken)) or 0)
