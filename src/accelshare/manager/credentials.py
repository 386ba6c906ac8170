"""Keypair generation and credential look-ups for authentication.

The API layer authenticates against the small :class:`CredentialStore` protocol so
that its tests can use an in-memory store; :class:`DBCredentialStore` is the real one.
Both look-ups are single indexed queries (keypair PK / user email).
"""

from __future__ import annotations

import secrets
import string
import uuid
from dataclasses import dataclass
from typing import Protocol

import sqlalchemy as sa

from .db import Database
from .models import (
    ACCESS_KEY_LENGTH,
    SECRET_KEY_LENGTH,
    Keypair,
    User,
    UserRole,
    UserStatus,
    email_matches,
)

__all__ = [
    "Credential",
    "CredentialStore",
    "DBCredentialStore",
    "LoginRecord",
    "generate_access_key",
    "generate_secret_key",
]

_ACCESS_KEY_PREFIX = "AKIA"
_ACCESS_ALPHABET = string.ascii_uppercase + string.digits
_SECRET_ALPHABET = string.ascii_letters + string.digits


def generate_access_key() -> str:
    """``AKIA`` + 16 upper-case letters/digits (20 characters, like AWS's)."""
    body = ACCESS_KEY_LENGTH - len(_ACCESS_KEY_PREFIX)
    return _ACCESS_KEY_PREFIX + "".join(secrets.choice(_ACCESS_ALPHABET) for _ in range(body))


def generate_secret_key() -> str:
    """40 letters/digits (~238 bits), safe unquoted in shell env files."""
    return "".join(secrets.choice(_SECRET_ALPHABET) for _ in range(SECRET_KEY_LENGTH))


@dataclass(frozen=True, slots=True)
class Credential:
    """A keypair with its owner, as the HMAC check needs it."""

    access_key: str
    secret_key: str
    is_key_active: bool
    is_admin_key: bool
    resource_policy: str
    user_id: uuid.UUID
    email: str
    role: UserRole
    user_status: UserStatus
    domain_name: str
    login_generation: int = 0  # console cookies of another generation are ended


@dataclass(frozen=True, slots=True)
class LoginRecord:
    """A user as the email/password login needs it (``access_key``: its oldest active key)."""

    user_id: uuid.UUID
    email: str
    password_hash: str
    role: UserRole
    status: UserStatus
    domain_name: str
    access_key: str | None
    login_generation: int = 0


class CredentialStore(Protocol):
    async def get_credential(self, access_key: str) -> Credential | None: ...

    async def get_login(self, email: str) -> LoginRecord | None: ...

    async def end_logins(self, user_id: uuid.UUID) -> None:
        """End every console login of the user (the cookies issued so far)."""
        ...


_CREDENTIAL = (
    sa.select(
        Keypair.access_key,
        Keypair.secret_key,
        Keypair.is_active,
        Keypair.is_admin,
        Keypair.resource_policy,
        User.id,
        User.email,
        User.role,
        User.status,
        User.domain_name,
        User.login_generation,
    )
    .join(User, User.id == Keypair.user_id)
    .where(Keypair.access_key == sa.bindparam("access_key"))
)


class DBCredentialStore:
    """:class:`CredentialStore` over the manager database."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def get_credential(self, access_key: str) -> Credential | None:
        # every signed request reads this: a prebuilt Core statement (no construction or
        # cache key per call) on a Core connection (no ORM session), the columns used only
        async with self.db.connect() as conn:
            row = (await conn.execute(_CREDENTIAL, {"access_key": access_key})).first()
        if row is None:
            return None
        return Credential(
            access_key=row[0],
            secret_key=row[1],
            is_key_active=row[2],
            is_admin_key=row[3],
            resource_policy=row[4],
            user_id=row[5],
            email=row[6],
            role=row[7],
            user_status=row[8],
            domain_name=row[9],
            login_generation=row[10],
        )

    async def get_login(self, email: str) -> LoginRecord | None:
        async with self.db.begin() as session:
            query = sa.select(User).where(email_matches(email))  # any case (one account)
            user = (await session.execute(query)).scalar()
            if user is None:
                return None
            access_key = (
                await session.execute(
                    sa.select(Keypair.access_key)
                    .where(Keypair.user_id == user.id, Keypair.is_active.is_(True))
                    .order_by(Keypair.created_at, Keypair.access_key)
                    .limit(1)
                )
            ).scalar()
        return LoginRecord(
            user_id=user.id,
            email=user.email,
            password_hash=user.password_hash,
            role=user.role,
            status=user.status,
            domain_name=user.domain_name,
            access_key=access_key,
            login_generation=user.login_generation,
        )

    async def end_logins(self, user_id: uuid.UUID) -> None:
        async with self.db.begin(write=True) as session:
            await session.execute(
                sa.update(User)
                .where(User.id == user_id)
                .values(login_generation=User.login_generation + 1)
            )
