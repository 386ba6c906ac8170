"""Configuration store benchmark: put_prefix / get_prefix of a large tree on both backends.

    .venv/bin/python bench/config_bench.py [--keys 10000] [--runs 3] [--backend etcd|embedded]

For each backend: one put_prefix of a tree of ``--keys`` leaves (100 per subtree, one
transaction), then get_prefix of the same tree, plus single-key put/get latency.  The
etcd half starts its own throwaway etcd (like the test fixture) with --max-txn-ops
raised above ``--keys``; it is skipped if no etcd binary is found.  Each figure is the
median of ``--runs`` runs, every run in a fresh namespace.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from accelshare.config import ConfigScopes, ConfigStore
from accelshare.config.backend import KVBackend
from accelshare.config.embedded import EmbeddedBackend
from accelshare.config.etcd import EtcdBackend
from accelshare_testkit.etcd_server import EtcdProcess, find_etcd_binary

SINGLE_OPS = 200


def make_tree(keys: int) -> dict[str, Any]:
    tree: dict[str, dict[str, str]] = {}
    for i in range(keys):
        tree.setdefault(f"group-{i // 100:04d}", {})[f"key {i % 100:02d}"] = f"value-{i:06d}"
    return tree


async def timed(action: Callable[[], Awaitable[Any]]) -> float:
    started = time.perf_counter()
    await action()
    return time.perf_counter() - started


async def one_run(name: str, store: ConfigStore, tree: dict[str, Any]) -> tuple[float, ...]:
    """Seconds for put_prefix and get_prefix of ``tree``, and per single put / get."""
    await store.delete_prefix("", scope=ConfigScopes.GLOBAL)
    put_s = await timed(lambda: store.put_prefix("bench", tree))
    started = time.perf_counter()
    result = await store.get_prefix("bench", scope=ConfigScopes.GLOBAL)
    get_s = time.perf_counter() - started
    if result != tree:
        raise SystemExit(f"{name}: get_prefix did not return the tree that was put")

    async def puts() -> None:
        for i in range(SINGLE_OPS):
            await store.put(f"single/k{i}", "v")

    async def gets() -> None:
        for i in range(SINGLE_OPS):
            await store.get(f"single/k{i}", scope=ConfigScopes.GLOBAL)

    return put_s, get_s, await timed(puts) / SINGLE_OPS, await timed(gets) / SINGLE_OPS


async def bench_backend(
    name: str, make_backend: Callable[[], KVBackend], keys: int, runs: int
) -> list[tuple[str, str, float, str]]:
    tree = make_tree(keys)
    samples: list[tuple[float, ...]] = []
    for run in range(runs):
        async with ConfigStore(make_backend(), namespace=f"bench-{run}") as store:
            samples.append(await one_run(name, store, tree))
    put, get, single_put, single_get = (
        statistics.median(column) for column in zip(*samples, strict=True)
    )
    return [
        (name, f"put_prefix {keys:,} keys (1 txn)", put, f"{keys / put:,.0f} keys/s"),
        (name, f"get_prefix {keys:,} keys", get, f"{keys / get:,.0f} keys/s"),
        (name, "put 1 key", single_put, "sequential, median"),
        (name, "get 1 key", single_get, "sequential, median"),
    ]


def print_table(rows: list[tuple[str, str, float, str]]) -> None:
    header = ("backend", "operation", "time", "rate")
    cells = [
        (b, op, f"{s * 1000:.1f} ms" if s < 1 else f"{s:.2f} s", rate) for b, op, s, rate in rows
    ]
    widths = [max(len(row[i]) for row in [header, *cells]) for i in range(4)]
    line = "  ".join("-" * w for w in widths)
    print("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip())
    print(line)
    for row in cells:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--backend", choices=["embedded", "etcd", "both"], default="both")
    args = parser.parse_args()

    rows: list[tuple[str, str, float, str]] = []
    with tempfile.TemporaryDirectory(prefix="accelshare-bench-") as tmp:
        if args.backend in ("embedded", "both"):
            path = Path(tmp) / "config-store.db"
            rows += await bench_backend(
                "embedded (SQLite WAL)", lambda: EmbeddedBackend(path), args.keys, args.runs
            )
        if args.backend in ("etcd", "both"):
            if find_etcd_binary() is None:
                print(
                    "etcd: skipped (no etcd binary; apt-get install etcd-server)", file=sys.stderr
                )
            else:
                etcd = EtcdProcess(
                    Path(tmp) / "etcd",
                    max_txn_ops=args.keys + 1000,
                    max_request_bytes=64 * 1024 * 1024,
                )
                with etcd:
                    version = etcd.version()
                    rows += await bench_backend(
                        f"etcd {version}",
                        lambda: EtcdBackend(host=etcd.host, port=etcd.port, timeout_s=30),
                        args.keys,
                        args.runs,
                    )
    print(f"accelshare config store benchmark: {args.keys:,} keys, median of {args.runs} runs")
    print_table(rows)


if __name__ == "__main__":
    asyncio.run(main())
