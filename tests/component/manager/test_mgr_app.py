"""The manager app built from manager.toml: schema, bootstrap, then signed requests and login."""

from __future__ import annotations

from collections.abc import AsyncIterator, Generator
from datetime import UTC, datetime, timedelta

import httpx
import pytest
import sqlalchemy as sa
from fastapi import FastAPI

from accelshare.api.signing import sign_request
from accelshare.manager.bootstrap import AdminCredentials
from accelshare.manager.clock import FrozenClock
from accelshare.manager.config import ManagerConfig
from accelshare.manager.db import Database
from accelshare.manager.models import Keypair

T0 = datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC)


class Signer(httpx.Auth):
    def __init__(self, creds: AdminCredentials, clock: FrozenClock) -> None:
        self.creds, self.clock = creds, clock

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        request.headers.update(
            sign_request(
                access_key=self.creds.access_key,
                secret_key=self.creds.secret_key,
                method=request.method,
                path_query=request.url.raw_path.decode("ascii"),
                host=request.headers["host"],
                now=self.clock(),
            )
        )
        yield request


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(T0)


@pytest.fixture
async def app(manager_config: ManagerConfig, clock: FrozenClock) -> AsyncIterator[FastAPI]:
    from accelshare.api.app import create_manager_app

    application = await create_manager_app(manager_config, clock=clock)
    async with application.router.lifespan_context(application):
        yield application


@pytest.fixture
async def client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8081") as c:
        yield c


async def test_superadmin_from_the_credentials_file_can_sign(
    app: FastAPI, client: httpx.AsyncClient, manager_config: ManagerConfig, clock: FrozenClock
) -> None:
    creds = AdminCredentials.from_env_file(manager_config.credentials_file)
    response = await client.get("/whoami", auth=Signer(creds, clock))
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["email"], body["role"], body["access_key"]) == (
        "admin@accelshare.local",
        "superadmin",
        creds.access_key,
    )
    assert manager_config.cookie_secret_file.stat().st_mode & 0o777 == 0o600

    clock.advance(timedelta(minutes=20))  # the client's clock is now 20 min behind
    stale = Signer(creds, FrozenClock(T0))
    expired = await client.get("/whoami", auth=stale)
    assert expired.status_code == 401
    assert expired.json()["reason"] == "date-expired"


async def test_deactivated_key_is_refused(
    app: FastAPI, client: httpx.AsyncClient, manager_config: ManagerConfig, clock: FrozenClock
) -> None:
    creds = AdminCredentials.from_env_file(manager_config.credentials_file)
    db: Database = app.state.db
    async with db.begin(write=True) as session:
        await session.execute(sa.update(Keypair).values(is_active=False))
    response = await client.get("/whoami", auth=Signer(creds, clock))
    assert response.status_code == 401
    assert response.json()["reason"] == "inactive-access-key"


async def test_login_with_the_bootstrap_password(
    client: httpx.AsyncClient, manager_config: ManagerConfig
) -> None:
    creds = AdminCredentials.from_env_file(manager_config.credentials_file)
    response = await client.post(
        "/auth/login", json={"email": creds.email, "password": creds.password}
    )
    assert response.status_code == 200, response.text
    assert response.json()["access_key"] == creds.access_key
    whoami = await client.get("/whoami")
    assert whoami.json()["auth_method"] == "cookie"


async def test_health_reports_the_database(client: httpx.AsyncClient, app: FastAPI) -> None:
    response = await client.get("/health")
    assert response.json() == {"status": "ok", "database": app.state.db.dialect}


async def test_restart_keeps_state(
    app: FastAPI, manager_config: ManagerConfig, clock: FrozenClock
) -> None:
    from accelshare.api.app import create_manager_app

    before = manager_config.credentials_file.read_text()
    again = await create_manager_app(manager_config, clock=clock)
    async with again.router.lifespan_context(again):
        db: Database = again.state.db
        async with db.begin() as session:
            keys = (await session.execute(sa.select(sa.func.count()).select_from(Keypair))).scalar()
    assert keys == 1
    assert manager_config.credentials_file.read_text() == before
