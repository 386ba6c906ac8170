"""The indexed planner (``sched.plan``) against the previous one (``reference_plan``).

Same assignments (agent and per-device placement, in order), same failures (kind,
retries, message when deferred, predicates, whether it blocks lower bands), and the same
reasons for every agent whose state the pass did not change.  The one intended
difference: per-agent reasons now describe every agent as it is at the end of the pass
(before, an agent that refused on its devices or for a waiting session was described as
it was when the session was tried); for agents the plan placed nothing on, both agree.
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

from hypothesis import given, settings
from hypothesis import strategies as st

from accelshare.sched.images import ImageRequirement
from accelshare.sched.model import AgentState
from accelshare.sched.outcome import FailureKind, SchedulingPlan
from accelshare.sched.pickers import PickerName
from accelshare.sched.plan import plan_pass
from accelshare.sched.selectors import SelectorName
from accelshare.sched.snapshot import AgentSnapshot, SchedulerOptions, SchedulingSnapshot

from . import reference_plan
from .builders import T0, cpu_map, gpu_map, mem_map, session, slots

D = Decimal
GIB = 2**30
IMAGE = ImageRequirement("img-a")


@st.composite
def agents(draw: st.DrawFn, index: int) -> AgentSnapshot:
    cpus = draw(st.integers(1, 6))
    cpu_used = draw(st.integers(0, cpus))
    mem = draw(st.sampled_from([4, 8])) * GIB
    mem_used = draw(st.integers(0, 4)) * GIB
    aid = f"a{index:02d}"
    where = {
        "architecture": draw(st.sampled_from(["x86_64", "x86_64", "aarch64"])),
        "images": draw(st.sampled_from([frozenset(), frozenset({"img-a"})])),
    }
    if draw(st.integers(0, 3)) == 0:  # CPU-only
        state = AgentState(
            aid, slots(cpu=cpus, mem=mem), slots(cpu=cpu_used, mem=mem_used), **where
        )
        return AgentSnapshot(state, (cpu_map(cpus, cpu_used), mem_map(mem, mem_used)))
    gpus = draw(st.lists(st.sampled_from(["0", "0.2", "0.5", "0.7", "1"]), min_size=1, max_size=4))
    strategy = draw(st.sampled_from(["EVENLY", "EVENLY", "FILL"]))
    used = sum((D(g) for g in gpus), D(0))
    state = AgentState(
        aid,
        slots(cpu=cpus, mem=mem, cuda_shares=len(gpus)),
        slots(cpu=cpu_used, mem=mem_used, cuda_shares=used),
        **where,
    )
    maps = (gpu_map(*gpus, strategy=strategy), cpu_map(cpus, cpu_used), mem_map(mem, mem_used))
    return AgentSnapshot(state, maps)


@st.composite
def scenarios(draw: st.DrawFn) -> SchedulingSnapshot:
    cluster = [draw(agents(i)) for i in range(draw(st.integers(1, 13)))]
    ids = [a.state.id for a in cluster]
    pending = []
    for i in range(draw(st.integers(1, 24))):
        shares = draw(st.sampled_from(["0", "0.1", "0.3", "0.5", "0.8", "1", "1.5", "2.5"]))
        req = slots(cpu=draw(st.integers(0, 3)), mem=draw(st.integers(0, 3)) * GIB)
        if shares != "0":
            req = req + slots(cuda_shares=shares)
        designated = draw(st.sampled_from([None] * 8 + [*ids[:2], "gone"]))
        pending.append(
            session(
                f"s{i:02d}",
                age_s=draw(st.integers(0, 5)),
                access_key=draw(st.sampled_from(["AK1", "AK2", "AK3"])),
                priority=draw(st.sampled_from([10, 10, 50, 90])),
                retries=draw(st.integers(0, 3)),
                requested_slots=req,
                allow_fragmentation=draw(st.booleans()),
                designated_agent=designated,
                image=draw(st.sampled_from([None, None, None, IMAGE])),
            )
        )
    options = SchedulerOptions(
        picker=draw(st.sampled_from(list(PickerName))),
        selector=draw(st.sampled_from(list(SelectorName))),
        num_retries_to_skip=draw(st.sampled_from([0, 0, 2])),
    )
    return SchedulingSnapshot(
        "default",
        T0 + timedelta(hours=1),
        tuple(cluster),
        tuple(pending),
        options=options,
        last_roundrobin_agent=draw(st.sampled_from([None, *ids])),
    )


def _agent_of(reason: str) -> str:
    return reason.split(":", 1)[0]


def assert_same_plan(
    snapshot: SchedulingSnapshot, new: SchedulingPlan, old: SchedulingPlan
) -> None:
    assert [(a.session_id, a.agent_id, a.allocation) for a in new.assignments] == [
        (a.session_id, a.agent_id, a.allocation) for a in old.assignments
    ]
    assert new.last_roundrobin_agent == old.last_roundrobin_agent
    changed = {a.agent_id for a in new.assignments}
    assert len(new.failures) == len(old.failures)
    for mine, theirs in zip(new.failures, old.failures, strict=True):
        where = (mine.session_id, mine.msg, theirs.msg)
        assert mine.session_id == theirs.session_id, where
        assert mine.kind is theirs.kind, where
        assert mine.retries == theirs.retries, where
        assert mine.failed_predicates == theirs.failed_predicates, where
        assert mine.passed_predicates == theirs.passed_predicates, where
        assert mine.blocks_lower_priorities == theirs.blocks_lower_priorities, where
        assert [_agent_of(r) for r in mine.agent_reasons] == [
            _agent_of(r) for r in theirs.agent_reasons
        ], where
        for a, b in zip(mine.agent_reasons, theirs.agent_reasons, strict=True):
            if _agent_of(a) not in changed:
                assert a == b, where
        if mine.kind is not FailureKind.NO_AGENT or not changed:
            assert mine.msg == theirs.msg, where


@settings(max_examples=200, deadline=None)
@given(scenarios())
def test_same_plan_as_the_reference(snapshot: SchedulingSnapshot) -> None:
    assert_same_plan(snapshot, plan_pass(snapshot), reference_plan.plan_pass(snapshot))
