"""The session lifecycle: statuses, the allowed-transition table and its checks.

Pure and synchronous (no I/O): the manager asks this module before it writes a new
status, and records every transition it makes in the status history.

The table is the one of spec 05, plus the way back to the queue::

    PENDING -> SCHEDULED -> PREPARING -> (PULLING -> PREPARED) -> CREATING -> RUNNING
            -> TERMINATING -> TERMINATED
    plus ERROR (from every live status) and CANCELLED (from every status before RUNNING);
    plus PENDING from every status between SCHEDULED and CREATING (the agent refused
    the manager's plan as a conflict: the session is planned again);
    TERMINATED and CANCELLED are final.

    >>> can_transition(SessionStatus.PENDING, SessionStatus.SCHEDULED)
    True
    >>> can_transition(SessionStatus.RUNNING, SessionStatus.CANCELLED)
    False
    >>> is_resource_occupying(SessionStatus.PENDING), is_resource_occupying(SessionStatus.ERROR)
    (False, True)

A transition to the same status is *not* a transition and is refused; callers that
may repeat an update (idempotent handlers) compare first.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType

__all__ = [
    "ALLOWED_TRANSITIONS",
    "FINAL_STATUSES",
    "RESOURCE_OCCUPYING_STATUSES",
    "InvalidStatusTransition",
    "SessionResult",
    "SessionStatus",
    "allowed_next",
    "can_transition",
    "check_transition",
    "is_final",
    "is_resource_occupying",
]


class SessionStatus(enum.StrEnum):
    """Where a session (and each of its kernels) is in its life."""

    PENDING = "PENDING"  # enqueued, waiting for the scheduler
    SCHEDULED = "SCHEDULED"  # an agent was chosen and its resources reserved
    PREPARING = "PREPARING"  # the agent is preparing (scratch dirs, plugins)
    PULLING = "PULLING"  # the agent is pulling the image
    PREPARED = "PREPARED"  # ready to create the kernel
    CREATING = "CREATING"  # the kernel's container/process is being started
    RUNNING = "RUNNING"
    TERMINATING = "TERMINATING"  # destroy requested, resources still held
    TERMINATED = "TERMINATED"  # final: resources released
    ERROR = "ERROR"  # something broke; must still be terminated to free resources
    CANCELLED = "CANCELLED"  # final: never ran (refused, timed out, kernel failed to start)


class SessionResult(enum.StrEnum):
    """How a session ended, as dependency predicates read it."""

    UNDEFINED = "UNDEFINED"
    SUCCESS = "SUCCESS"
    FAILURE = "FAILURE"


_S = SessionStatus

ALLOWED_TRANSITIONS: Mapping[SessionStatus, frozenset[SessionStatus]] = MappingProxyType(
    {
        _S.PENDING: frozenset({_S.SCHEDULED, _S.ERROR, _S.CANCELLED}),
        _S.SCHEDULED: frozenset(
            {_S.PREPARING, _S.PULLING, _S.PREPARED, _S.ERROR, _S.CANCELLED, _S.PENDING}
        ),
        _S.PREPARING: frozenset({_S.PULLING, _S.PREPARED, _S.ERROR, _S.CANCELLED, _S.PENDING}),
        _S.PULLING: frozenset({_S.PREPARED, _S.ERROR, _S.CANCELLED, _S.PENDING}),
        _S.PREPARED: frozenset({_S.CREATING, _S.ERROR, _S.CANCELLED, _S.PENDING}),
        _S.CREATING: frozenset({_S.RUNNING, _S.ERROR, _S.CANCELLED, _S.PENDING}),
        _S.RUNNING: frozenset({_S.TERMINATING, _S.TERMINATED, _S.ERROR}),
        _S.TERMINATING: frozenset({_S.TERMINATED, _S.ERROR}),
        _S.ERROR: frozenset({_S.TERMINATING, _S.TERMINATED}),
        _S.TERMINATED: frozenset(),
        _S.CANCELLED: frozenset(),
    }
)
"""status -> the statuses it may move to (spec 05, "Session lifecycle", and re-planning)."""

FINAL_STATUSES: frozenset[SessionStatus] = frozenset({_S.TERMINATED, _S.CANCELLED})

RESOURCE_OCCUPYING_STATUSES: frozenset[SessionStatus] = frozenset(SessionStatus) - {
    _S.PENDING,
    _S.TERMINATED,
    _S.CANCELLED,
}
"""Statuses whose sessions hold agent resources (ERROR included: it is not released yet)."""


class InvalidStatusTransition(ValueError):
    """A status change that the lifecycle table does not allow.

    Carries ``current``, ``requested`` and ``allowed`` so that an API error can name them.
    """

    def __init__(self, current: SessionStatus, requested: SessionStatus) -> None:
        self.current = current
        self.requested = requested
        self.allowed = ALLOWED_TRANSITIONS[current]
        if current in FINAL_STATUSES:
            why = f"{current} is final"
        elif current == requested:
            why = f"the session is already {current}"
        else:
            why = "allowed from " + str(current) + ": " + ", ".join(sorted(self.allowed))
        super().__init__(f"Cannot change a session's status from {current} to {requested} ({why})")


def _coerce(status: SessionStatus | str) -> SessionStatus:
    """Accept the enum or its value; an unknown value raises ``ValueError`` naming it."""
    try:
        return SessionStatus(status)
    except ValueError:
        known = ", ".join(SessionStatus)
        raise ValueError(f"Unknown session status {status!r}: expected one of {known}") from None


def allowed_next(current: SessionStatus | str) -> frozenset[SessionStatus]:
    """The statuses ``current`` may move to (empty for final statuses)."""
    return ALLOWED_TRANSITIONS[_coerce(current)]


def can_transition(current: SessionStatus | str, requested: SessionStatus | str) -> bool:
    """True when the table allows ``current`` -> ``requested``."""
    return _coerce(requested) in ALLOWED_TRANSITIONS[_coerce(current)]


def check_transition(current: SessionStatus | str, requested: SessionStatus | str) -> SessionStatus:
    """Return ``requested`` as a :class:`SessionStatus`, or raise :class:`InvalidStatusTransition`."""
    src, dst = _coerce(current), _coerce(requested)
    if dst not in ALLOWED_TRANSITIONS[src]:
        raise InvalidStatusTransition(src, dst)
    return dst


def is_final(status: SessionStatus | str) -> bool:
    """TERMINATED and CANCELLED: nothing may follow."""
    return _coerce(status) in FINAL_STATUSES


def is_resource_occupying(status: SessionStatus | str) -> bool:
    """Every status except PENDING, TERMINATED and CANCELLED holds agent resources."""
    return _coerce(status) in RESOURCE_OCCUPYING_STATUSES
