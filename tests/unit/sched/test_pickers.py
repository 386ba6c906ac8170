from decimal import Decimal

import pytest

from accelshare.sched.pickers import dominant_share, pick

from .builders import session, slots


def test_fifo_picks_oldest() -> None:
    cands = [session("b", age_s=2), session("a", age_s=1), session("c", age_s=3)]
    assert pick("fifo", cands).id == "a"  # type: ignore[union-attr]


def test_lifo_picks_newest() -> None:
    cands = [session("b", age_s=2), session("a", age_s=1), session("c", age_s=3)]
    assert pick("lifo", cands).id == "c"  # type: ignore[union-attr]


def test_empty_candidates() -> None:
    assert pick("fifo", []) is None


@pytest.mark.parametrize(
    ("retries", "skip", "expected"),
    [
        pytest.param((0, 0), 0, "old", id="no-skipping"),
        pytest.param((3, 0), 3, "new", id="head-failed-enough-skipped"),
        pytest.param((2, 0), 3, "old", id="head-below-threshold"),
        pytest.param((5, 5), 3, "old", id="all-skipped-falls-back-to-oldest"),
    ],
)
def test_fifo_head_of_line_skipping(retries: tuple[int, int], skip: int, expected: str) -> None:
    cands = [
        session("old", age_s=1, retries=retries[0]),
        session("new", age_s=2, retries=retries[1]),
    ]
    assert pick("fifo", cands, num_retries_to_skip=skip).id == expected  # type: ignore[union-attr]


def test_ties_broken_by_id() -> None:
    cands = [session("z"), session("y")]
    assert pick("fifo", cands).id == "y"  # type: ignore[union-attr]


def test_drf_prefers_smallest_dominant_share() -> None:
    capacity = slots(cpu=10, cuda_shares=4)
    occupancy = {"alice": slots(cpu=1, cuda_shares=2), "bob": slots(cpu=4)}
    cands = [
        session("a1", age_s=1, access_key="alice"),
        session("b1", age_s=2, access_key="bob"),
        session("b0", age_s=0, access_key="bob"),
    ]
    chosen = pick("drf", cands, occupancy_by_access_key=occupancy, total_capacity=capacity)
    assert chosen is not None
    assert chosen.id == "b0"


def test_drf_newcomer_goes_first() -> None:
    capacity = slots(cpu=10)
    occupancy = {"heavy": slots(cpu=1)}
    cands = [session("h", age_s=0, access_key="heavy"), session("n", age_s=9, access_key="new")]
    chosen = pick("drf", cands, occupancy_by_access_key=occupancy, total_capacity=capacity)
    assert chosen is not None
    assert chosen.id == "n"


def test_drf_without_capacity_falls_back_to_age() -> None:
    cands = [session("x", age_s=5), session("y", age_s=1)]
    assert pick("drf", cands).id == "y"  # type: ignore[union-attr]


def test_dominant_share_ignores_zero_and_infinite_capacity() -> None:
    capacity = slots(cpu=4, mem=0, x="Infinity")
    assert dominant_share(slots(cpu=1, mem=5, x=3), capacity) == Decimal("0.25")


def test_unknown_picker() -> None:
    with pytest.raises(ValueError, match="'best' is not a valid PickerName"):
        pick("best", [session("a")])
