"""Databases for manager tests: a SQLite file and a fresh PostgreSQL database per test.

PostgreSQL is the local server (``ACCELSHARE_TEST_PG``, default
``postgresql://postgres@127.0.0.1:5432/postgres``, trust auth); each test gets its own
``accelshare_test_<random>`` database, dropped afterwards.  The PostgreSQL cases are
marked ``integration`` and skip with the reason when the server cannot be reached.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from sqlalchemy.engine import make_url

from accelshare.manager.clock import FrozenClock
from accelshare.manager.config import ManagerConfig
from accelshare.manager.db import Database

from .cluster import Frozen, running_cluster

PG_ADMIN_URL = os.environ.get("ACCELSHARE_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


@asynccontextmanager
async def temporary_pg_database() -> AsyncIterator[str]:
    """Create ``accelshare_test_<random>``; yield its asyncpg SQLAlchemy URL; drop it."""
    try:
        admin = await asyncpg.connect(PG_ADMIN_URL, timeout=5)
    except (OSError, asyncpg.PostgresError) as e:
        pytest.skip(f"PostgreSQL is not reachable at {PG_ADMIN_URL}: {e}")
    name = f"accelshare_test_{uuid.uuid4().hex[:12]}"
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        url = make_url(PG_ADMIN_URL).set(drivername="postgresql+asyncpg", database=name)
        yield url.render_as_string(hide_password=False)
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


@pytest.fixture(
    params=["sqlite", pytest.param("postgresql", marks=pytest.mark.integration)],
)
async def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    if request.param == "sqlite":
        yield f"sqlite+aiosqlite:///{tmp_path / 'manager.db'}"
        return
    async with temporary_pg_database() as url:
        yield url


@pytest.fixture
async def database(db_url: str) -> AsyncIterator[Database]:
    db = Database.from_url(db_url)
    try:
        yield db
    finally:
        await db.dispose()


@pytest.fixture
def manager_config(db_url: str, tmp_path: Path) -> ManagerConfig:
    return ManagerConfig.model_validate(
        {
            "manager": {"data-dir": str(tmp_path / "state")},
            "db": {"url": db_url},
        }
    )


@pytest.fixture
async def cluster(db_url: str, tmp_path: Path) -> AsyncIterator[Any]:
    """A running manager with no agents yet (add them with ``cluster.add_agent``)."""
    from .cluster import running_cluster

    async with running_cluster(db_url, tmp_path / "state") as running:
        yield running


@pytest.fixture
async def frozen(db_url: str, tmp_path: Path) -> AsyncIterator[Frozen]:
    """A cluster whose passes run by hand (``run_once``) under a frozen clock."""
    clock = FrozenClock(datetime.now(UTC))
    async with running_cluster(db_url, tmp_path / "state", clock=clock, background=False) as c:
        yield c, clock
