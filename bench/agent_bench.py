"""Agent benchmark: alloc-map queries with many live kernels, restart recovery, create latency.

Two parts:

1. **In-process** (no processes): an agent-shaped allocations (1,000 cpu cores, memory, four
   fractional mock GPUs) holding N recorded kernel allocations.  Times building the
   full alloc-map view (uncached, i.e. right after a change), serving it (cached), the
   compatible form, and ``restore`` of N recorded allocations (the map part of restart
   recovery).
2. **Real agent** (process runtime, cgroups when writable): an in-process agent with its
   RPC served by uvicorn on loopback; N real ``shell`` kernels (idle ``sleep``).  Times
   agent-side create -> running (the first ``--sequential`` creates, one at a time, then
   20 through the RPC); alloc-map queries over HTTP with N live kernels from a client
   process (as the manager asks): back to back with the map unchanged (served from the
   cached JSON), then ``--churn`` queries each right after a real destroy + create and
   ``--churn`` more 50 ms after one (the view must be rebuilt), and a control round
   paced like those with nothing changed; and a restart (stop the agent, kernels keep
   running, start a new one: plugins, discovery of N kernels, maps rebuilt) -- then
   checks the rebuilt view is identical and destroys everything.  Creation stops early
   (and says so) when less than ``--min-free-gib`` of memory is left: each kernel costs
   a Python supervisor (~5 MB) and a ``sleep``.

Run: ``.venv/bin/python bench/agent_bench.py [--kernels 1000] [--queries 2000] [--churn 200]``
(1.5-2.5 minutes with 1,000 kernels on the shared 2-core development machine;
``--kernels 100 --churn 40`` for a quick run).
This is a script that prints figures, not a timed test.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import logging
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time
import tomllib
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import psutil  # type: ignore[import-untyped,unused-ignore]
import uvicorn

from accelshare.agent.allocations import AgentAllocations
from accelshare.agent.rpc import create_rpc_app
from accelshare.agent.service import AgentService
from accelshare.alloc import DeviceSlotInfo, DiscreteAllocMap, FractionAllocMap
from accelshare.common import SlotTypes
from accelshare.config import open_config_store
from accelshare.config.agent_file import parse_agent_config
from accelshare.config.settings import load_config_store_settings
from accelshare.protocol import CLUSTER_SECRET_HEADER, CreateKernelRequest

REPO = Path(__file__).resolve().parents[1]
MOCK = REPO / "configs" / "accelerator" / "mock-accelerator.toml"
SECRET = "agent-bench-cluster-secret"
GPUS = [f"c59395cd-ac91-4cd3-a1b0-3d2568aa2d0{i}" for i in range(1, 5)]
ROWS: list[tuple[str, str, str]] = []


def row(metric: str, value: str, target: str = "") -> None:
    ROWS.append((metric, value, target))
    print(f"  {metric}: {value}", file=sys.stderr, flush=True)


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summary(samples: list[float]) -> str:
    return f"p50 {ms(statistics.median(samples))}, p99 {ms(pct(samples, 0.99))} (n={len(samples)})"


# -- part 1: in-process -------------------------------------------------------------------
def in_process(n_kernels: int, queries: int) -> None:
    maps = {
        "cuda": FractionAllocMap(
            {g: DeviceSlotInfo(SlotTypes.COUNT, "cuda.shares", Decimal(40)) for g in GPUS},
            quantum_size=Decimal("0.1"),
            exclusive_slot_types=["cuda.device", "cuda.shares", "cuda.device:*-mig"],
        ),
        "cpu": DiscreteAllocMap(
            {str(i): DeviceSlotInfo(SlotTypes.COUNT, "cpu", Decimal(1)) for i in range(1000)}
        ),
        "mem": DiscreteAllocMap(
            {"root": DeviceSlotInfo(SlotTypes.BYTES, "mem", Decimal(2000 << 30))},
            allocation_strategy="FILL",
        ),
    }
    allocations = AgentAllocations(maps)
    t0 = time.perf_counter()
    for i in range(n_kernels):
        allocations.allocate(
            f"k{i:04}",
            {"cpu": Decimal(1), "mem": Decimal(1 << 30), "cuda.shares": Decimal("0.1")},
            allocation_order=("cuda", "cpu", "mem"),
            affinity_policy="INTERLEAVED",
        )
    row(f"in-process: allocate {n_kernels} kernels (3 maps each)", ms(time.perf_counter() - t0))
    built, objects, cached, compat = [], [], [], []
    request = {"cpu": Decimal(1), "mem": Decimal(1 << 30), "cuda.shares": Decimal("0.1")}
    for i in range(max(400, queries // 5)):
        victim = f"k{i % n_kernels:04}"  # a kernel ends and another starts: the view changes
        allocations.release(victim)
        allocations.allocate(
            victim, request, allocation_order=("cuda", "cpu", "mem"), affinity_policy="INTERLEAVED"
        )
        t = time.perf_counter()
        if i % 2:  # what the alloc-map query serves
            allocations.view_json("i-bench")
            built.append(time.perf_counter() - t)
        else:  # the view object (heartbeats), serialised whole
            allocations.view("i-bench").model_dump_json()
            objects.append(time.perf_counter() - t)
    size = len(allocations.view_json("i-bench"))
    for _ in range(queries):
        t = time.perf_counter()
        allocations.view_json("i-bench")
        cached.append(time.perf_counter() - t)
    for _ in range(queries):
        allocations.version += 1  # forces a rebuild of the compat form
        t = time.perf_counter()
        allocations.compat_view()
        compat.append(time.perf_counter() - t)
    row(
        f"in-process: full view JSON after a change (view_json), {n_kernels} kernels "
        f"({size // 1024} KiB)",
        summary(built),
        "p99 <= 5 ms",
    )
    row(
        "in-process: the same as view() + model_dump_json (the path before view_json)",
        summary(objects),
    )
    row("in-process: full view JSON, unchanged allocations (cached)", summary(cached))
    row("in-process: compat view rebuilt", summary(compat))
    recorded = [(k, allocations.recorded(k)) for k in allocations.kernel_ids()]
    before = allocations.view("i-bench")
    samples = []
    for _ in range(5):
        t = time.perf_counter()
        allocations.restore(recorded)
        samples.append(time.perf_counter() - t)
    assert allocations.view("i-bench") == before
    row(f"in-process: restore {n_kernels} recorded allocations", summary(samples))


# -- part 2: a real agent -----------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def put_store(path: Path, values: dict[str, str]) -> None:
    async with await open_config_store(load_config_store_settings(path)) as store:
        for key, value in values.items():
            await store.put(key, value)


SERVER_SIDE: list[float] = []  # time inside the agent's app per /v1/alloc-map request


def timed_app(app: Any) -> Any:
    """ASGI wrapper recording how long the agent spends on each alloc-map request."""

    async def wrapped(scope: Any, receive: Any, send: Any) -> None:
        if scope.get("path") != "/v1/alloc-map":
            await app(scope, receive, send)
            return
        t = time.perf_counter()
        await app(scope, receive, send)
        SERVER_SIDE.append(time.perf_counter() - t)

    return wrapped


async def serve(service: AgentService, port: int) -> tuple[uvicorn.Server, asyncio.Task[None]]:
    server = uvicorn.Server(
        uvicorn.Config(
            timed_app(create_rpc_app(service, secret=SECRET)),
            host="127.0.0.1",
            port=port,
            log_config=None,
            access_log=False,
            lifespan="off",
        )
    )
    server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign,assignment]
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    return server, task


CLIENT = """
import json, sys, time, httpx
url, secret, form, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
params = {"form": form} if form != "full" else {}
samples = []
with httpx.Client(base_url=url, headers={"X-Accelshare-Cluster-Secret": secret}) as client:
    for _ in range(n):
        t = time.perf_counter()
        response = client.get("/v1/alloc-map", params=params)
        response.read()
        samples.append(time.perf_counter() - t)
        assert response.status_code == 200, response.text
print(json.dumps(samples))
"""


async def timed_queries(url: str, form: str, n: int) -> tuple[list[float], list[float]]:
    """Latencies seen by a client in another process (as the manager would ask), and the
    agent process's garbage-collection pauses meanwhile."""
    pauses: list[float] = []
    started: list[float] = []

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started.append(time.perf_counter())
        elif started:
            pauses.append(time.perf_counter() - started.pop())

    gc.callbacks.append(on_gc)
    SERVER_SIDE.clear()
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", CLIENT, url, SECRET, form, str(n), stdout=asyncio.subprocess.PIPE
        )
        out, _ = await proc.communicate()
    finally:
        gc.callbacks.remove(on_gc)
    samples: list[float] = json.loads(out)
    return samples[n // 10 :], pauses  # the first tenth warms the connection up


STEP_CLIENT = """
import sys, time, httpx
url, secret = sys.argv[1], sys.argv[2]
with httpx.Client(base_url=url, headers={"X-Accelshare-Cluster-Secret": secret}) as client:
    client.get("/v1/health").read()  # the connection is up before the first timed query
    print("ready", flush=True)
    for _ in sys.stdin:  # one query per line, when the agent says so
        t = time.perf_counter()
        response = client.get("/v1/alloc-map")
        response.read()
        assert response.status_code == 200, response.text
        print(time.perf_counter() - t, flush=True)
"""


async def churn_queries(service: AgentService, url: str, live: int, n: int) -> None:
    """Alloc-map queries with the map changing in between: before each query one real
    kernel is destroyed and a new one created (a session ends, another starts), so the
    agent cannot answer from its cached JSON and must rebuild the view.

    The client is another process (as the manager is), told by a line on its stdin when
    to send each query.  Two rounds of ``n``: the query sent the moment the create
    returns (it competes with the create's own aftermath in the agent: the kernel's exit
    watcher starting, a spare launcher being started), and the query sent 50 ms later
    (the rebuild alone); then a control round with the same pacing and no change (a
    query after 50 ms idle costs more than back-to-back ones: caches, wake-ups)."""
    client = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        STEP_CLIENT,
        url,
        SECRET,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert client.stdin is not None
    assert client.stdout is not None
    assert (await client.stdout.readline()).strip() == b"ready"
    victims = sorted(r.kernel_id for r in service.registry.live())
    serial = 100_000
    builds: list[float] = []  # of the time inside the agent: making the JSON answer
    serve_json = service.alloc_map_json

    def timed_json() -> bytes:
        t = time.perf_counter()
        try:
            return serve_json()
        finally:
            builds.append(time.perf_counter() - t)

    service.alloc_map_json = timed_json  # type: ignore[method-assign]
    try:
        rounds = ((True, 0.0, "at once"), (True, 0.05, "50 ms later"), (False, 0.05, ""))
        for churn, settle_s, label in rounds:
            round_trips: list[float] = []
            SERVER_SIDE.clear()
            for i in range(n):
                if churn:
                    slot = i % len(victims)
                    await service.destroy_kernel(victims[slot])
                    serial += 1
                    replacement = request(serial)
                    report = await service.create_kernel(replacement)
                    assert report.status == "RUNNING", report
                    victims[slot] = replacement.kernel_id
                if settle_s:
                    await asyncio.sleep(settle_s)
                version = service.allocations.version
                client.stdin.write(b"query\n")
                await client.stdin.drain()
                round_trips.append(float(await client.stdout.readline()))
                assert service.allocations.version == version  # the query saw one fresh change
            if churn:
                row(
                    f"real: GET /v1/alloc-map after a destroy + create, {live} live kernels "
                    f"(view rebuilt), query {label}, other process",
                    summary(round_trips),
                    "p99 <= 5 ms",
                )
                row(f"real: the same ({label}), time inside the agent", summary(SERVER_SIDE[-n:]))
                row(f"real: of which rebuilding the view JSON ({label})", summary(builds[-n:]))
            else:  # the control: the same pacing (one query per 50 ms), nothing changed
                row(
                    "real: control: unchanged map, one query per 50 ms, other process",
                    summary(round_trips),
                )
                row("real: the same (control), time inside the agent", summary(SERVER_SIDE[-n:]))
    finally:
        del service.alloc_map_json  # the method again
        client.stdin.close()
        await client.wait()


def write_agent_toml(path: Path, workdir: Path, port: int, kernels: int) -> None:
    path.write_text(
        "\n".join(
            [
                "[agent]",
                'id = "i-bench"',
                f'rpc-listen-addr = "127.0.0.1:{port}"',
                'allowed-compute-plugins = ["mock"]',
                f'mock-accelerator-config = "{MOCK}"',
                "[container]",
                f'scratch-root = "{workdir / "scratch"}"',
                'cgroup-parent = "accelshare-bench"',
                "stop-grace-s = 2.0",
                "[resource]",
                f"cpu-count = {max(8, kernels)}",
                f'memory-size = "{max(16, kernels)}g"',
                "[config-store]",
                f'path = "{workdir / "store.db"}"',
            ]
        )
        + "\n"
    )


def request(i: int) -> CreateKernelRequest:
    return CreateKernelRequest(
        kernel_id=f"b-{i:05}",
        session_id="bench",
        image="shell",
        requested_slots={"cpu": "1", "mem": "1g", "cuda.shares": "0.1"},
    )


async def real_agent(args: argparse.Namespace, workdir: Path) -> None:
    path = workdir / "agent.toml"
    port = free_port()
    write_agent_toml(path, workdir, port, args.kernels)
    prefix = "config/plugins/accelerator/cuda/"
    await put_store(
        path,
        {
            prefix + "allocation_mode": "fractional",
            prefix + "unit_mem": "1g",
            prefix + "unit_proc": "2",
        },
    )
    config = parse_agent_config(tomllib.loads(path.read_text()), source_path=path)

    async def start() -> tuple[AgentService, float]:
        async with await open_config_store(load_config_store_settings(path)) as store:
            service = AgentService(config, store=store, secret=SECRET, report_to_manager=False)
            t = time.perf_counter()
            await service.start()
            return service, time.perf_counter() - t

    service, _ = await start()
    server, task = await serve(service, port)
    url = f"http://127.0.0.1:{port}"
    client = httpx.AsyncClient(base_url=url, headers={CLUSTER_SECRET_HEADER: SECRET}, timeout=60)
    try:
        direct: list[float] = []
        rpc: list[float] = []
        stopped_early = ""
        t_all = time.perf_counter()
        i = 0
        while i < args.kernels:
            free_gib = psutil.virtual_memory().available / 2**30
            if free_gib < args.min_free_gib:
                stopped_early = f"; stopped at {i}: {free_gib:.1f} GiB free"
                break
            if i < args.sequential:  # the agent's own create_kernel, one at a time
                t = time.perf_counter()
                report = await service.create_kernel(request(i))
                direct.append(time.perf_counter() - t)
                assert report.status == "RUNNING", report
                i += 1
            elif i < args.sequential + 20:  # through the RPC, one at a time
                t = time.perf_counter()
                response = await client.post("/v1/kernels", json=request(i).model_dump())
                rpc.append(time.perf_counter() - t)
                assert response.json()["status"] == "RUNNING", response.text
                i += 1
            else:  # the rest in batches, a few at a time
                batch = range(i, min(i + 50, args.kernels))
                sem = asyncio.Semaphore(args.concurrency)

                async def one(n: int, sem: asyncio.Semaphore = sem) -> None:
                    async with sem:
                        report = await service.create_kernel(request(n))
                        assert report.status == "RUNNING", report

                await asyncio.gather(*(one(n) for n in batch))
                i = batch.stop
        live = len(service.registry)
        row(
            f"real: create -> running, agent side ({len(direct)} one by one)",
            summary(direct),
            "p50 <= 50 ms",
        )
        if rpc:
            row("real: create -> running, RPC round trip (HTTP)", summary(rpc))
        row(
            f"real: {live} kernels created",
            f"{time.perf_counter() - t_all:.1f} s{stopped_early}",
        )
        supervisors = [
            p
            for p in psutil.process_iter(["cmdline"])
            if "_launcher.py" in " ".join(p.info["cmdline"] or [])
        ][:50]
        with contextlib.suppress(psutil.Error):
            pss = sum(p.memory_full_info().pss for p in supervisors) / max(1, len(supervisors))
            row("real: supervisor proportional set size (mean of 50)", f"{pss / 2**20:.1f} MiB")

        size = len((await client.get("/v1/alloc-map")).content)
        samples, pauses = await timed_queries(url, "full", args.queries)
        row(
            f"real: GET /v1/alloc-map, {live} live kernels ({size // 1024} KiB), map unchanged "
            "(cached JSON), other process",
            summary(samples),
            "p99 <= 5 ms",
        )
        row(
            "real: the same, time inside the agent (ASGI app)",
            summary(SERVER_SIDE[-len(samples) :]),
        )
        row(
            "real: agent GC pauses during those queries",
            f"{len(pauses)}, max {ms(max(pauses, default=0.0))}",
        )
        samples, _ = await timed_queries(url, "compat", args.queries)
        row("real: GET /v1/alloc-map?form=compat, other process", summary(samples))
        if args.churn:
            await churn_queries(service, url, live, args.churn)
        view = (await client.get("/v1/alloc-map")).json()

        server.should_exit = True
        await task
        await service.stop()
        service, start_s = await start()
        row(
            f"real: restart recovery, {live} live kernels (start(): plugins, discovery, maps)",
            f"{start_s * 1000:.0f} ms",
            "<= 2 s",
        )
        server, task = await serve(service, port)
        t = time.perf_counter()
        again = (await client.get("/v1/alloc-map")).json()
        row("real: first alloc-map answer after the restart", ms(time.perf_counter() - t))
        if again != view:
            raise AssertionError("the alloc map after the restart differs")
        row("real: alloc map identical after the restart", "yes")
    finally:
        t = time.perf_counter()
        sem = asyncio.Semaphore(args.concurrency)

        async def destroy(kernel_id: str) -> None:
            async with sem:
                with contextlib.suppress(Exception):
                    await service.destroy_kernel(kernel_id)

        live_ids = [r.kernel_id for r in service.registry.live()]
        await asyncio.gather(*(destroy(k) for k in live_ids))
        row(f"real: destroy {len(live_ids)} kernels", f"{time.perf_counter() - t:.1f} s")
        await client.aclose()
        server.should_exit = True
        with contextlib.suppress(Exception):
            await task
        await service.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kernels", type=int, default=1000)
    parser.add_argument("--queries", type=int, default=2000)
    parser.add_argument("--sequential", type=int, default=100, help="creates timed one by one")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--min-free-gib", type=float, default=3.0)
    parser.add_argument(
        "--churn",
        type=int,
        default=200,
        help="alloc-map queries each right after a real destroy + create, and as many "
        "50 ms after one (0: skip)",
    )
    parser.add_argument("--in-process-only", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    print(f"accelshare agent benchmark ({os.cpu_count()} CPUs, Python {sys.version.split()[0]})")
    in_process(args.kernels, args.queries)
    if not args.in_process_only:
        workdir = Path(tempfile.mkdtemp(prefix="agent-bench-"))
        try:
            asyncio.run(real_agent(args, workdir))
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
    width = max(len(m) for m, _, _ in ROWS)
    vwidth = max(len(v) for _, v, _ in ROWS)
    print(f"{'metric':<{width}}  {'value':<{vwidth}}  target")
    print(f"{'-' * width}  {'-' * vwidth}  ------")
    for metric, value, target in ROWS:
        print(f"{metric:<{width}}  {value:<{vwidth}}  {target}")


if __name__ == "__main__":
    main()
