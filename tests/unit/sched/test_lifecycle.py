"""The session lifecycle table of spec 05, transition by transition."""

from __future__ import annotations

import itertools

import pytest

from accelshare.sched.lifecycle import (
    ALLOWED_TRANSITIONS,
    FINAL_STATUSES,
    RESOURCE_OCCUPYING_STATUSES,
    InvalidStatusTransition,
    SessionStatus,
    allowed_next,
    can_transition,
    check_transition,
    is_final,
    is_resource_occupying,
)

S = SessionStatus

# Spec 05, "Session lifecycle", transcribed line by line, plus PENDING from every status
# between SCHEDULED and CREATING (an agent refused the plan as a conflict: planned again).
SPEC_ALLOWED: dict[SessionStatus, set[SessionStatus]] = {
    S.PENDING: {S.SCHEDULED, S.ERROR, S.CANCELLED},
    S.SCHEDULED: {S.PREPARING, S.PULLING, S.PREPARED, S.ERROR, S.CANCELLED, S.PENDING},
    S.PREPARING: {S.PULLING, S.PREPARED, S.ERROR, S.CANCELLED, S.PENDING},
    S.PULLING: {S.PREPARED, S.ERROR, S.CANCELLED, S.PENDING},
    S.PREPARED: {S.CREATING, S.ERROR, S.CANCELLED, S.PENDING},
    S.CREATING: {S.RUNNING, S.ERROR, S.CANCELLED, S.PENDING},
    S.RUNNING: {S.TERMINATING, S.TERMINATED, S.ERROR},
    S.TERMINATING: {S.TERMINATED, S.ERROR},
    S.ERROR: {S.TERMINATING, S.TERMINATED},
    S.TERMINATED: set(),
    S.CANCELLED: set(),
}

ALLOWED_PAIRS = [(src, dst) for src, dsts in SPEC_ALLOWED.items() for dst in sorted(dsts)]
FORBIDDEN_PAIRS = [
    (src, dst)
    for src, dst in itertools.product(SessionStatus, SessionStatus)
    if dst not in SPEC_ALLOWED[src]
]


def test_table_is_exactly_the_spec() -> None:
    assert {k: set(v) for k, v in ALLOWED_TRANSITIONS.items()} == SPEC_ALLOWED
    assert set(ALLOWED_TRANSITIONS) == set(SessionStatus)


@pytest.mark.parametrize(("src", "dst"), ALLOWED_PAIRS, ids=str)
def test_every_allowed_transition(src: SessionStatus, dst: SessionStatus) -> None:
    assert can_transition(src, dst)
    assert check_transition(src, dst) is dst
    assert dst in allowed_next(src)


@pytest.mark.parametrize(("src", "dst"), FORBIDDEN_PAIRS, ids=str)
def test_every_forbidden_transition_raises(src: SessionStatus, dst: SessionStatus) -> None:
    assert not can_transition(src, dst)
    with pytest.raises(InvalidStatusTransition) as info:
        check_transition(src, dst)
    assert info.value.current is src
    assert info.value.requested is dst
    assert str(src) in str(info.value)
    assert str(dst) in str(info.value)


@pytest.mark.parametrize(
    ("src", "dst", "fragment"),
    [
        pytest.param(S.RUNNING, S.CANCELLED, "allowed from RUNNING: ERROR", id="running-cancel"),
        pytest.param(S.PENDING, S.RUNNING, "CANCELLED, ERROR, SCHEDULED", id="skip-ahead"),
        pytest.param(S.TERMINATED, S.RUNNING, "TERMINATED is final", id="revive"),
        pytest.param(S.CANCELLED, S.PENDING, "CANCELLED is final", id="requeue-cancelled"),
        pytest.param(S.RUNNING, S.RUNNING, "already RUNNING", id="same-status"),
        pytest.param(S.ERROR, S.RUNNING, "TERMINATED, TERMINATING", id="error-recover"),
    ],
)
def test_forbidden_messages_say_why(src: SessionStatus, dst: SessionStatus, fragment: str) -> None:
    with pytest.raises(InvalidStatusTransition, match=fragment):
        check_transition(src, dst)


def test_finals_have_no_way_out() -> None:
    assert {S.TERMINATED, S.CANCELLED} == FINAL_STATUSES
    for status in SessionStatus:
        assert is_final(status) == (not ALLOWED_TRANSITIONS[status])


@pytest.mark.parametrize("status", list(SessionStatus), ids=str)
def test_resource_occupying_is_all_but_pending_and_finals(status: SessionStatus) -> None:
    expected = status not in {S.PENDING, S.TERMINATED, S.CANCELLED}
    assert is_resource_occupying(status) is expected
    assert (status in RESOURCE_OCCUPYING_STATUSES) is expected


def test_error_still_occupies_until_terminated() -> None:
    assert is_resource_occupying(S.ERROR)
    assert can_transition(S.ERROR, S.TERMINATED)


def test_strings_are_accepted_and_unknown_values_named() -> None:
    assert can_transition("PENDING", "SCHEDULED")
    assert check_transition("RUNNING", "TERMINATING") is S.TERMINATING
    with pytest.raises(ValueError, match="Unknown session status 'FROZEN'"):
        can_transition("RUNNING", "FROZEN")


def test_every_status_reaches_a_final_one() -> None:
    """No dead end: from any status some path leads to TERMINATED or CANCELLED."""
    for start in SessionStatus:
        seen, frontier = {start}, [start]
        while frontier:
            for nxt in ALLOWED_TRANSITIONS[frontier.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    frontier.append(nxt)
        assert seen & FINAL_STATUSES, start


def test_lifecycle_imports_no_io_library() -> None:
    import subprocess
    import sys

    code = (
        "import sys, accelshare.sched.lifecycle\n"
        "bad = [m for m in ('asyncio', 'socket', 'sqlalchemy', 'fastapi', 'httpx') "
        "if m in sys.modules]\nprint(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
