"""The reasons kept between passes (``PlanMemo``) never change a plan: a pass with the
previous pass's memo gives exactly the plan of a pass without one, whatever changed in
between (agents replaced, added or gone, sessions placed or new), and a pass over the
same agents reuses their reasons."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import accelshare.sched.onepass as onepass_module
from accelshare.sched.memo import PlanMemo
from accelshare.sched.model import PendingSession
from accelshare.sched.outcome import MAX_AGENT_REASONS, FailureKind, SchedulingPlan
from accelshare.sched.pickers import PickerName
from accelshare.sched.plan import place_pass, plan_pass
from accelshare.sched.snapshot import SchedulerOptions, SchedulingSnapshot

from .builders import T0, gpu_agent, session, slots
from .test_plan_equivalence import agents, scenarios


def assert_identical(with_memo: SchedulingPlan, without: SchedulingPlan) -> None:
    assert with_memo.assignments == without.assignments
    assert with_memo.failures == without.failures
    assert with_memo.last_roundrobin_agent == without.last_roundrobin_agent


@st.composite
def next_snapshots(draw: st.DrawFn, first: SchedulingSnapshot) -> SchedulingSnapshot:
    """The next pass's snapshot: unchanged agents are the *same* objects (as the
    manager's snapshot cache hands them), some replaced by new states, some gone, a new
    one; the pending sessions placed in between are gone, the rest keep their order."""
    cluster = list(first.agents)
    for i in draw(st.sets(st.integers(0, len(cluster) - 1), max_size=3)):
        fresh = draw(agents(i))
        cluster[i] = replace(fresh, state=replace(fresh.state, id=cluster[i].state.id))
    if len(cluster) > 1 and draw(st.booleans()):
        del cluster[draw(st.integers(0, len(cluster) - 1))]
    if draw(st.booleans()):
        cluster.append(draw(agents(99)))
    pending = list(first.pending)
    for _ in range(draw(st.integers(0, min(3, len(pending) - 1)))):
        del pending[draw(st.integers(0, len(pending) - 1))]
    options = first.options
    if draw(st.booleans()):  # the same sessions, another picker or skip: another order
        options = replace(
            options,
            picker=draw(st.sampled_from(list(PickerName))),
            num_retries_to_skip=draw(st.sampled_from([0, 1, 2])),
        )
    return replace(first, agents=tuple(cluster), pending=tuple(pending), options=options)


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_a_memo_never_changes_the_plan(data: st.DataObject) -> None:
    first = data.draw(scenarios())
    memo = PlanMemo()
    assert_identical(plan_pass(first, memo), plan_pass(first))
    for _ in range(3):
        following = data.draw(next_snapshots(first))
        if data.draw(st.booleans()):  # a pass whose placements were never explained
            place_pass(following, memo)
        assert_identical(plan_pass(following, memo), plan_pass(following))
        first = following


@settings(max_examples=100, deadline=None)
@given(scenarios())
def test_placing_then_explaining_is_the_whole_pass(snapshot: SchedulingSnapshot) -> None:
    whole = plan_pass(snapshot)
    placed = place_pass(snapshot)
    assert placed.placements.assignments == whole.assignments
    assert placed.placements.last_roundrobin_agent == whole.last_roundrobin_agent
    assert placed.placements.failures == ()
    plan = placed.explain()
    assert plan == whole
    assert placed.explain() is plan  # worked out once


def test_a_band_of_the_same_sessions_is_ordered_once() -> None:
    cluster = (gpu_agent("a00", "0.8", "0.9"),)
    pending = tuple(
        session(f"s{i}", age_s=10 - i, requested_slots=slots(cpu=1, cuda_shares="1"))
        for i in range(5)
    )
    snapshot = SchedulingSnapshot("default", T0, cluster, pending)
    memo = PlanMemo()
    first = plan_pass(snapshot, memo)
    order = memo.orders[pending[0].priority][2]
    assert [s.id for s in order] == ["s4", "s3", "s2", "s1", "s0"]  # oldest first
    assert plan_pass(snapshot, memo) == first
    assert memo.orders[pending[0].priority][2] is order  # not sorted again
    # an equal band of new objects, or another picker, is sorted anew
    renewed = replace(snapshot, pending=tuple(replace(s) for s in pending))
    plan_pass(renewed, memo)
    assert memo.orders[pending[0].priority][2] is not order
    lifo = replace(renewed, options=SchedulerOptions(picker=PickerName.LIFO))
    plan_pass(lifo, memo)
    assert [s.id for s in memo.orders[pending[0].priority][2]] == ["s0", "s1", "s2", "s3", "s4"]


def test_a_placed_pass_leaves_the_memo_as_it_was_until_explained() -> None:
    cluster = tuple(gpu_agent(f"a{i:02d}", "0.8", "0.9", cpus=8 + i) for i in range(3))
    pending = (session("s0", requested_slots=slots(cpu=1, cuda_shares="1")),)
    snapshot = SchedulingSnapshot("default", T0, cluster, pending)
    memo = PlanMemo()
    plan_pass(snapshot, memo)
    entries, orders = memo.entries, memo.orders
    placed = place_pass(replace(snapshot, agents=cluster[:2]), memo)
    assert memo.entries is entries
    assert memo.orders is orders
    plan = placed.explain()
    assert memo.entries is not entries
    assert [r.split(":")[0] for r in plan.failures[0].agent_reasons] == ["a00", "a01"]


def test_reasons_of_unchanged_agents_are_reused() -> None:
    # a full cluster: nothing fits, each shown agent explains each of the two shapes
    # (agents built alike would be explained once in a pass: they differ in cores)
    cluster = tuple(gpu_agent(f"a{i:02d}", "0.8", "0.9", cpus=8 + i) for i in range(12))
    pending = tuple(
        session(f"s{i}", age_s=i, requested_slots=slots(cpu=1, cuda_shares=shares))
        for i, shares in enumerate(["0.5", "1", "0.5", "1"])
    )
    snapshot = SchedulingSnapshot("default", T0, cluster, pending)
    memo = PlanMemo()
    first = plan_pass(snapshot, memo)
    assert not first.assignments
    assert first.failures[0].agent_reasons[0].startswith("a00: cuda.shares needs 0.5")
    assert memo.hits == 0
    assert len(memo.entries) == 2 * MAX_AGENT_REASONS  # shapes x shown agents
    # each session's shape key, kept by identity, two distinct keys
    assert {id(s) for s in pending} == set(memo.shape_ids)
    assert sorted(memo.shape_keys.values()) == [0, 1]
    assert plan_pass(snapshot, memo).failures == first.failures
    assert memo.hits == 2 * MAX_AGENT_REASONS  # every reason came from the memo
    # one agent replaced (a release there): only its reasons are worked out again
    freed = replace(snapshot, agents=(gpu_agent("a00", "0", "0.9", cpus=8), *cluster[1:]))
    hits = memo.hits
    again = plan_pass(freed, memo)
    assert again == plan_pass(freed)
    # both 0.5-share sessions fit a00 now; the 1-share ones are explained by the nine
    # unchanged shown agents from the memo, by a00 anew
    assert [(a.session_id, a.agent_id) for a in again.assignments] == [("s0", "a00"), ("s2", "a00")]
    assert memo.hits - hits == MAX_AGENT_REASONS - 1
    # equal but new objects are explained anew (identity, not equality, is the key)
    renewed = replace(snapshot, agents=tuple(replace(a) for a in cluster))
    hits = memo.hits
    assert plan_pass(renewed, memo).failures == first.failures
    assert memo.hits == hits


def test_sessions_of_a_failed_shape_still_hold_lower_bands_back_on_a_memoed_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # two priority-50 sessions of one shape that fit the agent only when it is empty;
    # on the second pass (shapes from the memo) the second one takes the O(1) path of a
    # failed shape, and the agent's GPUs are still protected from the priority-10 one
    cluster = (gpu_agent("a00", "0.8", "0.9"),)
    big = slots(cpu=1, cuda_shares="1")
    pending = (
        session("h1", age_s=1, priority=50, requested_slots=big),
        session("h2", age_s=2, priority=50, requested_slots=big),
        session("low", age_s=3, priority=10, requested_slots=slots(cpu=1, cuda_shares="0.1")),
    )
    snapshot = SchedulingSnapshot("default", T0, cluster, pending)
    memo = PlanMemo()
    first = plan_pass(snapshot, memo)
    tried: list[str] = []  # sessions that went through the predicates (the general path)
    predicate_results = onepass_module.predicate_results

    def counted(session: PendingSession, *args: Any) -> Any:
        tried.append(session.id)
        return predicate_results(session, *args)

    monkeypatch.setattr(onepass_module, "predicate_results", counted)
    second = plan_pass(snapshot, memo)
    assert tried == ["h1", "low"]  # h2: its shape failed with h1, in O(1)
    assert second == first == plan_pass(snapshot)
    assert not second.assignments
    kinds = {f.session_id: f.kind for f in second.failures}
    assert kinds == {
        "h1": FailureKind.NO_AGENT,
        "h2": FailureKind.NO_AGENT,
        "low": FailureKind.DEFERRED,
    }
