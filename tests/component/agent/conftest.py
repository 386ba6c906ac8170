"""Fixtures for real process-runtime kernels: a runtime per test, cleaned up afterwards,
probes that say what this machine supports (cgroups, namespaces), and whole in-process
agents (agent.toml writer, fake manager, RPC client through the ASGI app)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest

from accelshare.agent import service_runtime
from accelshare.agent.daemon import start_agent_service
from accelshare.agent.rpc import create_rpc_app
from accelshare.agent.runtime import ProcessRuntime, ProcessRuntimeConfig, ResourceLimits
from accelshare.agent.runtime.cgroups import CgroupLayout, CgroupManager
from accelshare.agent.runtime.exec_helper import ExecHelperState, build_exec_helper
from accelshare.agent.runtime.sandbox import SandboxConfig
from accelshare.agent.runtime.sandbox import probe as probe_sandbox
from accelshare.agent.service import AgentService
from accelshare.cbuild import BuildFailed
from accelshare.config import open_config_store
from accelshare.config.agent_file import load_agent_config
from accelshare.config.settings import load_config_store_settings
from accelshare.protocol import CLUSTER_SECRET_HEADER

RuntimeFactory = Callable[..., ProcessRuntime]


Eventually = Callable[..., Awaitable[Any]]


async def _eventually(
    check: Callable[[], Awaitable[Any] | Any], *, timeout_s: float = 10.0, what: str = ""
) -> Any:
    """Poll ``check`` until it returns something truthy (no sleeps as assertions)."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what or check}")
        await asyncio.sleep(0.02)


@pytest.fixture
def eventually() -> Eventually:
    """``await eventually(check, timeout_s=..., what=...)``: poll until truthy, with a deadline."""
    return _eventually


@pytest.fixture(scope="session")
def cgroup_support() -> dict[str, str | None]:
    """controller -> None when a kernel cgroup with that limit can be made, else why not."""
    layout = CgroupLayout.detect()
    if layout.version is None:
        reason = "no cgroup hierarchy with memory/cpu/pids controllers is mounted"
        return dict.fromkeys(("memory", "cpu", "pids"), reason)
    manager = CgroupManager(layout, "accelshare-probe")
    probe = f"probe-{uuid.uuid4().hex[:8]}"
    try:
        cgroup = manager.create(
            probe, ResourceLimits(cpu_count=Decimal(1), mem_bytes=64 << 20, pids_max=10)
        )
    except OSError as e:
        return dict.fromkeys(("memory", "cpu", "pids"), f"cannot write cgroup limits: {e}")
    if cgroup is None:
        return dict.fromkeys(("memory", "cpu", "pids"), f"{layout.describe()} is not writable")
    manager.remove(cgroup)
    return {
        c: None if c in cgroup.applied else f"{layout.describe()}: no writable {c} controller"
        for c in ("memory", "cpu", "pids")
    }


@pytest.fixture(scope="session")
def sandbox_support() -> str | None:
    """None when a bubblewrap sandbox can be made here (as the kernels' user), else why not."""
    return probe_sandbox(SandboxConfig())


@pytest.fixture(scope="session")
def exec_helper_build(tmp_path_factory: pytest.TempPathFactory) -> Path | str:
    """The kernels' exec helper, built once for the session; why not (a string) where
    this machine cannot build it."""
    try:
        return build_exec_helper(tmp_path_factory.mktemp("exec-helper"))
    except BuildFailed as e:
        return str(e)


@pytest.fixture(autouse=True)
def _session_exec_helper(monkeypatch: pytest.MonkeyPatch, exec_helper_build: Path | str) -> None:
    """Agents started in-process take the session's exec helper instead of compiling one
    into each test's scratch root (~0.3 s of CPU each); the build at agent start is
    test_exec_helper.py's."""
    state = (
        ExecHelperState(path=exec_helper_build)
        if isinstance(exec_helper_build, Path)
        else ExecHelperState(reason=exec_helper_build)
    )

    def prepared(scratch_root: Path, **_: Any) -> ExecHelperState:
        return state

    monkeypatch.setattr(service_runtime, "prepare_exec_helper", prepared)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A module with ``BOTH_KERNEL_EXECS = True`` runs each test that starts kernels
    (through ``kernel_exec``) both ways: with the exec helper and the Python way."""
    if getattr(metafunc.module, "BOTH_KERNEL_EXECS", False) and (
        "kernel_exec" in metafunc.fixturenames
    ):
        metafunc.parametrize("kernel_exec", ["helper", "python"], indirect=True)


@pytest.fixture
def kernel_exec(request: pytest.FixtureRequest, exec_helper_build: Path | str) -> Path | None:
    """The exec helper the runtimes of ``make_runtime`` start kernels with (None: a
    forked Python process), as the agent does: the helper where it builds.  A test
    asks for one way with ``@pytest.mark.parametrize("kernel_exec", ["helper",
    "python"], indirect=True)``, a module for both with ``BOTH_KERNEL_EXECS = True``
    ("helper" skips where it cannot be built)."""
    way = getattr(request, "param", None)
    if way == "python":
        return None
    if isinstance(exec_helper_build, str):
        if way == "helper":
            pytest.skip(f"no exec helper: {exec_helper_build}")
        return None
    return exec_helper_build


@pytest.fixture
def scratch_root(tmp_path: Path) -> Path:
    return tmp_path / "scratch"


@pytest.fixture
async def make_runtime(
    scratch_root: Path, kernel_exec: Path | None
) -> AsyncIterator[RuntimeFactory]:
    """Build runtimes on one scratch root (a second one = the agent after a restart),
    starting kernels with ``kernel_exec`` unless told otherwise (``exec_helper=``).
    With the exec helper a runtime starts kernels as the agent does by default: through
    the launcher's fork server, whose supervisors are the helper's (``supervise``);
    ``fork_server=False`` gives the Python supervisor the helper's ``enter`` runs under.

    At the end every kernel left on the scratch root is destroyed and cleaned up, so
    no process or cgroup outlives the test.
    """

    def factory(*, cgroups: CgroupManager | None = None, **overrides: Any) -> ProcessRuntime:
        settings: dict[str, Any] = {
            "scratch_root": scratch_root,
            "stop_grace_s": 2.0,
            "cgroup_parent": "accelshare-test",
            "exec_helper": kernel_exec,
            "fork_server": kernel_exec is not None,
        }
        settings.update(overrides)
        return ProcessRuntime(ProcessRuntimeConfig(**settings), cgroups=cgroups)

    yield factory
    cleaner = factory(fork_server=False)
    for info in await cleaner.scan_kernels():
        with contextlib.suppress(Exception):
            await cleaner.destroy_kernel(info.kernel_id, grace_s=0)
        with contextlib.suppress(Exception):
            await cleaner.cleanup_kernel(info.kernel_id)


@pytest.fixture
def runtime(make_runtime: RuntimeFactory) -> ProcessRuntime:
    return make_runtime()


# -- whole agents (accelshare.agent.service) ----------------------------------------------

REPO = Path(__file__).resolve().parents[3]
TWO_FGPU = REPO / "configs" / "accelerator" / "two-fgpu.toml"
CLUSTER_SECRET = "component-test-cluster-secret"
MODE_KEY = "config/plugins/accelerator/cuda/allocation_mode"


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str | Path):
        return json.dumps(str(value))
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} as TOML")


def to_toml(data: dict[str, dict[str, Any]]) -> str:
    """Enough TOML for agent.toml: tables of scalars and lists."""
    lines: list[str] = []
    for table, values in data.items():
        lines.append(f"[{table}]")
        lines.extend(f"{key} = {_toml_value(value)}" for key, value in values.items())
        lines.append("")
    return "\n".join(lines)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


AgentTomlFactory = Callable[..., Path]


@pytest.fixture
def agent_toml(tmp_path: Path, scratch_root: Path) -> AgentTomlFactory:
    """Write an agent.toml for a test agent: mock two-fgpu, 8 cores / 16g advertised (so
    this machine's size does not bound the tests), an embedded config store in tmp_path.
    Keyword arguments override ``{table: {key: value}}``."""

    def write(**overrides: dict[str, Any]) -> Path:
        data: dict[str, dict[str, Any]] = {
            "agent": {
                "id": "i-test",
                "rpc-listen-addr": f"127.0.0.1:{free_port()}",
                "allowed-compute-plugins": ["mock"],
                "mock-accelerator-config": str(TWO_FGPU),
                "cluster-secret": CLUSTER_SECRET,
                "heartbeat-interval-s": 0.05,
            },
            "container": {
                "scratch-root": str(scratch_root),
                "cgroup-parent": "accelshare-test",
                "stop-grace-s": 2.0,
            },
            "resource": {"cpu-count": 8, "memory-size": "16g"},
            "manager": {"endpoint": f"http://127.0.0.1:{free_port()}"},
            "config-store": {"path": str(tmp_path / "config-store.db")},
        }
        for table, values in overrides.items():
            data.setdefault(table.replace("_", "-"), {}).update(values)
        path = tmp_path / "agent.toml"
        path.write_text(to_toml(data))
        return path

    return write


async def set_allocation_mode(agent_toml_path: Path, mode: str) -> None:
    """Put ``allocation_mode`` for the cuda (mock) plugin in the agent's config store."""
    settings = load_config_store_settings(agent_toml_path)
    async with await open_config_store(settings) as store:
        await store.put(MODE_KEY, mode)


class FakeManager:
    """The manager's agent endpoints, in memory (an httpx.MockTransport handler)."""

    def __init__(self) -> None:
        self.heartbeats: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.secrets: set[str | None] = set()
        self.destroy_kernels: list[str] = []
        self.down = False
        self.transport = httpx.MockTransport(self._handle)

    def _handle(self, request: httpx.Request) -> httpx.Response:
        if self.down:
            raise httpx.ConnectError("connection refused", request=request)
        self.secrets.add(request.headers.get(CLUSTER_SECRET_HEADER))
        body = json.loads(request.content)
        if request.url.path == "/internal/agents/heartbeat":
            self.heartbeats.append(body)
            return httpx.Response(200, json={"destroy_kernels": self.destroy_kernels})
        if request.url.path == "/internal/agents/events":
            self.events.extend(body["events"])
            return httpx.Response(204)
        return httpx.Response(404)

    def events_of(self, kernel_id: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["kernel_id"] == kernel_id]


@dataclass
class Agent:
    """A started in-process agent and an RPC client bound to it (through the ASGI app)."""

    service: AgentService
    client: httpx.AsyncClient
    manager: FakeManager

    async def create(
        self,
        kernel_id: str,
        slots: dict[str, str] | None = None,
        *,
        image: str = "shell",
        command: list[str] | None = None,
    ) -> dict[str, Any]:
        body = {
            "kernel_id": kernel_id,
            "session_id": f"s-{kernel_id}",
            "image": image,
            "requested_slots": slots or {"cpu": "1", "mem": "1g"},
            "command": command,
        }
        response = await self.client.post("/v1/kernels", json=body)
        assert response.status_code == 200, response.text
        return dict(response.json())

    async def destroy(self, kernel_id: str) -> dict[str, Any]:
        response = await self.client.delete(f"/v1/kernels/{kernel_id}")
        assert response.status_code == 200, response.text
        return dict(response.json())

    async def alloc_map(self, form: str = "full") -> dict[str, Any]:
        response = await self.client.get("/v1/alloc-map", params={"form": form})
        assert response.status_code == 200, response.text
        return dict(response.json())


AgentFactory = Callable[..., Awaitable[Agent]]


@pytest.fixture
async def start_agent(make_runtime: RuntimeFactory) -> AsyncIterator[AgentFactory]:
    """Start in-process agents from an agent.toml (``make_runtime`` cleans up kernels)."""
    started: list[Agent] = []

    async def start(path: Path, manager: FakeManager | None = None) -> Agent:
        manager = manager or FakeManager()
        config = load_agent_config(path)
        service = await start_agent_service(config, CLUSTER_SECRET, transport=manager.transport)
        service.start_reporting()
        client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=create_rpc_app(service, secret=CLUSTER_SECRET)),
            base_url="http://agent",
            headers={CLUSTER_SECRET_HEADER: CLUSTER_SECRET},
        )
        agent = Agent(service, client, manager)
        started.append(agent)
        return agent

    yield start
    for agent in started:
        await agent.client.aclose()
        with contextlib.suppress(RuntimeError):
            await agent.service.stop()


ModeSetter = Callable[[Path, str], Awaitable[None]]


@pytest.fixture
def set_mode() -> ModeSetter:
    """``await set_mode(agent_toml_path, "fractional")``: the mock's allocation mode."""
    return set_allocation_mode


@pytest.fixture
def fake_manager() -> FakeManager:
    return FakeManager()
