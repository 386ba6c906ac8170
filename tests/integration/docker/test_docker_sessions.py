"""Sessions as real containers, end to end: the manager process, an agent daemon on the
docker runtime (the fixture's dockerd and its locally built busybox image), and the
public API.

A batch session prints, from inside its container, ``/home/config/resource.txt``, its
environment and its cgroup limits, then exits: the session ends TERMINATED with exit
code 0 and its logs show the mock GPU allocation and the limits.  An interactive session
(no command) keeps its container running until it is destroyed through the API.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Protocol

import aiodocker
import httpx
import pytest
from aiodocker.exceptions import DockerError

from accelshare.client.auth import KeypairAuth
from accelshare.config import open_config_store
from accelshare.config.settings import load_config_store_settings
from accelshare.manager.bootstrap import AdminCredentials
from accelshare_testkit.waiting import until

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]
SECRET = "docker-session-test-cluster-secret"
REPORT = (
    "echo RESOURCE-TXT; cat /home/config/resource.txt; "
    "echo ENVIRONMENT; env; "
    "echo MEMORY-LIMIT=$(cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null "
    "|| cat /sys/fs/cgroup/memory.max 2>/dev/null); "
    "echo REPORT-END"
)


class DockerEngine(Protocol):  # conftest.DockerEngine (the tests here are not a package)
    @property
    def url(self) -> str: ...


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start(argv: list[str], log: Path, cwd: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env={**os.environ, "ACCELSHARE_CLUSTER_SECRET": SECRET},
        )


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextlib.asynccontextmanager
async def docker_cluster(
    tmp_path: Path, engine_url: str, *, network: str = "none"
) -> AsyncIterator[httpx.AsyncClient]:
    port, rpc_port = free_port(), free_port()
    store = f'[config-store]\npath = "{tmp_path / "config-store.db"}"\n'
    (tmp_path / "manager.toml").write_text(
        f'[manager]\ndata-dir = "{tmp_path / "state"}"\nservice-addr = "127.0.0.1:{port}"\n' + store
    )
    (tmp_path / "agent.toml").write_text(
        f'[agent]\nid = "i-docker"\nrpc-listen-addr = "127.0.0.1:{rpc_port}"\n'
        'allowed-compute-plugins = ["mock"]\n'
        f'mock-accelerator-config = "{REPO / "configs/accelerator/two-fgpu.toml"}"\n'
        "heartbeat-interval-s = 0.3\n"
        f'[container]\nruntime = "docker"\ndocker-url = "{engine_url}"\n'
        f'docker-network = "{network}"\nscratch-root = "{tmp_path / "scratch"}"\nstop-grace-s = 1.0\n'
        '[resource]\nreserved-cpu = 0\nreserved-mem = 0\ncpu-count = 4\nmemory-size = "8g"\n'
        f'[manager]\nendpoint = "http://127.0.0.1:{port}"\n' + store
    )
    async with await open_config_store(load_config_store_settings(tmp_path / "agent.toml")) as s:
        await s.put("config/plugins/accelerator/cuda/allocation_mode", "fractional")
    manager = _start(
        [sys.executable, "-m", "accelshare.client.cli", "server", "manager", "--config",
         str(tmp_path / "manager.toml")],
        tmp_path / "manager.log",
        tmp_path,
    )  # fmt: skip
    agent: subprocess.Popen[bytes] | None = None
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as plain:

            async def healthy() -> bool:
                assert manager.poll() is None, (tmp_path / "manager.log").read_text()
                with contextlib.suppress(httpx.HTTPError):
                    return (await plain.get("/health")).status_code == 200
                return False

            await until(healthy, "the manager")
        agent = _start(
            [sys.executable, "-m", "accelshare.agent", "--config", str(tmp_path / "agent.toml")],
            tmp_path / "agent.log",
            tmp_path,
        )
        creds = AdminCredentials.from_env_file(tmp_path / "state" / "admin-credentials.env")
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{port}",
            auth=KeypairAuth(creds.access_key, creds.secret_key),
            timeout=60,
        ) as client:

            async def registered() -> bool:
                assert agent is not None
                assert agent.poll() is None, (tmp_path / "agent.log").read_text()
                items = (await client.get("/agents", params={"status": "ALIVE"})).json()["items"]
                return bool(items)

            await until(registered, "the docker agent to register")
            yield client
    finally:
        if agent is not None:
            _stop(agent)
        _stop(manager)


async def test_sessions_run_as_containers(
    tmp_path: Path, docker_engine: DockerEngine, busybox_image: str
) -> None:
    docker = aiodocker.Docker(url=docker_engine.url)
    try:
        async with docker_cluster(tmp_path, docker_engine.url) as client:
            # -- a batch session: its container reports from inside and exits -------------
            created = await client.post(
                "/session",
                json={
                    "image": busybox_image,
                    "name": "in-a-box",
                    "type": "batch",
                    "startupCommand": REPORT,
                    "config": {"resources": {"cpu": "1", "mem": "128m", "cuda.shares": "0.5"}},
                },
            )
            assert created.status_code == 201, created.text

            async def ended() -> dict[str, Any] | None:
                info = (await client.get("/session/in-a-box")).json()
                return info if info["status"] in ("TERMINATED", "CANCELLED") else None

            info = await until(ended, "the batch container to end")
            assert (info["status"], info["exitCode"]) == ("TERMINATED", 0), info
            logs = (await client.get("/session/in-a-box/logs")).json()
            text = logs["result"]["logs"]
            resource_txt = text.split("RESOURCE-TXT\n", 1)[1].split("ENVIRONMENT", 1)[0]
            environment = text.split("ENVIRONMENT\n", 1)[1].split("MEMORY-LIMIT", 1)[0]
            shares = next(
                line for line in resource_txt.splitlines() if line.startswith("CUDA.SHARES_SHARES=")
            )
            device = shares.removeprefix("CUDA.SHARES_SHARES=").split(":")[0]
            assert shares == f"CUDA.SHARES_SHARES={device}:0.5"
            assert "CUDA_RESOURCE_VIRTUALIZED=1" in resource_txt
            assert f"BACKENDAI_MOCK_CUDA_DEVICES={device}" in environment
            assert "BACKENDAI_MOCK_CUDA_DEVICE_COUNT=1" in environment
            memory_limit = text.split("MEMORY-LIMIT=", 1)[1].split("\n", 1)[0].strip()
            assert memory_limit == str(128 << 20)  # the limit, seen from inside

            # -- an interactive session: a container that runs until destroyed -------------
            created = await client.post(
                "/session",
                json={
                    "image": busybox_image,
                    "name": "stays",
                    "maxWaitSeconds": 30,
                    "config": {"resources": {"cpu": "1", "mem": "64m", "cuda.shares": "1"}},
                },
            )
            assert created.status_code == 201, created.text
            assert created.json()["status"] == "RUNNING"
            session_id = created.json()["sessionId"]
            filters = json.dumps({"label": [f"ai.accelshare.session-id={session_id}"]})
            (container,) = await docker.containers.list(filters=filters)
            shown = await container.show()
            assert shown["State"]["Running"] is True
            assert shown["HostConfig"]["Memory"] == 64 << 20
            assert (await client.delete("/session/stays")).status_code in (200, 202, 204)

            async def removed() -> bool:
                try:
                    await container.show()
                except DockerError as e:
                    return e.status == 404
                return False

            await until(removed, "the container to be removed")
            assert (await client.get("/session/stays")).json()["status"] == "TERMINATED"
    finally:
        await docker.close()


def _non_loopback_address() -> str | None:
    """An IPv4 address of this host other than loopback (the route's source), if any."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("10.255.255.255", 1))  # no packet is sent
        except OSError:
            return None
        address = str(probe.getsockname()[0])
    return None if address.startswith("127.") or address == "0.0.0.0" else address


# Serves who.txt (its session id and the port it listens on) with busybox httpd on its
# declared port, inside the container.
WHO_HTTPD = (
    "mkdir -p /home/work/www && "
    'echo "$ACCELSHARE_SESSION_ID $BACKENDAI_SERVICE_PORT_WEB" > /home/work/www/who.txt && '
    'exec httpd -f -p "$BACKENDAI_SERVICE_PORT_WEB" -h /home/work/www'
)


async def test_app_services_of_bridge_containers_through_the_proxy(
    tmp_path: Path, docker_engine: DockerEngine, busybox_image: str
) -> None:
    """Two containers on a bridge network both serve their app on the declared port 8080:
    each is published on its own host port from [container] port-range, and the manager's
    proxy reaches each one's own app."""
    docker = aiodocker.Docker(url=docker_engine.url)
    network_name = f"astest-{os.getpid()}"
    try:
        try:
            network = await docker.networks.create({"Name": network_name, "Driver": "bridge"})
        except DockerError as e:
            pytest.skip(f"no bridge network on this engine: {e}")
        try:
            async with docker_cluster(tmp_path, docker_engine.url, network=network_name) as client:
                sids = []
                for name in ("app1", "app2"):
                    created = await client.post(
                        "/session",
                        json={
                            "image": busybox_image,
                            "name": name,
                            "type": "batch",
                            "startupCommand": WHO_HTTPD,
                            "maxWaitSeconds": 30,
                            "config": {
                                "resources": {"cpu": "1", "mem": "64m"},
                                "service_ports": [{"name": "web", "port": 8080}],
                            },
                        },
                    )
                    assert created.status_code == 201, created.text
                    assert created.json()["status"] == "RUNNING", created.text
                    sids.append(created.json()["sessionId"])
                host_ports = []
                for sid in sids:
                    (app,) = (await client.get(f"/session/{sid}/apps")).json()["apps"]
                    assert app["port"] == 8080
                    host_ports.append(app["hostPort"])
                    filters = json.dumps({"label": [f"ai.accelshare.session-id={sid}"]})
                    (container,) = await docker.containers.list(filters=filters)
                    shown = await container.show()
                    assert shown["HostConfig"]["NetworkMode"] == network_name
                    # Published on the address the proxy connects to (the agent's
                    # RPC host, 127.0.0.1 here) only, not on every address.
                    assert shown["HostConfig"]["PortBindings"] == {
                        "8080/tcp": [{"HostIp": "127.0.0.1", "HostPort": str(app["hostPort"])}]
                    }
                    assert shown["NetworkSettings"]["Ports"]["8080/tcp"] == [
                        {"HostIp": "127.0.0.1", "HostPort": str(app["hostPort"])}
                    ]
                    other = _non_loopback_address()
                    if other is not None:  # nothing listens there for the app
                        with pytest.raises(ConnectionRefusedError):
                            socket.create_connection((other, app["hostPort"]), timeout=2).close()

                    async def who(sid: str = sid) -> httpx.Response | None:
                        response = await client.get(f"/session/{sid}/apps/web/who.txt")
                        return response if response.status_code == 200 else None

                    response = await until(who, f"the app of {sid}", timeout_s=30)
                    # Its own app, listening on the declared port inside its container.
                    assert response.text.strip() == f"{sid} 8080"
                assert len(set(host_ports)) == 2
                assert all(30000 <= p <= 31000 for p in host_ports)
                for sid in sids:
                    await client.delete(f"/session/{sid}")
        finally:
            await network.delete()
    finally:
        await docker.close()
