"""A database that cannot be reached or drops the connection is a 503 problem+json with
``Retry-After``, not a 500; other database errors stay 500s.

Real failures: on PostgreSQL a request waiting inside the database has its connection
terminated, and connections are refused (``ALLOW_CONNECTIONS false``); on SQLite the
database is held locked past the busy timeout.  Then a table of raised errors checks
the classification on its own.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import make_url

from accelshare.api.problems import install_problem_handlers, is_database_unavailable
from accelshare.manager.services.sessions import admission

from .cluster import Cluster, running_cluster
from .conftest import PG_ADMIN_URL, temporary_pg_database


def assert_unavailable(response: httpx.Response) -> None:
    assert response.status_code == 503, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert response.headers["retry-after"] == "2"
    body = response.json()
    assert (body["type"], body["reason"]) == (
        "/problems/service-unavailable",
        "database-unavailable",
    )
    assert body["detail"].startswith("The database is unavailable")


@pytest.fixture
async def pg(tmp_path: Path) -> AsyncIterator[tuple[Cluster, str]]:
    async with (
        temporary_pg_database() as url,
        running_cluster(url, tmp_path / "state", background=False) as cluster,
    ):
        yield cluster, str(make_url(url).database)


async def terminate_backends(admin: asyncpg.Connection, database: str, *spare: int) -> int:
    killed: int = await admin.fetchval(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
        " WHERE datname = $1 AND pid <> ALL($2::int[])",
        database,
        [*spare],
    )
    return killed


@pytest.mark.integration
async def test_a_connection_dropped_mid_request_is_a_503(pg: tuple[Cluster, str]) -> None:
    cluster, database = pg
    raw = make_url(PG_ADMIN_URL).set(drivername="postgresql", database=database)
    holder = await asyncpg.connect(raw.render_as_string(hide_password=False), timeout=5)
    admin = await asyncpg.connect(PG_ADMIN_URL, timeout=5)
    try:
        # hold the enqueue lock of the superadmin's key: its POST /session waits in PostgreSQL
        held = holder.transaction()
        await held.start()
        key = admission.enqueue_lock_key(cluster.creds.access_key)
        await holder.execute("SELECT pg_advisory_xact_lock($1)", key)
        creating = asyncio.create_task(cluster.create({"cpu": 1}, enqueueOnly=True))

        async def waiting() -> bool:
            count = await admin.fetchval(
                "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database"
                " WHERE d.datname = $1 AND l.locktype = 'advisory' AND NOT l.granted",
                database,
            )
            return creating.done() or count == 1

        await cluster.until(waiting, what="POST /session to wait for the enqueue lock")
        assert not creating.done()
        assert await terminate_backends(admin, database, holder.get_server_pid()) >= 1
        assert_unavailable(await asyncio.wait_for(creating, 20))
        await held.rollback()
    finally:
        await holder.close()
        await admin.close()
    # the pool replaces the dead connection: the retry the answer asked for succeeds
    retried = await cluster.create({"cpu": 1}, enqueueOnly=True)
    assert retried.status_code == 201, retried.text


@pytest.mark.integration
async def test_refused_connections_are_a_503_until_the_database_is_back(
    pg: tuple[Cluster, str],
) -> None:
    cluster, database = pg
    admin = await asyncpg.connect(PG_ADMIN_URL, timeout=5)
    try:
        await admin.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS false')
        await terminate_backends(admin, database)
        for method, path in (("GET", "/sessions"), ("POST", "/session"), ("GET", "/whoami")):
            assert_unavailable(await cluster.admin.request(method, path, json={"image": "x"}))
    finally:
        await admin.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS true')
        await admin.close()
    assert (await cluster.admin.get("/sessions")).status_code == 200


async def test_a_locked_sqlite_database_is_a_503(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'manager.db'}"
    async with running_cluster(
        url, tmp_path / "state", background=False, db={"busy-timeout": 0.2}
    ) as cluster:
        other = sqlite3.connect(tmp_path / "manager.db", isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")  # another process holds the write lock
            assert_unavailable(await cluster.create({"cpu": 1}, enqueueOnly=True))
            assert (await cluster.admin.get("/sessions")).status_code == 200  # reads go on
            other.execute("ROLLBACK")
        finally:
            other.close()
        assert (await cluster.create({"cpu": 1}, enqueueOnly=True)).status_code == 201


class DriverError(Exception):
    """Stands for asyncpg's errors, which carry ``sqlstate`` and ``severity``."""

    def __init__(self, sqlstate: str, severity: str = "ERROR") -> None:
        super().__init__(f"{severity}: {sqlstate}")
        self.sqlstate, self.severity = sqlstate, severity


def dbapi(cls: type[sa_exc.DBAPIError], orig: Exception, **kw: Any) -> sa_exc.DBAPIError:
    return cls("SELECT 1", {}, orig, **kw)


def wrapped(driver: Exception) -> sa_exc.DBAPIError:
    """As SQLAlchemy's asyncpg adapter raises them: its Error, the driver's as cause."""
    adapter = Exception(str(driver))
    adapter.__cause__ = driver
    return dbapi(sa_exc.DBAPIError, adapter)


CASES: list[tuple[str, BaseException, bool]] = [
    ("refused", ConnectionRefusedError(111, "Connect call failed"), True),
    ("reset", ConnectionResetError(104, "reset by peer"), True),
    ("dropped", dbapi(sa_exc.DBAPIError, Exception("closed"), connection_invalidated=True), True),
    ("operational", dbapi(sa_exc.OperationalError, Exception("database is locked")), True),
    ("interface", dbapi(sa_exc.InterfaceError, Exception("connection is closed")), True),
    ("pool-timeout", sa_exc.TimeoutError("QueuePool limit reached"), True),
    ("08006", wrapped(DriverError("08006")), True),
    ("57P01", wrapped(DriverError("57P01", "FATAL")), True),
    ("53300", wrapped(DriverError("53300", "FATAL")), True),
    ("fatal-55000", wrapped(DriverError("55000", "FATAL")), True),
    ("integrity", dbapi(sa_exc.IntegrityError, Exception("duplicate key")), False),
    ("syntax", wrapped(DriverError("42601")), False),
    ("plain-55000", wrapped(DriverError("55000")), False),
    ("no-result", sa_exc.NoResultFound("no row"), False),
    ("os-error", FileNotFoundError(2, "No such file"), False),
]


@pytest.mark.parametrize(("case", "error", "unavailable"), CASES, ids=[c[0] for c in CASES])
async def test_which_errors_mean_the_database_is_unavailable(
    case: str, error: BaseException, unavailable: bool
) -> None:
    assert is_database_unavailable(error) is unavailable
    app = FastAPI()
    install_problem_handlers(app)

    @app.get("/boom")
    async def boom() -> None:
        raise error

    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        response = await client.get("/boom")
    if unavailable:
        assert_unavailable(response)
    else:
        assert response.status_code == 500, response.text
        assert response.headers["content-type"] == "application/problem+json"
        assert "retry-after" not in response.headers
        assert (
            response.json()["detail"] == "The server hit an unexpected error; see the manager log."
        )
