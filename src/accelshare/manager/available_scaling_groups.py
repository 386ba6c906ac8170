"""``GET /scaling-groups?group=...`` (Backend.AI's ``admin scaling-group get-available``):
the scaling groups a project's sessions may use.

The answer is what ``POST /session`` lets the caller's sessions charged to that project
use: the active scaling groups associated with the caller's domain, with the project or
with the caller's keypair (:mod:`.services.scaling_group_access`), by name.  The project
must exist in the caller's domain (any domain for a superadmin), and a plain user must
be one of its members.
"""

from __future__ import annotations

import uuid

import sqlalchemy as sa

from .db import Database
from .enums import UserRole
from .errors import NotFound
from .models import Group, GroupMember
from .services.actor import Actor
from .services.scaling_group_access import allowed_scaling_groups

__all__ = ["available_scaling_groups"]


async def available_scaling_groups(db: Database, caller: Actor, group: str) -> list[str]:
    """Names of the scaling groups ``group`` (a project's id or name) may use."""
    try:
        by_id: sa.ColumnElement[bool] = Group.id == uuid.UUID(group)
    except ValueError:
        by_id = sa.false()
    query = sa.select(Group.id).where(sa.or_(by_id, Group.name == group))
    if caller.role is not UserRole.SUPERADMIN:
        query = query.where(Group.domain_name == caller.domain_name)
    if caller.role is UserRole.USER:
        query = query.join(GroupMember, GroupMember.group_id == Group.id).where(
            GroupMember.user_id == caller.user_id
        )
    async with db.begin() as session:
        found = (await session.execute(query.limit(1))).scalar_one_or_none()
        if found is None:
            raise NotFound(
                f"No project {group!r} that you belong to",
                field="group",
                expected="the id or name of one of your projects",
                received=group,
            )
        allowed = await allowed_scaling_groups(
            session, domain=caller.domain_name, group_id=found, access_key=caller.access_key
        )
        return [a.name for a in allowed]
