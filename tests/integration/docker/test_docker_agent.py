"""The whole agent on the docker runtime: the real daemon (``python -m accelshare.agent``)
with ``[container] runtime = "docker"`` against the fixture's dockerd, the mock plugin in
fractional mode (two 1.0-share GPUs), driven through its RPC over TCP and reporting to a
manager stand-in over HTTP.

One kernel's story: created asking ``cuda.shares`` -> a running container whose
``/home/config/resource.txt`` and environment carry the mock's allocation and whose
HostConfig (and cgroup files) carry the limits; the allocation map and the heartbeat show
it; the agent restarts (SIGTERM, the container keeps running) and re-adopts it with the
same map; destroy removes the container and frees the map.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Protocol

import aiodocker
import httpx
import pytest
from aiodocker.exceptions import DockerError

from accelshare.agent.runtime import AGENT_ID_LABEL, KERNEL_ID_LABEL
from accelshare.config import open_config_store
from accelshare.config.settings import load_config_store_settings

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]
TWO_FGPU = REPO / "configs" / "accelerator" / "two-fgpu.toml"
GPUS = ("c59395cd-ac91-4cd3-a1b0-3d2568aa2d01", "c59395cd-ac91-4cd3-a1b0-3d2568aa2d02")
SECRET = "docker-agent-test-cluster-secret"
SECRET_HEADER = "X-Accelshare-Cluster-Secret"
MODE_KEY = "config/plugins/accelerator/cuda/allocation_mode"
MEM_BYTES = 128 << 20
# What the kernel prints, between markers, then idles until SIGTERM.
REPORT = (
    "echo RESOURCE-TXT; cat /home/config/resource.txt; "
    "echo ENVIRONMENT; env; "
    "echo MEMORY-LIMIT=$(cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null "
    "|| cat /sys/fs/cgroup/memory.max 2>/dev/null); "
    "echo CPU-QUOTA=$(cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us 2>/dev/null "
    "|| cat /sys/fs/cgroup/cpu.max 2>/dev/null); "
    "echo REPORT-END; trap 'exit 0' TERM; while :; do sleep 1 & wait $!; done"
)


class DockerEngine(Protocol):  # conftest.DockerEngine (the tests here are not a package)
    @property
    def url(self) -> str: ...


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def eventually(check: Any, *, what: str, timeout_s: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.05)


class ManagerStandIn:
    """The manager's two agent endpoints over real HTTP (the daemon posts to them)."""

    def __init__(self) -> None:
        self.heartbeats: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path == "/internal/agents/heartbeat":
                    stand_in.heartbeats.append(body)
                    payload = b'{"destroy_kernels": []}'
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                if self.path == "/internal/agents/events":
                    stand_in.events.extend(body["events"])
                self.send_response(204 if self.path == "/internal/agents/events" else 404)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def last_heartbeat_with(self, predicate: Any) -> dict[str, Any] | None:
        return next((b for b in reversed(list(self.heartbeats)) if predicate(b)), None)


@pytest.fixture
def manager() -> Iterator[ManagerStandIn]:
    stand_in = ManagerStandIn()
    stand_in.thread.start()
    try:
        yield stand_in
    finally:
        stand_in.server.shutdown()
        stand_in.server.server_close()


class Daemon:
    """``python -m accelshare.agent --config PATH``, output in a log file."""

    def __init__(self, path: Path, url: str, log: Path) -> None:
        self.path, self.url, self.log = path, url, log
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        with self.log.open("ab") as log:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "accelshare.agent", "--config", str(self.path),
                stdout=log, stderr=log,
            )  # fmt: skip

        async def healthy() -> bool:
            assert self.proc is not None
            if self.proc.returncode is not None:
                raise AssertionError(f"agent exited {self.proc.returncode}: {self.output()}")
            try:
                async with httpx.AsyncClient(headers={SECRET_HEADER: SECRET}) as client:
                    return (await client.get(self.url + "/v1/health")).status_code == 200
            except httpx.TransportError:
                return False

        await eventually(healthy, what="the agent answering /v1/health")

    async def stop(self) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return await asyncio.wait_for(self.proc.wait(), timeout=30)

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-6000:]


@pytest.fixture
async def docker(docker_engine: DockerEngine) -> AsyncIterator[aiodocker.Docker]:
    client = aiodocker.Docker(url=docker_engine.url)
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture
async def agent(
    tmp_path: Path,
    docker_engine: DockerEngine,
    busybox_image: str,
    manager: ManagerStandIn,
    docker: aiodocker.Docker,
) -> AsyncIterator[Daemon]:
    """An agent.toml for the docker runtime + the mock in fractional mode; the daemon is
    started by the test.  Afterwards: the daemon killed, its containers removed."""
    agent_id = f"i-dock-{uuid.uuid4().hex[:8]}"
    port = free_port()
    path = tmp_path / "agent.toml"
    path.write_text(
        f"""\
[agent]
id = "{agent_id}"
rpc-listen-addr = "127.0.0.1:{port}"
allowed-compute-plugins = ["mock"]
mock-accelerator-config = "{TWO_FGPU}"
cluster-secret = "{SECRET}"
heartbeat-interval-s = 0.2

[container]
runtime = "docker"
docker-url = "{docker_engine.url}"
docker-network = "none"
scratch-root = "{tmp_path / "scratch"}"
stop-grace-s = 1.0

[resource]
cpu-count = 8
memory-size = "16g"

[manager]
endpoint = "{manager.url}"

[config-store]
path = "{tmp_path / "config-store.db"}"
"""
    )
    async with await open_config_store(load_config_store_settings(path)) as store:
        await store.put(MODE_KEY, "fractional")
    daemon = Daemon(path, f"http://127.0.0.1:{port}", tmp_path / "agent.log")
    try:
        yield daemon
    finally:
        if daemon.proc is not None and daemon.proc.returncode is None:
            daemon.proc.kill()
            await daemon.proc.wait()
        filters = json.dumps({"label": [f"{AGENT_ID_LABEL}={agent_id}"]})
        for container in await docker.containers.list(all=True, filters=filters):
            with contextlib.suppress(DockerError):
                await container.delete(force=True, v=True)


def section(logs: str, start: str, end: str) -> str:
    return logs.split(start + "\n", 1)[1].split(end, 1)[0]


async def inspect(docker: aiodocker.Docker, name: str) -> dict[str, Any] | None:
    try:
        return dict(await (await docker.containers.get(name)).show())
    except DockerError as e:
        if e.status == 404:
            return None
        raise


async def test_a_kernel_through_the_agent_on_the_docker_runtime(
    agent: Daemon,
    manager: ManagerStandIn,
    docker: aiodocker.Docker,
    busybox_image: str,
    tmp_path: Path,
) -> None:
    await agent.start()
    client = httpx.AsyncClient(base_url=agent.url, headers={SECRET_HEADER: SECRET}, timeout=30)
    try:
        empty = (await client.get("/v1/alloc-map")).json()
        kernel_id = f"dk-{uuid.uuid4().hex[:10]}"
        body = {
            "kernel_id": kernel_id,
            "session_id": "s-docker",
            "image": busybox_image,
            "requested_slots": {"cpu": "1", "mem": str(MEM_BYTES), "cuda.shares": "0.5"},
            "command": ["/bin/sh", "-c", REPORT],
        }
        created = (await client.post("/v1/kernels", json=body)).json()
        assert created["status"] == "RUNNING", (created, agent.output())
        (gpu,) = created["allocations"]["cuda.shares"]
        assert gpu in GPUS
        assert created["allocations"]["cuda.shares"] == {gpu: "0.5"}
        container_id = created["container_id"]

        # -- the container: running, limits and network in its HostConfig ----------------
        data = await inspect(docker, f"accelshare-{kernel_id}")
        assert data is not None
        assert data["Id"] == container_id
        assert data["State"]["Running"] is True
        host = data["HostConfig"]
        assert (host["Memory"], host["MemorySwap"]) == (MEM_BYTES, MEM_BYTES)
        assert host["NanoCpus"] == 1_000_000_000  # cpu = 1
        assert host["NetworkMode"] == "none"  # [container] docker-network
        assert data["Config"]["Labels"][KERNEL_ID_LABEL] == kernel_id
        assert data["Config"]["Labels"]["ai.accelshare.session-id"] == "s-docker"
        scratch = tmp_path / "scratch" / kernel_id
        assert {(m["Source"], m["Destination"]) for m in data["Mounts"]} >= {
            (str(scratch / "config"), "/home/config"),
            (str(scratch / "work"), "/home/work"),
        }

        # -- inside it: resource.txt, the plugin's environment, the cgroup limits --------
        async def report() -> str | None:
            response = await client.get(f"/v1/kernels/{kernel_id}/logs")
            return response.text if "REPORT-END" in response.text else None

        logs = await eventually(report, what="the kernel's report in its logs (RPC)")
        resource_txt = section(logs, "RESOURCE-TXT", "ENVIRONMENT")
        assert f"CUDA.SHARES_SHARES={gpu}:0.5\n" in resource_txt
        assert "MEM_SHARES=root:128m\n" in resource_txt
        environment = section(logs, "ENVIRONMENT", "MEMORY-LIMIT").splitlines()
        assert f"BACKENDAI_MOCK_CUDA_DEVICES={gpu}" in environment
        assert f"BACKENDAI_KERNEL_ID={kernel_id}" in environment
        assert "ACCELSHARE_RESOURCE_TXT=/home/config/resource.txt" in environment
        memory_limit = logs.split("MEMORY-LIMIT=", 1)[1].split("\n", 1)[0]
        cpu_quota = logs.split("CPU-QUOTA=", 1)[1].split("\n", 1)[0]
        if memory_limit:  # cgroup files readable in the container (v1 here, or v2)
            assert memory_limit == str(MEM_BYTES)
        if cpu_quota:
            assert cpu_quota in ("100000", "100000 100000")  # 1 core: quota = period
        on_host = (scratch / "config" / "resource.txt").read_text()
        assert on_host.count("CID=") == 1
        assert on_host.endswith(f"CID={container_id}\n")

        # -- the allocation map and the heartbeat ----------------------------------------
        view = (await client.get("/v1/alloc-map")).json()
        cuda = {d["device_id"]: d for d in view["maps"]["cuda"]["devices"]}
        assert (cuda[gpu]["allocated"], cuda[gpu]["kernels"]) == ("0.5", {kernel_id: "0.5"})
        (other,) = set(GPUS) - {gpu}
        assert (cuda[other]["allocated"], cuda[other]["kernels"]) == ("0", {})
        (root,) = view["maps"]["mem"]["devices"]
        assert root["kernels"] == {kernel_id: str(MEM_BYTES)}
        cores = [d for d in view["maps"]["cpu"]["devices"] if d["kernels"]]
        assert [d["kernels"] for d in cores] == [{kernel_id: "1"}]
        compat = (await client.get("/v1/alloc-map", params={"form": "compat"})).json()
        assert compat == {gpu: "0.50", other: "0.00"}

        beat = await eventually(
            lambda: manager.last_heartbeat_with(
                lambda b: [k["kernel_id"] for k in b["kernels"]] == [kernel_id]
            ),
            what="a heartbeat listing the kernel",
        )
        assert busybox_image in beat["images"]  # the engine's images, not environments
        assert "shell" not in beat["images"]
        extra_repo, extra_tag = "accelshare-test/pulled-later", uuid.uuid4().hex[:8]
        await docker.images.tag(busybox_image, repo=extra_repo, tag=extra_tag)
        try:
            await eventually(
                lambda: manager.last_heartbeat_with(
                    lambda b: f"{extra_repo}:{extra_tag}" in b["images"]
                ),
                what="a heartbeat with an image tagged after the agent started",
            )
        finally:
            await docker.images.delete(f"{extra_repo}:{extra_tag}")
        started = [e for e in manager.events if e["kernel_id"] == kernel_id]
        assert [e["event"] for e in started] == ["started"]

        # -- restart: the container keeps running, the agent re-adopts it ----------------
        assert await agent.stop() == 0, agent.output()
        still = await inspect(docker, f"accelshare-{kernel_id}")
        assert still is not None
        assert still["State"]["Running"] is True
        await agent.start()
        assert (await client.get("/v1/alloc-map")).json() == view
        assert (await client.get("/v1/alloc-map", params={"form": "compat"})).json() == compat
        kernels = (await client.get("/v1/kernels")).json()["kernels"]
        assert [(k["kernel_id"], k["status"], k["container_id"]) for k in kernels] == [
            (kernel_id, "RUNNING", container_id)
        ]
        assert kernels[0]["allocations"] == created["allocations"]
        assert (scratch / "config" / "resource.txt").read_text().count("CID=") == 1

        # -- destroy: the container is gone, the map back to zero ------------------------
        destroyed = (await client.delete(f"/v1/kernels/{kernel_id}")).json()
        assert (destroyed["status"], destroyed["reason"]) == ("EXITED", "destroyed")
        assert destroyed["exit_code"] == 0  # the trap ended it on SIGTERM
        assert await inspect(docker, f"accelshare-{kernel_id}") is None
        assert (await client.get("/v1/alloc-map")).json() == empty
        assert not scratch.exists()  # keep-scratch = false
        await eventually(
            lambda: any(
                e["kernel_id"] == kernel_id and e["event"] == "exited" for e in manager.events
            ),
            what="the exited event",
        )
        assert await agent.stop() == 0
    finally:
        await client.aclose()
    output = agent.output()
    assert "docker runtime: engine" in output
    assert "restart recovery: 1 kernel(s) re-adopted" in output
