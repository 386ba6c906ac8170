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
[--agents 2]``.  A script that prints figures; the judgement (no errors, nothing left,
descriptors flat, RSS slope over the second half) is :func:`accelshare_testkit.soak.judge`,
which ``tests/reliability/test_rel_soak.py`` asserts (issue #11).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
import tempfile
from pathlib import Path

from accelshare.devcluster import DevClusterOptions, LocalCluster, free_port
from accelshare_testkit.soak import SoakReport, judge, percentile, run_soak, slope_per_min


def show(report: SoakReport, args: argparse.Namespace) -> list[str]:
    elapsed = report.elapsed_s
    print()
    print(
        f"accelshare soak: {args.duration_s:.0f} s, {args.workers} workers, "
        f"{args.agents} agent(s), process runtime, SQLite, loopback"
    )
    print(
        f"requests       {report.requests} ({report.requests / elapsed:.1f}/s),"
        f" errors {sum(report.errors.values())}"
    )
    for kind, count in sorted(report.errors.items()):
        print(f"  error        {kind}: {count}")
    print(f"sessions       {report.created} created, {report.destroyed} destroyed")
    print(f"{'call':<22} {'n':>6} {'p50':>9} {'p99':>9} {'max':>9}")
    for kind, times in report.latency.items():
        print(
            f"{kind:<22} {len(times):>6} {percentile(times, 50) * 1000:>7.1f}ms"
            f" {percentile(times, 99) * 1000:>7.1f}ms {max(times) * 1000:>7.1f}ms"
        )
    all_times = [t for times in report.latency.values() for t in times]
    print(
        f"{'all calls':<22} {len(all_times):>6} {percentile(all_times, 50) * 1000:>7.1f}ms"
        f" {percentile(all_times, 99) * 1000:>7.1f}ms {max(all_times) * 1000:>7.1f}ms"
    )
    print(f"{'daemon':<10} {'RSS start':>10} {'RSS end':>8} {'slope 2nd half':>16} {'fds':>9}")
    for name in report.samples[0][1]:
        rss, fds = report.series(name, 0), report.series(name, 1)
        half = [p for p in rss if p[0] >= elapsed / 2]
        print(
            f"{name:<10} {rss[0][1]:>7.1f}MiB {rss[-1][1]:>5.1f}MiB"
            f" {slope_per_min(half):>+9.2f}MiB/min {fds[0][1]:>4.0f} -> {fds[-1][1]:<4.0f}"
            f"  (RSS MiB: {', '.join(f'{v:.0f}' for _, v in rss)})"
        )
    print(
        f"left over      {len(report.left)} live session(s), {len(report.held)} device(s) allocated"
    )
    print(
        f"\n({os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end,"
        f" {platform.system()} {platform.release()}, Python {platform.python_version()})"
    )
    problems = judge(report)
    print("verdict        " + ("passed" if not problems else "FAILED"))
    for problem in problems:
        print(f"  {problem}")
    return problems


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
            report = asyncio.run(
                run_soak(cluster, duration_s=args.duration_s, workers=args.workers)
            )
        finally:
            cluster.stop(destroy_sessions=True)
    if show(report, args):
        raise SystemExit("the soak run failed (see above)")


if __name__ == "__main__":
    main()
