"""Two ordinary users on a real manager + agent (process runtime, sandboxed by default):
one user's session attacks the host and the other user's session, as issue #26 tried.

The attacker's session tries to read the superadmin's keypair file in the manager's data
dir, the agent's configuration, and the victim's work folder; to connect to the victim's
app port and to the manager's and agent's ports on the host's loopback; to signal the
victim's processes.  Each attempt is also made from the test itself (on the host), so a
refusal inside the session is the sandbox's doing, not a wrong path or port.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import websockets

from accelshare.agent.runtime.sandbox import SandboxConfig
from accelshare.agent.runtime.sandbox import probe as probe_sandbox
from accelshare_testkit.terminal import TerminalScreen
from accelshare_testkit.waiting import until

from .cluster import free_ports_below_ephemeral
from .test_mgr_real_agent import real_cluster
from .test_mgr_terminal import make_user, signed_headers, ws_url

WHY_NOT = probe_sandbox(SandboxConfig())
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=f"no sandbox here: {WHY_NOT}")

# The victim: a secret in its work folder, an app on its declared port.
VICTIM_APP = """
import http.server, os
open("secret.txt", "w").write("victim's secret")
port = int(os.environ["BACKENDAI_SERVICE_PORT_WEB"])
http.server.ThreadingHTTPServer(("127.0.0.1", port), http.server.SimpleHTTPRequestHandler
    ).serve_forever()
"""

# The attacker: every attempt's outcome, as one JSON line in its log.
ATTACK = """
import json, os, socket, sys
targets = json.loads(sys.argv[1])
def can_read(path):
    try:
        with open(path, "rb") as f:
            f.read(1)
        return True
    except OSError:
        return False
def can_connect(port):
    try:
        socket.create_connection(("127.0.0.1", port), 2).close()
        return True
    except OSError:
        return False
def can_signal(pid):
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False
out = {"uid": os.getuid(), "gid": os.getgid()}
out.update({name: can_read(path) for name, path in targets["files"].items()})
out.update({name: can_connect(port) for name, port in targets["ports"].items()})
out["signal_victim"] = can_signal(targets["victim_pid"])
out["host_pids_seen"] = sum(1 for p in os.listdir("/proc") if p.isdigit())
print("RESULT " + json.dumps(out), flush=True)
"""


@pytest.fixture
async def admin(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    low = free_ports_below_ephemeral(2)
    async with real_cluster(
        f"sqlite+aiosqlite:///{tmp_path / 'manager.db'}",
        tmp_path,
        agent_container_toml=f"port-range = [{low}, {low + 1}]",
    ) as client:
        yield client


def _body(name: str, startup: str, *, ports: bool = False) -> dict[str, Any]:
    config: dict[str, Any] = {"resources": {"cpu": 1, "mem": "256m"}}
    if ports:
        config["service_ports"] = [{"name": "web", "protocol": "http", "port": 8888}]
    return {
        "image": "python",
        "name": name,
        "type": "batch",
        "startupCommand": startup,
        "maxWaitSeconds": 30,
        "config": config,
    }


def _host_can_connect(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), 2).close()
        return True
    except OSError:
        return False


async def test_a_session_cannot_reach_the_host_nor_another_users_session(
    admin: httpx.AsyncClient, tmp_path: Path
) -> None:
    victim = await make_user(admin, "victim@example.com")
    attacker = await make_user(admin, "attacker@example.com")
    created = await victim.post(
        "/session", json=_body("v", f"python -c {shlex.quote(VICTIM_APP)}", ports=True)
    )
    assert created.json()["status"] == "RUNNING", created.text
    victim_sid = created.json()["sessionId"]
    info = (await victim.get(f"/session/{victim_sid}")).json()
    kernel = info["kernels"][0]
    secret = tmp_path / "scratch" / kernel["kernelId"] / "work" / "secret.txt"

    async def written() -> bool:
        return secret.exists()

    await until(written, "the victim's secret file", timeout_s=20)
    host_port = info["servicePorts"][0]["hostPort"]

    async def served() -> httpx.Response | None:
        response = await victim.get(f"/session/{victim_sid}/apps/web/secret.txt")
        return response if response.status_code == 200 else None

    # The victim's own app is reached through the proxy (the agent relays the host port
    # into its sandbox), and the host itself reaches it on the host port.
    assert (await until(served, "the victim's app", timeout_s=20)).text == "victim's secret"
    assert _host_can_connect(host_port)

    manager_port = urlsplit(str(admin.base_url)).port
    agent_toml = (tmp_path / "agent.toml").read_text()
    agent_port = int(agent_toml.split('rpc-listen-addr = "127.0.0.1:')[1].split('"')[0])
    victim_pid = int(kernel["containerId"]) if kernel.get("containerId") else 0
    files = {
        "admin_credentials": str(tmp_path / "state" / "admin-credentials.env"),
        "agent_toml": str(tmp_path / "agent.toml"),
        "manager_db": str(tmp_path / "manager.db"),
        "victim_secret": str(secret),
    }
    ports = {"victim_app": host_port, "manager": manager_port, "agent_rpc": agent_port}
    # Each target is there for the host: a refusal below is the sandbox's.
    assert all(Path(p).is_file() for p in files.values())
    assert all(_host_can_connect(p) for p in ports.values() if p)
    assert victim_pid > 0
    os.kill(victim_pid, 0)

    targets = json.dumps({"files": files, "ports": ports, "victim_pid": victim_pid})
    startup = f"python -c {shlex.quote(ATTACK)} {shlex.quote(targets)}"
    attacked = await attacker.post("/session", json=_body("a", startup))
    assert attacked.status_code == 201, attacked.text
    attacker_sid = attacked.json()["sessionId"]

    async def result() -> dict[str, Any] | None:
        logs = (await attacker.get(f"/session/{attacker_sid}/logs")).json()["result"]["logs"]
        line = next((x for x in logs.splitlines() if x.startswith("RESULT ")), None)
        return json.loads(line[len("RESULT ") :]) if line else None

    found = await until(result, "the attacker's report", timeout_s=30)
    assert found["uid"] != 0
    assert found["gid"] != 0
    assert {k: v for k, v in found.items() if isinstance(v, bool)} == dict.fromkeys(
        [*files, *ports, "signal_victim"], False
    ), found
    assert found["host_pids_seen"] < 10, found  # its own processes, not the host's
    # The victim's session went on untouched.
    assert (await victim.get(f"/session/{victim_sid}")).json()["status"] == "RUNNING"

    # The attacker's web terminal runs in a sandbox too, as the same unprivileged user.
    shell = await attacker.post(
        "/session",
        json={
            "image": "shell",
            "name": "t",
            "maxWaitSeconds": 30,
            "config": {"resources": {"cpu": 1, "mem": "256m"}},
        },
    )
    assert shell.json()["status"] == "RUNNING", shell.text
    path = f"/session/{shell.json()['sessionId']}/terminal"
    async with websockets.connect(
        ws_url(attacker, path), additional_headers=signed_headers(attacker, path)
    ) as ws:
        screen = TerminalScreen(ws)
        await ws.send(
            f"echo uid=$(id -u) creds=$(cat {files['admin_credentials']} >/dev/null 2>&1"
            " && echo read || echo refused)\r".encode()
        )
        await screen.until(f"uid={found['uid']} creds=refused", timeout_s=15)
    for client in (victim, attacker):
        await client.aclose()
