"""Soak benchmark: sessions created and destroyed without pause on a local cluster.

Starts a throwaway local cluster (``dev up``'s: the manager with SQLite, agents with the
process runtime and the 2-fGPU mock, all on loopback) and runs ``--workers`` clients
for ``--duration-s`` seconds, each looping: create a session and wait for RUNNING,
read it, list sessions, destroy it.  Then reports, as a client and an operator see it:

* requests made, errors (any non-2xx or transport error), sessions created/destroyed;
* p50 / p99 / max latency of every API call kind;
* memory (RSS) and open file descriptors of the manager and each agent: after the
  warm-up, then at the end (both should stay flat: a leak shows as steady growth);
* that nothing is left: no session outside TERMINATED/CANCELLED and every agent's
  alloc map empty once the workers stop.

Run: ``.venv/bin/python bench/soak_bench.py [--duration-s 60] [--workers 8]
[--agents 2]``.  A script that prints figures, not a timed test (issue #11).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
import tempfile
import time
from collections import defaultdict
from decimal import Decimal
from pathlib import Path

import httpx
import psutil  # type: ignore[import-untyped,unused-ignore]

from accelshare.client.auth import KeypairAuth
from accelshare.devcluster import DevClusterOptions, LocalCluster, free_port

RESOURCES = {"cpu": "1", "mem": "64m", "cuda.shares": "0.1"}
ENDED = {"TERMINATED", "CANCELLED"}


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


def usage(cluster: LocalCluster) -> dict[str, tuple[int, int]]:
    """daemon name -> (RSS bytes, open fds), children (kernels) not included."""
    out: dict[str, tuple[int, int]] = {}
    for daemon in [*([cluster.manager] if cluster.manager else []), *cluster.agents]:
        if daemon.pid is None:
            continue
        proc = psutil.Process(daemon.pid)
        out[daemon.name] = (proc.memory_info().rss, proc.num_fds())
    return out


class Soak:
    def __init__(self, http: httpx.AsyncClient) -> None:
        self.http = http
        self.latency: dict[str, list[float]] = defaultdict(list)
        self.errors: dict[str, int] = defaultdict(int)
        self.created = 0
        self.destroyed = 0

    async def call(self, kind: str, method: str, url: str, **kw: object) -> httpx.Response | None:
        start = time.perf_counter()
        try:
            response = await self.http.request(method, url, **kw)  # type: ignore[arg-type]
        except httpx.HTTPError as e:
            self.errors[f"{kind}: {type(e).__name__}"] += 1
            return None
        self.latency[kind].append(time.perf_counter() - start)
        if response.status_code >= 300:
            self.errors[f"{kind}: {response.status_code}"] += 1
            return None
        return response

    async def worker(self, deadline: float) -> None:
        body = {"image": "python", "config": {"resources": RESOURCES}, "maxWaitSeconds": 60}
        while time.monotonic() < deadline:
            created = await self.call("create (wait RUNNING)", "POST", "/session", json=body)
            if created is None:
                continue
            self.created += 1
            sid = created.json()["sessionId"]
            await self.call("get", "GET", f"/session/{sid}")
            await self.call("list", "GET", "/sessions", params={"limit": 50})
            if await self.call("destroy", "DELETE", f"/session/{sid}") is not None:
                self.destroyed += 1


async def run(cluster: LocalCluster, args: argparse.Namespace) -> None:
    config = cluster.client_config()
    auth = KeypairAuth(config.access_key, config.secret_key)
    limits = httpx.Limits(max_connections=args.workers * 2)
    async with httpx.AsyncClient(
        base_url=config.endpoint, auth=auth, timeout=120, limits=limits
    ) as http:
        warm = Soak(http)
        await warm.worker(time.monotonic() + 3)  # imports, first pages, first kernels
        before = usage(cluster)
        soak = Soak(http)
        start = time.monotonic()
        deadline = start + args.duration_s
        samples: list[dict[str, tuple[int, int]]] = []

        async def sampler() -> None:
            while time.monotonic() < deadline:
                await asyncio.sleep(min(10.0, args.duration_s / 6))
                samples.append(usage(cluster))

        sampling = asyncio.create_task(sampler())
        await asyncio.gather(*(soak.worker(deadline) for _ in range(args.workers)))
        elapsed = time.monotonic() - start
        sampling.cancel()
        after = usage(cluster)
        listed = (await http.get("/sessions", params={"status": "all", "limit": 1000})).json()
        left = [s for s in listed["items"] if s["status"] not in ENDED]
        held: dict[str, Decimal] = {}
        for agent_id in cluster.agent_ids:
            amap = (await http.get(f"/agents/{agent_id}/alloc-map")).json()
            for plugin in amap["maps"].values():
                for device in plugin["devices"]:
                    if Decimal(device["allocated"]):
                        held[f"{agent_id}/{device['device_id']}"] = Decimal(device["allocated"])

    requests = sum(len(v) for v in soak.latency.values()) + sum(soak.errors.values())
    print()
    print(
        f"accelshare soak: {args.duration_s:.0f} s, {args.workers} workers, "
        f"{args.agents} agent(s), process runtime, SQLite, loopback"
    )
    print(
        f"requests       {requests} ({requests / elapsed:.1f}/s), errors {sum(soak.errors.values())}"
    )
    for kind, count in sorted(soak.errors.items()):
        print(f"  error        {kind}: {count}")
    print(f"sessions       {soak.created} created, {soak.destroyed} destroyed")
    print(f"{'call':<22} {'n':>6} {'p50':>9} {'p99':>9} {'max':>9}")
    for kind, times in soak.latency.items():
        print(
            f"{kind:<22} {len(times):>6} {pct(times, 50) * 1000:>7.1f}ms"
            f" {pct(times, 99) * 1000:>7.1f}ms {max(times) * 1000:>7.1f}ms"
        )
    all_times = [t for times in soak.latency.values() for t in times]
    print(
        f"{'all calls':<22} {len(all_times):>6} {pct(all_times, 50) * 1000:>7.1f}ms"
        f" {pct(all_times, 99) * 1000:>7.1f}ms {max(all_times) * 1000:>7.1f}ms"
    )
    print(f"{'daemon':<10} {'RSS after warm-up':>18} {'RSS at end':>11} {'fds':>9}")
    for name, (rss0, fds0) in before.items():
        rss1, fds1 = after.get(name, (0, 0))
        trail = ", ".join(f"{s[name][0] / 2**20:.0f}/{s[name][1]}" for s in samples if name in s)
        print(
            f"{name:<10} {rss0 / 2**20:>15.1f}MiB {rss1 / 2**20:>8.1f}MiB {fds0:>4} -> {fds1:<4}"
            f"  (samples, RSS MiB/fds: {trail})"
        )
    print(f"left over      {len(left)} live session(s), {len(held)} device(s) still allocated")
    print(
        f"\n({os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end,"
        f" {platform.system()} {platform.release()}, Python {platform.python_version()})"
    )
    if left or held or soak.created != soak.destroyed:
        raise SystemExit("something was left behind (see above)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration-s", type=float, default=60.0)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--agents", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="accelshare-soak-") as tmp:
        cluster = LocalCluster(
            DevClusterOptions(
                data_dir=Path(tmp),
                port=free_port(),
                agents=args.agents,
                cpus=256,
                mem_bytes=256 * 2**30,
            ),
            progress=lambda m: print(m, file=sys.stderr),
        )
        cluster.start()
        try:
            asyncio.run(run(cluster, args))
        finally:
            cluster.stop(destroy_sessions=True)


if __name__ == "__main__":
    main()
