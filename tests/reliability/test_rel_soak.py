"""The soak run, judged (issue #11): sessions created and destroyed without pause on a
real local cluster (manager and two agents as processes, kernels as real processes);
no error, nothing left behind, descriptors flat, memory not growing in the second half.

Short run (``make test``): 25 s, 4 workers, loose RSS bound (a short run cannot tell a
slow leak from warm-up); ``ACCELSHARE_RELIABILITY_FULL=1`` (``make reliability``):
240 s, 8 workers, 2 MiB/min.  The figures of a long run are in docs/reliability.md.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from accelshare.devcluster import DevClusterOptions, LocalCluster, free_port
from accelshare_testkit.soak import SoakReport, judge, run_soak

from .conftest import FULL, scaled


@pytest.fixture
def local(tmp_path: Path) -> Iterator[LocalCluster]:
    cluster = LocalCluster(
        DevClusterOptions(
            data_dir=tmp_path / "dev", port=free_port(), agents=2, cpus=256, mem_bytes=256 * 2**30
        )
    )
    cluster.start(timeout_s=120)
    try:
        yield cluster
    finally:
        cluster.stop(destroy_sessions=True, grace_s=5)


async def test_soak_loses_nothing_and_leaks_nothing(local: LocalCluster) -> None:
    report = await run_soak(local, duration_s=scaled(25, 240), workers=scaled(4, 8))
    problems = judge(report, max_fd_growth=8, max_rss_mib_per_min=2.0 if FULL else 20.0)
    assert not problems, "\n".join(problems)
    assert report.created >= 20, report.created  # it really soaked
    assert set(report.samples[0][1]) == {"manager", *local.agent_ids}  # all three judged


def _report(**series: list[tuple[float, tuple[int, int]]]) -> SoakReport:
    report = SoakReport(duration_s=60, workers=1, elapsed_s=60, created=5, destroyed=5)
    times = sorted({t for points in series.values() for t, _ in points})
    for t in times:
        report.samples.append((t, {n: u for n, pts in series.items() for s, u in pts if s == t}))
    return report


def test_judge_catches_leaks_and_leftovers() -> None:
    mib = 2**20
    flat = [(t, (100 * mib, 20)) for t in (0.0, 15.0, 30.0, 45.0, 60.0)]
    assert judge(_report(manager=flat)) == []
    growing = [(t, (int((100 + t / 10) * mib), 20)) for t in (0.0, 15.0, 30.0, 45.0, 60.0)]
    (problem,) = judge(_report(manager=growing))  # 6 MiB/min
    assert problem.startswith("manager: RSS grows 6.00 MiB/min over the second half")
    ramp = [(t, (100 * mib, 60 if t else 20)) for t in (0.0, 30.0, 45.0, 60.0)]
    assert judge(_report(manager=ramp)) == []  # connections opened early are no leak
    leaking = [(t, (100 * mib, 20 + int(t))) for t in (0.0, 30.0, 60.0)]
    assert judge(_report(manager=leaking)) == [
        "manager: open fds grew from 50 to 80 over the second half (more than 8)"
    ]
    report = _report(manager=flat)
    report.left, report.destroyed = ["s1"], 4
    report.errors["create: 500"] = 2
    assert judge(report) == [
        "error create: 500: 2",
        "1 session(s) left live: ['s1']",
        "5 created but 4 destroyed",
    ]
