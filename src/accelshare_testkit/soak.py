"""A soak run against a local cluster, shared by ``bench/soak_bench.py`` (which prints the
figures) and ``tests/reliability/test_rel_soak.py`` (which judges them).

``workers`` clients loop for ``duration_s``: create a session and wait for RUNNING, read
it, list sessions, destroy it.  Meanwhile the manager's and each agent's memory (RSS) and
open file descriptors are sampled.  :func:`judge` then says what is wrong, if anything:

* errors (any non-2xx answer or transport error);
* something left behind: a live session, an allocated device, created != destroyed;
* a leak, judged over the second half of the run only (the first half is where the
  clients' keep-alive connections, the database pool, caches and the allocator's arenas
  fill up): open descriptors grew by more than ``max_fd_growth`` from the first sample of
  that half to the last, or RSS grew faster than ``max_rss_mib_per_min`` (least-squares
  slope of that half's samples).

Example of the slope (MiB against minutes): samples (0.0, 100), (0.5, 101), (1.0, 102)
give 2 MiB/min.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from dataclasses import dataclass, field
from decimal import Decimal

import httpx
import psutil  # type: ignore[import-untyped,unused-ignore]

from accelshare.client.auth import KeypairAuth
from accelshare.devcluster import LocalCluster

__all__ = ["SoakReport", "judge", "percentile", "run_soak", "slope_per_min", "usage"]

RESOURCES = {"cpu": "1", "mem": "64m", "cuda.shares": "0.1"}
ENDED = {"TERMINATED", "CANCELLED"}

Usage = dict[str, tuple[int, int]]  # daemon name -> (RSS bytes, open fds)


def usage(cluster: LocalCluster) -> Usage:
    """The manager's and each agent's (RSS bytes, open fds); kernels not included."""
    out: Usage = {}
    for daemon in [*([cluster.manager] if cluster.manager else []), *cluster.agents]:
        if daemon.pid is None:
            continue
        proc = psutil.Process(daemon.pid)
        out[daemon.name] = (proc.memory_info().rss, proc.num_fds())
    return out


def percentile(samples: list[float], q: float) -> float:
    """The nearest-rank percentile: ``percentile([1, 2, 3, 4], 50) == 2``."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


def slope_per_min(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, value) points, per minute; 0 for < 2 points.

    >>> slope_per_min([(0.0, 100.0), (30.0, 101.0), (60.0, 102.0)])
    2.0
    """
    if len(points) < 2:
        return 0.0
    n = len(points)
    mean_t = sum(t for t, _ in points) / n
    mean_v = sum(v for _, v in points) / n
    var = sum((t - mean_t) ** 2 for t, _ in points)
    if var == 0:
        return 0.0
    cov = sum((t - mean_t) * (v - mean_v) for t, v in points)
    return cov / var * 60.0


@dataclass
class SoakReport:
    duration_s: float
    workers: int
    elapsed_s: float = 0.0
    latency: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    errors: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    created: int = 0
    destroyed: int = 0
    samples: list[tuple[float, Usage]] = field(default_factory=list)  # (s since start, usage)
    left: list[str] = field(default_factory=list)  # live session ids after the run
    held: dict[str, Decimal] = field(default_factory=dict)  # agent/device -> allocated

    @property
    def requests(self) -> int:
        return sum(len(v) for v in self.latency.values()) + sum(self.errors.values())

    def series(self, daemon: str, index: int) -> list[tuple[float, float]]:
        """(seconds, RSS MiB) for index 0, (seconds, fds) for index 1."""
        scale = 2**20 if index == 0 else 1
        return [(t, u[daemon][index] / scale) for t, u in self.samples if daemon in u]


class _Client:
    def __init__(self, http: httpx.AsyncClient, report: SoakReport) -> None:
        self.http = http
        self.report = report

    async def call(self, kind: str, method: str, url: str, **kw: object) -> httpx.Response | None:
        start = time.perf_counter()
        try:
            response = await self.http.request(method, url, **kw)  # type: ignore[arg-type]
        except httpx.HTTPError as e:
            self.report.errors[f"{kind}: {type(e).__name__}"] += 1
            return None
        self.report.latency[kind].append(time.perf_counter() - start)
        if response.status_code >= 300:
            self.report.errors[f"{kind}: {response.status_code}"] += 1
            return None
        return response

    async def worker(self, deadline: float) -> None:
        body = {"image": "python", "config": {"resources": RESOURCES}, "maxWaitSeconds": 60}
        while time.monotonic() < deadline:
            created = await self.call("create (wait RUNNING)", "POST", "/session", json=body)
            if created is None:
                continue
            self.report.created += 1
            sid = created.json()["sessionId"]
            await self.call("get", "GET", f"/session/{sid}")
            await self.call("list", "GET", "/sessions", params={"limit": 50})
            if await self.call("destroy", "DELETE", f"/session/{sid}") is not None:
                self.report.destroyed += 1


async def run_soak(
    cluster: LocalCluster,
    *,
    duration_s: float,
    workers: int,
    warm_up_s: float = 3.0,
    samples: int = 12,
) -> SoakReport:
    """Warm up, soak for ``duration_s`` with ``workers`` clients sampling usage
    ``samples`` times, then check what is left."""
    config = cluster.client_config()
    auth = KeypairAuth(config.access_key, config.secret_key)
    limits = httpx.Limits(max_connections=workers * 2)
    async with httpx.AsyncClient(
        base_url=config.endpoint, auth=auth, timeout=120, limits=limits
    ) as http:
        warm = SoakReport(duration_s=warm_up_s, workers=1)
        await _Client(http, warm).worker(time.monotonic() + warm_up_s)  # imports, first kernels
        report = SoakReport(duration_s=duration_s, workers=workers)
        start = time.monotonic()
        deadline = start + duration_s
        report.samples.append((0.0, usage(cluster)))

        async def sampler() -> None:
            every = duration_s / samples
            while time.monotonic() + every < deadline:
                await asyncio.sleep(every)
                report.samples.append((time.monotonic() - start, usage(cluster)))

        sampling = asyncio.create_task(sampler())
        client = _Client(http, report)
        await asyncio.gather(*(client.worker(deadline) for _ in range(workers)))
        report.elapsed_s = time.monotonic() - start
        sampling.cancel()
        report.samples.append((report.elapsed_s, usage(cluster)))
        listed = (await http.get("/sessions", params={"status": "all", "limit": 1000})).json()
        report.left = [s["sessionId"] for s in listed["items"] if s["status"] not in ENDED]
        for agent_id in cluster.agent_ids:
            amap = (await http.get(f"/agents/{agent_id}/alloc-map")).json()
            for plugin in amap["maps"].values():
                for device in plugin["devices"]:
                    if Decimal(device["allocated"]):
                        key = f"{agent_id}/{device['device_id']}"
                        report.held[key] = Decimal(device["allocated"])
    return report


def judge(
    report: SoakReport, *, max_fd_growth: int = 8, max_rss_mib_per_min: float = 2.0
) -> list[str]:
    """What is wrong with a soak run, one line each; empty when it passed."""
    problems = [f"error {kind}: {count}" for kind, count in sorted(report.errors.items())]
    if report.left:
        problems.append(f"{len(report.left)} session(s) left live: {report.left[:5]}")
    if report.held:
        problems.append(f"devices still allocated: {report.held}")
    if report.created != report.destroyed:
        problems.append(f"{report.created} created but {report.destroyed} destroyed")
    if report.created == 0:
        problems.append("no session was created")
    daemons = report.samples[0][1].keys() if report.samples else []
    for name in daemons:
        fds = [p for p in report.series(name, 1) if p[0] >= report.elapsed_s / 2]
        if len(fds) >= 2 and fds[-1][1] - fds[0][1] > max_fd_growth:
            problems.append(
                f"{name}: open fds grew from {fds[0][1]:.0f} to {fds[-1][1]:.0f}"
                f" over the second half (more than {max_fd_growth})"
            )
        rss = report.series(name, 0)
        second_half = [p for p in rss if p[0] >= report.elapsed_s / 2]
        slope = slope_per_min(second_half)
        if slope > max_rss_mib_per_min:
            problems.append(
                f"{name}: RSS grows {slope:.2f} MiB/min over the second half"
                f" (more than {max_rss_mib_per_min}): "
                + ", ".join(f"{v:.1f}" for _, v in second_half)
            )
    return problems
