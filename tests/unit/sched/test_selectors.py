import pytest

from accelshare.sched.selectors import select_agent, unused_accelerators

from .builders import agent, session, slots

GPU_A = agent("a", available=slots(cpu=8, cuda_shares=2), occupied=slots(cpu=0, cuda_shares="0.5"))
GPU_B = agent("b", available=slots(cpu=8, cuda_shares=2), occupied=slots(cpu=6))
CPU_C = agent("c", available=slots(cpu=16))


def test_dispersed_most_remaining_in_priority_order() -> None:
    s = session("s", requested_slots=slots(cpu=1, cuda_shares="0.5"))
    assert select_agent("dispersed", s, [GPU_A, GPU_B]).id == "b"  # type: ignore[union-attr]


def test_concentrated_least_remaining() -> None:
    s = session("s", requested_slots=slots(cpu=1, cuda_shares="0.5"))
    assert select_agent("concentrated", s, [GPU_A, GPU_B]).id == "a"  # type: ignore[union-attr]


def test_legacy_largest_total() -> None:
    big = agent("big", available=slots(cpu=32, cuda_shares=1), occupied=slots(cpu=31))
    s = session("s", requested_slots=slots(cpu=1))
    small = agent("small", available=slots(cpu=8, cuda_shares=1))
    assert select_agent("legacy", s, [small, big]).id == "big"  # type: ignore[union-attr]


@pytest.mark.parametrize("selector", ["dispersed", "concentrated", "legacy"])
def test_cpu_only_session_prefers_agent_without_accelerators(selector: str) -> None:
    s = session("s", requested_slots=slots(cpu=1, cuda_shares=0))
    assert select_agent(selector, s, [GPU_A, GPU_B, CPU_C]).id == "c"  # type: ignore[union-attr]


def test_unused_accelerators_counts_device_kinds() -> None:
    a = agent("x", available=slots(cpu=1, cuda_shares=1, cuda_device=1, rocm_device=2))
    assert unused_accelerators(a, slots(cpu=1)) == 2
    assert unused_accelerators(a, slots(cpu=1, cuda_shares="0.1")) == 1


@pytest.mark.parametrize(
    ("last", "expected"),
    [(None, "a"), ("a", "b"), ("b", "c"), ("c", "a"), ("bb", "c")],
)
def test_roundrobin_cycles_by_id(last: str | None, expected: str) -> None:
    s = session("s")
    agents = [CPU_C, GPU_A, GPU_B]
    assert select_agent("roundrobin", s, agents, last_roundrobin_agent=last).id == expected  # type: ignore[union-attr]


def test_no_candidates() -> None:
    assert select_agent("dispersed", session("s"), []) is None


def test_ties_broken_by_id() -> None:
    x = agent("x", available=slots(cpu=4))
    w = agent("w", available=slots(cpu=4))
    assert select_agent("dispersed", session("s"), [x, w]).id == "w"  # type: ignore[union-attr]


@pytest.mark.parametrize("selector", ["dispersed", "concentrated", "legacy", "roundrobin"])
@pytest.mark.parametrize("last", [None, "a", "b", "c"])
def test_rank_agents_starts_with_select_agent(selector: str, last: str | None) -> None:
    from accelshare.sched.selectors import rank_agents

    s = session("s", requested_slots=slots(cpu=1, cuda_shares="0.5"))
    agents = [GPU_A, GPU_B, CPU_C]
    ranked = rank_agents(selector, s, agents, last_roundrobin_agent=last)
    assert sorted(a.id for a in ranked) == ["a", "b", "c"]
    assert ranked[0] == select_agent(selector, s, agents, last_roundrobin_agent=last)
