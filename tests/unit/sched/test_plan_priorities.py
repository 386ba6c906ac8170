"""No starvation across priority bands: what a waiting higher-priority session holds back.

The rule (``sched.plan``): a session that passed its predicates but found no room, and
could fit some agent if it were empty, protects what it needs on every such agent from
every lower band — its accelerator slots entirely, and of every other slot the amount
it asks for.  Lower-band sessions that do not compete (another agent, or slack the
waiting session does not need) still run in the same pass.
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accelshare.common import ResourceSlot
from accelshare.sched.fit import TrialMaps, fits_capacity
from accelshare.sched.model import AgentState
from accelshare.sched.outcome import FailureKind, SchedulingPlan
from accelshare.sched.plan import plan_pass
from accelshare.sched.selectors import SelectorName
from accelshare.sched.snapshot import AgentSnapshot, SchedulingSnapshot

from .builders import T0, cpu_map, gpu_agent, session, slots

D = Decimal


def snap(agents: list[AgentSnapshot], pending: list[Any]) -> SchedulingSnapshot:
    return SchedulingSnapshot("default", T0 + timedelta(hours=1), tuple(agents), tuple(pending))


def cpu_agent(aid: str, cpus: int = 8, used: int = 0) -> AgentSnapshot:
    state = AgentState(aid, slots(cpu=cpus), slots(cpu=used))
    return AgentSnapshot(state, (cpu_map(cpus, used),))


def busy_gpu_agent(aid: str, *allocated: str, cpus: int = 8, cpu_used: int = 0) -> AgentSnapshot:
    base = gpu_agent(aid, *allocated, cpus=cpus)
    state = AgentState(
        aid,
        base.state.available_slots,
        base.state.occupied_slots + slots(cpu=cpu_used),
    )
    return AgentSnapshot(state, (base.maps[0], cpu_map(cpus, cpu_used)))


def outcome(plan: SchedulingPlan) -> dict[str, str]:
    result = {a.session_id: f"placed on {a.agent_id}" for a in plan.assignments}
    result.update({f.session_id: f.kind.value for f in plan.failures})
    return result


HIGH_GPU = session("high", priority=50, requested_slots=slots(cpu=1, cuda_shares="2"))

CASES = [
    pytest.param(
        [busy_gpu_agent("gpu", "0.5", "1")],
        [HIGH_GPU, session("low", priority=10, requested_slots=slots(cpu=1))],
        {"high": "no-agent", "low": "placed on gpu"},
        id="cpu-only low session runs beside a session waiting for GPUs",
    ),
    pytest.param(
        [busy_gpu_agent("gpu", "0.5", "1")],
        [HIGH_GPU, session("low", priority=10, requested_slots=slots(cpu=1, cuda_shares="0.5"))],
        {"high": "no-agent", "low": "deferred"},
        id="low GPU session is held back: it would take the GPU the high one waits for",
    ),
    pytest.param(
        [busy_gpu_agent("gpu", "0", "0", cpus=4, cpu_used=2)],
        [
            session("high", priority=50, requested_slots=slots(cpu=4, cuda_shares="1")),
            session("low", priority=10, requested_slots=slots(cpu=1)),
        ],
        {"high": "no-agent", "low": "deferred"},
        id="cpu-only low session is held back when cores are what the high one waits for",
    ),
    pytest.param(
        [busy_gpu_agent("gpu", "0.5", "1", cpus=8, cpu_used=2)],
        [
            session("high", priority=50, requested_slots=slots(cpu=4, cuda_shares="2")),
            session("low", priority=10, requested_slots=slots(cpu=3)),
        ],
        {"high": "no-agent", "low": "deferred"},
        id="cpu-only low session is held back when it would leave too few cores",
    ),
    pytest.param(
        [busy_gpu_agent("gpu", "0.5", "1", cpus=8, cpu_used=2)],
        [
            session("high", priority=50, requested_slots=slots(cpu=4, cuda_shares="2")),
            session("low", priority=10, requested_slots=slots(cpu=2)),
        ],
        {"high": "no-agent", "low": "placed on gpu"},
        id="cpu-only low session uses cores the high one does not need",
    ),
    pytest.param(
        [busy_gpu_agent("gpu", "0.5", "1", cpus=8, cpu_used=2)],
        [
            session("H", priority=50, requested_slots=slots(cpu=4, cuda_shares="2")),
            session("L1", priority=10, age_s=1, requested_slots=slots(cpu=2)),
            session("L2", priority=10, age_s=2, requested_slots=slots(cpu=3)),
            session("L3", priority=10, age_s=3, requested_slots=slots(cpu=1, cuda_shares="0.5")),
        ],
        {"H": "no-agent", "L1": "placed on gpu", "L2": "deferred", "L3": "deferred"},
        id="the worked example of docs/scheduler.md",
    ),
    pytest.param(
        [busy_gpu_agent("big", "0.5", "1"), gpu_agent("small", 0)],
        [HIGH_GPU, session("low", priority=10, requested_slots=slots(cpu=1, cuda_shares="0.5"))],
        {"high": "no-agent", "low": "placed on small"},
        id="low GPU session goes to an agent the high one can never use",
    ),
    pytest.param(
        [busy_gpu_agent("gpu", "0.5", "1"), cpu_agent("cpu")],
        [
            HIGH_GPU,
            session("low-a", priority=10, age_s=1, requested_slots=slots(cpu=1)),
            session("low-b", priority=10, age_s=2, requested_slots=slots(cpu=1, cuda_shares="0.5")),
        ],
        # low-a prefers the CPU-only agent anyway (no unused GPUs)
        {"high": "no-agent", "low-a": "placed on cpu", "low-b": "deferred"},
        id="mixed lower band: only the competing session waits",
    ),
    pytest.param(
        [gpu_agent("gpu", 0, 0)],
        [
            session("high", priority=50, requested_slots=slots(cpu=1, cuda_shares="3")),
            session("low", priority=10, requested_slots=slots(cpu=1, cuda_shares="1")),
        ],
        {"high": "no-agent", "low": "placed on gpu"},
        id="a session that can never fit holds nothing back",
    ),
    pytest.param(
        [busy_gpu_agent("gpu", "0.5", "0.5")],
        [
            session("top", priority=90, requested_slots=slots(cpu=1, cuda_shares="2")),
            session("mid", priority=50, requested_slots=slots(cpu=1, cuda_shares="0.5")),
            session("bottom", priority=10, requested_slots=slots(cpu=1)),
        ],
        {"top": "no-agent", "mid": "deferred", "bottom": "placed on gpu"},
        id="three bands: the middle one waits behind the top, CPU work below still runs",
    ),
]


@pytest.mark.parametrize(("agents", "pending", "expected"), CASES)
def test_what_a_waiting_session_holds_back(
    agents: list[AgentSnapshot], pending: list[Any], expected: dict[str, str]
) -> None:
    assert outcome(plan_pass(snap(agents, pending))) == expected


def test_deferred_session_says_why_and_keeps_its_retries() -> None:
    low = session("low", priority=10, retries=4, requested_slots=slots(cpu=1, cuda_shares="0.5"))
    plan = plan_pass(snap([busy_gpu_agent("gpu", "0.5", "1")], [HIGH_GPU, low]))
    failure = next(f for f in plan.failures if f.session_id == "low")
    assert failure.kind is FailureKind.DEFERRED
    assert failure.msg == (
        "Waiting for priority-50 sessions to be placed first (this session has priority 10)"
    )
    assert failure.retries == 4
    assert failure.agent_reasons == (
        "gpu: held for a waiting priority-50 session (cuda.shares it needs here)",
    )
    assert [p.name for p in failure.passed_predicates]  # predicates ran


def test_many_agents_list_ten_reasons_and_a_count() -> None:
    agents = [gpu_agent(f"i-node{i:02d}", 1) for i in range(13)]
    plan = plan_pass(snap(agents, [session("s", requested_slots=slots(cpu=1, cuda_shares="1"))]))
    (failure,) = plan.failures
    assert len(failure.agent_reasons) == 11
    assert failure.agent_reasons[0].startswith("i-node00: cuda.shares needs 1")
    assert failure.agent_reasons[-1] == "... and 3 more agent(s)"
    assert failure.msg.endswith("; and 10 more agent(s)")


# -- the property ---------------------------------------------------------------------------

_amounts = st.sampled_from(["0", "0.3", "0.5", "1", "1.5", "2"])


@st.composite
def scenarios(draw: st.DrawFn) -> SchedulingSnapshot:
    agents: list[AgentSnapshot] = []
    for i in range(draw(st.integers(1, 4))):
        if draw(st.booleans()):
            gpus = draw(
                st.lists(st.sampled_from(["0", "0.2", "0.5", "0.8", "1"]), min_size=1, max_size=3)
            )
            cpus = draw(st.integers(2, 8))
            agents.append(
                busy_gpu_agent(f"a{i}", *gpus, cpus=cpus, cpu_used=draw(st.integers(0, cpus)))
            )
        else:
            cpus = draw(st.integers(1, 8))
            agents.append(cpu_agent(f"a{i}", cpus, draw(st.integers(0, cpus))))
    pending = []
    for i in range(draw(st.integers(1, 10))):
        shares = draw(_amounts)
        req = slots(cpu=draw(st.integers(1, 4)))
        if shares != "0":
            req = req + slots(cuda_shares=shares)
        pending.append(
            session(
                f"s{i}",
                age_s=i,
                priority=draw(st.sampled_from([10, 50, 90])),
                requested_slots=req,
                allow_fragmentation=draw(st.booleans()),
            )
        )
    selector = draw(st.sampled_from(list(SelectorName)))
    from accelshare.sched.snapshot import SchedulerOptions

    return SchedulingSnapshot(
        "default",
        T0 + timedelta(hours=1),
        tuple(agents),
        tuple(pending),
        options=SchedulerOptions(selector=selector),
    )


@settings(max_examples=300, deadline=None)
@given(scenarios())
def test_no_lower_session_takes_what_a_waiting_higher_one_could_use(
    snapshot: SchedulingSnapshot,
) -> None:
    plan = plan_pass(snapshot)
    sessions = {s.id: s for s in snapshot.pending}
    agents = {a.state.id: a for a in snapshot.agents}
    final: dict[str, ResourceSlot] = {aid: a.state.remaining_slots for aid, a in agents.items()}
    for a in plan.assignments:
        final[a.agent_id] = final[a.agent_id] - a.requested_slots
    waiting = [sessions[f.session_id] for f in plan.failures if f.blocks_lower_priorities]
    for high in waiting:
        for a in plan.assignments:
            low = sessions[a.session_id]
            if low.priority >= high.priority:
                continue
            agent = agents[a.agent_id]
            usable = fits_capacity(
                agent.state.available_slots,
                TrialMaps(agent.state.id, agent.maps),
                high.requested_slots,
                allow_fragmentation=high.allow_fragmentation,
            )
            if not usable:
                continue
            for slot, amount in low.requested_slots.items():
                need = high.requested_slots.get_amount(slot)
                if amount <= 0 or need <= 0:
                    continue
                assert slot != "cuda.shares", (low.id, high.id, a.agent_id)
                assert final[a.agent_id].get_amount(slot) >= need, (low.id, high.id, slot)
    # and the waiting session is never overtaken inside its own resources: every
    # lower-band session that was refused for it is DEFERRED with its retries kept
    for f in plan.failures:
        if f.kind is FailureKind.DEFERRED:
            assert f.retries == sessions[f.session_id].retries
            assert any(sessions[w.id].priority > sessions[f.session_id].priority for w in waiting)
