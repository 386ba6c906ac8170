"""The agent choice for sessions that refuse fragmentation: the least hole loss among the
first ``PACK_CANDIDATES`` fitting agents in the selector's order (docs/scheduler.md,
*Packing with the anti-fragmentation guard*)."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest

from accelshare.sched.fit import TrialMaps
from accelshare.sched.onepass import PACK_CANDIDATES
from accelshare.sched.plan import plan_pass
from accelshare.sched.selectors import SelectorName
from accelshare.sched.snapshot import AgentSnapshot, SchedulerOptions, SchedulingSnapshot

from .builders import T0, gpu_agent, session, slots

D = Decimal


def _plan(agents: list[AgentSnapshot], *, allow: bool, selector: str = "dispersed") -> str:
    pending = [
        session("s1", requested_slots=slots(cpu=1, cuda_shares="0.5"), allow_fragmentation=allow)
    ]
    snapshot = SchedulingSnapshot(
        "default",
        T0 + timedelta(hours=1),
        tuple(agents),
        tuple(pending),
        options=SchedulerOptions(selector=SelectorName(selector)),
    )
    plan = plan_pass(snapshot)
    assert len(plan.assignments) == 1
    return plan.assignments[0].agent_id


@pytest.mark.parametrize("selector", ["dispersed", "concentrated", "legacy", "roundrobin"])
def test_refusing_fragmentation_goes_where_the_holes_stay_largest(selector: str) -> None:
    # a0: two free GPUs (2.0 left); a1: GPUs holding 0.5 and 0.7 (0.8 left).  0.5 on a0
    # takes half a whole GPU (hole loss 0.5 * (2 * 1 - 0.5) = 0.75); on a1 it fills the
    # GPU with 0.5 free (0.5 * (2 * 0.5 - 0.5) = 0.25): a1, whatever the selector.
    agents = [gpu_agent("a0", 0, 0), gpu_agent("a1", "0.5", "0.7")]
    assert _plan(agents, allow=False, selector=selector) == "a1"


def test_fragmentation_allowed_keeps_the_selector_choice() -> None:
    agents = [gpu_agent("a0", 0, 0), gpu_agent("a1", "0.5", "0.7")]
    assert _plan(agents, allow=True) == "a0"  # dispersed: the most remaining


def test_ties_keep_the_selector_order() -> None:
    agents = [gpu_agent("a0", 0, 0), gpu_agent("a1", 0, 0)]
    assert _plan(agents, allow=False) == "a0"


def test_only_the_first_candidates_are_compared() -> None:
    # PACK_CANDIDATES agents with two free GPUs come first in the dispersed order; the
    # tight agent after them is never looked at.
    agents = [gpu_agent(f"a{i:02d}", 0, 0) for i in range(PACK_CANDIDATES)]
    agents.append(gpu_agent("z", "0.5", "0.7"))
    assert _plan(agents, allow=False) == "a00"
    # One fewer and it is among them.
    assert _plan(agents[1:], allow=False) == "z"


def test_agents_whose_devices_refuse_are_skipped() -> None:
    # a0 has 1.1 left (ranked first), but as 0.5 + 0.5 + 0.1: 0.8 would fragment there.
    agents = [gpu_agent("a0", "0.5", "0.5", "0.9"), gpu_agent("a1", "0.2", "1")]
    pending = [
        session("s1", requested_slots=slots(cpu=1, cuda_shares="0.8"), allow_fragmentation=False)
    ]
    plan = plan_pass(SchedulingSnapshot("default", T0, tuple(agents), tuple(pending)))
    assert [(a.agent_id, a.kernel_allocation["cuda.shares"]) for a in plan.assignments] == [
        ("a1", {"GPU1": D("0.8")})
    ]


def test_hole_loss() -> None:
    trial = TrialMaps("a", gpu_agent("a", "0.5", "0").maps)
    # 0.5 goes on GPU1 (best fit): 0.5 * (2 * 0.5 - 0.5); cpu is not an accelerator slot.
    request = (("cuda.shares", D("0.5")), ("cpu", D(1)))
    assert trial.hole_loss(request, ("cuda.shares",)) == D("0.25")
    assert trial.hole_loss(request, ("rocm.shares",)) == 0
