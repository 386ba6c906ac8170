"""Every worked example of spec 02-alloc-maps.md, as tables with readable ids.

A case is a map, a sequence of requests on it with the expected result of each (a
per-device allocation, or an error class), and the expected allocated amounts at the end.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import pytest

from accelshare.alloc import (
    InsufficientResource,
    NotMultipleOfQuantum,
    ResourceError,
)
from accelshare.alloc.base import AbstractAllocMap

from .builders import EVENLY, FILL, amounts, dmap, fmap

Step = tuple[str, dict[str, str] | type[ResourceError]]


@dataclass(frozen=True)
class Case:
    build: Callable[[], AbstractAllocMap]
    slot: str
    steps: list[Step]
    allocated: dict[str, str] | None = None


CASES: dict[str, Case] = {
    # -- fractional, the canonical example: two GPUs of 1.0 share, quantum 0.1 ------------
    "frac-evenly-two-gpus-0.2-then-1.2": Case(
        lambda: fmap(["1.0", "1.0"], quantum="0.1", prefix="GPU"),
        "cuda.shares",
        [("0.2", {"GPU1": "0.2"}), ("1.2", {"GPU0": "0.6", "GPU1": "0.6"})],
        allocated={"GPU0": "0.6", "GPU1": "0.8"},
    ),
    "frac-fill-two-gpus-0.2-then-1.2": Case(
        lambda: fmap(["1.0", "1.0"], quantum="0.1", strategy=FILL, prefix="GPU"),
        "cuda.shares",
        [("0.2", {"GPU0": "0.2"}), ("1.2", {"GPU1": "1.0", "GPU0": "0.2"})],
        allocated={"GPU0": "0.4", "GPU1": "1.0"},
    ),
    # Backend.AI gives 1.4 for 1.5 here; we split on the grid and add up exactly.
    "frac-evenly-1.5-over-two-gpus-is-exact": Case(
        lambda: fmap(["1.0", "1.0"], quantum="0.1"),
        "cuda.shares",
        [("1.5", {"a0": "0.8", "a1": "0.7"})],
        allocated={"a0": "0.8", "a1": "0.7"},
    ),
    "frac-evenly-1.5-off-grid-after-1.2": Case(
        lambda: fmap(["1.0", "1.0"], quantum="0.1"),
        "cuda.shares",
        [
            ("0.2", {"a1": "0.2"}),
            ("1.2", {"a0": "0.6", "a1": "0.6"}),
            ("1.5", InsufficientResource),
        ],
        allocated={"a0": "0.6", "a1": "0.8"},
    ),
    "frac-not-multiple-of-quantum": Case(
        lambda: fmap(["1.0", "1.0"], quantum="0.1"),
        "cuda.shares",
        [("0.15", NotMultipleOfQuantum)],
        allocated={"a0": "0", "a1": "0"},
    ),
    # -- "evenly distribute fractions", fresh map each, quantum 0.01 ----------------------
    **{
        f"frac-evenly-[0.3,0.2,0.1]-{request}": Case(
            lambda: fmap(["0.3", "0.2", "0.1"]), "cuda.shares", [(request, expected)]
        )
        for request, expected in [
            ("0.1", {"a2": "0.1"}),
            ("0.2", {"a1": "0.2"}),
            ("0.4", {"a0": "0.2", "a1": "0.2"}),
            ("0.6", {"a0": "0.3", "a1": "0.2", "a2": "0.1"}),
            ("0.7", InsufficientResource),
        ]
    },
    **{
        f"frac-evenly-[0.3,0.3]-{request}": Case(
            lambda: fmap(["0.3", "0.3"]), "cuda.shares", [(request, expected)]
        )
        for request, expected in [("0.3", {"a1": "0.3"}), ("0.5", {"a0": "0.25", "a1": "0.25"})]
    },
    # -- discrete EVENLY ------------------------------------------------------------------
    "disc-evenly-two-of-100-130-then-15": Case(
        lambda: dmap([100, 100]),
        "cpu",
        [("130", {"a0": "65", "a1": "65"}), ("15", {"a0": "8", "a1": "7"})],
        allocated={"a0": "73", "a1": "72"},
    ),
    "disc-evenly-three-of-10-7-then-23": Case(
        lambda: dmap([10, 10, 10]),
        "cpu",
        [("7", {"a0": "3", "a1": "2", "a2": "2"}), ("23", {"a0": "7", "a1": "8", "a2": "8"})],
        allocated={"a0": "10", "a1": "10", "a2": "10"},
    ),
    "disc-evenly-four-cpus-of-2-sequence": Case(
        lambda: dmap([2, 2, 2, 2], prefix="cpu"),
        "cpu",
        [
            ("4", {"cpu0": "1", "cpu1": "1", "cpu2": "1", "cpu3": "1"}),
            ("2", {"cpu0": "1", "cpu1": "1"}),
            ("3", InsufficientResource),
            ("2", {"cpu2": "1", "cpu3": "1"}),
        ],
        allocated={"cpu0": "2", "cpu1": "2", "cpu2": "2", "cpu3": "2"},
    ),
    # -- discrete FILL --------------------------------------------------------------------
    "disc-fill-takes-most-free-first": Case(
        lambda: dmap([100, 100], strategy=FILL),
        "cpu",
        [("130", {"a0": "100", "a1": "30"}), ("15", {"a1": "15"}), ("56", InsufficientResource)],
        allocated={"a0": "100", "a1": "45"},
    ),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_spec_example(case: Case) -> None:
    alloc_map = case.build()
    for request, expected in case.steps:
        before = alloc_map.allocations
        if isinstance(expected, dict):
            result = alloc_map.allocate({case.slot: Decimal(request)})
            assert result == {case.slot: amounts(expected)}
        else:
            with pytest.raises(expected):
                alloc_map.allocate({case.slot: Decimal(request)})
            assert alloc_map.allocations == before
    if case.allocated is not None:
        assert alloc_map.allocations[case.slot] == amounts(case.allocated)


def test_evenly_is_the_default_strategy() -> None:
    assert fmap(["1"]).allocation_strategy is EVENLY
    assert dmap([1]).allocation_strategy is EVENLY


def test_insufficient_message_matches_the_spec_example() -> None:
    # Allocated GPU1 0.6 / GPU2 0.2 of 1.0 each: 1.2 free, 1.5 does not fit.
    m = fmap(["1.0", "1.0"], quantum="0.1", prefix="GPU")
    m.apply_allocation({"cuda.shares": amounts({"GPU0": "0.6", "GPU1": "0.2"})})
    with pytest.raises(InsufficientResource) as info:
        m.allocate({"cuda.shares": Decimal("1.5")}, context_tag=None)
    assert str(info.value) == (
        "InsufficientResource: cannot allocate 1.5 of cuda.shares: 1.2 free (GPU0 0.4, GPU1 0.8)"
    )
    error: Any = info.value
    assert (error.slot, error.requested, error.available) == (
        "cuda.shares",
        Decimal("1.5"),
        Decimal("1.2"),
    )
    assert error.devices == amounts({"GPU0": "0.4", "GPU1": "0.8"})
