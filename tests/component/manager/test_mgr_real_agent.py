"""The seed scenarios with a real agent process (mock plugin, process runtime) and the
manager process (``accelshare server manager``), over real HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from accelshare.config import ConfigStore
from accelshare.config.embedded import EmbeddedBackend
from accelshare.manager.bootstrap import AdminCredentials

from .cluster import SECRET, ManagerProcess, Signer, free_port

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        importlib.util.find_spec("accelshare.agent.daemon") is None,
        reason="the agent daemon (accelshare.agent.daemon) is not in this tree",
    ),
]

REPO = Path(__file__).resolve().parents[3]
GPU1 = "c59395cd-ac91-4cd3-a1b0-3d2568aa2d01"
GPU2 = "c59395cd-ac91-4cd3-a1b0-3d2568aa2d02"
MOCK_PLUGINS = (
    'allowed-compute-plugins = ["mock"]\n'
    f'mock-accelerator-config = "{REPO / "configs/accelerator/two-fgpu.toml"}"\n'
)
QUERY = "query ($agent_id: String!) { agent(agent_id: $agent_id) { gpu_alloc_map } }"


@contextlib.asynccontextmanager
async def real_cluster(
    db_url: str,
    tmp_path: Path,
    *,
    keep_scratch: bool = False,
    extra_toml: str = "",
    agent_container_toml: str = "",
    agent_plugins_toml: str = MOCK_PLUGINS,
    manager_toml: str = "",
) -> AsyncIterator[httpx.AsyncClient]:
    """A manager process and one agent process; ``extra_toml`` is appended to both
    files (e.g. a ``[redis]`` table), ``agent_container_toml`` to the agent's
    ``[container]`` table, ``agent_plugins_toml`` (the mock GPUs of two-fgpu.toml by
    default) to its ``[agent]`` table, ``manager_toml`` to the manager's file only (an
    ``[api.connections]`` table...).  cuda's allocation_mode is fractional."""
    port, rpc_port = free_port(), free_port()
    store_path = tmp_path / "config-store.db"
    async with ConfigStore(EmbeddedBackend(store_path)) as store:
        await store.put("config/plugins/accelerator/cuda/allocation_mode", "fractional")
    (tmp_path / "manager.toml").write_text(
        f'[manager]\ndata-dir = "{tmp_path / "state"}"\nservice-addr = "127.0.0.1:{port}"\n'
        f'cluster-secret = "{SECRET}"\n[db]\nurl = "{db_url}"\n'
        f'[config-store]\npath = "{store_path}"\n' + extra_toml + manager_toml
    )
    (tmp_path / "agent.toml").write_text(
        f'[agent]\nid = "i-node01"\nrpc-listen-addr = "127.0.0.1:{rpc_port}"\n'
        f"{agent_plugins_toml}"
        f'[container]\nruntime = "process"\nscratch-root = "{tmp_path / "scratch"}"\n'
        f"keep-scratch = {str(keep_scratch).lower()}\n{agent_container_toml}\n"
        '[resource]\nreserved-cpu = 0\ncpu-count = 8\nmemory-size = "16g"\nreserved-mem = 0\n'
        f'[manager]\nendpoint = "http://127.0.0.1:{port}"\n'
        f'[config-store]\npath = "{store_path}"\n' + extra_toml
    )
    manager = ManagerProcess(tmp_path / "manager.toml", port, tmp_path / "manager.log")
    agent_log = tmp_path / "agent.log"
    agent: subprocess.Popen[bytes] | None = None
    try:
        await manager.start()
        agent = subprocess.Popen(
            [sys.executable, "-m", "accelshare.agent", "--config", str(tmp_path / "agent.toml")],
            stdout=agent_log.open("ab"),
            stderr=subprocess.STDOUT,
            cwd=tmp_path,
            env={**os.environ, "ACCELSHARE_CLUSTER_SECRET": SECRET},
        )
        creds = AdminCredentials.from_env_file(tmp_path / "state" / "admin-credentials.env")
        auth = Signer(creds.access_key, creds.secret_key)
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{port}", auth=auth, timeout=60
        ) as client:
            deadline = time.monotonic() + 60
            while not (await client.get("/agents", params={"status": "ALIVE"})).json()["items"]:
                if agent.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError("the agent did not register:\n" + agent_log.read_text())
                await asyncio.sleep(0.2)
            try:
                yield client
            finally:
                listing = (await client.get("/sessions")).json()["items"]
                for s in listing:
                    await client.delete(f"/session/{s['sessionId']}")
    finally:
        if agent is not None and agent.poll() is None:
            agent.send_signal(signal.SIGTERM)
            agent.wait(30)
        manager.stop()


async def wait_for(
    client: httpx.AsyncClient, names: list[str], want: Counter[str]
) -> dict[str, str]:
    deadline = time.monotonic() + 60
    while True:
        statuses = {n: (await client.get(f"/session/{n}")).json()["status"] for n in names}
        if Counter(statuses.values()) == want:
            return statuses
        assert time.monotonic() < deadline, statuses
        await asyncio.sleep(0.2)


async def test_seed_scenarios_with_a_real_agent(db_url: str, tmp_path: Path) -> None:
    async with real_cluster(db_url, tmp_path) as client:
        for name, shares in (("small", "0.2"), ("big", "1.2")):
            body = {
                "image": "python",
                "name": name,
                "maxWaitSeconds": 30,
                "config": {"resources": {"cpu": 1, "mem": "256m", "cuda.shares": shares}},
            }
            created = await client.post("/session", json=body)
            assert created.status_code == 201, created.text
            assert created.json()["status"] == "RUNNING", created.text
        answer = await client.post(
            "/admin/gql", json={"query": QUERY, "variables": {"agent_id": "i-node01"}}
        )
        assert answer.json() == {
            "data": {"agent": {"gpu_alloc_map": json.dumps({GPU2: "0.80", GPU1: "0.60"})}}
        }
        for name in ("small", "big"):
            assert (await client.delete(f"/session/{name}")).json()["status"] == "TERMINATED"

        names = ["a", "b", "c"]
        for name in names:
            body = {
                "image": "python",
                "name": name,
                "enqueueOnly": True,
                "config": {"resources": {"cpu": 1, "mem": "256m", "cuda.shares": "1"}},
            }
            assert (await client.post("/session", json=body)).status_code == 201
        statuses = await wait_for(client, names, Counter({"RUNNING": 2, "PENDING": 1}))
        waiting = next(n for n, s in statuses.items() if s == "PENDING")
        deadline = time.monotonic() + 30
        while not (why := (await client.get(f"/session/{waiting}/why")).json())["agents"]:
            assert time.monotonic() < deadline, why  # the first pass has not looked at it yet
            await asyncio.sleep(0.1)
        assert why["agents"][0].startswith("i-node01: cuda.shares needs 1, largest placement 0")
        running = next(n for n, s in statuses.items() if s == "RUNNING")
        assert (await client.delete(f"/session/{running}")).json()["status"] == "TERMINATED"
        await wait_for(client, names, Counter({"RUNNING": 2, "TERMINATED": 1}))


async def test_batch_sessions_run_their_command_through_the_shell(
    db_url: str, tmp_path: Path
) -> None:
    """A batch session's startupCommand runs as Backend.AI runs it: ``/bin/sh -c`` in the
    session's work dir, with the session's environ, whatever the environment; ``python``
    there is the environment's interpreter; the exit code decides SUCCESS / FAILURE.
    (The issue's case: ``--startup-command "echo hi; echo $FOO" -e FOO=bar python``.)
    Scratch dirs are kept so the logs outlive the heartbeat that cleans up ended kernels.
    """
    where = "import sys; print(sys.executable)"
    cases = [
        # name, image, startupCommand, exit code, result, output (None: checked below)
        ("env", "python", "echo hi; echo $FOO", 0, "SUCCESS", "hi\nbar\n"),
        ("three", "python", "exit 3", 3, "FAILURE", ""),
        ("py", "python", "python -c 'print(42)'", 0, "SUCCESS", "42\n"),
        ("which", "python", f"python -c '{where}'", 0, "SUCCESS", f"{sys.executable}\n"),
        ("sh", "shell", "echo hello; exit 3", 3, "FAILURE", "hello\n"),
        ("pwd", "python", "pwd", 0, "SUCCESS", None),
    ]
    async with real_cluster(db_url, tmp_path, keep_scratch=True) as client:
        for name, image, startup, _, _, _ in cases:
            body = {
                "image": image,
                "name": name,
                "type": "batch",
                "startupCommand": startup,
                "enqueueOnly": True,
                "config": {"resources": {"cpu": 1, "mem": "256m"}, "environ": {"FOO": "bar"}},
            }
            created = await client.post("/session", json=body)
            assert created.status_code == 201, created.text
        names = [case[0] for case in cases]
        await wait_for(client, names, Counter({"TERMINATED": len(cases)}))
        for name, _, _, exit_code, result, output in cases:
            session = (await client.get(f"/session/{name}")).json()
            assert (session["exitCode"], session["result"]) == (exit_code, result), session
            logs = (await client.get(f"/session/{name}/logs")).json()["result"]["logs"]
            if output is not None:
                assert logs == output, (name, logs)
        # pwd: the kernel's work dir, <scratch-root>/<kernel id>/work
        logs = (await client.get("/session/pwd/logs")).json()["result"]["logs"]
        work = Path(logs.strip())
        assert work.name == "work", logs
        assert work.parent.parent == (tmp_path / "scratch").resolve(), logs
        assert work.is_dir(), logs


async def test_execute_runs_code_in_a_running_session_and_names_what_it_refuses(
    db_url: str, tmp_path: Path
) -> None:
    """Backend.AI's REST execute (``POST /session/{ref}``) relayed to the real agent."""
    async with real_cluster(db_url, tmp_path) as client:
        body = {"image": "python", "name": "ex", "config": {"resources": {"cpu": 1, "mem": "256m"}}}
        created = await client.post("/session", json={**body, "maxWaitSeconds": 30})
        assert created.json()["status"] == "RUNNING", created.text
        ran = await client.post("/session/ex", json={"mode": "query", "code": "print(6 * 7)"})
        assert ran.status_code == 200, ran.text
        result = ran.json()["result"]
        assert (result["status"], result["exitCode"]) == ("finished", 0)
        assert result["console"] == [["stdout", "42\n"]]

        async def refused(payload: dict[str, object], ref: str = "ex") -> dict[str, object]:
            response = await client.post(f"/session/{ref}", json=payload)
            assert response.status_code >= 400, response.text
            return {"status": response.status_code, **response.json()}

        bad_mode = await refused({"mode": "shell", "code": "ls"})
        assert (bad_mode["status"], bad_mode["field"]) == (400, "mode")
        assert (await refused({"code": "x"}))["status"] == 501  # "complete": no mode
        unknown = await refused({"mode": "continue", "runId": "nosuch", "code": ""})
        assert (unknown["status"], unknown["field"]) == (404, "runId")
        no_exec = await refused({"mode": "batch", "options": {"build": "true"}})
        assert (no_exec["status"], no_exec["field"]) == (409, "options")
        assert (await refused({"mode": "query", "code": "1"}, ref="nosuch"))["status"] == 404

        # a session that is not RUNNING: 409 naming its status, nothing run
        waiting = {**body, "name": "waits", "enqueueOnly": True, "waitForAgents": True}
        waiting["config"] = {"resources": {"cpu": 1, "mem": "256m", "cuda.shares": "5"}}
        assert (await client.post("/session", json=waiting)).status_code == 201
        pending = await refused({"mode": "query", "code": "1"}, ref="waits")
        assert pending["status"] == 409
        assert "PENDING" in str(pending["detail"])
