"""Hand-off tokens of the apps origin are single-use across manager replicas.

Two manager apps (two replicas) share one database (SQLite file, PostgreSQL): a token
redeemed on one is refused on the other within its ``token-ttl``; the used-token rows
are pruned once expired.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from accelshare.api.app_origin import AppOrigin, AppTokenError, HandOff
from accelshare.manager.app_tokens import CLOCK_SLACK_S, DbUsedTokens
from accelshare.manager.db import Database
from accelshare.manager.schema import ensure_schema

SID = "4f0c2d4e-1111-4222-8333-944455556666"
HANDOFF = HandOff(SID, "AKIAOWNER", "user-1", f"/session/{SID}/apps/web/")
SECRET = b"s" * 32


@pytest.fixture
async def schema(database: Database) -> Database:
    await ensure_schema(database, auto_upgrade=True)
    return database


def replica(db: Database) -> AppOrigin:
    """One manager replica's apps origin (sharing the cookie secret and the database)."""
    return AppOrigin.from_secret(SECRET, used_tokens=DbUsedTokens(db), token_ttl_s=30)


async def test_a_token_redeemed_on_one_replica_is_refused_on_another(
    schema: Database, db_url: str
) -> None:
    other_db = Database.from_url(db_url)  # the second replica's own engine
    try:
        first, second = replica(schema), replica(other_db)
        token = first.hand_off(HANDOFF)
        assert await first.redeem(token) == HANDOFF
        with pytest.raises(AppTokenError, match="already used"):
            await second.redeem(token)
        # The other way round, and at the same time: exactly one wins.
        token = second.hand_off(HANDOFF)
        results = await asyncio.gather(
            first.redeem(token), second.redeem(token), return_exceptions=True
        )
        assert sorted(type(r).__name__ for r in results) == ["AppTokenError", "HandOff"]
    finally:
        await other_db.dispose()


async def test_used_tokens_are_pruned_once_expired(schema: Database) -> None:
    used = DbUsedTokens(schema)
    now = time.time()
    assert await used.claim("old", now - CLOCK_SLACK_S - 5)  # expired, slack included
    assert await used.count() == 1
    assert await used.claim("recent", now - 5)  # expired, within the slack: kept
    assert await used.count() == 1  # each claim prunes what has expired: "old"
    assert not await used.claim("recent", now - 5)
    assert await used.claim("new", now + 30)
    assert await used.count() == 2
    assert not await used.claim("new", now + 30)


async def test_apps_of_a_manager_app_record_tokens_in_its_database(schema: Database) -> None:
    from accelshare.api.app import create_app
    from accelshare.api.auth import AuthSettings
    from accelshare.manager.assembly import shared_used_tokens
    from accelshare.manager.credentials import DBCredentialStore

    apps = AppOrigin.from_secret(SECRET)
    create_app(
        store=DBCredentialStore(schema),
        settings=AuthSettings(cookie_secret=SECRET),
        db=schema,
        used_tokens=shared_used_tokens(schema),
        apps=apps,
    )
    assert isinstance(apps.used_tokens, DbUsedTokens)
    await apps.redeem(apps.hand_off(HANDOFF))
    assert await DbUsedTokens(schema).count() == 1
