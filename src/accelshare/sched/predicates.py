"""Predicates: may this session start now, independent of which agent?

Each predicate returns a :class:`PredicateResult` with a readable message; a failed
predicate leaves the session PENDING (it is an expected outcome, not an error).
Counters come from the snapshot, which the manager derives from its database in the
same transaction as the pass, so they cannot drift.

| name | passes when |
|---|---|
| reserved_time | the session has no ``starts_at`` or it is not in the future |
| dependencies | every session it depends on TERMINATED successfully |
| concurrency | the access key runs fewer than ``max_concurrent_sessions`` (0 = unlimited) |
| keypair_resource_limit | keypair occupancy + request <= the keypair's policy |
| user/group/domain_resource_limit | occupancy + request <= that quota |
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from accelshare.common import ResourceSlot, canonical_decimal

from .model import KeypairLimits, PendingSession, PredicateResult

__all__ = [
    "DEFAULT_PREDICATES",
    "DependencyState",
    "PredicateContext",
    "check_enqueue_limits",
    "predicate_results",
    "run_predicates",
]

_EMPTY = ResourceSlot()
_NO_LIMITS = KeypairLimits()
_PASSED: dict[str, PredicateResult] = {}


def _passed(name: str) -> PredicateResult:
    """The (frozen, shared) result of a predicate that passed: a pass runs every
    predicate for every pending session, so it does not build thousands of equal ones."""
    result = _PASSED.get(name)
    if result is None:
        result = _PASSED[name] = PredicateResult(name, True)
    return result


@dataclass(frozen=True, slots=True)
class DependencyState:
    status: str  # a SessionStatus value
    succeeded: bool  # TERMINATED with exit code 0 / result SUCCESS


@dataclass(slots=True)
class PredicateContext:
    """Everything the predicates read.  Mutable only through :meth:`occupy`."""

    now: datetime
    limits: Mapping[str, KeypairLimits] = field(default_factory=dict)
    dependencies: Mapping[str, DependencyState] = field(default_factory=dict)
    concurrent_sessions: dict[str, int] = field(default_factory=dict)
    # occupancy and quotas keyed by (scope, id): ("keypair", ak), ("user", uid), ...
    occupancy: dict[tuple[str, str], ResourceSlot] = field(default_factory=dict)
    quotas: Mapping[tuple[str, str], ResourceSlot] = field(default_factory=dict)

    def occupy(self, session: PendingSession) -> None:
        """Account a session placed earlier in the same pass."""
        self.concurrent_sessions[session.access_key] = (
            self.concurrent_sessions.get(session.access_key, 0) + 1
        )
        for scope_key in _scope_keys(session):
            self.occupancy[scope_key] = (
                self.occupancy.get(scope_key, _EMPTY) + session.requested_slots
            )


def _scope_keys(session: PendingSession) -> list[tuple[str, str]]:
    return [
        ("keypair", session.access_key),
        ("user", session.user_id),
        ("group", session.group_id),
        ("domain", session.domain_name),
    ]


def reserved_time(session: PendingSession, ctx: PredicateContext) -> PredicateResult:
    if session.starts_at is not None and session.starts_at > ctx.now:
        return PredicateResult(
            "reserved_time", False, f"Before start time ({session.starts_at.isoformat()})"
        )
    return _passed("reserved_time")


def dependencies(session: PendingSession, ctx: PredicateContext) -> PredicateResult:
    waiting = []
    for dep in session.dependencies:
        state = ctx.dependencies.get(dep)
        if state is None or state.status != "TERMINATED" or not state.succeeded:
            described = "unknown" if state is None else state.status.lower()
            if state is not None and state.status == "TERMINATED":
                described = "terminated unsuccessfully"
            waiting.append(f"{dep} ({described})")
    if waiting:
        return PredicateResult(
            "dependencies", False, "Waiting for dependency sessions: " + ", ".join(waiting)
        )
    return _passed("dependencies")


def concurrency(session: PendingSession, ctx: PredicateContext) -> PredicateResult:
    limit = ctx.limits.get(session.access_key, _NO_LIMITS).max_concurrent_sessions
    running = ctx.concurrent_sessions.get(session.access_key, 0)
    if limit > 0 and running >= limit:
        return PredicateResult(
            "concurrency",
            False,
            f"You cannot run more than {limit} concurrent session(s) ({running} running)",
        )
    return _passed("concurrency")


def _quota_check(
    name: str,
    label: str,
    scope_key: tuple[str, str],
    quota: ResourceSlot | None,
    session: PendingSession,
    ctx: PredicateContext,
) -> PredicateResult:
    if quota is None:
        return _passed(name)
    occupied = ctx.occupancy.get(scope_key, _EMPTY)
    wanted = occupied + session.requested_slots
    over = {
        slot: amount
        for slot, amount in wanted.items()
        if amount > 0 and amount > quota.get_amount(slot)
    }
    if over:
        details = "; ".join(
            f"{slot}: {canonical_decimal(occupied.get_amount(slot))} in use + "
            f"{canonical_decimal(session.requested_slots.get_amount(slot))} requested > "
            f"{canonical_decimal(quota.get_amount(slot))} allowed"
            for slot in over
        )
        return PredicateResult(name, False, f"{label} resource quota exceeded ({details})")
    return _passed(name)


def keypair_resource_limit(session: PendingSession, ctx: PredicateContext) -> PredicateResult:
    quota = ctx.limits.get(session.access_key, _NO_LIMITS).total_resource_slots
    return _quota_check(
        "keypair_resource_limit", "Keypair", ("keypair", session.access_key), quota, session, ctx
    )


def user_resource_limit(session: PendingSession, ctx: PredicateContext) -> PredicateResult:
    key = ("user", session.user_id)
    return _quota_check("user_resource_limit", "User", key, ctx.quotas.get(key), session, ctx)


def group_resource_limit(session: PendingSession, ctx: PredicateContext) -> PredicateResult:
    key = ("group", session.group_id)
    return _quota_check("group_resource_limit", "Group", key, ctx.quotas.get(key), session, ctx)


def domain_resource_limit(session: PendingSession, ctx: PredicateContext) -> PredicateResult:
    key = ("domain", session.domain_name)
    return _quota_check("domain_resource_limit", "Domain", key, ctx.quotas.get(key), session, ctx)


Predicate = Callable[[PendingSession, PredicateContext], PredicateResult]

DEFAULT_PREDICATES: tuple[Predicate, ...] = (
    reserved_time,
    dependencies,
    concurrency,
    keypair_resource_limit,
    user_resource_limit,
    group_resource_limit,
    domain_resource_limit,
)


def run_predicates(
    session: PendingSession,
    ctx: PredicateContext,
    predicates: Sequence[Predicate] = DEFAULT_PREDICATES,
) -> tuple[list[PredicateResult], list[PredicateResult]]:
    """Run every predicate (no short-circuit, so the user sees all reasons at once)."""
    if predicates is DEFAULT_PREDICATES and _passes_trivially(session, ctx):
        return list(_DEFAULT_PASSED), []
    passed: list[PredicateResult] = []
    failed: list[PredicateResult] = []
    for predicate in predicates:
        result = predicate(session, ctx)
        (passed if result.passed else failed).append(result)
    return passed, failed


def predicate_results(
    session: PendingSession,
    ctx: PredicateContext,
    predicates: Sequence[Predicate] = DEFAULT_PREDICATES,
) -> tuple[tuple[PredicateResult, ...], tuple[PredicateResult, ...]]:
    """:func:`run_predicates` as ``(passed, failed)`` tuples; when no default predicate
    can fail, the same shared tuple for every session (a pass keeps one per session)."""
    if predicates is DEFAULT_PREDICATES and _passes_trivially(session, ctx):
        return _DEFAULT_PASSED, ()
    passed, failed = run_predicates(session, ctx, predicates)
    return tuple(passed), tuple(failed)


def passed_without_limits(
    ctx: PredicateContext, predicates: Sequence[Predicate] = DEFAULT_PREDICATES
) -> tuple[PredicateResult, ...] | None:
    """With the default predicates, no quota and no keypair limit that running
    sessions count against (a keypair's pending-queue limits are checked at enqueue):
    the passed results :func:`predicate_results` gives every session without a start
    time and dependencies (the same shared tuple); otherwise None."""
    if (
        predicates is DEFAULT_PREDICATES
        and not ctx.quotas
        and not any(limits.limits_running for limits in ctx.limits.values())
    ):
        return _DEFAULT_PASSED
    return None


_DEFAULT_PASSED = tuple(
    _passed(name)
    for name in (
        "reserved_time",
        "dependencies",
        "concurrency",
        "keypair_resource_limit",
        "user_resource_limit",
        "group_resource_limit",
        "domain_resource_limit",
    )
)


def _passes_trivially(session: PendingSession, ctx: PredicateContext) -> bool:
    """Every default predicate passes without looking further: no start time, no
    dependencies, no keypair concurrency limit or quota and no user, group or domain
    quota (the common case; a pass asks it for thousands of sessions)."""
    if session.starts_at is not None or session.dependencies:
        return False
    limits = ctx.limits.get(session.access_key)
    if limits is not None and limits.limits_running:
        return False
    quotas = ctx.quotas
    return not quotas or all(key not in quotas for key in _scope_keys(session)[1:])


def check_enqueue_limits(
    limits: KeypairLimits,
    *,
    pending_count: int,
    pending_slots: ResourceSlot,
    requested: ResourceSlot,
) -> str | None:
    """Pending-queue limits are checked when a session is enqueued, not in a pass.

    Returns the refusal reason, or None.  (Backend.AI checks them as scheduling
    predicates, which blocks sessions already queued; refusing the new request is
    what a user can act on.)
    """
    if limits.max_pending_session_count > 0 and pending_count >= limits.max_pending_session_count:
        return (
            f"You cannot have more than {limits.max_pending_session_count} pending session(s)"
            f" ({pending_count} pending)"
        )
    cap = limits.max_pending_session_resource_slots
    if cap is not None:
        wanted = pending_slots + requested
        over = [s for s, v in wanted.items() if v > 0 and v > cap.get_amount(s)]
        if over:
            return "Pending sessions would exceed the pending resource limit: " + ", ".join(
                f"{s} {canonical_decimal(wanted.get_amount(s))} > "
                f"{canonical_decimal(cap.get_amount(s))}"
                for s in over
            )
    return None
