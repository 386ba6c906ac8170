"""An in-memory credential store, a frozen clock and a signing httpx client for API tests."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Generator
from dataclasses import replace
from datetime import UTC, datetime

import httpx
import pytest
from fastapi import FastAPI

from accelshare.api.app import create_app
from accelshare.api.auth import AuthSettings
from accelshare.api.signing import sign_request
from accelshare.manager.clock import Clock, FrozenClock
from accelshare.manager.credentials import (
    Credential,
    LoginRecord,
    generate_access_key,
    generate_secret_key,
)
from accelshare.manager.enums import UserRole, UserStatus
from accelshare.manager.passwords import ScryptParams, hash_password

T0 = datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC)
COOKIE_SECRET = b"0123456789abcdef0123456789abcdef"
FAST_SCRYPT = ScryptParams(n=2**10)  # tests only: cheap hashes


class MemoryCredentialStore:
    """``CredentialStore`` over dicts; ``add`` builds a user with one keypair."""

    def __init__(self) -> None:
        self.credentials: dict[str, Credential] = {}
        self.logins: dict[str, LoginRecord] = {}

    async def get_credential(self, access_key: str) -> Credential | None:
        return self.credentials.get(access_key)

    async def get_login(self, email: str) -> LoginRecord | None:
        return self.logins.get(email)

    async def end_logins(self, user_id: uuid.UUID) -> None:
        for key, cred in list(self.credentials.items()):
            if cred.user_id == user_id:
                generation = cred.login_generation + 1
                self.credentials[key] = replace(cred, login_generation=generation)
                login = self.logins[cred.email]
                self.logins[cred.email] = replace(login, login_generation=generation)

    def add(
        self,
        email: str,
        role: UserRole = UserRole.USER,
        *,
        password: str = "correct horse",
        key_active: bool = True,
        user_status: UserStatus = UserStatus.ACTIVE,
    ) -> Credential:
        cred = Credential(
            access_key=generate_access_key(),
            secret_key=generate_secret_key(),
            is_key_active=key_active,
            is_admin_key=role is not UserRole.USER,
            resource_policy="default",
            user_id=uuid.uuid4(),
            email=email,
            role=role,
            user_status=user_status,
            domain_name="default",
        )
        self.credentials[cred.access_key] = cred
        self.logins[email] = LoginRecord(
            user_id=cred.user_id,
            email=email,
            password_hash=hash_password(password, FAST_SCRYPT),
            role=role,
            status=user_status,
            domain_name="default",
            access_key=cred.access_key if key_active else None,
        )
        return cred

    def update(self, access_key: str, **changes: object) -> None:
        self.credentials[access_key] = replace(self.credentials[access_key], **changes)  # type: ignore[arg-type]


class HMACAuth(httpx.Auth):
    """Signs each request as a Backend.AI client does, from what goes on the wire."""

    def __init__(
        self,
        cred: Credential,
        clock: Clock,
        *,
        content_type: str = "application/json",
        secret_key: str | None = None,
    ) -> None:
        self.cred, self.clock, self.content_type = cred, clock, content_type
        self.secret_key = secret_key or cred.secret_key

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        request.headers.update(
            sign_request(
                access_key=self.cred.access_key,
                secret_key=self.secret_key,
                method=request.method,
                path_query=request.url.raw_path.decode("ascii"),
                host=request.headers["host"],
                now=self.clock(),
                content_type=self.content_type,
            )
        )
        yield request


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(T0)


@pytest.fixture
def store() -> MemoryCredentialStore:
    return MemoryCredentialStore()


@pytest.fixture
def app(store: MemoryCredentialStore, clock: FrozenClock) -> FastAPI:
    return create_app(store=store, settings=AuthSettings(cookie_secret=COOKIE_SECRET, clock=clock))


@pytest.fixture
async def client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
        yield c
