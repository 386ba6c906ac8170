"""Failed-login throttling (accelshare.api.login_throttle) under a hand-driven clock."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from accelshare.api.login_throttle import KNOWN_ADDRESSES, LoginThrottle, ThrottleSettings

SETTINGS = ThrottleSettings(
    window_s=60.0, max_per_address=6, max_per_account_address=3, max_per_account=4
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def throttle(**changes: object) -> tuple[LoginThrottle, Clock]:
    clock = Clock()
    return LoginThrottle(SETTINGS, clock=clock, **changes), clock  # type: ignore[arg-type]


def test_one_account_from_one_address_is_throttled_until_the_window_passes() -> None:
    t, clock = throttle()
    for _ in range(3):
        assert t.check("a@x", "1.1.1.1") is None
        t.failed("a@x", "1.1.1.1")
        clock.now += 10
    refusal = t.check("a@x", "1.1.1.1")
    assert refusal is not None
    assert (refusal.limit, refusal.value) == ("max-failures-per-account-address", 3)
    assert refusal.retry_after_s == 30  # the first failure (at 1000) leaves at 1060; now 1030
    clock.now = 1059.5
    assert t.check("a@x", "1.1.1.1") is not None
    clock.now = 1060.0
    assert t.check("a@x", "1.1.1.1") is None


def test_other_addresses_are_not_locked_out_by_one_guesser() -> None:
    t, _clock = throttle()
    for _ in range(3):
        t.failed("a@x", "6.6.6.6")
    assert t.check("a@x", "6.6.6.6") is not None
    assert t.check("a@x", "1.1.1.1") is None


def test_one_address_spraying_accounts_is_throttled_for_every_account() -> None:
    t, _clock = throttle()
    for i in range(6):
        t.failed(f"u{i}@x", "6.6.6.6")
    refusal = t.check("new@x", "6.6.6.6")
    assert refusal is not None
    assert refusal.limit == "max-failures-per-address"
    assert t.check("new@x", "1.1.1.1") is None


def test_many_addresses_throttle_the_account_but_not_from_its_known_address() -> None:
    t, clock = throttle()
    t.succeeded("admin@x", "10.0.0.1")  # the owner's usual address
    for i in range(4):
        t.failed("admin@x", f"6.6.6.{i}")
    refusal = t.check("admin@x", "7.7.7.7")
    assert refusal is not None
    assert refusal.limit == "max-failures-per-account"
    assert t.check("admin@x", "10.0.0.1") is None
    clock.now += SETTINGS.window_s
    assert t.check("admin@x", "7.7.7.7") is None


def test_known_addresses_are_the_last_few() -> None:
    t, _clock = throttle()
    for i in range(KNOWN_ADDRESSES + 1):
        t.succeeded("a@x", f"10.0.0.{i}")
    for i in range(4):
        t.failed("a@x", f"6.6.6.{i}")
    assert t.check("a@x", "10.0.0.0") is not None  # the oldest was forgotten
    assert t.check("a@x", f"10.0.0.{KNOWN_ADDRESSES}") is None


def test_a_success_clears_the_accounts_failures_not_the_addresss() -> None:
    t, _clock = throttle()
    for _ in range(2):
        t.failed("a@x", "1.1.1.1")
    for i in range(4):
        t.failed(f"u{i}@x", "1.1.1.1")
    t.succeeded("a@x", "1.1.1.1")
    assert t.check("a@x", "1.1.1.1") is not None  # the address still has 6 failures
    assert t.check("a@x", "2.2.2.2") is None


def test_changed_settings_keep_the_counted_failures() -> None:
    t, _clock = throttle()
    for _ in range(2):
        t.failed("a@x", "1.1.1.1")
    t.settings = ThrottleSettings(window_s=60.0, max_per_account_address=2)
    t.failed("a@x", "1.1.1.1")
    refusal = t.check("a@x", "1.1.1.1")
    assert refusal is not None
    assert refusal.value == 2


def test_the_counters_are_bounded() -> None:
    t, clock = throttle(max_keys=10)
    for i in range(5):
        t.failed(f"old{i}@x", f"9.9.9.{i}")
    clock.now += SETTINGS.window_s + 1
    for i in range(20):
        t.failed(f"new{i}@x", f"8.8.8.{i}")
        t.succeeded(f"ok{i}@x", "8.8.8.8")
    assert len(t._failures) <= 10
    assert len(t._known) <= 11


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["a@x", "b@x", "root@x"]),
            st.sampled_from(["1.1.1.1", "2.2.2.2", "3.3.3.3"]),
            st.booleans(),
            st.floats(min_value=0, max_value=30),
        ),
        max_size=60,
    )
)
def test_a_lockout_never_outlasts_the_window(
    events: list[tuple[str, str, bool, float]],
) -> None:
    """Whatever an attacker sends (refused attempts are not counted), a refusal asks
    to wait at most the window, and once the window has passed since the last counted
    failure every login may be tried again."""
    t, clock = throttle()
    last_counted = -math.inf
    for account, address, ok, delay in events:
        clock.now += delay
        refusal = t.check(account, address)
        if refusal is not None:
            assert 1 <= refusal.retry_after_s <= math.ceil(SETTINGS.window_s)
            continue
        if ok:
            t.succeeded(account, address)
        else:
            t.failed(account, address)
            last_counted = clock.now
    clock.now = max(clock.now, last_counted + SETTINGS.window_s)
    for account in ("a@x", "b@x", "root@x"):
        for address in ("1.1.1.1", "2.2.2.2", "3.3.3.3"):
            assert t.check(account, address) is None
