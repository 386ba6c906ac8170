"""``accelshare dev demo`` / ``make demo``: the README tour, run and checked.

Starts a throwaway cluster (a temporary data dir, a free port, one agent with the
2-fGPU mock of ``configs/accelerator/two-fgpu.toml`` in fractional mode), then runs
the tour through the real ``accelshare`` command line, printing each command, its
output and what it verifies:

1. ``session create -r cpu=1 -r mem=1g -r cuda.shares=0.2`` and ``-r cuda.shares=1.2``
   -> both ready; the allocation map shows 0.60 / 1.00 and 0.80 / 1.00 (CLI bars and
   the GraphQL ``gpu_alloc_map``); both destroyed;
2. three 1-fGPU sessions on the 2-fGPU agent -> two ready, one PENDING whose reason
   names the agent and ``cuda.shares`` (in the create answer and in ``session why``);
   destroying a running one -> the PENDING one is RUNNING by itself, on the agent, and
   both GPUs are full again;
3. the demo image catalogue (docs/images.md): a batch session on ``demo-lib:1.0`` and
   one on the alias ``demo-lib`` (-> ``demo-lib:2.0``) print ``demo-lib 1.0`` and
   ``demo-lib 2.0``;
4. storage folders (docs/folders.md): ``vfolder create data``, a file uploaded into it
   through the storage proxy, listed, and read by a batch session that mounts the folder
   (``-m data``) in its work dir (``/home/work/data``).

Exits 1 if any check fails.  The cluster (and every session) is stopped at the end.
With ``as_json`` the tour's output goes to stderr and stdout gets one JSON document:
``{"passed": 18, "failed": [], "checks": [{"check": "...", "ok": true}, ...]}``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from .cluster import LocalCluster, free_port
from .layout import DevClusterOptions
from .processes import child_env
from .up import START_ERRORS

__all__ = ["Tour", "run_demo"]

GPU_ALLOC_QUERY = "query ($agent_id: String!) { agent(agent_id: $agent_id) { id gpu_alloc_map } }"
# What the scheduler says of an agent whose GPUs are taken by two 1-share sessions.
CUDA_REASON = "cuda.shares needs 1"


@dataclass
class Tour:
    env: Mapping[str, str]
    out: Console
    failures: list[str] = field(default_factory=list)
    passed: int = 0
    checks: list[tuple[str, bool]] = field(default_factory=list)

    def cli(self, *args: str, echo: bool = True) -> subprocess.CompletedProcess[str]:
        """Run ``accelshare ARGS`` and print it (its output too unless ``echo`` is off)."""
        shown = " ".join(_quote(a) for a in args)
        self.out.print(f"\n[bold]$ accelshare {escape(shown)}[/bold]")
        result = subprocess.run(
            [sys.executable, "-m", "accelshare.client.cli", *args],
            env=dict(self.env),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        text = (result.stdout + result.stderr).rstrip()
        if not echo:
            text = f"({len(text.splitlines())} lines of output, checked below)"
        for line in text.splitlines():
            self.out.print(f"  {escape(line)}")
        return result

    def check(self, ok: bool, what: str) -> bool:
        self.checks.append((what, ok))
        if ok:
            self.passed += 1
            self.out.print(f"[green]  ✓ {escape(what)}[/green]")
        else:
            self.failures.append(what)
            self.out.print(f"[red]  ✗ {escape(what)}[/red]")
        return ok


def _quote(arg: str) -> str:
    return arg if arg and all(c.isalnum() or c in "-_=.:,/" for c in arg) else f"'{arg}'"


def _json(result: subprocess.CompletedProcess[str]) -> object:
    try:
        return json.loads(result.stdout)
    except ValueError:
        return None


def _pending_reason(stdout: str) -> str:
    """``Session ID … is enqueued (PENDING: <reason>)`` -> the reason ("" if not so)."""
    _, found, rest = stdout.partition("is enqueued (PENDING: ")
    return rest.rstrip().removesuffix(")") if found else ""


def _cuda_allocations(result: subprocess.CompletedProcess[str]) -> list[Decimal]:
    doc = _json(result)
    if not isinstance(doc, dict):
        return []
    cuda = (doc.get("maps") or {}).get("cuda") or {}
    return sorted(Decimal(d["allocated"]) for d in cuda.get("devices", []))


def run_tour(tour: Tour, agent_id: str) -> None:
    """The README tour; each step prints its command and checks."""
    agents = tour.cli("agent", "list")
    tour.check(agents.returncode == 0 and agent_id in agents.stdout, f"agent {agent_id} is ALIVE")

    for name, shares in (("tour-a", "0.2"), ("tour-b", "1.2")):
        created = tour.cli(
            "session", "create", "-r", "cpu=1", "-r", "mem=1g", "-r", f"cuda.shares={shares}",
            "--name", name, "python",
        )  # fmt: skip
        tour.check(
            created.returncode == 0 and "is created and ready." in created.stdout,
            f"{name} ({shares} fGPU) is created and ready",
        )

    bars = tour.cli("agent", "alloc-map", agent_id, "--plugin", "cuda")
    tour.check(
        "0.60 / 1.00" in bars.stdout and "0.80 / 1.00" in bars.stdout,
        "the allocation map shows 0.60 / 1.00 and 0.80 / 1.00 (0.2 + 1.2 shares over 2 GPUs)",
    )
    amap = tour.cli("agent", "alloc-map", agent_id, "--json", echo=False)
    tour.check(
        _cuda_allocations(amap) == [Decimal("0.6"), Decimal("0.8")],
        "alloc-map --json: cuda.shares allocated 0.6 and 0.8",
    )
    gql = tour.cli(
        "admin", "query", GPU_ALLOC_QUERY, "--variables", json.dumps({"agent_id": agent_id})
    )
    doc = _json(gql)
    gpu_map: dict[str, str] = {}
    if isinstance(doc, dict):
        agent = (doc.get("data") or {}).get("agent") or {}
        gpu_map = json.loads(agent.get("gpu_alloc_map") or "{}")
    tour.check(
        sorted(gpu_map.values()) == ["0.60", "0.80"],
        'GraphQL gpu_alloc_map is {"...": "0.80", "...": "0.60"}',
    )
    destroyed = tour.cli("session", "destroy", "tour-a", "tour-b")
    tour.check(destroyed.returncode == 0, "tour-a and tour-b are destroyed")

    for name in ("fill-1", "fill-2"):
        created = tour.cli("session", "create", "-r", "cuda.shares=1", "--name", name, "python")
        tour.check("is created and ready." in created.stdout, f"{name} (1 fGPU) is ready")
    third = tour.cli("session", "create", "-r", "cuda.shares=1", "--name", "fill-3", "python")
    reason = _pending_reason(third.stdout)
    tour.check(
        third.returncode == 0 and f"{agent_id}: {CUDA_REASON}" in reason,
        f"fill-3 waits as PENDING, because {agent_id}: {CUDA_REASON} (the 2 fGPU are taken)",
    )
    why = tour.cli("session", "why", "fill-3")
    why_lines = why.stdout.splitlines()
    tour.check(
        why.returncode == 0
        and bool(why_lines)
        and why_lines[0].endswith("(fill-3): PENDING")
        and f"{agent_id}: {CUDA_REASON}" in why.stdout,
        f"session why says fill-3 is PENDING and names {agent_id}: {CUDA_REASON}",
    )
    tour.cli("session", "destroy", "fill-1")
    waited = tour.cli("session", "wait", "fill-3", "--status", "RUNNING", "--timeout", "30")
    info = _json(tour.cli("session", "info", "fill-3", "--json", echo=False))
    resumed = isinstance(info, dict) and (info.get("status"), info.get("agentId")) == (
        "RUNNING",
        agent_id,
    )
    tour.check(
        waited.returncode == 0 and waited.stdout.rstrip().endswith("is RUNNING.") and resumed,
        f"after destroying fill-1, fill-3 is RUNNING by itself on {agent_id} (session info)",
    )
    full = tour.cli("agent", "alloc-map", agent_id, "--plugin", "cuda")
    tour.check(full.stdout.count("1.00 / 1.00") == 2, "both GPUs are fully allocated again")
    tour.cli("session", "destroy", "fill-2", "fill-3")
    run_image_tour(tour)
    run_folder_tour(tour)


PRINT_DEMO_LIB = "import demo_lib; print('demo-lib', demo_lib.__version__)"


def run_image_tour(tour: Tour) -> None:
    """Two sessions, one per demo environment, print two versions of one library."""
    for name, image, version in (("lib-1", "demo-lib:1.0", "1.0"), ("lib-2", "demo-lib", "2.0")):
        tour.cli(
            "session", "create", "-r", "cpu=1", "-r", "mem=256", "--name", name, image,
            "--", "python", "-c", PRINT_DEMO_LIB,
        )  # fmt: skip
        tour.cli("session", "wait", name, "--status", "TERMINATED", "--timeout", "60", echo=False)
        logs = tour.cli("session", "logs", name)
        tour.check(
            f"demo-lib {version}" in logs.stdout.splitlines(),
            f"{name} ({image}) prints demo-lib {version}: its own environment's version",
        )


FOLDER_TEXT = "hello from a storage folder"


def run_folder_tour(tour: Tour) -> None:
    """A storage folder: made, a file uploaded into it, listed, read by a session that
    mounts it."""
    created = tour.cli("vfolder", "create", "data")
    tour.check(created.returncode == 0, "the storage folder data is created (local:volume1)")
    with tempfile.TemporaryDirectory(prefix="accelshare-demo-files-") as tmp:
        hello = Path(tmp) / "hello.txt"
        hello.write_text(FOLDER_TEXT + "\n")
        up = tour.cli("vfolder", "upload", "data", str(hello), "-b", tmp)
    listed = _json(tour.cli("vfolder", "ls", "data", "--json", echo=False))
    names = [e.get("name") for e in listed] if isinstance(listed, list) else []
    tour.check(
        up.returncode == 0 and "hello.txt" in names,
        "hello.txt is uploaded through the storage proxy and listed in data",
    )
    tour.cli(
        "session", "create", "-r", "cpu=1", "-r", "mem=256", "--name", "reader", "-m", "data",
        "shell", "--", "cat data/hello.txt",
    )  # fmt: skip
    tour.cli("session", "wait", "reader", "--status", "TERMINATED", "--timeout", "60", echo=False)
    logs = tour.cli("session", "logs", "reader")
    tour.check(
        FOLDER_TEXT in logs.stdout.splitlines(),
        "a session that mounts data (-m data) reads data/hello.txt in its work dir",
    )


def run_demo(
    *,
    data_dir: Path | None = None,
    port: int | None = None,
    out: Console | None = None,
    tour: Callable[[Tour, str], None] = run_tour,
    as_json: bool = False,
) -> int:
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    out = out or (err if as_json else Console(highlight=False, soft_wrap=True))
    with tempfile.TemporaryDirectory(prefix="accelshare-demo-") as tmp:
        options = DevClusterOptions(
            data_dir=data_dir or Path(tmp),
            port=port or free_port(),
            allocation_mode="fractional",
        )
        cluster = LocalCluster(options, progress=lambda m: out.print(f"[dim]{escape(m)}[/dim]"))
        try:
            cluster.start()
        except START_ERRORS as e:
            err.print(f"[red]error:[/red] the demo cluster did not start: {escape(str(e))}")
            return 1
        try:
            out.print(
                f"[bold]local cluster at {cluster.endpoint}[/bold] (data dir {cluster.layout.root})"
            )
            walk = Tour(env={**child_env(), **cluster.client_env()}, out=out)
            tour(walk, cluster.agent_ids[0])
        finally:
            cluster.stop(destroy_sessions=True)
    if as_json:
        doc = {
            "passed": walk.passed,
            "failed": walk.failures,
            "checks": [{"check": what, "ok": ok} for what, ok in walk.checks],
        }
        print(json.dumps(doc, indent=2, ensure_ascii=False), flush=True)
        return 1 if walk.failures else 0
    out.print()
    if walk.failures:
        out.print(f"[red bold]demo FAILED: {len(walk.failures)} check(s) failed[/red bold]")
        for what in walk.failures:
            out.print(f"[red]  ✗ {escape(what)}[/red]")
        return 1
    out.print(f"[green bold]demo passed: {walk.passed} checks[/green bold]")
    return 0
