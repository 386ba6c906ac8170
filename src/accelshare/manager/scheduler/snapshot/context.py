"""The predicates' inputs (:class:`~accelshare.sched.predicates.PredicateContext`).

For a pass's pending sessions: their owners' keypair policy limits and user / group /
domain quotas, their dependencies' states and, when something reads them, the counters
(concurrent sessions per access key, occupancy per keypair / user / group / domain over
every scaling group), read in the pass's transaction so they cannot drift.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import datetime
from decimal import Decimal

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from accelshare.common import DefaultForUnspecified, ResourceSlot, SlotTypes
from accelshare.sched.lifecycle import SessionResult, SessionStatus
from accelshare.sched.model import KeypairLimits, PendingSession
from accelshare.sched.pickers import PickerName
from accelshare.sched.predicates import DEFAULT_PREDICATES, DependencyState, PredicateContext
from accelshare.sched.snapshot import SchedulerOptions

from ...models import Domain, Group, Keypair, KeypairResourcePolicy, Session, User
from ...transitions import OCCUPYING
from .cache import Texts
from .stored import json_text, parse_slots

__all__ = ["predicate_context"]


_INFINITY = Decimal("Infinity")


async def _counters(
    db: AsyncSession, texts: Texts
) -> tuple[dict[str, int], dict[tuple[str, str], ResourceSlot], dict[str, ResourceSlot]]:
    """Running sessions per access key and occupancy per keypair / user / group / domain
    (over every scaling group), and per access key for DRF.  Every pass that needs them,
    in its transaction (no drifting counters): grouped by owner and the amounts' stored
    text with a count, so hundreds of sessions of a few shapes are a few rows and
    multiplications (exact, the same sums as row by row); only the parse of the slots'
    stored text is shared between passes."""
    concurrent: dict[str, int] = {}
    terms: dict[tuple[str, str], list[tuple[ResourceSlot, int]]] = {}
    by_key_terms: dict[str, list[tuple[ResourceSlot, int]]] = {}
    columns = (
        Session.access_key,
        Session.user_id,
        Session.group_id,
        Session.domain_name,
        json_text(Session.occupied_slots),
        json_text(Session.requested_slots),
    )
    rows = await db.execute(
        sa.select(*columns, sa.func.count()).where(Session.status.in_(OCCUPYING)).group_by(*columns)
    )
    for access_key, user_id, group_id, domain, occupied_text, requested_text, n in rows:
        count = int(n)
        occupied = texts.get("slots", occupied_text, parse_slots)
        slots = (
            occupied if len(occupied.nonzero()) else texts.get("slots", requested_text, parse_slots)
        )
        concurrent[access_key] = concurrent.get(access_key, 0) + count
        by_key_terms.setdefault(access_key, []).append((slots, count))
        for scope in (
            ("keypair", access_key),
            ("user", str(user_id)),
            ("group", str(group_id)),
            ("domain", domain),
        ):
            terms.setdefault(scope, []).append((slots, count))
    occupancy = {scope: ResourceSlot.sum_of(t) for scope, t in terms.items()}
    by_key = {key: ResourceSlot.sum_of(t) for key, t in by_key_terms.items()}
    return concurrent, occupancy, by_key


async def predicate_context(
    db: AsyncSession,
    pending: list[PendingSession],
    now: datetime,
    known: Mapping[str, SlotTypes],
    texts: Texts,
    options: SchedulerOptions,
) -> tuple[PredicateContext, dict[str, ResourceSlot]]:
    """The predicates' inputs for ``pending``: the owners' policy limits and quotas, the
    dependencies' states and, when something reads them (a concurrency limit, a quota,
    the drf picker, a predicate set other than the default), the counters of
    :func:`_counters` — skipped otherwise: at thousands of running sessions they are
    the largest read of a pass, and the common cluster sets no limit."""
    limits: dict[str, KeypairLimits] = {}
    quotas: dict[tuple[str, str], ResourceSlot] = {}
    dependencies: dict[str, DependencyState] = {}
    if pending:
        keys = sorted({p.access_key for p in pending})
        policy_rows = await db.execute(
            sa.select(Keypair.access_key, KeypairResourcePolicy)
            .join(KeypairResourcePolicy, KeypairResourcePolicy.name == Keypair.resource_policy)
            .where(Keypair.access_key.in_(keys))
        )
        for access_key, policy in policy_rows:
            limits[access_key] = KeypairLimits(
                max_concurrent_sessions=policy.max_concurrent_sessions,
                max_pending_session_count=policy.max_pending_session_count,
                max_pending_session_resource_slots=policy.max_pending_session_resource_slots,
                total_resource_slots=_keypair_quota(policy, known),
            )
        user_ids = sorted(uuid.UUID(u) for u in {p.user_id for p in pending})
        for uid, total in await db.execute(
            sa.select(User.id, User.total_resource_slots).where(User.id.in_(user_ids))
        ):
            if (q := _quota(total, known)) is not None:
                quotas[("user", str(uid))] = q
        group_ids = sorted(uuid.UUID(g) for g in {p.group_id for p in pending})
        for gid, total in await db.execute(
            sa.select(Group.id, Group.total_resource_slots).where(Group.id.in_(group_ids))
        ):
            if (q := _quota(total, known)) is not None:
                quotas[("group", str(gid))] = q
        domains = sorted({p.domain_name for p in pending})
        for name, total in await db.execute(
            sa.select(Domain.name, Domain.total_resource_slots).where(Domain.name.in_(domains))
        ):
            if (q := _quota(total, known)) is not None:
                quotas[("domain", name)] = q
        dep_ids = sorted({uuid.UUID(d) for p in pending for d in p.dependencies})
        if dep_ids:
            for sid, status, result, exit_code in await db.execute(
                sa.select(Session.id, Session.status, Session.result, Session.exit_code).where(
                    Session.id.in_(dep_ids)
                )
            ):
                succeeded = status is SessionStatus.TERMINATED and (
                    result is SessionResult.SUCCESS
                    or (result is SessionResult.UNDEFINED and exit_code in (0, None))
                )
                dependencies[str(sid)] = DependencyState(str(status), succeeded)
    concurrent: dict[str, int] = {}
    occupancy: dict[tuple[str, str], ResourceSlot] = {}
    by_key: dict[str, ResourceSlot] = {}
    if (
        options.picker is PickerName.DRF
        or options.predicates is not DEFAULT_PREDICATES
        or quotas
        or any(limit.limits_running for limit in limits.values())
    ):
        concurrent, occupancy, by_key = await _counters(db, texts)
    ctx = PredicateContext(
        now=now,
        limits=limits,
        dependencies=dependencies,
        concurrent_sessions=concurrent,
        occupancy=occupancy,
        quotas=quotas,
    )
    return ctx, by_key


def _quota(total: ResourceSlot, known: Mapping[str, SlotTypes]) -> ResourceSlot | None:
    """User / group / domain quotas: listed slots limit, unlisted ones are unlimited."""
    listed = dict(total.items())
    if not listed:
        return None
    return ResourceSlot({**dict.fromkeys(known, _INFINITY), **listed})


def _keypair_quota(
    policy: KeypairResourcePolicy, known: Mapping[str, SlotTypes]
) -> ResourceSlot | None:
    if policy.default_for_unspecified is DefaultForUnspecified.UNLIMITED and not len(
        policy.total_resource_slots
    ):
        return None
    return ResourceSlot.from_policy(
        {
            "default_for_unspecified": policy.default_for_unspecified.value,
            "total_resource_slots": policy.total_resource_slots.to_json(),
        },
        known,
    )
