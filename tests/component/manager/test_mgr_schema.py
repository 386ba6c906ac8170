"""The packaged Alembic migrations produce exactly the models' schema (SQLite and PostgreSQL)."""

from __future__ import annotations

import asyncio
import uuid
from decimal import Decimal
from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy.engine import Connection

from accelshare.common import ResourceSlot
from accelshare.manager.db import Database
from accelshare.manager.models import (
    Agent,
    AgentHeldRevision,
    AgentStatus,
    Base,
    Domain,
    Group,
    Kernel,
    Keypair,
    KeypairResourcePolicy,
    ScalingGroup,
    ScalingGroupForDomain,
    ScalingGroupForGroup,
    ScalingGroupForKeypair,
    Session,
    User,
    email_matches,
)
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
        {"map_views": {"cuda": {"devices": []}}},  # a parsed column changed: +1
        {"map_views": {"cuda": {"devices": []}}},  # the same value again: unchanged
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


def _before_0012(table: sa.Table, renamed: str) -> sa.Table:
    """``table`` as revision 0011 left it (0012 renamed its ``device_allocs`` to ``renamed``)."""
    columns = []
    for column in table.columns:
        copy = column._copy()
        if column.name == renamed:
            copy.name = copy.key = "device_allocs"
        columns.append(copy)
    return sa.Table(table.name, sa.MetaData(), *columns)


AGENTS_0011 = _before_0012(Agent.__table__, "map_views")
KERNELS_0011 = _before_0012(Kernel.__table__, "allocation")
VIEWS = {"cuda": {"devices": [{"device_id": "gpu0", "capacity": "1", "allocated": "0.2"}]}}
ALLOCATION = {"cuda.shares": {"gpu0": "0.2"}}


async def _seed(database: Database, *, domains: list[str], scaling_groups: list[str]) -> None:
    """What an older revision's bootstrap made (the tables it had): a domain each, a
    scaling group each, a policy, and in the first domain a project with a user and its
    keypair."""
    async with database.connect(write=True) as conn:
        for name in domains:
            await conn.execute(sa.insert(Domain).values(name=name))
        for name in scaling_groups:
            await conn.execute(sa.insert(ScalingGroup).values(name=name))
        await conn.execute(sa.insert(KeypairResourcePolicy).values(name="default"))
        user_id = uuid.uuid4()
        await conn.execute(
            sa.insert(User).values(
                id=user_id, email="u@x.org", password_hash="x", domain_name=domains[0]
            )
        )
        await conn.execute(sa.insert(Group).values(name="default", domain_name=domains[0]))
        await conn.execute(
            sa.insert(Keypair).values(
                access_key="AKIA0000000000000001",
                secret_key="s" * 40,
                user_id=user_id,
                resource_policy="default",
            )
        )


async def _revisions(database: Database, agent_id: str) -> tuple[int, int]:
    """The agent's views revision and (SQLite; 0 on PostgreSQL) held revision."""
    async with database.connect() as conn:
        views = (
            await conn.execute(sa.select(Agent.views_revision).where(Agent.id == agent_id))
        ).scalar_one()
        held = (
            await conn.execute(
                sa.select(AgentHeldRevision.revision).where(AgentHeldRevision.agent_id == agent_id)
            )
        ).scalar_one_or_none()
    return views, held or 0


async def _write(database: Database, statement: sa.Executable) -> None:
    async with database.connect(write=True) as conn:
        await conn.execute(statement)


async def test_0012_renames_the_columns_keeping_values_and_triggers(database: Database) -> None:
    """An agent's heartbeat views and a kernel's allocation written at 0011 come through
    the rename (and back, on a downgrade) unchanged, and the revision triggers over
    those columns keep counting under either name."""
    await upgrade_schema(database, "0011")
    await _seed(database, domains=["default"], scaling_groups=["default"])
    sqlite = database.dialect == "sqlite"
    async with database.connect(write=True) as conn:
        user_id = (await conn.execute(sa.select(User.id))).scalar_one()
        group_id = (await conn.execute(sa.select(Group.id))).scalar_one()
        access_key = (await conn.execute(sa.select(Keypair.access_key))).scalar_one()
        await conn.execute(
            sa.insert(AGENTS_0011).values(
                id="i-old",
                status=AgentStatus.ALIVE,
                scaling_group="default",
                address="tcp://127.0.0.1:6001",
                device_allocs=VIEWS,
            )
        )
        session_id = uuid.uuid4()
        await conn.execute(
            sa.insert(Session).values(
                id=session_id,
                name="s1",
                access_key=access_key,
                user_id=user_id,
                group_id=group_id,
                domain_name="default",
                image="python",
                scaling_group="default",
                requested_slots=ResourceSlot({"cuda.shares": Decimal("0.2")}),
            )
        )
        await conn.execute(
            sa.insert(KERNELS_0011).values(
                id=uuid.uuid4(),
                session_id=session_id,
                agent_id="i-old",
                image="python",
                requested_slots=ResourceSlot({"cuda.shares": Decimal("0.2")}),
                device_allocs=ALLOCATION,
            )
        )
    views_0, held_0 = await _revisions(database, "i-old")
    assert held_0 == (1 if sqlite else 0)  # the kernel's insert

    assert (await upgrade_schema(database)).is_current
    async with database.connect() as conn:
        assert (await conn.execute(sa.select(Agent.map_views))).scalar_one() == VIEWS
        assert (await conn.execute(sa.select(Kernel.allocation))).scalar_one() == ALLOCATION
    assert await _revisions(database, "i-old") == (views_0, held_0)  # the rename wrote nothing
    await _write(database, sa.update(Agent).values(map_views={}))
    await _write(database, sa.update(Agent).values(map_views={}))  # the same value: unchanged
    await _write(database, sa.update(Kernel).values(allocation={"cuda.shares": {"gpu0": "0.3"}}))
    assert await _revisions(database, "i-old") == (views_0 + 1, held_0 + (1 if sqlite else 0))
    assert await schema_diff(database) == []

    def down(connection: Connection) -> None:
        cfg = alembic_config()
        cfg.attributes["connection"] = connection
        command.downgrade(cfg, "0011")

    async with database.connect(write=True) as conn:
        await conn.run_sync(down)
    assert (await get_schema_state(database)).current == "0011"
    async with database.connect() as conn:
        assert (await conn.execute(sa.select(AGENTS_0011.c.device_allocs))).scalar_one() == {}
        assert (await conn.execute(sa.select(KERNELS_0011.c.device_allocs))).scalar_one() == {
            "cuda.shares": {"gpu0": "0.3"}
        }
    await _write(database, sa.update(AGENTS_0011).values(device_allocs=VIEWS))
    await _write(database, sa.update(KERNELS_0011).values(device_allocs=ALLOCATION))
    assert await _revisions(database, "i-old") == (views_0 + 2, held_0 + (2 if sqlite else 0))
    assert (await upgrade_schema(database)).is_current


async def test_0013_opens_every_scaling_group_to_every_domain(database: Database) -> None:
    """A cluster upgraded to the association tables keeps letting every user use every
    scaling group: each one is associated with each domain; nothing with a group or a
    keypair.  The downgrade drops the tables."""
    await upgrade_schema(database, "0012")
    await _seed(database, domains=["default", "lab"], scaling_groups=["default", "gpu"])
    assert (await upgrade_schema(database)).is_current
    async with database.connect() as conn:
        pairs = await conn.execute(
            sa.select(ScalingGroupForDomain.scaling_group, ScalingGroupForDomain.domain)
        )
        assert sorted(tuple(p) for p in pairs) == [
            ("default", "default"),
            ("default", "lab"),
            ("gpu", "default"),
            ("gpu", "lab"),
        ]
        for table in (ScalingGroupForGroup, ScalingGroupForKeypair):
            count = await conn.execute(sa.select(sa.func.count()).select_from(table))
            assert count.scalar_one() == 0
    assert await schema_diff(database) == []

    def down(connection: Connection) -> None:
        cfg = alembic_config()
        cfg.attributes["connection"] = connection
        command.downgrade(cfg, "0012")

    async with database.connect(write=True) as conn:
        await conn.run_sync(down)
    state = await get_schema_state(database)
    assert state.current == "0012"
    assert not state.tables & {"sgroups_for_domains", "sgroups_for_groups", "sgroups_for_keypairs"}
    assert (await upgrade_schema(database)).is_current


async def test_associations_go_with_their_scaling_group_domain_group_or_keypair(
    database: Database,
) -> None:
    """ON DELETE CASCADE on every foreign key of the association tables."""
    await upgrade_schema(database)
    await _seed(database, domains=["default"], scaling_groups=["default", "gpu"])
    async with database.connect(write=True) as conn:
        group_id = (await conn.execute(sa.select(Group.id))).scalar_one()
        for sg in ("default", "gpu"):
            await conn.execute(
                sa.insert(ScalingGroupForGroup).values(scaling_group=sg, group=group_id)
            )
            await conn.execute(
                sa.insert(ScalingGroupForKeypair).values(
                    scaling_group=sg, access_key="AKIA0000000000000001"
                )
            )
        await conn.execute(sa.delete(ScalingGroup).where(ScalingGroup.name == "gpu"))

    async def left(table: type[object]) -> int:
        async with database.connect() as conn:
            return (await conn.execute(sa.select(sa.func.count()).select_from(table))).scalar_one()

    assert (await left(ScalingGroupForDomain), await left(ScalingGroupForGroup)) == (0, 1)
    assert await left(ScalingGroupForKeypair) == 1
    async with database.connect(write=True) as conn:
        await conn.execute(sa.delete(Keypair))
        await conn.execute(sa.delete(Group))
        await conn.execute(
            sa.insert(ScalingGroupForDomain).values(scaling_group="default", domain="default")
        )
        await conn.execute(sa.delete(User))
        await conn.execute(sa.delete(Domain))
    for table in (ScalingGroupForDomain, ScalingGroupForGroup, ScalingGroupForKeypair):
        assert await left(table) == 0
