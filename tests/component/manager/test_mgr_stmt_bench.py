"""A smoke run of the statement overhead benchmark (``bench/stmt_bench.py``) at a tiny
size: it still runs every variant against the manager's real SQLite set-up and prints one
figure each.  Not a timed test (the figures are not compared)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[3] / "bench" / "stmt_bench.py"


async def test_bench_prints_a_figure_per_variant(capsys: pytest.CaptureFixture[str]) -> None:
    spec = importlib.util.spec_from_file_location("stmt_bench", BENCH)
    assert spec is not None
    assert spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    await bench.main(5)
    figures = re.findall(r"^(SELECT|transaction) .*\s(\d+) us$", capsys.readouterr().out, re.M)
    assert [kind for kind, _ in figures] == ["SELECT"] * 4 + ["transaction"] * 2
    assert all(int(us) > 0 for _, us in figures)
