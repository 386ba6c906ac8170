"""One pass: bands, pickers, predicates, fit, in-pass accounting, failures with reasons."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accelshare.common import ResourceSlot
from accelshare.sched.fit import sum_allocations
from accelshare.sched.model import AgentState, KeypairLimits
from accelshare.sched.outcome import NEVER_FITS, FailureKind, SchedulingPlan
from accelshare.sched.pickers import PickerName
from accelshare.sched.plan import plan_pass
from accelshare.sched.predicates import PredicateContext
from accelshare.sched.selectors import SelectorName
from accelshare.sched.snapshot import AgentSnapshot, SchedulerOptions, SchedulingSnapshot

from .builders import T0, cpu_map, gpu_agent, gpu_map, session, slots

D = Decimal


def snap(agents: list[AgentSnapshot], pending: list, **kw: object) -> SchedulingSnapshot:
    return SchedulingSnapshot(
        "default", T0 + timedelta(hours=1), tuple(agents), tuple(pending), **kw
    )  # type: ignore[arg-type]


def gpu_req(shares: str, cpu: int = 1) -> ResourceSlot:
    return slots(cpu=cpu, cuda_shares=shares)


def placed(plan: SchedulingPlan) -> dict[str, str]:
    return {a.session_id: a.agent_id for a in plan.assignments}


def failed(plan: SchedulingPlan) -> dict[str, FailureKind]:
    return {f.session_id: f.kind for f in plan.failures}


def test_seed_two_of_three_one_fgpu_sessions_fit() -> None:
    agent = gpu_agent("i-node01", 0, 0)
    pending = [session(s, age_s=i, requested_slots=gpu_req("1")) for i, s in enumerate("abc")]
    plan = plan_pass(snap([agent], pending))
    assert placed(plan) == {"a": "i-node01", "b": "i-node01"}
    (failure,) = plan.failures
    assert failure.session_id == "c"
    assert failure.kind is FailureKind.NO_AGENT
    reason = "i-node01: cuda.shares needs 1, largest placement 0 (GPU1 0, GPU2 0 free)"
    assert failure.agent_reasons == (reason,)
    assert failure.retries == 1
    data = failure.scheduler_data(T0)
    assert data["msg"] == f"No agent can hold the request now: {reason}"
    assert {p["name"] for p in data["passed_predicates"]} >= {"reserved_time", "concurrency"}


def test_a_session_no_empty_agent_could_hold_says_it_waits_for_one_to_join() -> None:
    """3 shares on two 1.0 GPUs: not "now" but never, while the agents stay as they are."""
    agent = gpu_agent("i-node01", 0, 0)
    plan = plan_pass(snap([agent], [session("big", requested_slots=gpu_req("3"))]))
    (failure,) = plan.failures
    assert failure.kind is FailureKind.NO_AGENT
    assert failure.msg == NEVER_FITS + "; ".join(failure.agent_reasons)
    assert failure.msg.startswith(
        "No agent could hold the request even if it were empty; waiting for an agent"
        " that can to join: i-node01: cuda.shares needs 3"
    )
    assert not failure.blocks_lower_priorities


def test_canonical_placement_recorded_in_the_assignment() -> None:
    pending = [
        session("small", age_s=0, requested_slots=gpu_req("0.2")),
        session("big", age_s=1, requested_slots=gpu_req("1.2")),
    ]
    plan = plan_pass(snap([gpu_agent("i-node01", 0, 0)], pending))
    allocs = {a.session_id: a.kernel_allocation["cuda.shares"] for a in plan.assignments}
    assert allocs == {"small": {"GPU2": D("0.2")}, "big": {"GPU1": D("0.6"), "GPU2": D("0.6")}}


def test_fragmented_devices_reason_per_agent() -> None:
    frag = gpu_agent("i-node01", "0.6", "0.2")
    cpu_only = AgentSnapshot(AgentState("i-node02", slots(cpu=8), slots()), (cpu_map(8),))
    s = session("s", requested_slots=gpu_req("1.5"))
    plan = plan_pass(snap([frag, cpu_only], [s]))
    assert plan.failures[0].agent_reasons == (
        "i-node01: cuda.shares needs 1.5, largest placement 1.2 (GPU1 0.4, GPU2 0.8 free)",
        "i-node02: no cuda.shares slot",
    )


def test_failures_carry_the_device_state_of_the_accelerator_slot_they_wait_for() -> None:
    """The console words these as "GPU 1 and GPU 2 are full"; ``session why --json``
    keeps the exact device ids."""
    full = gpu_agent("i-node01", 0, 0)
    cpu_only = AgentSnapshot(AgentState("i-node02", slots(cpu=8), slots()), (cpu_map(8),))
    pending = [
        session("a", age_s=0, requested_slots=gpu_req("1")),
        session("b", age_s=1, requested_slots=gpu_req("1")),
        session("c", age_s=2, requested_slots=gpu_req("0.5")),
    ]
    plan = plan_pass(snap([full, cpu_only], pending))
    assert placed(plan) == {"a": "i-node01", "b": "i-node01"}
    (failure,) = plan.failures
    (shortage,) = failure.shortages  # i-node02 has no GPU slot: nothing to show of it
    assert (shortage.agent_id, shortage.slot, shortage.needs) == (
        "i-node01",
        "cuda.shares",
        D("0.5"),
    )
    assert shortage.devices == (("GPU1", D(0), D(1)), ("GPU2", D(0), D(1)))
    assert failure.scheduler_data(T0)["devices"] == [
        {
            "agent": "i-node01",
            "slot": "cuda.shares",
            "needs": "0.5",
            "devices": [
                {"id": "GPU1", "free": "0", "capacity": "1"},
                {"id": "GPU2", "free": "0", "capacity": "1"},
            ],
        }
    ]


def test_a_failure_short_of_memory_only_shows_no_devices() -> None:
    agent = gpu_agent("i-node01", 0, 0)
    big_mem = slots(cpu=1, mem=2**50, cuda_shares="0.1")
    plan = plan_pass(snap([agent], [session("m", requested_slots=big_mem)]))
    (failure,) = plan.failures
    assert failure.agent_reasons == ("i-node01: no mem slot",)
    assert failure.shortages == ()
    assert failure.scheduler_data(T0)["devices"] == []


def test_no_head_of_line_blocking() -> None:
    pending = [
        session("huge", age_s=0, requested_slots=gpu_req("2")),
        session("small", age_s=1, requested_slots=gpu_req("0.5")),
    ]
    plan = plan_pass(snap([gpu_agent("a", "0.5", 0)], pending))
    assert placed(plan) == {"small": "a"}
    assert failed(plan) == {"huge": FailureKind.NO_AGENT}


def test_dispersed_spreads_over_agents() -> None:
    pending = [session(f"s{i}", age_s=i, requested_slots=gpu_req("0.5")) for i in range(2)]
    plan = plan_pass(snap([gpu_agent("a", 0, 0), gpu_agent("b", 0, 0)], pending))
    assert sorted(placed(plan).values()) == ["a", "b"]


def test_concentrated_packs_one_agent() -> None:
    pending = [session(f"s{i}", age_s=i, requested_slots=gpu_req("0.5")) for i in range(2)]
    options = SchedulerOptions(selector=SelectorName.CONCENTRATED)
    plan = plan_pass(snap([gpu_agent("a", 0, 0), gpu_agent("b", 0, 0)], pending, options=options))
    assert sorted(placed(plan).values()) == ["a", "a"]


def test_devices_fit_even_when_totals_rank_first_agent_higher() -> None:
    # "a" has more remaining in total but only fragments; "b" can hold 0.9 on one GPU.
    a = gpu_agent("a", "0.5", "0.5", "0.5")
    b = gpu_agent("b", "0.1", "1")
    s = session("s", requested_slots=gpu_req("0.9"), allow_fragmentation=False)
    plan = plan_pass(snap([a, b], [s]))
    assert placed(plan) == {"s": "b"}


def test_predicate_failure_keeps_every_result() -> None:
    later = session("later", starts_at=T0 + timedelta(days=1), requested_slots=gpu_req("0.1"))
    plan = plan_pass(snap([gpu_agent("a", 0)], [later]))
    (f,) = plan.failures
    assert f.kind is FailureKind.PREDICATE
    assert [p.name for p in f.failed_predicates] == ["reserved_time"]
    assert f.msg.startswith("Before start time")
    assert f.agent_reasons == ()


def test_concurrency_counted_in_pass() -> None:
    limits = {"AK": KeypairLimits(max_concurrent_sessions=1)}
    ctx = PredicateContext(now=T0, limits=limits)
    pending = [
        session("x", age_s=0, access_key="AK", requested_slots=gpu_req("0.1")),
        session("y", age_s=1, access_key="AK", requested_slots=gpu_req("0.1")),
    ]
    plan = plan_pass(snap([gpu_agent("a", 0)], pending, predicate_context=ctx))
    assert placed(plan) == {"x": "a"}
    assert failed(plan) == {"y": FailureKind.PREDICATE}
    assert ctx.concurrent_sessions == {}  # the snapshot's context is untouched


def test_highest_band_blocks_lower_when_waiting_for_resources() -> None:
    agent = gpu_agent("a", "0.5", 0)  # 1.5 free
    pending = [
        session("high", priority=50, requested_slots=gpu_req("2")),  # fits when empty
        session("low", priority=10, requested_slots=gpu_req("0.5")),
    ]
    plan = plan_pass(snap([agent], pending))
    assert placed(plan) == {}
    kinds = failed(plan)
    assert kinds == {"high": FailureKind.NO_AGENT, "low": FailureKind.DEFERRED}
    low = next(f for f in plan.failures if f.session_id == "low")
    assert (
        low.msg
        == "Waiting for priority-50 sessions to be placed first (this session has priority 10)"
    )
    assert low.retries == 0


@pytest.mark.parametrize(
    "high",
    [
        pytest.param(session("high", priority=50, requested_slots=gpu_req("3")), id="never-fits"),
        pytest.param(
            session(
                "high", priority=50, starts_at=T0 + timedelta(days=1), requested_slots=gpu_req("1")
            ),
            id="before-start-time",
        ),
    ],
)
def test_band_that_cannot_use_resources_does_not_block(high: object) -> None:
    low = session("low", priority=10, requested_slots=gpu_req("0.5"))
    plan = plan_pass(snap([gpu_agent("a", 0, 0)], [high, low]))
    assert placed(plan) == {"low": "a"}


def test_full_band_lets_next_band_run_in_same_pass() -> None:
    pending = [
        session("high", priority=50, requested_slots=gpu_req("0.5")),
        session("low", priority=10, requested_slots=gpu_req("0.5")),
    ]
    plan = plan_pass(snap([gpu_agent("a", 0, 0)], pending))
    assert set(placed(plan)) == {"high", "low"}


def test_fifo_order_and_retry_skipping() -> None:
    agent = gpu_agent("a", 0)  # room for one 1.0 session
    old = session("old", age_s=0, retries=5, requested_slots=gpu_req("1"))
    new = session("new", age_s=1, requested_slots=gpu_req("1"))
    assert placed(plan_pass(snap([agent], [new, old]))) == {"old": "a"}
    skipping = SchedulerOptions(num_retries_to_skip=3)
    assert placed(plan_pass(snap([agent], [new, old], options=skipping))) == {"new": "a"}


def test_lifo_picks_newest() -> None:
    agent = gpu_agent("a", 0)
    pending = [session(s, age_s=i, requested_slots=gpu_req("1")) for i, s in enumerate("abc")]
    options = SchedulerOptions(picker=PickerName.LIFO)
    assert placed(plan_pass(snap([agent], pending, options=options))) == {"c": "a"}


def test_drf_prefers_owner_with_smaller_share() -> None:
    agent = gpu_agent("a", 0)
    heavy = session("heavy", age_s=0, access_key="H", requested_slots=gpu_req("1"))
    light = session("light", age_s=1, access_key="L", requested_slots=gpu_req("1"))
    options = SchedulerOptions(picker=PickerName.DRF)
    occupancy = {"H": slots(cuda_shares=4)}
    plan = plan_pass(
        snap([agent], [heavy, light], options=options, occupancy_by_access_key=occupancy)
    )
    assert placed(plan) == {"light": "a"}


def test_designated_agent() -> None:
    s = session("s", designated_agent="b", requested_slots=gpu_req("0.5"))
    assert placed(plan_pass(snap([gpu_agent("a", 0), gpu_agent("b", 0)], [s]))) == {"s": "b"}
    missing = session("m", designated_agent="zz", requested_slots=gpu_req("0.5"))
    plan = plan_pass(snap([gpu_agent("a", 0)], [missing]))
    assert "zz: the designated agent is not ALIVE" in plan.failures[0].agent_reasons[0]


@pytest.mark.parametrize(
    ("case", "designated", "request_", "reason"),
    [
        # b's totals: 2 shares, 1.8 used -> 0.2 free; a is empty but never considered
        ("totals-short", gpu_agent("b", "0.9", "0.9"), "0.5", "b: cuda.shares needs 0.5"),
        # b's totals cover 0.8 (0.5 + 0.5 free) but, unfragmented, no single GPU holds it
        ("per-device", gpu_agent("b", "0.5", "0.5"), "0.8", "b: cuda.shares needs 0.8, largest"),
    ],
)
def test_designated_agent_is_still_checked_for_capacity(
    case: str, designated: AgentSnapshot, request_: str, reason: str
) -> None:
    s = session(
        "s",
        designated_agent="b",
        requested_slots=gpu_req(request_),
        allow_fragmentation=False,
    )
    plan = plan_pass(snap([gpu_agent("a", 0, 0), designated], [s]))
    assert plan.assignments == (), case
    (failure,) = plan.failures
    assert failure.kind is FailureKind.NO_AGENT
    assert len(failure.agent_reasons) == 1
    assert failure.agent_reasons[0].startswith(reason), failure.agent_reasons
    assert reason in failure.msg


def test_designated_agent_gets_it_when_it_fits_even_if_others_rank_higher() -> None:
    # dispersed would prefer the empty agent a; the designation wins
    s = session("s", designated_agent="b", requested_slots=gpu_req("0.5"))
    plan = plan_pass(snap([gpu_agent("a", 0, 0), gpu_agent("b", "0.4", "0.4")], [s]))
    assert placed(plan) == {"s": "b"}


def test_roundrobin_continues_after_last_agent() -> None:
    options = SchedulerOptions(selector=SelectorName.ROUNDROBIN)
    agents = [gpu_agent(a, 0) for a in ("a", "b", "c")]
    pending = [session(f"s{i}", age_s=i, requested_slots=gpu_req("0.1")) for i in range(2)]
    plan = plan_pass(snap(agents, pending, options=options, last_roundrobin_agent="a"))
    assert [a.agent_id for a in plan.assignments] == ["b", "c"]
    assert plan.last_roundrobin_agent == "c"


def test_no_agents() -> None:
    plan = plan_pass(snap([], [session("s")]))
    assert plan.failures[0].agent_reasons == ("no ALIVE agent in scaling group default",)
    assert not plan.failures[0].blocks_lower_priorities


@pytest.mark.parametrize(
    ("scheduler", "opts", "expected"),
    [
        ("fifo", {}, SchedulerOptions()),
        (
            "drf",
            {"agent_selection_strategy": "concentrated"},
            SchedulerOptions(PickerName.DRF, SelectorName.CONCENTRATED),
        ),
        ("fifo", {"config": {"num_retries_to_skip": 2}}, SchedulerOptions(num_retries_to_skip=2)),
    ],
)
def test_options_from_scaling_group(scheduler: str, opts: dict, expected: SchedulerOptions) -> None:
    assert SchedulerOptions.from_scaling_group(scheduler, opts) == expected


@pytest.mark.parametrize(
    ("scheduler", "opts", "message"),
    [
        ("magic", {}, "scheduler 'magic': expected one of fifo, lifo, drf"),
        ("fifo", {"agent_selection_strategy": "x"}, "agent_selection_strategy 'x'"),
        ("fifo", {"config": {"num_retries_to_skip": -1}}, "num_retries_to_skip -1"),
    ],
)
def test_bad_options_are_named(scheduler: str, opts: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        SchedulerOptions.from_scaling_group(scheduler, opts)


@pytest.mark.parametrize(
    ("case", "db_opts", "store", "expected_skip"),
    [
        ("store-only", {}, {"num_retries_to_skip": "3"}, 3),
        ("db-wins", {"config": {"num_retries_to_skip": 1}}, {"num_retries_to_skip": "3"}, 1),
        (
            "db-zero-still-wins",
            {"config": {"num_retries_to_skip": 0}},
            {"num_retries_to_skip": "3"},
            0,
        ),
        ("neither", {}, None, 0),
        ("store-unrelated-key", {}, {"other": "x"}, 0),
    ],
)
def test_options_from_the_config_store_under_the_scaling_group(
    case: str, db_opts: dict[str, Any], store: dict[str, str] | None, expected_skip: int
) -> None:
    options = SchedulerOptions.from_scaling_group("fifo", db_opts, store)
    assert options.num_retries_to_skip == expected_skip, case


def test_bad_store_option_names_the_store_key() -> None:
    with pytest.raises(ValueError, match="config/plugins/scheduler/fifo/num_retries_to_skip 'x'"):
        SchedulerOptions.from_scaling_group("fifo", {}, {"num_retries_to_skip": "x"})


# -- property: a plan never over-commits an agent or a device -----------------------------

shares = st.integers(min_value=1, max_value=25).map(lambda n: D(n) / 10)


@st.composite
def scenarios(draw: st.DrawFn) -> SchedulingSnapshot:
    agents = []
    for i in range(draw(st.integers(1, 3))):
        allocated = draw(st.lists(st.integers(0, 10), min_size=1, max_size=3))
        cpus = draw(st.integers(1, 4))
        gmap = gpu_map(*[str(D(a) / 10) for a in allocated])
        used = sum((D(a) / 10 for a in allocated), D(0))
        state = AgentState(
            f"a{i}",
            slots(cpu=cpus, cuda_shares=len(allocated)),
            slots(cuda_shares=used),
        )
        agents.append(AgentSnapshot(state, (gmap, cpu_map(cpus))))
    pending = [
        session(
            f"s{j}",
            age_s=j,
            priority=draw(st.sampled_from([10, 10, 20])),
            allow_fragmentation=draw(st.booleans()),
            requested_slots=slots(cpu=draw(st.integers(0, 2)), cuda_shares=draw(shares)),
        )
        for j in range(draw(st.integers(1, 12)))
    ]
    selector = draw(st.sampled_from(list(SelectorName)))
    picker = draw(st.sampled_from(list(PickerName)))
    return snap(agents, pending, options=SchedulerOptions(picker, selector))


@settings(max_examples=150, deadline=None)
@given(scenarios())
def test_plan_never_overcommits(snapshot: SchedulingSnapshot) -> None:
    plan = plan_pass(snapshot)
    agents = {a.state.id: a for a in snapshot.agents}
    assert len({a.session_id for a in plan.assignments}) == len(plan.assignments)
    assert {a.session_id for a in plan.assignments}.isdisjoint(f.session_id for f in plan.failures)
    assert len(plan.assignments) + len(plan.failures) == len(snapshot.pending)
    for agent_id, assigned in plan.by_agent().items():
        agent = agents[agent_id]
        total = agent.state.occupied_slots
        for a in assigned:
            total = total + a.requested_slots
            # each placement adds up exactly to the request, on the quantum grid
            for slot, per_device in a.kernel_allocation.items():
                assert sum(per_device.values()) == a.requested_slots[slot]
                assert all(v % D("0.1") == 0 for v in per_device.values())
        assert total <= agent.state.available_slots
        used = sum_allocations([a.kernel_allocation for a in assigned])
        for m in agent.maps:
            for device in m.devices:
                taken = used.get(device.slot_name, {}).get(device.device_id, D(0))
                assert device.allocated + taken <= device.capacity
