"""The unit-level algorithms, table-driven (amounts in units: quanta or whole units)."""

from __future__ import annotations

import pytest

from accelshare.alloc.strategies import (
    best_fit,
    fill,
    fits_unfragmented,
    largest_unfragmented,
    split_over_windows,
    spread_evenly,
)

SPLITS: dict[str, tuple[list[int], int, int, list[int]]] = {
    "two-gpus-even": ([10, 8], 12, 1, [6, 6]),
    "fill-least-free-then-even": ([10, 10, 1], 21, 1, [10, 10, 1]),
    "fill-down-to-one-device": ([10, 1], 11, 1, [10, 1]),
    "leftover-to-most-free": ([10, 10, 9], 23, 1, [8, 8, 7]),
    "even-split-with-fewer-devices-wins": ([10, 10, 9], 20, 1, [10, 10, 0]),
    "uneven-window-stops-the-slide": ([10, 10, 5, 5], 12, 1, [6, 6, 0, 0]),
    "fewest-devices-on-equal-evenness": ([5, 5, 5, 5], 10, 1, [0, 0, 5, 5]),
    "one-unit-each-when-need-is-small": ([1, 1, 1, 1], 3, 1, [1, 1, 1, 0]),
    "fragments-break-ties": ([7, 6, 6], 10, 2, [5, 5, 0]),
}


@pytest.mark.parametrize("case", SPLITS.values(), ids=SPLITS.keys())
def test_split_over_windows(case: tuple[list[int], int, int, list[int]]) -> None:
    spares, need, min_units, expected = case
    assert split_over_windows(spares, need, min_units) == expected


def test_fill_and_spread() -> None:
    assert fill(["a", "b", "c"], {"a": 0, "b": 5, "c": 5}, 7) == {"b": 5, "c": 2}
    assert spread_evenly(["a", "b"], {"a": 35, "b": 35}, 15) == {"a": 8, "b": 7}
    # Capped devices: another round spreads what is left over the others.
    assert spread_evenly(["a", "b", "c"], {"a": 10, "b": 10, "c": 1}, 15) == {
        "a": 7,
        "b": 7,
        "c": 1,
    }


def test_best_fit() -> None:
    assert best_fit([], {}, 1) is None
    assert best_fit(["a", "b"], {"a": 3, "b": 3}, 4) is None
    assert best_fit(["a", "b"], {"a": 3, "b": 3}, 3) == "b"


GUARD: dict[str, tuple[list[int], int, int, bool]] = {
    "single-device": ([4, 8], 10, 8, True),
    "fragments-only": ([4, 4], 10, 5, False),
    "even-split": ([10, 10, 5, 5], 10, 15, True),
    "no-even-split": ([10, 10, 5, 5], 10, 26, False),
}


@pytest.mark.parametrize("case", GUARD.values(), ids=GUARD.keys())
def test_fits_unfragmented(case: tuple[list[int], int, int, bool]) -> None:
    spares, capacity, need, expected = case
    assert fits_unfragmented(spares, capacity, need) is expected


def test_largest_unfragmented() -> None:
    assert largest_unfragmented([], 10) == (0, 0)
    assert largest_unfragmented([10, 10, 5, 5], 10) == (10, 22)  # 6 + 6 + 5 + 5
    assert largest_unfragmented([4, 4, 4], 10) == (4, 12)
