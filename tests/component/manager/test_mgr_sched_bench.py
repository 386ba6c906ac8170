"""A smoke run of the scheduler scale benchmark (``bench/sched_bench.py``) at a tiny size.

Not a timed test: it only checks that the benchmark still drives the real manager, its
loop and hollow agents end to end (2 agents x 8 GPUs, 20 pending sessions, SQLite).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[3] / "bench" / "sched_bench.py"


def load_bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("sched_bench", BENCH)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["sched_bench"] = module
    spec.loader.exec_module(module)
    return module


async def test_bench_places_sessions_and_measures_releases() -> None:
    bench = load_bench()
    result = await bench.run_case("sqlite", 2, 20, 1, 3, False)
    assert 0 < result.placed < 20  # 16 GPUs' worth of mixed requests: some stay pending
    assert result.passes
    assert result.placements_per_s > 0
    assert len(result.release_latencies) + result.release_misses == 1


async def test_a_case_runs_isolated_in_its_own_process_and_reports_back() -> None:
    import argparse

    bench = load_bench()
    args = argparse.Namespace(
        pending=20, releases=1, seed=3, verbose=False, profile=False, profile_manager=False
    )
    result = await bench.run_isolated("sqlite", 2, args)
    assert (result.db, result.agents, result.pending) == ("sqlite", 2, 20)
    assert 0 < result.placed < 20
    assert result.passes
    assert all(isinstance(p, bench.PassRecord) for p in result.passes)
    assert result.placements_per_s > 0
