"""Scheduling latency across hosts and event delivery through Redis (needs root).

    .venv/bin/python bench/multihost_bench.py [--sessions 40]

Builds the production-shaped cluster of ``accelshare_testkit.multihost`` on this machine:
a server host (network namespace) with PostgreSQL, etcd, Redis and the manager, a GPU
host (two 1.0-share mock GPUs, fractional) and a CPU-only host, joined by veth links.
Then, from this (operator's) host:

* **create -> RUNNING across hosts**: sessions created one at a time with
  ``maxWaitSeconds`` (alternately 0.1 fGPU on the GPU host and CPU-only on the CPU host),
  each destroyed after; the time until the create call answers RUNNING;
* **event delivery through Redis**: a reader of the ``events`` stream (``XREAD``, not
  the managers' group) on this host: for each kernel event, the time from the agent
  noting it (``event.at``) to the reader holding it — agent -> Redis -> consumer;
* **which path brought each event first** to the manager (Redis or the agents' HTTP
  call) and the mean age at which it was applied, from ``accelshare_event_delivery_seconds``.

All hosts share this machine's clock, so the ages are meaningful.  Prints a table.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from accelshare.protocol import KernelEventBatch
from accelshare_testkit.multihost import MultiHostCluster, multihost_unavailable

REPO = Path(__file__).resolve().parents[1]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def read_stream(addr: str, stop: asyncio.Event, delays: list[float]) -> None:
    host, port = addr.rsplit(":", 1)
    client = aioredis.Redis(host=host, port=int(port))
    last = "$"
    try:
        while not stop.is_set():
            answer: Any = await client.xread({"accelshare:multihost:events": last}, block=500)
            received = datetime.now(UTC)
            for _stream, items in answer or []:
                for entry_id, fields in items:
                    last = entry_id
                    batch = KernelEventBatch.model_validate_json(fields[b"batch"])
                    delays += [(received - e.at).total_seconds() for e in batch.events]
    finally:
        await client.aclose()


async def run(sessions: int) -> None:
    work = Path(tempfile.mkdtemp(prefix="accelshare-multihost-bench-"))
    with MultiHostCluster(work, agent_timeout_s=10.0) as cluster:
        t0 = time.perf_counter()
        cluster.start_services()
        await cluster.put_config(
            {"config": {"plugins": {"accelerator": {"cuda": {"allocation_mode": "fractional"}}}}}
        )
        cluster.start_manager()
        cluster.start_agent("gpu", mock_config=REPO / "configs/accelerator/two-fgpu.toml", cpus=16)
        cluster.start_agent("cpu", mock_config=None, cpus=16)
        await cluster.wait_agents_alive("gpu", "cpu")
        print(f"cluster up in {time.perf_counter() - t0:.1f} s (work dir {work})")
        stop = asyncio.Event()
        delays: list[float] = []
        reader = asyncio.create_task(read_stream(f"{cluster.srv.address}:6379", stop, delays))
        latencies: dict[str, list[float]] = {"i-gpu": [], "i-cpu": []}
        async with cluster.client() as http:
            for i in range(sessions + 4):  # the first 4 warm up
                gpu = i % 2 == 0
                resources = {"cpu": "1", "mem": "256m", **({"cuda.shares": "0.1"} if gpu else {})}
                started = time.perf_counter()
                reply = await http.post(
                    "/session",
                    json={
                        "image": "python",
                        "name": f"b{i}",
                        "maxWaitSeconds": 30,
                        "config": {"resources": resources},
                    },
                )
                elapsed = time.perf_counter() - started
                assert reply.json()["status"] == "RUNNING", reply.text
                if i >= 4:
                    latencies["i-gpu" if gpu else "i-cpu"].append(elapsed)
                await http.delete(f"/session/b{i}")
            await asyncio.sleep(1.0)  # the last exits travel
            metrics = (await http.get("/metrics")).text
        stop.set()
        await reader

    print()
    print("| measure | n | p50 | p90 | p99 | mean |")
    print("|---|---|---|---|---|---|")
    for agent, values in latencies.items():
        print(
            f"| create -> RUNNING on {agent} (across hosts) | {len(values)} | "
            f"{pct(values, 0.5) * 1000:.0f} ms | {pct(values, 0.9) * 1000:.0f} ms | "
            f"{pct(values, 0.99) * 1000:.0f} ms | {statistics.mean(values) * 1000:.0f} ms |"
        )
    if delays:
        print(
            f"| kernel event: agent -> Redis -> a reader | {len(delays)} | "
            f"{pct(delays, 0.5) * 1000:.1f} ms | {pct(delays, 0.9) * 1000:.1f} ms | "
            f"{pct(delays, 0.99) * 1000:.1f} ms | {statistics.mean(delays) * 1000:.1f} ms |"
        )
    for path in ("redis", "http"):
        count = re.search(
            rf'^accelshare_event_delivery_seconds_count{{path="{path}"}} (\S+)$', metrics, re.M
        )
        total = re.search(
            rf'^accelshare_event_delivery_seconds_sum{{path="{path}"}} (\S+)$', metrics, re.M
        )
        n = float(count.group(1)) if count else 0.0
        mean = float(total.group(1)) / n if total and n else 0.0
        print(
            f"| events the manager applied first from {path} | {n:.0f} | | | | "
            f"{mean * 1000:.1f} ms |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=40)
    args = parser.parse_args()
    reason = multihost_unavailable()
    if reason is not None:
        raise SystemExit(f"cannot build the multi-host cluster here: {reason}")
    asyncio.run(run(args.sessions))


if __name__ == "__main__":
    main()
