"""Scheduler scale benchmark: the real manager, its scheduling loop and database, hollow agents.

For every database (``--db sqlite,postgresql``) and agent count (``--agents 10,100,1000``)
a fresh manager app is started in process (``create_manager_app``: real schema,
bootstrap, scheduling loop with its triggers, binder, agent RPC) with ``N`` hollow
agents (:mod:`accelshare_testkit.hollow_agent`; 8 mock GPUs of 1.0 share at
quantum 0.1 each, 64 cores, 512 GiB; they speak the real agent RPC and heartbeat and
accept kernels instantly on their real allocation maps).  Then:

1. **Fill**: ``--pending`` PENDING sessions of mixed requests are written straight into
   the database (the enqueue API is not what is measured here) — 90 % ask
   ``cuda.shares`` 0.1–2.0 (quantum multiples) with 1–4 cores and 1–8 GiB, 10 % are
   CPU-only — and one pass is triggered.  *Placements* are sessions that reached
   SCHEDULED in a pass **and** whose kernel the hollow agent accepted;
   placements/s = placements / (trigger → last kernel accepted).  Passes are re-triggered
   until one places nothing (the cluster is full; thousands stay pending).
2. **Release → placed**: ``--releases`` times, one RUNNING session is destroyed through
   the API (``DELETE /session/{id}``) while thousands pend; the latency is from the
   answer of the destroy (resources released in the database) until a hollow agent
   accepted the kernel of a pending session placed into the freed room.

Every pass is timed (``Scheduler._pass`` wrapped here, and its parts: snapshot load,
pure plan, apply + commit); p50 / p99 pass latency covers every pass of both phases.
The pure planner's own throughput (``plan_pass`` on the fill pass's snapshot, no I/O)
is printed as a separate figure.  ``--plot docs/sched-scale.png`` draws placements/s
and the cost per placement against the number of agents (needs matplotlib: the
``bench`` extra, never a runtime dependency).

Run: ``.venv/bin/python bench/sched_bench.py [--agents 10,100,1000] [--pending 10000]
[--db sqlite,postgresql] [--releases 30] [--quick] [--plot docs/sched-scale.png]``.
A script that prints figures, not a timed test.  Targets (issue #7): >= 1,000
placements/s on SQLite and >= 500/s on PostgreSQL at 1,000 agents; release → placed
p50 <= 100 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import dataclasses
import json
import logging
import os
import platform
import pstats
import random
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from accelshare.api.app import create_manager_app
from accelshare.api.signing import sign_request
from accelshare.common import ResourceSlot
from accelshare.config import ConfigStore
from accelshare.config.embedded import EmbeddedBackend
from accelshare.manager.bootstrap import AdminCredentials
from accelshare.manager.clock import utcnow
from accelshare.manager.config import ManagerConfig
from accelshare.manager.gc_tuning import tune_gc
from accelshare.manager.models import Group, Keypair, Session, SessionStatusHistory, User
from accelshare.manager.runtime import Manager
from accelshare.manager.scheduler import loop as sched_loop
from accelshare.sched.lifecycle import SessionStatus
from accelshare.sched.plan import PlacedPass, plan_pass
from accelshare.sched.snapshot import SchedulingSnapshot
from accelshare_testkit.hollow_agent import (
    TWO_FGPU,
    CreateTally,
    HollowAgent,
    HollowCluster,
    HollowSpec,
)

SECRET = "bench-cluster-secret-0123456789abcdef"
PG_ADMIN_URL = os.environ.get("ACCELSHARE_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
GIB = 2**30
EIGHT_GPUS: dict[str, Any] = {
    **TWO_FGPU,
    "devices": [
        {**TWO_FGPU["devices"][0], "mother_uuid": f"c59395cd-ac91-4cd3-a1b0-3d2568aa2d{i:02d}"}
        for i in range(8)
    ],
}


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    index = min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))
    return ordered[index]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


class Signer(httpx.Auth):
    def __init__(self, access_key: str, secret_key: str) -> None:
        self.access_key, self.secret_key = access_key, secret_key

    def auth_flow(self, request: httpx.Request) -> Any:
        request.headers.update(
            sign_request(
                access_key=self.access_key,
                secret_key=self.secret_key,
                method=request.method,
                path_query=request.url.raw_path.decode("ascii"),
                host=request.headers["host"],
                now=utcnow(),
            )
        )
        yield request


@dataclass
class PassRecord:
    started: float
    seconds: float
    placed: int
    pending: int
    parts: dict[str, float] = field(default_factory=dict)


@dataclass
class CaseResult:
    db: str
    agents: int
    pending: int
    placed: int = 0
    fill_s: float = 0.0  # trigger -> last kernel accepted
    scheduled_s: float = 0.0  # trigger -> end of the last pass that placed
    passes: list[PassRecord] = field(default_factory=list)
    release_latencies: list[float] = field(default_factory=list)
    release_misses: int = 0
    planner_placements_per_s: float = 0.0
    setup_s: float = 0.0
    bind_s: float = 0.0  # end of the fill pass's apply -> last kernel accepted
    # GPU share in use when the first session (in FIFO order) had to wait, fill pass
    gpu_in_use_at_first_wait: float = 0.0

    @property
    def binds_per_s(self) -> float:
        return self.placed / self.bind_s if self.bind_s else 0.0

    @property
    def placements_per_s(self) -> float:
        return self.placed / self.fill_s if self.fill_s else 0.0

    @property
    def ms_per_placement(self) -> float:
        return 1000 * self.fill_s / self.placed if self.placed else 0.0


@contextlib.asynccontextmanager
async def database_url(kind: str, tmp: Path) -> AsyncIterator[str]:
    if kind == "sqlite":
        yield f"sqlite+aiosqlite:///{tmp / 'manager.db'}"
        return
    admin = await asyncpg.connect(PG_ADMIN_URL, timeout=5)
    name = f"accelshare_bench_{uuid.uuid4().hex[:10]}"
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        url = make_url(PG_ADMIN_URL).set(drivername="postgresql+asyncpg", database=name)
        yield url.render_as_string(hide_password=False)
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


def random_request(rng: random.Random) -> ResourceSlot:
    cpu = Decimal(rng.randint(1, 4))
    mem = Decimal(rng.randint(1, 8) * GIB)
    if rng.random() < 0.1:
        return ResourceSlot({"cpu": cpu, "mem": mem})
    shares = Decimal(rng.randint(1, 20)) / 10
    return ResourceSlot({"cpu": cpu, "mem": mem, "cuda.shares": shares})


async def insert_pending(manager: Manager, access_key: str, count: int, seed: int) -> None:
    rng = random.Random(seed)
    now = utcnow()
    async with manager.db.begin(write=True) as db:
        user_id = (
            await db.execute(sa.select(Keypair.user_id).where(Keypair.access_key == access_key))
        ).scalar_one()
        user = await db.get(User, user_id)
        assert user is not None
        group_id = (
            await db.execute(sa.select(Group.id).where(Group.domain_name == user.domain_name))
        ).scalar()
        for i in range(count):
            created = now + timedelta(microseconds=i)
            sid = uuid.uuid4()
            db.add(
                Session(
                    id=sid,
                    name=f"bench-{i}",
                    access_key=access_key,
                    user_id=user_id,
                    group_id=group_id,
                    domain_name=user.domain_name,
                    image="python:3.11",
                    requested_slots=random_request(rng),
                    resource_opts={"allow_fractional_resource_fragmentation": FRAGMENTATION[0]},
                    scaling_group="default",
                    status=SessionStatus.PENDING,
                    status_info="enqueued",
                    status_data={},
                    status_changed_at=created,
                    created_at=created,
                )
            )
            db.add(
                SessionStatusHistory(
                    session_id=sid,
                    from_status=None,
                    to_status=SessionStatus.PENDING,
                    reason="enqueued",
                    changed_at=created,
                )
            )


FRAGMENTATION = [True]  # the sessions' allow_fractional_resource_fragmentation
APPLY_ENDS: list[float] = []  # when each timed apply returned (binds start then)
PROFILE_PARTS: set[str] = set()  # parts cProfiled every pass (--profile-snapshot)


def instrument(manager: Manager, records: list[PassRecord]) -> Callable[[], None]:
    """Time every pass and its parts; returns the undo."""
    scheduler = manager.scheduler
    original_pass = scheduler._pass
    originals = {
        "snapshot": sched_loop.load_snapshot,
        "plan": sched_loop.place_pass,
        "explain": PlacedPass.explain,
        "apply": sched_loop.apply_plan,
    }
    parts: dict[str, float] = {}

    def timed(name: str, fn: Any) -> Any:
        if asyncio.iscoroutinefunction(fn):

            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                start = time.perf_counter()
                profiler = cProfile.Profile() if name in PROFILE_PARTS else None
                try:
                    if profiler is not None:  # the event loop's thread, other tasks too
                        profiler.enable()
                    return await fn(*args, **kwargs)
                finally:
                    if profiler is not None:
                        profiler.disable()
                        print(f"--- cProfile of one {name} (top 12 by own time)")
                        pstats.Stats(profiler).sort_stats("tottime").print_stats(12)
                    end = time.perf_counter()
                    parts[name] = parts.get(name, 0.0) + end - start
                    if name == "apply":
                        APPLY_ENDS.append(end)

            return async_wrapper

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                parts[name] = parts.get(name, 0.0) + time.perf_counter() - start

        return wrapper

    async def timed_pass(*args: Any, **kwargs: Any) -> Any:  # Scheduler._pass's arguments
        parts.clear()
        start = time.perf_counter()
        result = await original_pass(*args, **kwargs)
        elapsed = time.perf_counter() - start
        plan = result.plan
        records.append(
            PassRecord(
                start,
                elapsed,
                len(result.jobs),
                len(plan.failures) if plan is not None else 0,
                dict(parts),
            )
        )
        return result

    sched_loop.load_snapshot = timed("snapshot", originals["snapshot"])
    sched_loop.place_pass = timed("plan", originals["plan"])
    PlacedPass.explain = timed("explain", originals["explain"])  # type: ignore[method-assign]
    sched_loop.apply_plan = timed("apply", originals["apply"])
    scheduler._pass = timed_pass  # type: ignore[method-assign]

    def undo() -> None:
        sched_loop.load_snapshot = originals["snapshot"]  # type: ignore[assignment]
        sched_loop.place_pass = originals["plan"]
        PlacedPass.explain = originals["explain"]  # type: ignore[method-assign]
        sched_loop.apply_plan = originals["apply"]  # type: ignore[assignment]
        scheduler._pass = original_pass  # type: ignore[method-assign]

    return undo


SPY_OUT: list[Path] = []  # --spy FILE: py-spy's raw GIL samples of the fill


def _py_spy() -> str:
    """The virtualenv's py-spy (the ``bench`` extra) when the bench runs from it without
    the virtualenv on PATH, else whichever is on PATH."""
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.exists() else "py-spy"


async def start_spy(out: list[Path]) -> asyncio.subprocess.Process:
    """py-spy (``pip install py-spy``) sampling this process's GIL holder, every thread
    (the planner's worker thread too, unlike ``--profile-manager``), for the fill only."""
    spy = await asyncio.create_subprocess_exec(
        _py_spy(), "record", "--gil", "--rate", "250", "--format", "raw",
        "--output", str(out[0]), "--pid", str(os.getpid()),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    await asyncio.sleep(1.0)  # attached (it samples from its first second on)
    return spy


async def stop_spy(spy: asyncio.subprocess.Process) -> None:
    spy.send_signal(signal.SIGINT)  # it writes its samples on Ctrl-C
    _, err = await spy.communicate()
    print(f"  py-spy: {err.decode().strip().splitlines()[-1:]}")


def accepted(tally: CreateTally) -> int:
    return tally.count


async def wait_until(
    condition: Callable[[], bool], timeout_s: float, step_s: float = 0.002
) -> bool:
    deadline = time.perf_counter() + timeout_s
    while not condition():
        if time.perf_counter() > deadline:
            return False
        await asyncio.sleep(step_s)
    return True


async def run_case(
    kind: str,
    n_agents: int,
    n_pending: int,
    releases: int,
    seed: int,
    verbose: bool,
    profile: bool = False,
    profile_manager: bool = False,
) -> CaseResult:
    result = CaseResult(kind, n_agents, n_pending)
    setup_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="sched-bench-") as tmp_name:
        tmp = Path(tmp_name)
        async with database_url(kind, tmp) as url:
            config = ManagerConfig.model_validate(
                {
                    "manager": {
                        "data-dir": str(tmp / "state"),
                        "cluster-secret": SECRET,
                        "schedule-interval": 2.0,
                        "sweep-interval": 3600.0,
                        "agent-timeout": 3600.0,
                    },
                    "db": {"url": url},
                }
            )
            store = ConfigStore(EmbeddedBackend(tmp / "config-store.db"))
            hollow = HollowCluster()
            app = await create_manager_app(
                config, config_store=store, agent_transport=hollow.transport
            )
            tune_gc()  # as `accelshare server manager` does once its app is built
            creds = AdminCredentials.from_env_file(config.credentials_file)
            try:
                async with app.router.lifespan_context(app):
                    manager: Manager = app.state.manager
                    transport = httpx.ASGITransport(app=app)
                    async with (
                        httpx.AsyncClient(
                            transport=transport, base_url="http://manager", timeout=120
                        ) as internal,
                        httpx.AsyncClient(
                            transport=transport,
                            base_url="http://127.0.0.1:8081",
                            auth=Signer(creds.access_key, creds.secret_key),
                            timeout=120,
                        ) as admin,
                    ):
                        await _run(
                            result,
                            manager,
                            hollow,
                            internal,
                            admin,
                            creds,
                            n_agents,
                            n_pending,
                            releases,
                            seed,
                            verbose,
                            profile,
                            profile_manager,
                        )
            finally:
                await store.close()
    result.setup_s = time.perf_counter() - setup_start
    return result


async def _run(
    result: CaseResult,
    manager: Manager,
    hollow: HollowCluster,
    internal: httpx.AsyncClient,
    admin: httpx.AsyncClient,
    creds: AdminCredentials,
    n_agents: int,
    n_pending: int,
    releases: int,
    seed: int,
    verbose: bool,
    profile: bool,
    profile_manager: bool = False,
) -> None:
    tally = CreateTally()  # every agent's creates: polled every few ms below
    agents = [
        hollow.add(
            HollowAgent(
                HollowSpec(f"i-bench{i:05d}", mock_config=EIGHT_GPUS, cpus=64, mem_bytes=512 * GIB),
                cluster_secret=SECRET,
                tally=tally,
                manager=internal,
                send_events=False,
            )
        )
        for i in range(n_agents)
    ]
    for start in range(0, n_agents, 50):
        await asyncio.gather(*(a.heartbeat() for a in agents[start : start + 50]))
    records: list[PassRecord] = []
    undo = instrument(manager, records)
    timed_plan = sched_loop.place_pass
    captured: list[SchedulingSnapshot] = []

    def capture(snapshot: SchedulingSnapshot, *args: Any) -> Any:
        captured[1:] = [snapshot]
        if not captured:
            captured.append(snapshot)
        return timed_plan(snapshot, *args)

    sched_loop.place_pass = capture
    changes: list[float] = []  # when the accepted count last grew
    stop = asyncio.Event()

    async def watch() -> None:
        count = accepted(tally)
        while not stop.is_set():
            now_count = accepted(tally)
            if now_count != count:
                count = now_count
                changes[:] = [time.perf_counter()]
            await asyncio.sleep(0.002)

    watcher = asyncio.create_task(watch())
    try:
        await insert_pending(manager, creds.access_key, n_pending, seed)
        if manager.db.engine.dialect.name == "postgresql":
            # the statistics autovacuum keeps (within a minute of a bulk insert; the run
            # is shorter): without them PostgreSQL plans from the empty tables it saw
            # (the snapshot's dependency join then walks every pending session, +7 ms)
            async with manager.db.engine.connect() as conn:
                await conn.exec_driver_sql("ANALYZE")
        APPLY_ENDS.clear()
        manager_profiler = None
        if profile_manager:  # the event loop's thread only: not the planner's worker thread
            import cProfile

            manager_profiler = cProfile.Profile()
            manager_profiler.enable()
        spy = await start_spy(SPY_OUT) if SPY_OUT else None
        t0 = time.perf_counter()
        manager.trigger()
        placed = 0
        seen = 0
        while True:
            if len(records) > seen:
                new = records[seen:]
                seen = len(records)
                placed += sum(r.placed for r in new)
                if verbose:
                    for r in new:
                        print(
                            f"    pass {ms(r.seconds)} placed {r.placed} pending {r.pending}"
                            f" { ({k: round(v * 1000) for k, v in r.parts.items()}) }"
                        )
                if (new[-1].placed == 0 and placed) or new[-1].pending == 0:
                    break
                manager.trigger()
            await asyncio.sleep(0.005)
        if not await wait_until(lambda: accepted(tally) >= placed, 120):
            print(
                f"  warning: only {accepted(tally)} of {placed} kernels accepted", file=sys.stderr
            )
        await asyncio.sleep(0.01)
        if spy is not None:
            await stop_spy(spy)
        if manager_profiler is not None:
            import pstats

            manager_profiler.disable()
            print("  manager (event loop thread) from the trigger to the last accepted kernel:")
            pstats.Stats(manager_profiler).sort_stats("tottime").print_stats(30)
            if out := os.environ.get("SCHED_BENCH_PROFILE_OUT"):
                manager_profiler.dump_stats(out)  # for pstats / snakeviz
        placing = [r for r in records if r.placed]
        result.placed = accepted(tally)
        result.scheduled_s = (placing[-1].started + placing[-1].seconds - t0) if placing else 0.0
        result.fill_s = (changes[0] if changes else time.perf_counter()) - t0
        if APPLY_ENDS:  # the fill pass's binds: from its apply to the last accepted kernel
            result.bind_s = max(0.0, (changes[0] if changes else APPLY_ENDS[0]) - APPLY_ENDS[0])
        fill_passes = len(records)
        sched_loop.place_pass = timed_plan
        if captured:
            start = time.perf_counter()
            plan = plan_pass(captured[0])
            elapsed = time.perf_counter() - start
            result.planner_placements_per_s = len(plan.assignments) / elapsed if elapsed else 0
            result.gpu_in_use_at_first_wait = float(
                in_use_at_first_wait(captured[0], plan, n_agents * 8)
            )
            if profile:
                import cProfile
                import pstats

                for snap in (captured[0], captured[-1]):
                    profiler = cProfile.Profile()
                    profiler.runcall(plan_pass, snap)
                    pstats.Stats(profiler).sort_stats("cumulative").print_stats(25)
        await manager.binder.drain(60)

        # released resources -> a pending session placed
        rng = random.Random(seed + 1)
        timeline: list[tuple[float, float, float]] = []  # DELETE sent, answered, accepted
        # the largest GPU sessions: a pending session always fits into what they free
        async with manager.db.begin() as db:
            rows = await db.execute(
                sa.select(Session.id, Session.requested_slots).where(
                    Session.status == SessionStatus.RUNNING
                )
            )
            running = [(slots.get_amount("cuda.shares"), str(sid)) for sid, slots in rows]
        rng.shuffle(running)
        running.sort(key=lambda r: r[0], reverse=True)
        for _, sid in running[:releases]:
            before = accepted(tally)
            sent_at = time.perf_counter()
            response = await admin.delete(f"/session/{sid}")
            released_at = time.perf_counter()
            if response.status_code != 200:
                print(f"  destroy failed: {response.status_code} {response.text[:200]}")
                result.release_misses += 1
                continue
            if await wait_until(lambda b=before: accepted(tally) > b, 10, 0.001):  # type: ignore[misc]
                result.release_latencies.append(time.perf_counter() - released_at)
                timeline.append((sent_at, released_at, released_at + result.release_latencies[-1]))
            else:
                result.release_misses += 1
            await manager.binder.drain(30)
            await asyncio.sleep(0.05)
        if verbose:
            for sent_at, answered_at, accepted_at in timeline:  # where the time went
                mine = [r for r in records[fill_passes:] if r.started >= sent_at]
                applied = [e for e in APPLY_ENDS if e >= sent_at]
                if mine and applied:
                    print(
                        f"    release: DELETE sent -> pass start {ms(mine[0].started - sent_at)}"
                        f" (answered at {ms(answered_at - sent_at)}),"
                        f" -> binds submitted {ms(applied[0] - mine[0].started)},"
                        f" -> kernel accepted {ms(accepted_at - applied[0])}"
                    )
            for r in records[fill_passes:]:
                print(
                    f"    release pass {ms(r.seconds)} placed {r.placed} pending {r.pending}"
                    f" { ({k: round(v * 1000) for k, v in r.parts.items()}) }"
                )
        result.passes = list(records)
    finally:
        stop.set()
        await watcher
        undo()


def in_use_at_first_wait(snapshot: SchedulingSnapshot, plan: Any, capacity: int) -> Decimal:
    """The share of the GPU capacity in use when the first session, in FIFO order, could
    not be placed: what the sessions before it that were placed hold."""
    created = {s.id: (s.created_at, s.id) for s in snapshot.pending}
    waits = [created[f.session_id] for f in plan.failures if f.session_id in created]
    first = min(waits, default=None)
    used = sum(
        (
            a.requested_slots.get_amount("cuda.shares")
            for a in plan.assignments
            if first is None or created[a.session_id] < first
        ),
        Decimal(0),
    )
    return used / capacity


def report(results: list[CaseResult]) -> None:
    print()
    print(
        "| db | agents | pending | placed | placements/s | ms per placement | pass p50 | pass p99 |"
        " release→placed p50 | p99 | pure planner placements/s | binds/s after the apply |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        secs = [p.seconds for p in r.passes] or [0.0]
        rel = r.release_latencies or [float("nan")]
        miss = f" ({r.release_misses} missed)" if r.release_misses else ""
        print(
            f"| {r.db} | {r.agents:,} | {r.pending:,} | {r.placed:,} | {r.placements_per_s:,.0f} |"
            f" {r.ms_per_placement:.2f} | {ms(pct(secs, 50))} | {ms(pct(secs, 99))} |"
            f" {ms(pct(rel, 50))}{miss} | {ms(pct(rel, 99))} | {r.planner_placements_per_s:,.0f} |"
            f" {r.binds_per_s:,.0f} |"
        )
    for r in results:
        print(
            f"{r.db}, {r.agents:,} agents: {r.gpu_in_use_at_first_wait:.1%} of the GPU share in"
            " use when the first session had to wait (fill pass, FIFO; fragmentation"
            f" {'allowed' if FRAGMENTATION[0] else 'refused'})"
        )


def plot(results: list[CaseResult], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install -e '.[bench]'); no plot", file=sys.stderr)
        return
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for kind in sorted({r.db for r in results}):
        rows = sorted((r for r in results if r.db == kind), key=lambda r: r.agents)
        xs = [r.agents for r in rows]
        left.plot(xs, [r.placements_per_s for r in rows], marker="o", label=kind)
        right.plot(xs, [r.ms_per_placement for r in rows], marker="o", label=kind)
    for target, kind in ((1000, "sqlite target"), (500, "postgresql target")):
        left.axhline(target, linestyle="--", linewidth=0.8, color="grey")
        left.annotate(kind, (min(r.agents for r in results), target), fontsize=7)
    left.set(
        xscale="log",
        xlabel="agents (8 GPUs each)",
        ylabel="placements / s",
        title="End-to-end placement throughput",
    )
    right.set(
        xscale="log",
        xlabel="agents (8 GPUs each)",
        ylabel="ms per placement",
        title="Cost per placement",
    )
    for ax in (left, right):
        ax.grid(True, which="both", linewidth=0.3)
        ax.legend()
    fig.suptitle(
        f"accelshare scheduler, {results[0].pending:,} pending sessions (2 shared cores)",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot written to {path}")


async def run_isolated(kind: str, n_agents: int, args: argparse.Namespace) -> CaseResult:
    """One case in a fresh Python process, as one manager would run: the cases before
    it leave objects, caches and a frozen heap (``tune_gc``) that slowed the later
    cases by 5-15 % when they shared a process."""
    with tempfile.TemporaryDirectory(prefix="sched-bench-case-") as tmp:
        out = Path(tmp) / "result.json"
        argv = [sys.executable, __file__, "--db", kind, "--agents", str(n_agents)]
        argv += ["--pending", str(args.pending), "--releases", str(args.releases)]
        argv += ["--seed", str(args.seed), "--result-json", str(out)]
        argv += ["--verbose"] if args.verbose else []
        argv += ["--profile"] if args.profile else []
        argv += ["--profile-manager"] if args.profile_manager else []
        argv += ["--no-fragmentation"] if not FRAGMENTATION[0] else []
        child = await asyncio.create_subprocess_exec(*argv)
        if await child.wait() != 0 or not out.exists():
            raise SystemExit(f"the {kind} case with {n_agents} agents failed")
        data = json.loads(out.read_text())
    data["passes"] = [PassRecord(**p) for p in data["passes"]]
    return CaseResult(**data)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--agents", default="10,100,1000")
    parser.add_argument("--pending", type=int, default=10_000)
    parser.add_argument("--db", default="sqlite,postgresql")
    parser.add_argument("--releases", type=int, default=30)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="10,100 agents, 2,000 pending")
    parser.add_argument("--plot", type=Path, default=None)
    parser.add_argument("--verbose", action="store_true", help="print every pass")
    parser.add_argument("--profile", action="store_true", help="cProfile the pure planner")
    parser.add_argument(
        "--profile-snapshot",
        action="store_true",
        help="cProfile every snapshot load (the event loop's thread; binds show up too)",
    )
    parser.add_argument(
        "--profile-manager",
        action="store_true",
        help="cProfile the manager's event loop (snapshot, apply, binds, RPCs) during the fill",
    )
    parser.add_argument(
        "--spy",
        type=Path,
        default=None,
        help="py-spy's raw GIL samples (every thread) of the fill to FILE (one case only)",
    )
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="run every case in this process (default: each case in a fresh one)",
    )
    parser.add_argument(
        "--no-fragmentation",
        action="store_true",
        help="the pending sessions refuse fractional fragmentation",
    )
    parser.add_argument("--result-json", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    FRAGMENTATION[0] = not args.no_fragmentation
    if args.spy:
        SPY_OUT.append(args.spy)
    if args.profile_snapshot:
        PROFILE_PARTS.add("snapshot")
    if args.quick:
        args.agents, args.pending, args.releases = "10,100", 2000, 10
    logging.basicConfig(level=logging.WARNING)
    print(
        f"Python {platform.python_version()}, {os.cpu_count()} CPUs,"
        f" load average {os.getloadavg()[0]:.1f}"
    )
    results: list[CaseResult] = []
    cases = [(k, int(n)) for k in args.db.split(",") for n in args.agents.split(",")]
    for kind, n in cases:
        print(f"{kind}: {n} agents x 8 GPUs, {args.pending} pending ...", flush=True)
        if len(cases) > 1 and not args.in_process:
            r = await run_isolated(kind, n, args)
        else:
            r = await run_case(
                kind,
                n,
                args.pending,
                args.releases,
                args.seed,
                args.verbose,
                args.profile,
                args.profile_manager,
            )
        if args.result_json:
            args.result_json.write_text(json.dumps(dataclasses.asdict(r)))
        results.append(r)
        report([r])
    report(results)
    if args.plot:
        plot(results, args.plot)


if __name__ == "__main__":
    asyncio.run(main())
