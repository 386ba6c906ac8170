"""Which scaling groups a session may use, and the associations that decide it.

A scaling group is open to a session when it is active and associated with the
session owner's domain, with the project (group) the session is charged to, or with
the owner's keypair (Backend.AI's ``sgroups_for_domains`` / ``sgroups_for_groups`` /
``sgroups_for_keypairs``).  A scaling group made by an admin is associated with
nothing: a superadmin opens it with ``associate_scaling_group_with_domain`` (or
``_with_user_group`` / ``_with_keypair``), from GraphQL, ``POST
/admin/scaling-groups/{name}/associations`` or ``accelshare admin scaling-group
associate``.

Associating is idempotent (an existing association is kept), and so is dissociating
(nothing associated: nothing to remove); an unknown scaling group, domain, group or
keypair is a :class:`~accelshare.manager.errors.NotFound` naming it.  Session admission
reads the same tables in its own single query (:mod:`.sessions.admission`).
"""

from __future__ import annotations

import enum
import uuid
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession

from accelshare.common import ResourceSlot

from ..db import Database
from ..errors import NotFound
from ..models import (
    Domain,
    Group,
    Keypair,
    ScalingGroup,
    ScalingGroupForDomain,
    ScalingGroupForGroup,
    ScalingGroupForKeypair,
)

__all__ = [
    "AllowedScalingGroup",
    "AssociationKind",
    "ScalingGroupAccess",
    "allowed_scaling_groups",
]


class AssociationKind(enum.StrEnum):
    """What a scaling group is associated with."""

    DOMAIN = "domain"
    GROUP = "group"
    KEYPAIR = "keypair"


_Table = type[ScalingGroupForDomain] | type[ScalingGroupForGroup] | type[ScalingGroupForKeypair]


@dataclass(frozen=True, slots=True)
class _Kind:
    table: _Table
    column: str  # the association's column naming the domain / group / keypair
    target: Any  # the target's key column (Domain.name, Group.id, Keypair.access_key)
    field: str  # the request field that names the target
    label: str
    expected: str


_KINDS = {
    AssociationKind.DOMAIN: _Kind(
        ScalingGroupForDomain, "domain", Domain.name, "domain", "domain", "the name of a domain"
    ),
    AssociationKind.GROUP: _Kind(
        ScalingGroupForGroup,
        "group",
        Group.id,
        "user_group",
        "project (group)",
        "the id of a project (group)",
    ),
    AssociationKind.KEYPAIR: _Kind(
        ScalingGroupForKeypair,
        "access_key",
        Keypair.access_key,
        "access_key",
        "keypair",
        "an access key",
    ),
}


@dataclass(frozen=True, slots=True)
class AllowedScalingGroup:
    """An open scaling group, with what session admission needs of it."""

    name: str
    scheduler_opts: dict[str, Any] | None
    default_session_slots: ResourceSlot


def _open_to(domain: str, group_id: uuid.UUID | None, access_key: str) -> sa.ColumnElement[bool]:
    """``ScalingGroup`` is associated with the domain, the group or the keypair."""
    via_group: sa.ColumnElement[bool] = (
        sa.false()
        if group_id is None
        else sa.exists().where(
            ScalingGroupForGroup.scaling_group == ScalingGroup.name,
            ScalingGroupForGroup.group == group_id,
        )
    )
    return sa.or_(
        sa.exists().where(
            ScalingGroupForDomain.scaling_group == ScalingGroup.name,
            ScalingGroupForDomain.domain == domain,
        ),
        via_group,
        sa.exists().where(
            ScalingGroupForKeypair.scaling_group == ScalingGroup.name,
            ScalingGroupForKeypair.access_key == access_key,
        ),
    )


async def allowed_scaling_groups(
    db: AsyncSession, *, domain: str, group_id: uuid.UUID | None, access_key: str
) -> list[AllowedScalingGroup]:
    """The active scaling groups open to a session of ``access_key`` (a user of
    ``domain``) charged to ``group_id``, by name."""
    rows = await db.execute(
        sa.select(
            ScalingGroup.name, ScalingGroup.scheduler_opts, ScalingGroup.default_session_slots
        )
        .where(ScalingGroup.is_active.is_(True), _open_to(domain, group_id, access_key))
        .order_by(ScalingGroup.name)
    )
    return [AllowedScalingGroup(*row) for row in rows]


def _insert_ignoring_duplicates(dialect: str) -> Any:
    """The dialect's ``insert`` (both have ``on_conflict_do_nothing``)."""
    return postgresql.insert if dialect == "postgresql" else sqlite.insert


class ScalingGroupAccess:
    """The superadmin's associations of scaling groups (callers check the role)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def associate(self, kind: AssociationKind, scaling_group: str, target: Any) -> None:
        """Open ``scaling_group`` to ``target`` (a domain name, group id or access key)."""
        spec = _KINDS[kind]
        async with self.db.begin(write=True) as db:
            key = await self._target(db, spec, target)
            await self._scaling_group(db, scaling_group)
            insert = _insert_ignoring_duplicates(self.db.dialect)(spec.table)
            await db.execute(
                insert.values(
                    {"scaling_group": scaling_group, spec.column: key}
                ).on_conflict_do_nothing()
            )

    async def dissociate(self, kind: AssociationKind, scaling_group: str, target: Any) -> None:
        spec = _KINDS[kind]
        async with self.db.begin(write=True) as db:
            key = await self._target(db, spec, target)
            await self._scaling_group(db, scaling_group)
            column = getattr(spec.table, spec.column)
            await db.execute(
                sa.delete(spec.table).where(
                    spec.table.scaling_group == scaling_group, column == key
                )
            )

    async def dissociate_all(self, kind: AssociationKind, target: Any) -> None:
        """Close every scaling group to ``target``."""
        spec = _KINDS[kind]
        async with self.db.begin(write=True) as db:
            key = await self._target(db, spec, target)
            column = getattr(spec.table, spec.column)
            await db.execute(sa.delete(spec.table).where(column == key))

    async def associations(self, scaling_group: str) -> dict[str, list[str]]:
        """What ``scaling_group`` is associated with: ``{"domains", "groups" (ids),
        "keypairs"}``, each sorted."""
        async with self.db.begin() as db:
            await self._scaling_group(db, scaling_group)
            found: dict[str, list[str]] = {}
            for name, spec in (
                ("domains", _KINDS[AssociationKind.DOMAIN]),
                ("groups", _KINDS[AssociationKind.GROUP]),
                ("keypairs", _KINDS[AssociationKind.KEYPAIR]),
            ):
                column = getattr(spec.table, spec.column)
                rows = await db.execute(
                    sa.select(column).where(spec.table.scaling_group == scaling_group)
                )
                found[name] = sorted(str(value) for value in rows.scalars())
            return found

    @staticmethod
    async def _scaling_group(db: AsyncSession, name: str) -> None:
        if await db.get(ScalingGroup, name) is None:
            names = list(
                (
                    await db.execute(sa.select(ScalingGroup.name).order_by(ScalingGroup.name))
                ).scalars()
            )
            raise NotFound(
                f"No scaling group {name!r}",
                field="scaling_group",
                expected="one of " + (", ".join(names) or "(none)"),
                received=name,
            )

    @staticmethod
    async def _target(db: AsyncSession, spec: _Kind, value: Any) -> Any:
        """The target's key as stored (a group id given as text becomes a UUID)."""
        key = value
        if spec.table is ScalingGroupForGroup and not isinstance(value, uuid.UUID):
            try:
                key = uuid.UUID(str(value))
            except ValueError:
                key = None
        found = (
            None
            if key is None
            else (await db.execute(sa.select(spec.target).where(spec.target == key))).first()
        )
        if found is None:
            raise NotFound(
                f"No {spec.label} {str(value)!r}",
                field=spec.field,
                expected=spec.expected,
                received=str(value),
            )
        return key
