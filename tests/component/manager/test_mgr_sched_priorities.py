"""The no-starvation rule end to end (see docs/scheduler.md, *No starvation*): a session
waiting for GPUs holds back lower-priority GPU work, not CPU-only work beside it."""

from __future__ import annotations

from .cluster import Frozen
from .test_mgr_policies import end, enqueue, schedule, status_of


async def test_cpu_work_runs_beside_a_session_waiting_for_gpus(frozen: Frozen) -> None:
    cluster, _ = frozen
    await cluster.add_agent("i-node01")  # two GPUs of 1.0 share, 8 cores
    await enqueue(frozen, "hog", "1")
    await schedule(cluster, "hog")
    await enqueue(frozen, "gpu-high", "2", priority=50)
    await enqueue(frozen, "gpu-low", "0.5", priority=10)
    await enqueue(frozen, "cpu-low", "0", priority=10)
    await schedule(cluster, "cpu-low")
    assert await status_of(cluster, "gpu-high", "gpu-low") == dict.fromkeys(
        ("gpu-high", "gpu-low"), "PENDING"
    )
    why = (await cluster.admin.get("/session/gpu-low/why")).json()
    assert why["scheduler"]["kind"] == "deferred"
    assert why["agents"] == [
        "i-node01: held for a waiting priority-50 session (cuda.shares it needs here)"
    ]
    await end(cluster, "hog")
    await schedule(cluster, "gpu-high")
    assert await status_of(cluster, "gpu-low") == {"gpu-low": "PENDING"}
