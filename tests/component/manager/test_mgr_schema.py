"""The packaged Alembic migrations produce exactly the models' schema (SQLite and PostgreSQL)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy.engine import Connection

from accelshare.manager.db import Database
from accelshare.manager.models import Base, Domain, User, email_matches
from accelshare.manager.models.triggers import KERNEL_HELD
from accelshare.manager.schema import (
    SchemaError,
    alembic_config,
    create_schema_oneshot,
    ensure_schema,
    get_schema_state,
    head_revision,
    upgrade_schema,
)

APP_TABLES = frozenset(Base.metadata.tables)


def _diff(connection: Connection) -> list[Any]:
    context = MigrationContext.configure(
        connection, opts={"compare_type": True, "compare_server_default": True}
    )
    return list(compare_metadata(context, Base.metadata))


async def schema_diff(db: Database) -> list[Any]:
    async with db.connect() as conn:
        return await conn.run_sync(_diff)


async def test_migrations_match_the_models(database: Database) -> None:
    state = await upgrade_schema(database)
    assert state.current == head_revision()
    assert state.tables == APP_TABLES
    assert await schema_diff(database) == []


async def test_oneshot_matches_the_models_and_is_stamped(database: Database) -> None:
    state = await create_schema_oneshot(database)
    assert state.is_current
    assert state.tables == APP_TABLES
    assert await schema_diff(database) == []
    assert (await upgrade_schema(database)).is_current  # nothing left to run


async def test_oneshot_refuses_an_existing_schema(database: Database) -> None:
    await upgrade_schema(database)
    with pytest.raises(SchemaError, match="dbschema upgrade"):
        await create_schema_oneshot(database)


async def test_foreign_tables_are_not_touched(database: Database) -> None:
    async with database.connect(write=True) as conn:
        await conn.execute(sa.text("CREATE TABLE stray (id INTEGER PRIMARY KEY)"))
    with pytest.raises(SchemaError, match="stray"):
        await create_schema_oneshot(database)
    with pytest.raises(SchemaError, match="no Alembic revision"):
        await upgrade_schema(database)


async def test_downgrade_to_nothing_and_back(database: Database) -> None:
    assert (await upgrade_schema(database)).is_current

    def down(connection: Connection) -> None:
        cfg = alembic_config()
        cfg.attributes["connection"] = connection
        command.downgrade(cfg, "base")

    async with database.connect(write=True) as conn:
        await conn.run_sync(down)
    assert (await get_schema_state(database)).tables == frozenset()
    await upgrade_schema(database)
    assert await schema_diff(database) == []


async def test_ensure_schema_creates_then_keeps(database: Database) -> None:
    assert (await get_schema_state(database)).is_empty
    assert (await ensure_schema(database)).is_current
    assert (await ensure_schema(database, auto_upgrade=False)).is_current


async def test_ensure_schema_without_auto_upgrade_refuses_an_old_schema(database: Database) -> None:
    async with database.connect(write=True) as conn:
        await conn.execute(sa.text("CREATE TABLE alembic_version (version_num VARCHAR(32))"))
        await conn.execute(sa.text("INSERT INTO alembic_version VALUES ('0000_older')"))
    with pytest.raises(SchemaError, match="run 'accelshare mgr dbschema upgrade'"):
        await ensure_schema(database, auto_upgrade=False)


async def test_replicas_starting_together_create_the_schema_once(db_url: str) -> None:
    """Three managers (own connection pools) start on one empty database at the same
    moment: one creates the schema, the others wait for the schema lock and find it
    current (PostgreSQL; SQLite serialises writers by itself)."""
    replicas = [Database.from_url(db_url) for _ in range(3)]
    try:
        states = await asyncio.gather(*(ensure_schema(db) for db in replicas))
        assert all(state.is_current for state in states)
        assert await upgrade_schema(replicas[0]) == states[0]  # a later `dbschema upgrade`
    finally:
        for db in replicas:
            await db.dispose()


async def _views_revisions(database: Database) -> list[int]:
    """Write an agent row, then change it in several ways; its views_revision after each."""
    from accelshare.manager.models import Agent, ScalingGroup

    async with database.begin(write=True) as db:
        if await db.get(ScalingGroup, "default") is None:
            db.add(ScalingGroup(name="default"))
            await db.flush()
        db.add(Agent(id="i-rev", status="ALIVE", scaling_group="default", address="http://a"))
    seen: list[int] = []
    changes: list[dict[str, Any]] = [
        {"device_allocs": {"cuda": {"devices": []}}},  # a parsed column changed: +1
        {"device_allocs": {"cuda": {"devices": []}}},  # the same value again: unchanged
        {"last_heartbeat_at": sa.func.now(), "occupancy_revision": 7},  # not parsed
        {"images": ["python"], "runtime": "docker"},  # two at once: +1
        {"available_slots": {"cpu": "4"}},  # +1
    ]
    for values in changes:
        async with database.begin(write=True) as db:
            await db.execute(sa.update(Agent).where(Agent.id == "i-rev").values(**values))
            seen.append(
                (
                    await db.execute(sa.select(Agent.views_revision).where(Agent.id == "i-rev"))
                ).scalar_one()
            )
    return seen


async def test_the_views_revision_trigger_after_migrations(database: Database) -> None:
    await upgrade_schema(database)
    assert await _views_revisions(database) == [1, 1, 1, 2, 3]


async def test_the_views_revision_trigger_after_oneshot(database: Database) -> None:
    await create_schema_oneshot(database)
    assert await _views_revisions(database) == [1, 1, 1, 2, 3]


async def _triggers(database: Database) -> set[str]:
    async with database.connect() as conn:
        if conn.dialect.name == "postgresql":
            query = "SELECT tgname FROM pg_trigger WHERE NOT tgisinternal"
        else:
            query = "SELECT name FROM sqlite_master WHERE type = 'trigger'"
        return {name for (name,) in await conn.execute(sa.text(query))}


@pytest.mark.parametrize("make", ["migrations", "oneshot"])
async def test_the_revision_triggers_exist(database: Database, make: str) -> None:
    if make == "migrations":
        await upgrade_schema(database)
    else:
        await create_schema_oneshot(database)
    expected = {"agents_views_revision", "sessions_sched_revision"}
    if database.dialect == "sqlite":  # PostgreSQL reads the kernels' row versions instead
        expected |= {"kernels_held_insert", "kernels_held_update", "kernels_held_delete"}
        # as the models define them now (a migration made them, or create_all)
        async with database.connect() as conn:
            installed = await conn.execute(
                sa.text("SELECT sql FROM sqlite_master WHERE name LIKE 'kernels_held_%'")
            )
            assert {sql for (sql,) in installed} == set(KERNEL_HELD.create_ddl("sqlite"))
    assert await _triggers(database) == expected

    def down(connection: Connection) -> None:
        cfg = alembic_config()
        cfg.attributes["connection"] = connection
        command.downgrade(cfg, "0004")

    async with database.connect(write=True) as conn:
        await conn.run_sync(down)
    assert await _triggers(database) == set()


def _users_before_0009() -> sa.Table:
    """``users`` as revision 0008 left it (0009 added ``login_generation``)."""
    columns = [c._copy() for c in User.__table__.columns if c.name != "login_generation"]
    return sa.Table("users", sa.MetaData(), *columns)


async def _add_users(
    database: Database, *emails: str, table: sa.Table | None = None
) -> list[uuid.UUID]:
    ids = [uuid.uuid4() for _ in emails]
    users = User.__table__ if table is None else table
    async with database.connect(write=True) as conn:
        if (await conn.execute(sa.select(Domain.name))).first() is None:
            await conn.execute(sa.insert(Domain).values(name="default"))
        for user_id, email in zip(ids, emails, strict=True):
            await conn.execute(
                sa.insert(users).values(
                    id=user_id, email=email, password_hash="x", domain_name="default"
                )
            )
    return ids


@pytest.mark.parametrize("make", ["migrations", "oneshot"])
async def test_emails_are_unique_regardless_of_case(database: Database, make: str) -> None:
    await (upgrade_schema(database) if make == "migrations" else create_schema_oneshot(database))
    await _add_users(database, "UserA@Example.org")
    with pytest.raises(sa.exc.IntegrityError):
        await _add_users(database, "usera@example.ORG")
    async with database.connect() as conn:
        found = await conn.execute(sa.select(User.email).where(email_matches("USERA@example.org")))
        assert found.scalars().all() == ["UserA@Example.org"]


async def test_the_email_migration_refuses_clashes_and_names_them(database: Database) -> None:
    """Two accounts whose addresses differ only in case: the upgrade to 0008 refuses,
    naming every clashing address and user, and changes nothing; once the operator has
    given them distinct addresses it goes through."""
    await upgrade_schema(database, "0007")
    first, second, _, fourth = await _add_users(
        database,
        "UserA@x.org",
        "usera@x.org",
        "bob@x.org",
        "BOB@X.ORG",
        table=_users_before_0009(),
    )
    with pytest.raises(SchemaError) as caught:
        await upgrade_schema(database)
    message = str(caught.value)
    assert message.startswith(
        "Cannot upgrade to revision 0008: e-mail addresses become unique regardless of case,"
        " and 2 address(es) are used by more than one user:"
    )
    for email, user_id in (
        ("'UserA@x.org'", first),
        ("'usera@x.org'", second),
        ("'BOB@X.ORG'", fourth),
    ):
        assert f"{email} (user " in message
        assert str(user_id).replace("-", "") in message.replace("-", "")
    assert "nothing was changed" in message
    assert (await get_schema_state(database)).current == "0007"
    async with database.connect(write=True) as conn:
        await conn.execute(sa.update(User).where(User.id == second).values(email="usera+2@x.org"))
        await conn.execute(sa.update(User).where(User.id == fourth).values(email="bob2@x.org"))
    assert (await upgrade_schema(database)).is_current
    with pytest.raises(sa.exc.IntegrityError):
        await _add_users(database, "USERA@X.ORG")
