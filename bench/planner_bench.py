"""The pure planner's throughput: ``sched.plan.plan_pass`` on synthetic snapshots, no I/O.

Agents are built like the hollow agents of ``bench/sched_bench.py``: 8 GPUs of 1.0 share
at quantum 0.1 (``cuda.shares``, EVENLY), 64 cores, 512 GiB.  Pending sessions are
mixed like the scale benchmark's: 90 % ask ``cuda.shares`` 0.1–2.0 with 1–4 cores and
1–8 GiB, 10 % are CPU-only (seeded, so every run plans the same snapshot).

1. **Fill**: ``--agents`` (default 10, 100, 1000) empty agents × ``--pending`` (10,000)
   sessions, one pass; prints placements/s = placed sessions / pass time.
2. **Full cluster, one release**: every agent full (every GPU, core and byte taken)
   except one, which just freed one GPU, 4 cores and 16 GiB; ``--pending`` sessions
   wait.  Prints the pass time (median and max of ``--repeat`` passes): the planning
   part of "release -> placed".

Run: ``.venv/bin/python bench/planner_bench.py [--agents 10,100,1000] [--pending 10000]
[--selector dispersed] [--repeat 5] [--skip-fill] [--profile]``.  A script that prints
figures, not a timed test.  Targets (issue #7): >= 3,000 placements/s at 1,000 agents ×
10,000 pending; a release pass <= 30-50 ms.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import random
import statistics
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from accelshare.common import AllocationMode, ResourceSlot, SlotTypes
from accelshare.sched.fit import DeviceState, MapLayouts, MapState
from accelshare.sched.model import AgentState, PendingSession
from accelshare.sched.outcome import SchedulingPlan
from accelshare.sched.plan import plan_pass
from accelshare.sched.selectors import SelectorName
from accelshare.sched.snapshot import AgentSnapshot, SchedulerOptions, SchedulingSnapshot

GIB = 2**30
T0 = datetime(2026, 1, 1, tzinfo=UTC)
GPUS, CORES, MEM = 8, 64, 512 * GIB
LAYOUTS = MapLayouts()  # what the manager's scheduler keeps across passes (sched.fit.MapLayouts)


def _request(rng: random.Random) -> ResourceSlot:
    cpu = Decimal(rng.randint(1, 4))
    mem = Decimal(rng.randint(1, 8) * GIB)
    if rng.random() < 0.1:
        return ResourceSlot({"cpu": cpu, "mem": mem})
    shares = Decimal(rng.randint(1, 20)) / 10
    return ResourceSlot({"cpu": cpu, "mem": mem, "cuda.shares": shares})


def pending_sessions(
    count: int, seed: int = 7, *, allow_fragmentation: bool = True
) -> tuple[PendingSession, ...]:
    rng = random.Random(seed)
    return tuple(
        PendingSession(
            id=f"s{i:06d}",
            access_key=f"AK{i % 50}",
            requested_slots=_request(rng),
            created_at=T0 + timedelta(seconds=i),
            allow_fragmentation=allow_fragmentation,
        )
        for i in range(count)
    )


def share_at_first_wait(plan: SchedulingPlan, n_agents: int) -> tuple[Decimal, int]:
    """The share of GPU capacity in use when the first session (FIFO order) had to wait,
    and how many sessions were placed by then."""
    first = min((f.session_id for f in plan.failures), default=None)
    before = [a for a in plan.assignments if first is None or a.session_id < first]
    used = sum((a.requested_slots.get_amount("cuda.shares") for a in before), Decimal(0))
    return used / (n_agents * GPUS), len(before)


def agent(
    index: int, *, gpu_used: Decimal = Decimal(0), cpu_used: int = 0, mem_used: int = 0
) -> AgentSnapshot:
    """One agent; ``gpu_used`` is taken on every GPU, ``cpu_used`` cores, ``mem_used`` bytes."""
    one = Decimal(1)
    gpus = MapState(
        "cuda",
        AllocationMode.FRACTIONAL,
        tuple(
            DeviceState(f"GPU{g + 1}", "cuda.shares", SlotTypes.COUNT, one, gpu_used, g % 2)
            for g in range(GPUS)
        ),
        quantum=Decimal("0.1"),
        exclusive_slot_types=("cuda.device", "cuda.shares"),
    )
    cores = MapState(
        "cpu",
        AllocationMode.DISCRETE,
        tuple(
            DeviceState(str(c), "cpu", SlotTypes.COUNT, one, one if c < cpu_used else Decimal(0))
            for c in range(CORES)
        ),
    )
    memory = MapState(
        "mem",
        AllocationMode.DISCRETE,
        (DeviceState("root", "mem", SlotTypes.BYTES, Decimal(MEM), Decimal(mem_used)),),
        strategy="FILL",
    )
    state = AgentState(
        id=f"i-{index:05d}",
        available_slots=ResourceSlot(
            {"cpu": Decimal(CORES), "mem": Decimal(MEM), "cuda.shares": Decimal(GPUS)}
        ),
        occupied_slots=ResourceSlot(
            {"cpu": Decimal(cpu_used), "mem": Decimal(mem_used), "cuda.shares": gpu_used * GPUS}
        ),
    )
    return AgentSnapshot(state, (gpus, cores, memory))


def full_agent_with_release(index: int) -> AgentSnapshot:
    """A full agent that just released one GPU, 4 cores and 16 GiB."""
    full = agent(index, gpu_used=Decimal(1), cpu_used=CORES, mem_used=MEM)
    gpus, cores, memory = full.maps
    freed_gpu = (
        *gpus.devices[:-1],
        DeviceState(
            gpus.devices[-1].device_id, "cuda.shares", SlotTypes.COUNT, Decimal(1), Decimal(0), 1
        ),
    )
    freed_cores = tuple(
        DeviceState(d.device_id, "cpu", SlotTypes.COUNT, Decimal(1), Decimal(int(i < CORES - 4)))
        for i, d in enumerate(cores.devices)
    )
    freed_mem = (
        DeviceState("root", "mem", SlotTypes.BYTES, Decimal(MEM), Decimal(MEM - 16 * GIB)),
    )
    state = AgentState(
        id=full.state.id,
        available_slots=full.state.available_slots,
        occupied_slots=ResourceSlot(
            {
                "cpu": Decimal(CORES - 4),
                "mem": Decimal(MEM - 16 * GIB),
                "cuda.shares": Decimal(GPUS - 1),
            }
        ),
    )
    return AgentSnapshot(
        state,
        (
            MapState(
                gpus.key,
                gpus.kind,
                freed_gpu,
                gpus.strategy,
                gpus.quantum,
                gpus.exclusive_slot_types,
            ),
            MapState(cores.key, cores.kind, freed_cores),
            MapState(memory.key, memory.kind, freed_mem, memory.strategy),
        ),
    )


def snapshot(
    agents: tuple[AgentSnapshot, ...], pending: tuple[PendingSession, ...], selector: SelectorName
) -> SchedulingSnapshot:
    return SchedulingSnapshot(
        "default",
        T0 + timedelta(days=1),
        agents,
        pending,
        options=SchedulerOptions(selector=selector),
    )


def timed(snap: SchedulingSnapshot, profile: bool) -> tuple[SchedulingPlan, float, float]:
    """The plan, its wall-clock seconds and its CPU seconds (this process; on a shared
    machine the CPU time is the steadier figure)."""
    profiler = cProfile.Profile() if profile else None
    cpu = time.process_time()
    start = time.perf_counter()
    if profiler is not None:
        profiler.enable()
    plan = plan_pass(snap, layouts=LAYOUTS)  # kept across passes, as the manager does
    if profiler is not None:
        profiler.disable()
    elapsed = time.perf_counter() - start
    cpu = time.process_time() - cpu
    if profiler is not None:
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(25)
    return plan, elapsed, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", default="10,100,1000", help="comma-separated agent counts")
    parser.add_argument("--pending", type=int, default=10_000)
    parser.add_argument("--selector", default="dispersed", choices=[s.value for s in SelectorName])
    parser.add_argument("--repeat", type=int, default=5, help="release passes to time")
    parser.add_argument("--skip-fill", action="store_true", help="only the release case")
    parser.add_argument("--skip-release", action="store_true", help="only the fill case")
    parser.add_argument("--profile", action="store_true", help="cProfile each pass (slower)")
    parser.add_argument(
        "--first-wait",
        action="store_true",
        help="only: GPU share in use when the first session has to wait (fill pass, FIFO),"
        " fragmentation allowed and refused",
    )
    args = parser.parse_args()
    selector = SelectorName(args.selector)
    counts = [int(n) for n in args.agents.split(",") if n]
    pending = pending_sessions(args.pending)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"selector={selector} pending={args.pending} load(1m)={load:.2f} cpus={os.cpu_count()}")
    if args.first_wait:
        for allow in (True, False):
            sessions = pending_sessions(args.pending, allow_fragmentation=allow)
            for n in counts:
                agents = tuple(agent(i) for i in range(n))
                plan, elapsed, _ = timed(snapshot(agents, sessions, selector), False)
                share, placed = share_at_first_wait(plan, n)
                print(
                    f"first wait agents={n:>5} fragmentation {'allowed' if allow else 'refused'}:"
                    f" {share:.1%} of GPU share in use, {placed} placed before it"
                    f" (pass {elapsed:.2f} s, {len(plan.assignments)} placed in all)"
                )
        return
    if not args.skip_fill:
        for n in counts:
            agents = tuple(agent(i) for i in range(n))
            plan, elapsed, cpu = timed(snapshot(agents, pending, selector), args.profile)
            placed = len(plan.assignments)
            print(
                f"fill    agents={n:>5} pending={args.pending}: placed {placed:>6} in"
                f" {elapsed:7.3f} s -> {placed / elapsed:8.0f} placements/s"
                f" (CPU {cpu:7.3f} s -> {placed / cpu:8.0f}/s)"
            )
    if not args.skip_release:
        for n in counts:
            agents = (
                full_agent_with_release(0),
                *(agent(i, gpu_used=Decimal(1), cpu_used=CORES, mem_used=MEM) for i in range(1, n)),
            )
            snap = snapshot(agents, pending, selector)
            times, cpus, placed = [], [], 0
            for _ in range(max(1, args.repeat)):
                plan, elapsed, cpu = timed(snap, args.profile)
                times.append(elapsed)
                cpus.append(cpu)
                placed = len(plan.assignments)
            print(
                f"release agents={n:>5} pending={args.pending}: placed {placed}, pass"
                f" p50 {statistics.median(times) * 1000:8.1f} ms, max {max(times) * 1000:8.1f} ms"
                f" (CPU p50 {statistics.median(cpus) * 1000:8.1f} ms; {len(times)} passes)"
            )


if __name__ == "__main__":
    main()
