"""End-to-end benchmark: sessions through the real manager and agents (``dev up``'s cluster).

Starts a throwaway local cluster (child processes: the manager with SQLite and the
embedded config store, agents with the process runtime and the 2-fGPU mock; each agent
advertises ``--cpus`` cores and ``--mem`` so that CPU, not the GPUs, bounds how many
sessions fit), then measures through the SDK, as a client sees it:

1. **create -> RUNNING latency**: ``--samples`` sessions created one at a time with
   ``maxWaitSeconds`` (the answer comes when the session is RUNNING), each destroyed
   before the next; p50 / p90 / p99 / max of the wall time of the create call.
2. **sustained throughput**: ``--sessions`` sessions created by ``--concurrency``
   concurrent clients, each waiting for RUNNING; sessions/s = sessions / wall time
   (first request to last RUNNING).  Then every session is destroyed (also timed).

Each session is ``cpu=1 mem=64m`` running the process runtime's idle command, so the
figures include the agent starting a real kernel (a Python supervisor and ``sleep``).
Targets: p50 <= 150 ms, >= 50 sessions/s.

Run: ``.venv/bin/python bench/e2e_bench.py [--samples 50] [--sessions 200]
[--concurrency 16] [--agents 1]``.  A script that prints figures, not a timed test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import psutil

from accelshare.client import AccelshareClient
from accelshare.devcluster import DevClusterOptions, LocalCluster, free_port

RESOURCES = {"cpu": "1", "mem": "64m"}


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    index = min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))
    return ordered[index]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


async def latency(client: AccelshareClient, samples: int) -> list[float]:
    times: list[float] = []
    for _ in range(samples):
        start = time.perf_counter()
        created = await client.sessions.create("python", resources=RESOURCES, max_wait_s=60)
        elapsed = time.perf_counter() - start
        if created.status != "RUNNING":
            raise SystemExit(f"session {created.session_id} is {created.status}, not RUNNING")
        times.append(elapsed)
        await client.sessions.destroy(created.session_id)
    return times


async def throughput(
    client: AccelshareClient,
    sessions: int,
    concurrency: int,
    on_created: Callable[[], None] | None = None,
) -> tuple[float, float, list[float], list[str]]:
    sem = asyncio.Semaphore(concurrency)
    ids: list[str] = []
    per_call: list[float] = []

    async def one() -> None:
        async with sem:
            start = time.perf_counter()
            created = await client.sessions.create("python", resources=RESOURCES, max_wait_s=120)
            per_call.append(time.perf_counter() - start)
            if created.status != "RUNNING":
                raise SystemExit(f"session {created.session_id} is {created.status}")
            ids.append(created.session_id)

    start = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(sessions)))
    create_s = time.perf_counter() - start
    if on_created is not None:
        on_created()

    async def destroy(session_id: str) -> None:
        async with sem:
            await client.sessions.destroy(session_id)

    start = time.perf_counter()
    await asyncio.gather(*(destroy(i) for i in ids))
    destroy_s = time.perf_counter() - start
    return create_s, destroy_s, per_call, ids


def _py_spy() -> str:
    """The virtualenv's py-spy (the ``bench`` extra) when the bench runs from it without
    the virtualenv on PATH, else whichever is on PATH."""
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.exists() else "py-spy"


def start_spy(out: Path, pid: int | None) -> subprocess.Popen[bytes]:
    """py-spy (the ``bench`` extra) sampling a process's GIL holder, every thread, for the
    sustained create phase only (raw samples: feed them to ``flamegraph.pl`` or count
    frames with a script)."""
    if pid is None:
        raise SystemExit("--spy: the process's pid is unknown")
    spy = subprocess.Popen(
        [_py_spy(), "record", "--gil", "--rate", "250", "--format", "raw",
         "--output", str(out), "--pid", str(pid)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    time.sleep(1.0)  # attached (it samples from its first second on)
    return spy


def stop_spy(spy: subprocess.Popen[bytes]) -> None:
    spy.send_signal(signal.SIGINT)  # it writes its samples on Ctrl-C
    _, err = spy.communicate()
    print(f"py-spy: {err.decode().strip().splitlines()[-1:]}", file=sys.stderr)


def manager_stats(directory: str | None) -> dict[str, float]:
    """The manager's cumulative statement counts and ``cpu_s`` (``--sql-stats``)."""
    if directory is None:
        return {}
    time.sleep(0.6)  # the manager rewrites its file every 0.25 s
    for path in Path(directory).glob("*.json"):
        data = json.loads(path.read_text())
        if "manager" in data["argv"]:
            return {**data["counts"], "cpu_s": data["cpu_s"]}
    return {}


def _own_cgroup_usage() -> Callable[[], float] | None:
    """CPU seconds of the cgroup this bench runs in (cgroup v1 ``cpuacct`` or v2
    ``cpu.stat``), counting every process it starts (the cluster, the kernels, bwrap)
    and nothing else: None at a hierarchy's root, which counts the whole machine."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if path == "/":
            continue
        if "cpuacct" in controllers.split(","):
            usage = Path("/sys/fs/cgroup/cpuacct") / path.lstrip("/") / "cpuacct.usage"
            if usage.exists():
                return lambda: int(usage.read_text()) / 1e9
        if controllers == "":
            stat = Path("/sys/fs/cgroup") / path.lstrip("/") / "cpu.stat"
            if stat.exists():
                return lambda: int(stat.read_text().split()[1]) / 1e6  # usage_usec
    return None


CGROUP_USAGE = _own_cgroup_usage()


def cpu_snapshot(cluster: LocalCluster) -> dict[str, float]:
    """Cumulative CPU seconds by process: the manager, the agents, what the agents reaped
    (kernels and their supervisors that ended), this client, and the whole machine (or,
    when the bench runs in a cgroup of its own, that cgroup: the same processes without
    the rest of the machine's load)."""

    def proc_cpu(pid: int | None) -> tuple[float, float]:
        if pid is None:
            return 0.0, 0.0
        try:
            t = psutil.Process(pid).cpu_times()
        except psutil.Error:
            return 0.0, 0.0
        return t.user + t.system, t.children_user + t.children_system

    manager, _ = proc_cpu(cluster.manager.pid)
    agents = reaped = 0.0
    for daemon in cluster.agents:
        own, children = proc_cpu(daemon.pid)
        agents += own
        reaped += children
    machine = psutil.cpu_times()
    busy = machine.user + machine.nice + machine.system + machine.irq + machine.softirq
    found = {
        "manager": manager,
        "agents": agents,
        "kernels (reaped by the agents)": reaped,
        "this client": time.process_time(),
        "machine (all processes)": busy,
    }
    if CGROUP_USAGE is not None:
        found["the bench's cgroup (all its processes)"] = CGROUP_USAGE()
    return found


def print_cpu(title: str, before: dict[str, float], after: dict[str, float], n: int) -> None:
    if n == 0:
        return
    parts = ", ".join(f"{k} {(after[k] - before[k]) / n * 1000:.1f}" for k in after)
    print(f"CPU per session, {title} (ms): {parts}")


def scheduler_stats(endpoint: str) -> dict[str, float]:
    """The manager's pass count, pass seconds and placements (``/metrics``)."""
    text = httpx.get(f"{endpoint}/metrics", timeout=10).text
    wanted = {
        "accelshare_scheduler_pass_seconds_count": "passes",
        "accelshare_scheduler_pass_seconds_sum": "pass_s",
        "accelshare_scheduler_placements_total": "placed",
    }
    found: dict[str, float] = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        key = wanted.get(name.split("{")[0])
        if key is not None:
            found[key] = found.get(key, 0.0) + float(value)
    return found


def print_passes(title: str, before: dict[str, float], after: dict[str, float]) -> None:
    passes = after.get("passes", 0) - before.get("passes", 0)
    placed = after.get("placed", 0) - before.get("placed", 0)
    seconds = after.get("pass_s", 0) - before.get("pass_s", 0)
    if passes:
        print(
            f"scheduler, {title}: {passes:.0f} passes, {placed / passes:.2f} placements"
            f" per pass, {seconds / passes * 1000:.1f} ms per pass (wall, lock held)"
        )


def print_stats(title: str, before: dict[str, float], after: dict[str, float], n: int) -> None:
    """Per session: statements by kind, transactions, the manager's CPU."""
    if not after or n == 0:
        return
    diff = {k: after[k] - before.get(k, 0) for k in after}
    cpu = diff.pop("cpu_s", 0.0)
    statements = sum(v for k, v in diff.items() if k != "COMMIT")
    begins = sum(v for k, v in diff.items() if k.startswith("BEGIN"))
    writes = diff.get("BEGIN IMMEDIATE", 0)
    print(f"\nmanager, {title}, per session (n={n}, heartbeats included):")
    print(
        f"  {statements / n:.1f} statements, {begins / n:.1f} transactions"
        f" ({writes / n:.1f} write), {cpu / n * 1000:.1f} ms CPU"
    )
    for key, value in sorted(diff.items(), key=lambda kv: -kv[1]):
        if value:
            print(f"  {value / n:6.2f}  {key}")


async def measure(cluster: LocalCluster, args: argparse.Namespace) -> None:
    stats = os.environ.get("ACCELSHARE_SQL_STATS") if args.sql_stats else None
    async with AccelshareClient(cluster.client_config(), timeout_s=180) as client:
        # warm-up: imports, first DB pages, the agent's first kernel
        await latency(client, 3)
        s0, p0 = manager_stats(stats), scheduler_stats(cluster.endpoint)
        c0 = cpu_snapshot(cluster)
        lat = await latency(client, args.samples)
        await asyncio.sleep(1.0)  # let the last kernels' ends be reaped
        s1, p1 = manager_stats(stats), scheduler_stats(cluster.endpoint)
        c1 = cpu_snapshot(cluster)
        created_cpu: list[dict[str, float]] = []
        spies = [start_spy(args.spy, cluster.manager.pid)] if args.spy else []
        if args.spy_agent:
            spies.append(start_spy(args.spy_agent, cluster.agents[0].pid))
        daemons = [cluster.manager, *cluster.agents] if args.profile else []
        profiled = [d.pid for d in daemons if d is not None and d.pid is not None]
        for pid in profiled:
            os.kill(pid, signal.SIGUSR1)

        def on_created() -> None:
            created_cpu.append(cpu_snapshot(cluster))
            for spy in spies:
                stop_spy(spy)
            for pid in profiled:
                os.kill(pid, signal.SIGUSR2)

        create_s, destroy_s, per_call, ids = await throughput(
            client,
            args.sessions,
            args.concurrency,
            on_created=on_created,
        )
        await asyncio.sleep(1.0)
        s2, p2 = manager_stats(stats), scheduler_stats(cluster.endpoint)
        c2 = cpu_snapshot(cluster)
    print()
    print_passes("one at a time", p0, p1)
    print_passes(f"{args.concurrency} clients", p1, p2)
    print_cpu("one at a time (create + destroy)", c0, c1, args.samples)
    print_cpu(f"{args.concurrency} clients, create phase", c1, created_cpu[0], len(ids))
    print_cpu(f"{args.concurrency} clients, destroy phase", created_cpu[0], c2, len(ids))
    print_stats("one at a time (create + destroy)", s0, s1, args.samples)
    print_stats(f"{args.concurrency} clients (create + destroy)", s1, s2, len(ids))
    rate = len(ids) / create_s
    p50 = statistics.median(lat)
    rows = [
        ("create -> RUNNING, one at a time", f"p50 {ms(p50)}", "p50 <= 150 ms", p50 <= 0.150),
        ("", f"p90 {ms(pct(lat, 90))}", "", None),
        ("", f"p99 {ms(pct(lat, 99))}", "", None),
        ("", f"max {ms(max(lat))}  (n={len(lat)})", "", None),
        (
            f"sustained create, {args.concurrency} concurrent",
            f"{rate:.1f} sessions/s  ({len(ids)} in {create_s:.2f} s)",
            ">= 50 sessions/s",
            rate >= 50,
        ),
        (
            "",
            f"per call p50 {ms(statistics.median(per_call))}, p99 {ms(pct(per_call, 99))}",
            "",
            None,
        ),
        ("destroy, same concurrency", f"{len(ids) / destroy_s:.1f} sessions/s", "", None),
    ]
    width = max(len(r[0]) for r in rows)
    vwidth = max(len(r[1]) for r in rows)
    print()
    sandbox = f"sandbox {args.sandbox}" if args.sandbox else "sandbox: the agent's default"
    print(
        f"accelshare end-to-end benchmark ({args.agents} agent(s), process runtime, {sandbox},"
        " SQLite)"
    )
    print(f"{'metric':<{width}}  {'value':<{vwidth}}  target")
    print(f"{'-' * width}  {'-' * vwidth}  ------")
    for metric, value, target, ok in rows:
        verdict = "" if ok is None else (" (met)" if ok else " (NOT met)")
        print(f"{metric:<{width}}  {value:<{vwidth}}  {target}{verdict}")
    load = os.getloadavg()[0]
    print(
        f"\n({os.cpu_count()} CPUs, load average {load:.1f} at the end, {platform.system()}"
        f" {platform.release()}, Python {platform.python_version()})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=50, help="latency samples")
    parser.add_argument("--sessions", type=int, default=200, help="sessions for throughput")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--agents", type=int, default=1)
    parser.add_argument("--cpus", type=int, default=512, help="cores each agent advertises")
    parser.add_argument("--mem", default="512g", help="memory each agent advertises")
    parser.add_argument(
        "--sandbox",
        choices=["auto", "required", "off"],
        help="the agents' [container] sandbox (default: the agent's, auto); off: the"
        " unsandboxed peer of a sandboxed run",
    )
    parser.add_argument(
        "--sql-stats",
        action="store_true",
        help="count the manager's SQL statements and CPU per session (bench/sqlstats)",
    )
    parser.add_argument(
        "--sql-callers",
        action="store_true",
        help="with --sql-stats: key each statement by the accelshare function that ran it",
    )
    parser.add_argument(
        "--spy",
        type=Path,
        metavar="FILE",
        help="py-spy's raw GIL samples of the manager in the sustained create phase to FILE",
    )
    parser.add_argument(
        "--spy-agent",
        type=Path,
        metavar="FILE",
        help="the same for the (first) agent",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        metavar="DIR",
        help="cProfile the manager's and agents' main threads in the sustained create phase"
        " (bench/sqlstats): DIR/<pid>.prof, DIR/<pid>.argv",
    )
    args = parser.parse_args()
    hooks: list[str] = []
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
        os.environ["ACCELSHARE_PROFILE"] = str(args.profile.resolve())
        hooks.append(str(Path(__file__).resolve().parent / "sqlstats"))
    if args.sql_callers:
        os.environ["ACCELSHARE_SQL_STATS_CALLERS"] = "1"
    with tempfile.TemporaryDirectory(prefix="accelshare-bench-") as tmp:
        if args.sql_stats:
            stats_dir = Path(tmp) / "sql-stats"
            stats_dir.mkdir()
            os.environ["ACCELSHARE_SQL_STATS"] = str(stats_dir)
            hooks.append(str(Path(__file__).resolve().parent / "sqlstats"))
        if hooks:
            path = os.environ.get("PYTHONPATH")
            os.environ["PYTHONPATH"] = hooks[0] if not path else f"{hooks[0]}{os.pathsep}{path}"
        from accelshare.common import BinarySize

        cluster = LocalCluster(
            DevClusterOptions(
                data_dir=Path(tmp),
                port=free_port(),
                agents=args.agents,
                cpus=args.cpus,
                mem_bytes=int(BinarySize.finite_from_str(args.mem)),
                sandbox=args.sandbox,
            ),
            progress=lambda m: print(m, file=sys.stderr),
        )
        cluster.start()
        try:
            asyncio.run(measure(cluster, args))
        finally:
            cluster.stop(destroy_sessions=True)


if __name__ == "__main__":
    main()
