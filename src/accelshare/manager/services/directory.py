"""Look-ups by id: a group's name, a user's email, a keypair with its owner (what the
Backend.AI-compatible GraphQL fields ask for)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa

from ..db import Database
from ..models import Group, Keypair, User

__all__ = ["Directory", "KeypairInfo"]


@dataclass(frozen=True)
class KeypairInfo:
    """A keypair (never its secret) and its owner's email and domain."""

    access_key: str
    is_active: bool
    is_admin: bool
    resource_policy: str
    created_at: datetime
    owner_email: str
    domain_name: str


class Directory:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def keypair(self, access_key: str) -> KeypairInfo | None:
        async with self.db.begin() as db:
            row = (
                await db.execute(
                    sa.select(Keypair, User)
                    .join(User, User.id == Keypair.user_id)
                    .where(Keypair.access_key == access_key)
                )
            ).first()
        if row is None:
            return None
        keypair, user = row
        return KeypairInfo(
            access_key=keypair.access_key,
            is_active=keypair.is_active,
            is_admin=keypair.is_admin,
            resource_policy=keypair.resource_policy,
            created_at=keypair.created_at,
            owner_email=user.email,
            domain_name=user.domain_name,
        )

    async def group_name(self, group_id: str) -> str | None:
        async with self.db.begin() as db:
            name: str | None = (
                await db.execute(sa.select(Group.name).where(Group.id == uuid.UUID(group_id)))
            ).scalar_one_or_none()
        return name

    async def user_email(self, user_id: str) -> str | None:
        async with self.db.begin() as db:
            email: str | None = (
                await db.execute(sa.select(User.email).where(User.id == uuid.UUID(user_id)))
            ).scalar_one_or_none()
        return email
