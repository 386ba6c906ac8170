"""The admin directory as Backend.AI's GraphQL shows it: paged, role-scoped lists of
users, keypairs, domains, groups (projects) and keypair resource policies, and the
domain and group mutations (users, keypairs, policies and scaling groups are changed
through :class:`~accelshare.manager.services.admin.AdminService`).

Who sees what (the caller is an :class:`~.admin.Administrator` with a ``role``):

* a superadmin: everything;
* a domain admin: the users, keypairs, groups of its domain and the domain itself;
* a user: itself, its own keypairs, the groups it belongs to and its domain.

Lists answer :class:`Page` (the page's rows and the total count) with two queries (a
``count(*)`` and the page); what a row needs from other tables (a user's groups, a
keypair's owner) is fetched for the page only, with one ``IN`` query each.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from accelshare.common import ResourceSlot
from accelshare.common.text_input import check_text
from accelshare.sched.lifecycle import SessionStatus

from ..db import Database
from ..enums import UserRole, UserStatus
from ..errors import Conflict, InvalidRequest, NotFound, PermissionDenied
from ..list_specs import KEYPAIRS, USERS
from ..models import (
    Domain,
    Group,
    GroupMember,
    Keypair,
    KeypairResourcePolicy,
    Session,
    User,
    email_matches,
)
from ..querylang.compile_sql import filter_clause, order_clauses
from ..slots import KnownSlots
from .actor import Actor
from .admin import parse_slots, policy_json

__all__ = [
    "Actor",
    "AdminViews",
    "DomainChanges",
    "GroupChanges",
    "Page",
]

_LIVE_STATUSES = tuple(
    s for s in SessionStatus if s not in (SessionStatus.TERMINATED, SessionStatus.CANCELLED)
)


async def _all_in_domain(
    db: AsyncSession,
    model: type[Group] | type[User],
    wanted: set[uuid.UUID],
    domain: str,
    field: str,
    what: str,
) -> None:
    """Refuse (400 naming ``field``) ids in ``wanted`` that are not ``what``s (groups or
    users) of ``domain``."""
    if not wanted:
        return
    rows = await db.execute(
        sa.select(model.id).where(model.id.in_(wanted), model.domain_name == domain)
    )
    missing = sorted(str(i) for i in wanted - set(rows.scalars()))
    if missing:
        raise InvalidRequest(
            f"Unknown {what}(s) in the domain {domain}: {', '.join(missing)}",
            field=field,
            expected=f"ids of {what}s of the domain {domain}",
            received=missing,
        )


@dataclass(frozen=True)
class Page:
    items: list[dict[str, Any]]
    total: int


@dataclass(frozen=True)
class DomainChanges:
    """A new domain's settings or the changes to one (``None``: unchanged)."""

    description: str | None = None
    is_active: bool | None = None
    total_resource_slots: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class GroupChanges:
    """A new group's settings or the changes to one (``None``: unchanged);
    ``add_users`` / ``remove_users`` / ``set_users`` change its members."""

    name: str | None = None
    description: str | None = None
    is_active: bool | None = None
    total_resource_slots: Mapping[str, Any] | None = None
    add_users: Sequence[uuid.UUID] = field(default_factory=tuple)
    remove_users: Sequence[uuid.UUID] = field(default_factory=tuple)


def _iso(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


def _is_admin(caller: Actor) -> bool:
    return caller.role.includes(UserRole.ADMIN)


def _require_admin(caller: Actor, what: str) -> None:
    if not _is_admin(caller):
        raise PermissionDenied(f"{what} needs the admin role", reason="insufficient-role")


def _require_superadmin(caller: Actor, what: str) -> None:
    if not caller.is_superadmin:
        raise PermissionDenied(f"{what} needs the superadmin role", reason="insufficient-role")


def domain_json(d: Domain) -> dict[str, Any]:
    return {
        "name": d.name,
        "description": d.description,
        "is_active": d.is_active,
        "total_resource_slots": d.total_resource_slots.to_json(),
        "created_at": _iso(d.created_at),
        "modified_at": _iso(d.modified_at),
    }


def group_json(g: Group) -> dict[str, Any]:
    return {
        "id": str(g.id),
        "name": g.name,
        "domain_name": g.domain_name,
        "description": g.description,
        "is_active": g.is_active,
        "total_resource_slots": g.total_resource_slots.to_json(),
        "created_at": _iso(g.created_at),
        "modified_at": _iso(g.modified_at),
    }


def _user_row(u: User, groups: list[dict[str, str]]) -> dict[str, Any]:
    return {
        "id": str(u.id),
        "email": u.email,
        "username": u.username,
        "full_name": u.full_name,
        "role": u.role.value,
        "status": u.status.value,
        "is_active": u.is_active,
        "domain_name": u.domain_name,
        "total_resource_slots": u.total_resource_slots.to_json(),
        "created_at": _iso(u.created_at),
        "modified_at": _iso(u.modified_at),
        "groups": groups,
    }


async def _count(db: AsyncSession, query: sa.Select[Any]) -> int:
    total = (await db.execute(sa.select(sa.func.count()).select_from(query.subquery()))).scalar()
    return int(total or 0)


async def _groups_of(
    db: AsyncSession, user_ids: Sequence[uuid.UUID]
) -> dict[uuid.UUID, list[dict[str, str]]]:
    found: dict[uuid.UUID, list[dict[str, str]]] = defaultdict(list)
    if not user_ids:
        return found
    rows = await db.execute(
        sa.select(GroupMember.user_id, Group.id, Group.name)
        .join(Group, Group.id == GroupMember.group_id)
        .where(GroupMember.user_id.in_(user_ids))
        .order_by(Group.name)
    )
    for user_id, group_id, name in rows:
        found[user_id].append({"id": str(group_id), "name": name})
    return found


def _user_visible(caller: Actor) -> sa.ColumnElement[bool]:
    """The users a caller may see: all, its domain's, or itself."""
    if caller.is_superadmin:
        return sa.true()
    if caller.role is UserRole.ADMIN:
        return User.domain_name == caller.domain_name
    return User.id == caller.user_id


class AdminViews:
    """See the module doc."""

    def __init__(self, *, db: Database, known_slots: KnownSlots) -> None:
        self.db = db
        self.known_slots = known_slots

    # -- users ------------------------------------------------------------------------------
    def _users_query(
        self,
        caller: Actor,
        *,
        domain_name: str | None,
        group_id: uuid.UUID | None,
        is_active: bool | None,
        status: UserStatus | None,
    ) -> sa.Select[Any]:
        query = sa.select(User).where(_user_visible(caller))
        if domain_name:
            query = query.where(User.domain_name == domain_name)
        if group_id is not None:
            query = query.where(
                User.id.in_(sa.select(GroupMember.user_id).where(GroupMember.group_id == group_id))
            )
        if is_active is not None:
            query = query.where(
                User.status == UserStatus.ACTIVE if is_active else User.status != UserStatus.ACTIVE
            )
        if status is not None:
            query = query.where(User.status == status)
        return query

    async def users(
        self,
        caller: Actor,
        *,
        domain_name: str | None = None,
        group_id: uuid.UUID | None = None,
        is_active: bool | None = None,
        status: UserStatus | None = None,
        limit: int | None = None,
        offset: int = 0,
        filter: str | None = None,
        order: str | None = None,
    ) -> Page:
        """The users the caller may see, oldest first; ``filter`` / ``order``: Backend.AI's
        expressions over :data:`..list_specs.USERS` (``QueryError`` when bad)."""
        query = self._users_query(
            caller, domain_name=domain_name, group_id=group_id, is_active=is_active, status=status
        )
        matching = filter_clause(filter, USERS)
        if matching is not None:
            query = query.where(matching)
        ordering = (
            order_clauses(order, USERS)
            if order and order.strip()
            else [User.created_at, User.email]
        )
        async with self.db.begin() as db:
            total = await _count(db, query)
            page_query = query.order_by(*ordering).offset(offset)
            if limit is not None:
                page_query = page_query.limit(limit)
            users = list((await db.execute(page_query)).scalars())
            groups = await _groups_of(db, [u.id for u in users])
        return Page([_user_row(u, groups.get(u.id, [])) for u in users], total)

    async def user(
        self, caller: Actor, *, email: str | None = None, user_id: uuid.UUID | None = None
    ) -> dict[str, Any] | None:
        """One user the caller may see (itself when neither is given); None if not."""
        query = sa.select(User).where(_user_visible(caller))
        if email is not None:
            query = query.where(email_matches(check_text(email, field="email")))
        elif user_id is not None:
            query = query.where(User.id == user_id)
        else:
            query = query.where(User.id == caller.user_id)
        async with self.db.begin() as db:
            user = (await db.execute(query)).scalar_one_or_none()
            if user is None:
                return None
            groups = await _groups_of(db, [user.id])
        return _user_row(user, groups.get(user.id, []))

    async def set_user_groups(
        self, caller: Actor, email: str, group_ids: Sequence[uuid.UUID]
    ) -> None:
        """The user's groups become exactly these (all in the user's domain)."""
        _require_admin(caller, "Changing a user's groups")
        async with self.db.begin(write=True) as db:
            user = (
                await db.execute(
                    sa.select(User).where(_user_visible(caller)).where(email_matches(email))
                )
            ).scalar_one_or_none()
            if user is None:
                raise NotFound(f"No user {email!r}", field="email", received=email)
            wanted = set(group_ids)
            await _all_in_domain(db, Group, wanted, user.domain_name, "group_ids", "group")
            await db.execute(sa.delete(GroupMember).where(GroupMember.user_id == user.id))
            for gid in sorted(wanted):
                db.add(GroupMember(group_id=gid, user_id=user.id))

    # -- keypairs ---------------------------------------------------------------------------
    async def keypairs(
        self,
        caller: Actor,
        *,
        domain_name: str | None = None,
        email: str | None = None,
        is_active: bool | None = None,
        access_key: str | None = None,
        limit: int | None = None,
        offset: int = 0,
        filter: str | None = None,
        order: str | None = None,
    ) -> Page:
        """The keypairs the caller may see (without secrets), oldest first; each with its
        owner (``user_email``, ``user_uuid``, ``full_name``, ``domain_name``), the owner's
        group names (``projects``) and ``concurrency_used`` (its live sessions)."""
        query = (
            sa.select(Keypair, User)
            .join(User, User.id == Keypair.user_id)
            .where(_user_visible(caller))
        )
        if domain_name:
            query = query.where(User.domain_name == domain_name)
        if email:
            query = query.where(email_matches(check_text(email, field="email")))
        if is_active is not None:
            query = query.where(Keypair.is_active == is_active)
        if access_key is not None:
            query = query.where(Keypair.access_key == access_key)
        matching = filter_clause(filter, KEYPAIRS)  # over :data:`..list_specs.KEYPAIRS`
        if matching is not None:
            query = query.where(matching)
        ordering = (
            order_clauses(order, KEYPAIRS)
            if order and order.strip()
            else [Keypair.created_at, Keypair.access_key]
        )
        async with self.db.begin() as db:
            total = await _count(db, query.with_only_columns(Keypair.access_key))
            page_query = query.order_by(*ordering).offset(offset)
            if limit is not None:
                page_query = page_query.limit(limit)
            rows = list(await db.execute(page_query))
            groups = await _groups_of(db, list({u.id for _, u in rows}))
            keys = [k.access_key for k, _ in rows]
            used: dict[str, int] = {}
            if keys:
                used = {
                    key: int(n)
                    for key, n in await db.execute(
                        sa.select(Session.access_key, sa.func.count())
                        .where(Session.access_key.in_(keys), Session.status.in_(_LIVE_STATUSES))
                        .group_by(Session.access_key)
                    )
                }
        return Page(
            [
                {
                    "access_key": k.access_key,
                    "is_active": k.is_active,
                    "is_admin": k.is_admin,
                    "resource_policy": k.resource_policy,
                    "created_at": _iso(k.created_at),
                    "last_used_at": _iso(k.last_used_at),
                    "user_email": u.email,
                    "user_uuid": str(u.id),
                    "full_name": u.full_name,
                    "domain_name": u.domain_name,
                    "projects": [g["name"] for g in groups.get(u.id, [])],
                    "concurrency_used": used.get(k.access_key, 0),
                }
                for k, u in rows
            ],
            total,
        )

    async def keypair(self, caller: Actor, access_key: str) -> dict[str, Any] | None:
        page = await self.keypairs(caller, access_key=access_key)
        return page.items[0] if page.items else None

    # -- domains ----------------------------------------------------------------------------
    async def domains(
        self, caller: Actor, *, is_active: bool | None = None
    ) -> list[dict[str, Any]]:
        """All domains for a superadmin; the caller's own domain for anyone else."""
        query = sa.select(Domain).order_by(Domain.name)
        if not caller.is_superadmin:
            query = query.where(Domain.name == caller.domain_name)
        if is_active is not None:
            query = query.where(Domain.is_active == is_active)
        async with self.db.begin() as db:
            return [domain_json(d) for d in (await db.execute(query)).scalars()]

    async def domain(self, caller: Actor, name: str | None) -> dict[str, Any] | None:
        name = name or caller.domain_name
        if not caller.is_superadmin and name != caller.domain_name:
            return None
        async with self.db.begin() as db:
            found = await db.get(Domain, name)
        return domain_json(found) if found is not None else None

    async def create_domain(self, caller: Actor, name: str, new: DomainChanges) -> dict[str, Any]:
        _require_superadmin(caller, "Creating a domain")
        name = check_text(name, field="name")
        if not name or len(name) > 64:
            raise InvalidRequest(
                "A domain name is 1 to 64 characters",
                field="name",
                expected="1 to 64 characters",
                received=name,
            )
        known = await self.known_slots.load()
        async with self.db.begin(write=True) as db:
            if await db.get(Domain, name) is not None:
                raise Conflict(f"The domain {name!r} exists", field="name", received=name)
            domain = Domain(
                name=name,
                description="",
                is_active=True,
                total_resource_slots=ResourceSlot(),
            )
            _apply_domain(domain, new, known)
            db.add(domain)
        return domain_json(domain)

    async def modify_domain(
        self, caller: Actor, name: str, changes: DomainChanges
    ) -> dict[str, Any]:
        _require_superadmin(caller, "Changing a domain")
        known = await self.known_slots.load()
        async with self.db.begin(write=True) as db:
            domain = await db.get(Domain, name)
            if domain is None:
                raise NotFound(f"No domain {name!r}", field="name", received=name)
            _apply_domain(domain, changes, known)
        return domain_json(domain)

    async def purge_domain(self, caller: Actor, name: str) -> None:
        """Removes a domain that has no users and no groups (Conflict otherwise)."""
        _require_superadmin(caller, "Purging a domain")
        async with self.db.begin(write=True) as db:
            domain = await db.get(Domain, name)
            if domain is None:
                raise NotFound(f"No domain {name!r}", field="name", received=name)
            user = (await db.execute(sa.select(User.email).where(User.domain_name == name))).first()
            group = (
                await db.execute(sa.select(Group.name).where(Group.domain_name == name))
            ).first()
            if user is not None or group is not None:
                raise Conflict(
                    f"The domain {name!r} still has users or groups; deactivate it instead",
                    field="name",
                    received=name,
                )
            await db.delete(domain)

    # -- groups -----------------------------------------------------------------------------
    def _groups_query(self, caller: Actor) -> sa.Select[Any]:
        query = sa.select(Group)
        if caller.is_superadmin:
            return query
        if caller.role is UserRole.ADMIN:
            return query.where(Group.domain_name == caller.domain_name)
        return query.where(
            Group.id.in_(
                sa.select(GroupMember.group_id).where(GroupMember.user_id == caller.user_id)
            )
        )

    async def groups(
        self,
        caller: Actor,
        *,
        domain_name: str | None = None,
        is_active: bool | None = None,
        name: str | None = None,
        group_id: uuid.UUID | None = None,
    ) -> list[dict[str, Any]]:
        query = self._groups_query(caller).order_by(Group.domain_name, Group.name)
        if domain_name:
            query = query.where(Group.domain_name == domain_name)
        if is_active is not None:
            query = query.where(Group.is_active == is_active)
        if name is not None:
            query = query.where(Group.name == name)
        if group_id is not None:
            query = query.where(Group.id == group_id)
        async with self.db.begin() as db:
            return [group_json(g) for g in (await db.execute(query)).scalars()]

    async def _group_to_change(self, db: AsyncSession, caller: Actor, gid: uuid.UUID) -> Group:
        _require_admin(caller, "Changing a group")
        group = await db.get(Group, gid)
        if group is None or (not caller.is_superadmin and group.domain_name != caller.domain_name):
            raise NotFound(f"No group {gid}", field="gid", received=str(gid))
        return group

    async def create_group(
        self, caller: Actor, name: str, domain_name: str, new: GroupChanges
    ) -> dict[str, Any]:
        _require_admin(caller, "Creating a group")
        if not caller.is_superadmin and domain_name != caller.domain_name:
            raise NotFound(
                f"No such thing in your domain ({domain_name})",
                field="domain_name",
                received=domain_name,
            )
        name = check_text(name, field="name")
        if not name or len(name) > 64:
            raise InvalidRequest(
                "A group name is 1 to 64 characters",
                field="name",
                expected="1 to 64 characters",
                received=name,
            )
        known = await self.known_slots.load()
        async with self.db.begin(write=True) as db:
            if await db.get(Domain, domain_name) is None:
                raise InvalidRequest(
                    f"Unknown domain {domain_name!r}", field="domain_name", received=domain_name
                )
            taken = (
                await db.execute(
                    sa.select(Group.id).where(Group.domain_name == domain_name, Group.name == name)
                )
            ).first()
            if taken is not None:
                raise Conflict(
                    f"The domain {domain_name} has a group {name!r}", field="name", received=name
                )
            group = Group(
                id=uuid.uuid4(),
                name=name,
                domain_name=domain_name,
                description="",
                is_active=True,
                total_resource_slots=ResourceSlot(),
            )
            _apply_group(group, GroupChanges(**{**new.__dict__, "name": None}), known)
            db.add(group)
        return group_json(group)

    async def modify_group(
        self, caller: Actor, gid: uuid.UUID, changes: GroupChanges
    ) -> dict[str, Any]:
        known = await self.known_slots.load()
        async with self.db.begin(write=True) as db:
            group = await self._group_to_change(db, caller, gid)
            if changes.name is not None and changes.name != group.name:
                taken = (
                    await db.execute(
                        sa.select(Group.id).where(
                            Group.domain_name == group.domain_name, Group.name == changes.name
                        )
                    )
                ).first()
                if taken is not None:
                    raise Conflict(
                        f"The domain {group.domain_name} has a group {changes.name!r}",
                        field="name",
                        received=changes.name,
                    )
            _apply_group(group, changes, known)
            wanted = set(changes.add_users) | set(changes.remove_users)
            await _all_in_domain(db, User, wanted, group.domain_name, "user_uuids", "user")
            if changes.remove_users:
                await db.execute(
                    sa.delete(GroupMember).where(
                        GroupMember.group_id == gid, GroupMember.user_id.in_(changes.remove_users)
                    )
                )
            if changes.add_users:
                present = set(
                    (
                        await db.execute(
                            sa.select(GroupMember.user_id).where(GroupMember.group_id == gid)
                        )
                    ).scalars()
                )
                for uid in sorted(set(changes.add_users) - present):
                    db.add(GroupMember(group_id=gid, user_id=uid))
        return group_json(group)

    async def purge_group(self, caller: Actor, gid: uuid.UUID) -> None:
        """Removes a group no session was ever charged to (Conflict otherwise)."""
        async with self.db.begin(write=True) as db:
            group = await self._group_to_change(db, caller, gid)
            used = (
                await db.execute(sa.select(Session.id).where(Session.group_id == gid).limit(1))
            ).first()
            if used is not None:
                raise Conflict(
                    f"Sessions were charged to the group {group.name!r}; deactivate it instead",
                    field="gid",
                    received=str(gid),
                )
            await db.delete(group)

    # -- keypair resource policies ----------------------------------------------------------
    async def policies(self, caller: Actor, name: str | None = None) -> list[dict[str, Any]]:
        """All policies for an admin; for a user, those its keypairs use."""
        query = sa.select(KeypairResourcePolicy).order_by(KeypairResourcePolicy.name)
        if not _is_admin(caller):
            query = query.where(
                KeypairResourcePolicy.name.in_(
                    sa.select(Keypair.resource_policy).where(Keypair.user_id == caller.user_id)
                )
            )
        if name is not None:
            query = query.where(KeypairResourcePolicy.name == name)
        async with self.db.begin() as db:
            return [policy_json(p) for p in (await db.execute(query)).scalars()]


def _apply_domain(domain: Domain, changes: DomainChanges, known: Mapping[str, Any]) -> None:
    if changes.description is not None:
        domain.description = check_text(changes.description, field="description")
    if changes.is_active is not None:
        domain.is_active = changes.is_active
    if changes.total_resource_slots is not None:
        domain.total_resource_slots = parse_slots(
            changes.total_resource_slots, known, "total_resource_slots"
        )


def _apply_group(group: Group, changes: GroupChanges, known: Mapping[str, Any]) -> None:
    if changes.name is not None:
        name = check_text(changes.name, field="name")
        if not name or len(name) > 64:
            raise InvalidRequest(
                "A group name is 1 to 64 characters",
                field="name",
                expected="1 to 64 characters",
                received=name,
            )
        group.name = name
    if changes.description is not None:
        group.description = check_text(changes.description, field="description")
    if changes.is_active is not None:
        group.is_active = changes.is_active
    if changes.total_resource_slots is not None:
        group.total_resource_slots = parse_slots(
            changes.total_resource_slots, known, "total_resource_slots"
        )
