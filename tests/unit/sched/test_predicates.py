from datetime import timedelta

import pytest

from accelshare.common import ResourceSlot
from accelshare.sched.model import KeypairLimits
from accelshare.sched.predicates import (
    DEFAULT_PREDICATES,
    DependencyState,
    PredicateContext,
    check_enqueue_limits,
    passed_without_limits,
    predicate_results,
    run_predicates,
)

from .builders import T0, session, slots


def ctx(**kw: object) -> PredicateContext:
    return PredicateContext(now=T0, **kw)  # type: ignore[arg-type]


def failed_names(s: object, c: PredicateContext) -> dict[str, str]:
    _, failed = run_predicates(s, c)  # type: ignore[arg-type]
    return {r.name: r.message for r in failed}


def test_all_pass_by_default() -> None:
    passed, failed = run_predicates(session("a"), ctx())
    assert failed == []
    assert [r.name for r in passed] == [
        "reserved_time",
        "dependencies",
        "concurrency",
        "keypair_resource_limit",
        "user_resource_limit",
        "group_resource_limit",
        "domain_resource_limit",
    ]


def test_reserved_time() -> None:
    future = session("a", starts_at=T0 + timedelta(hours=1))
    assert "Before start time" in failed_names(future, ctx())["reserved_time"]
    past = session("a", starts_at=T0 - timedelta(hours=1))
    assert failed_names(past, ctx()) == {}


@pytest.mark.parametrize(
    ("state", "fragment"),
    [
        pytest.param(None, "dep (unknown)", id="unknown"),
        pytest.param(DependencyState("RUNNING", False), "dep (running)", id="running"),
        pytest.param(
            DependencyState("TERMINATED", False), "terminated unsuccessfully", id="failed"
        ),
    ],
)
def test_dependencies_wait(state: DependencyState | None, fragment: str) -> None:
    deps = {} if state is None else {"dep": state}
    msg = failed_names(session("a", dependencies=("dep",)), ctx(dependencies=deps))
    assert fragment in msg["dependencies"]


def test_dependencies_succeeded() -> None:
    deps = {"dep": DependencyState("TERMINATED", True)}
    assert failed_names(session("a", dependencies=("dep",)), ctx(dependencies=deps)) == {}


def test_concurrency_limit_and_in_pass_accounting() -> None:
    limits = {"AK": KeypairLimits(max_concurrent_sessions=2)}
    c = ctx(limits=limits, concurrent_sessions={"AK": 1})
    first = session("a", access_key="AK")
    assert failed_names(first, c) == {}
    c.occupy(first)
    msg = failed_names(session("b", access_key="AK"), c)["concurrency"]
    assert msg == "You cannot run more than 2 concurrent session(s) (2 running)"


@pytest.mark.parametrize(
    ("limits", "trivial"),
    [
        pytest.param(KeypairLimits(), True, id="policy-without-limits"),
        pytest.param(KeypairLimits(max_pending_session_count=3), True, id="pending-limit-only"),
        pytest.param(KeypairLimits(max_concurrent_sessions=2), False, id="concurrency"),
        pytest.param(KeypairLimits(total_resource_slots=slots(cpu=4, mem=4096)), False, id="quota"),
    ],
)
def test_only_limits_on_running_sessions_make_predicates_look(
    limits: KeypairLimits, trivial: bool
) -> None:
    # the shared "all passed" tuple means nothing was looked up (running counters unread)
    c = ctx(limits={"AK": limits})
    passed, failed = predicate_results(session("a", access_key="AK"), c)
    assert failed == ()
    assert (passed is predicate_results(session("b"), ctx())[0]) is trivial
    assert limits.limits_running is not trivial
    # the pass-wide answer: the same tuple, for every session without a start time and
    # dependencies, exactly when no keypair limits running sessions
    assert (passed_without_limits(c) is passed) is trivial
    assert (passed_without_limits(c) is None) is not trivial


def test_no_pass_wide_answer_with_quotas_or_other_predicates() -> None:
    everyone = passed_without_limits(ctx())
    assert everyone is not None
    assert everyone == predicate_results(session("a"), ctx())[0]
    assert passed_without_limits(ctx(quotas={("user", "u1"): slots(cpu=1)})) is None
    assert passed_without_limits(ctx(), predicates=DEFAULT_PREDICATES[:2]) is None


def test_keypair_quota_names_slot_and_amounts() -> None:
    limits = {"AK": KeypairLimits(total_resource_slots=slots(cpu=4, mem=4096))}
    c = ctx(limits=limits, occupancy={("keypair", "AK"): slots(cpu=3)})
    msg = failed_names(session("a", access_key="AK", requested_slots=slots(cpu=2)), c)
    assert msg["keypair_resource_limit"] == (
        "Keypair resource quota exceeded (cpu: 3 in use + 2 requested > 4 allowed)"
    )


def test_quota_infinite_and_missing_slot() -> None:
    quota = slots(cpu="Infinity")
    c = ctx(quotas={("user", "u1"): quota})
    ok = session("a", user_id="u1", requested_slots=slots(cpu=100))
    assert failed_names(ok, c) == {}
    gpu = session("b", user_id="u1", requested_slots=slots(cpu=1, cuda_shares="0.5"))
    assert "cuda.shares" in failed_names(gpu, c)["user_resource_limit"]


@pytest.mark.parametrize("scope", ["group", "domain"])
def test_group_and_domain_quota(scope: str) -> None:
    c = ctx(quotas={(scope, "x"): slots(cpu=1)})
    s = session("a", group_id="x", domain_name="x", requested_slots=slots(cpu=2))
    assert f"{scope}_resource_limit" in failed_names(s, c)


def test_occupy_accumulates_for_quota() -> None:
    c = ctx(quotas={("group", "g"): slots(cpu=3)})
    first = session("a", group_id="g", requested_slots=slots(cpu=2))
    assert failed_names(first, c) == {}
    c.occupy(first)
    assert "group_resource_limit" in failed_names(
        session("b", group_id="g", requested_slots=slots(cpu=2)), c
    )


def test_enqueue_limits() -> None:
    limits = KeypairLimits(
        max_pending_session_count=2, max_pending_session_resource_slots=slots(cpu=4)
    )
    empty = ResourceSlot()
    assert (
        check_enqueue_limits(limits, pending_count=1, pending_slots=empty, requested=slots(cpu=1))
        is None
    )
    assert "more than 2 pending" in str(
        check_enqueue_limits(limits, pending_count=2, pending_slots=empty, requested=slots(cpu=1))
    )
    assert "cpu 5 > 4" in str(
        check_enqueue_limits(
            limits, pending_count=0, pending_slots=slots(cpu=3), requested=slots(cpu=2)
        )
    )
    assert (
        check_enqueue_limits(
            KeypairLimits(), pending_count=99, pending_slots=empty, requested=empty
        )
        is None
    )
