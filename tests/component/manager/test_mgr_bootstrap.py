"""First-start bootstrap: defaults, one superadmin, credentials written once (0600), no leaks."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
import sqlalchemy as sa

from accelshare.manager.bootstrap import AdminCredentials, BootstrapError, bootstrap
from accelshare.manager.config import ManagerConfig
from accelshare.manager.db import Database
from accelshare.manager.models import (
    Domain,
    Group,
    GroupMember,
    Keypair,
    KeypairResourcePolicy,
    ScalingGroup,
    ScalingGroupForDomain,
    User,
    UserRole,
)
from accelshare.manager.passwords import verify_password
from accelshare.manager.schema import upgrade_schema


async def count(db: Database, model: type[object]) -> int:
    async with db.begin() as session:
        return (await session.execute(sa.select(sa.func.count()).select_from(model))).scalar_one()


async def counts(db: Database) -> dict[str, int]:
    models: list[type[object]] = [
        Domain,
        Group,
        GroupMember,
        User,
        Keypair,
        KeypairResourcePolicy,
        ScalingGroup,
        ScalingGroupForDomain,
    ]
    return {m.__name__: await count(db, m) for m in models}


@pytest.fixture
async def schema(database: Database) -> Database:
    await upgrade_schema(database)
    return database


async def test_first_start_creates_defaults_and_a_superadmin(
    schema: Database, manager_config: ManagerConfig, caplog: pytest.LogCaptureFixture
) -> None:
    # Ours at DEBUG, SQLAlchemy at INFO (as with [db] echo = true); aiosqlite's own DEBUG
    # trace prints every statement's parameters and is not something to run in production.
    caplog.set_level(logging.INFO)
    caplog.set_level(logging.DEBUG, logger="accelshare")
    caplog.set_level(logging.INFO, logger="sqlalchemy.engine")
    result = await bootstrap(schema, manager_config)
    assert result.credentials_written
    assert set(result.created) == {
        "domain:default",
        "resource-policy:default",
        "scaling-group:default",
        "group:default/default",
        "superadmin:admin@accelshare.local",
    }
    path = manager_config.credentials_file
    assert result.credentials_file == path
    assert path.stat().st_mode & 0o777 == 0o600
    creds = AdminCredentials.from_env_file(path)

    async with schema.begin() as session:
        user = (await session.execute(sa.select(User))).scalar_one()
        keypair = (await session.execute(sa.select(Keypair))).scalar_one()
        member = (await session.execute(sa.select(GroupMember))).scalar_one()
        scaling_group = await session.get(ScalingGroup, "default")
    assert user.role is UserRole.SUPERADMIN
    assert user.email == creds.email == "admin@accelshare.local"
    assert verify_password(creds.password, user.password_hash)
    assert creds.password not in user.password_hash
    assert (keypair.access_key, keypair.secret_key) == (creds.access_key, creds.secret_key)
    assert keypair.user_id == user.id
    assert keypair.is_active
    assert keypair.is_admin
    assert member.user_id == user.id
    assert scaling_group is not None
    assert scaling_group.scheduler == "fifo"
    assert scaling_group.scheduler_opts["agent_selection_strategy"] == "dispersed"
    assert scaling_group.default_session_slots.to_json() == {"cpu": "1", "mem": "1073741824"}

    logged = caplog.text
    assert "INSERT INTO keypairs" in logged  # the SQL log was captured, without parameters
    for secret in (creds.secret_key, creds.password, creds.access_key):
        assert secret not in logged
    assert str(path) in logged


async def test_second_start_changes_nothing(
    schema: Database, manager_config: ManagerConfig
) -> None:
    await bootstrap(schema, manager_config)
    path = manager_config.credentials_file
    before, stat = path.read_bytes(), path.stat()
    snapshot = await counts(schema)
    again = await bootstrap(schema, manager_config)
    assert again.created == ()
    assert not again.credentials_written
    assert again.superadmin_email is None
    assert await counts(schema) == snapshot
    assert path.read_bytes() == before
    assert path.stat().st_mtime_ns == stat.st_mtime_ns


async def _domain_associations(db: Database) -> list[tuple[str, str]]:
    async with db.begin() as session:
        rows = await session.execute(
            sa.select(ScalingGroupForDomain.scaling_group, ScalingGroupForDomain.domain)
        )
        return [tuple(r) for r in rows]


async def test_the_default_scaling_group_opens_to_the_default_domain_once(
    schema: Database, manager_config: ManagerConfig
) -> None:
    """A fresh cluster's users may use its scaling group; an operator who closes it
    later (``dissociate-scaling-group``) is not overruled by the next start."""
    await bootstrap(schema, manager_config)
    assert await _domain_associations(schema) == [("default", "default")]
    async with schema.begin(write=True) as session:
        await session.execute(sa.delete(ScalingGroupForDomain))
    assert (await bootstrap(schema, manager_config)).created == ()
    assert await _domain_associations(schema) == []


async def test_a_deleted_file_is_not_rewritten(
    schema: Database, manager_config: ManagerConfig
) -> None:
    await bootstrap(schema, manager_config)
    manager_config.credentials_file.unlink()
    result = await bootstrap(schema, manager_config)
    assert not result.credentials_written
    assert not manager_config.credentials_file.exists()


async def test_an_existing_file_is_adopted_by_a_fresh_database(
    schema: Database, manager_config: ManagerConfig
) -> None:
    creds = AdminCredentials.generate("ops@example.com")
    path = manager_config.credentials_file
    path.parent.mkdir(parents=True)
    path.write_text(creds.to_env())
    result = await bootstrap(schema, manager_config)
    assert not result.credentials_written
    assert result.superadmin_email == "ops@example.com"
    assert path.read_text() == creds.to_env()
    async with schema.begin() as session:
        keypair = (await session.execute(sa.select(Keypair))).scalar_one()
    assert keypair.secret_key == creds.secret_key


async def test_email_clash_is_explained_and_leaves_no_file(
    schema: Database, manager_config: ManagerConfig
) -> None:
    await bootstrap(schema, manager_config)
    async with schema.begin(write=True) as session:
        await session.execute(sa.update(User).values(role=UserRole.USER))
    manager_config.credentials_file.unlink()
    with pytest.raises(BootstrapError, match="exists but is not a superadmin"):
        await bootstrap(schema, manager_config)
    assert not manager_config.credentials_file.exists()


async def test_concurrent_first_starts_make_one_superadmin(
    db_url: str, manager_config: ManagerConfig
) -> None:
    first, second = Database.from_url(db_url), Database.from_url(db_url)
    try:
        await upgrade_schema(first)
        results = await asyncio.gather(
            bootstrap(first, manager_config), bootstrap(second, manager_config)
        )
        assert [r.credentials_written for r in results].count(True) == 1
        assert await count(first, User) == 1
        assert await count(first, Keypair) == 1
        assert await count(first, Domain) == 1
        creds = AdminCredentials.from_env_file(manager_config.credentials_file)
        async with first.begin() as session:
            keypair = (await session.execute(sa.select(Keypair))).scalar_one()
        assert keypair.access_key == creds.access_key
    finally:
        await first.dispose()
        await second.dispose()


def test_data_dir_is_created(tmp_path: Path) -> None:
    config = ManagerConfig.model_validate({"manager": {"data-dir": str(tmp_path / "a" / "b")}})
    assert config.credentials_file.parent == tmp_path / "a" / "b"
