"""Look-ups by id: a group's name, a user's email (what the Backend.AI-compatible
GraphQL session fields ask for; keypairs are read through :mod:`.admin_views`)."""

from __future__ import annotations

import uuid

import sqlalchemy as sa

from ..db import Database
from ..models import Group, User

__all__ = ["Directory"]


class Directory:
    def __init__(self, db: Database) -> None:
        self.db = db

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
