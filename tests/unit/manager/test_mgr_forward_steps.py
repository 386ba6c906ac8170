"""``forward_steps``: the steps ``walk_forward`` takes, as the binder's bulk path records them."""

from __future__ import annotations

import pytest

from accelshare.manager.transitions import forward_steps
from accelshare.sched.lifecycle import SessionStatus as S


def test_steps_from_each_bindable_status() -> None:
    r = "why"
    assert forward_steps(S.PREPARING, S.CREATING, r) == [
        (S.PREPARING, S.PREPARED, r),
        (S.PREPARED, S.CREATING, r),
    ]
    # PULLING sits where PREPARING does; the first step leaves PULLING
    assert forward_steps(S.PULLING, S.CREATING, r) == [
        (S.PULLING, S.PREPARED, r),
        (S.PREPARED, S.CREATING, r),
    ]
    assert forward_steps(S.CREATING, S.RUNNING, r) == [(S.CREATING, S.RUNNING, r)]


@pytest.mark.parametrize("current", [S.CREATING, S.RUNNING, S.TERMINATED, S.CANCELLED])
def test_nothing_when_at_or_past_the_target_or_off_the_chain(current: S) -> None:
    assert forward_steps(current, S.CREATING, "why") == []
