"""Fractional sessions on a real NVIDIA GPU: a manager process and an agent process that
loads the real cuda plugin (NVML + libcuda, fractional mode), process runtime, SQLite.

Skips on machines without an NVIDIA GPU (CI has none); run by hand on a GPU machine
(docs/plugins.md, "Checked on a real GPU").  The sessions run PyTorch (the agent's own
interpreter is the ``python`` image), which must then be installed next to accelshare.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections import Counter
from decimal import Decimal
from pathlib import Path

import httpx
import pytest

from accelshare_testkit.gpu import (
    nvidia_gpu_unavailable,
    smi_gpus,
    torch_installed,
    torch_sm_counts,
)

from .test_mgr_real_agent import QUERY, real_cluster, wait_for

pytestmark = [
    pytest.mark.skipif(
        (why := nvidia_gpu_unavailable()) is not None, reason=f"needs an NVIDIA GPU: {why}"
    ),
    pytest.mark.skipif(not torch_installed(), reason="the sessions run PyTorch"),
]

PROBE = """
import os, subprocess, torch
print("visible", os.environ["CUDA_VISIBLE_DEVICES"])
print("count", torch.cuda.device_count())
print("name", torch.cuda.get_device_name(0))
a = torch.ones(1024, 1024, device="cuda")
print("sum", int((a @ a).sum().item()))
print("threads", os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "-"))
print("limit", os.environ.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "-"))
print("free-within-limit", torch.cuda.mem_get_info()[0] <= 2**30)
def smi(*args):
    return subprocess.run(["nvidia-smi", *args], capture_output=True, text=True).stdout
print("smi-total", smi("--query-gpu=memory.total", "--format=csv,noheader").strip())
whole = [l for l in smi("-q", "-d", "MEMORY").splitlines() if "Total" in l][:1]
print("smi-q-total", whole[0].split(":")[1].strip() if whole else "-")
"""


async def start(
    client: httpx.AsyncClient, name: str, shares: Decimal, mem: str = "512m", **body: object
) -> None:
    request = {
        "image": "python",
        "name": name,
        "enqueueOnly": True,
        "config": {"resources": {"cpu": 1, "mem": mem, "cuda.shares": str(shares)}},
        **body,
    }
    created = await client.post("/session", json=request)
    assert created.status_code == 201, created.text


async def allocation_map(client: httpx.AsyncClient) -> dict[str, str]:
    answer = await client.post(
        "/admin/gql", json={"query": QUERY, "variables": {"agent_id": "i-node01"}}
    )
    mapped: dict[str, str] = json.loads(answer.json()["data"]["agent"]["gpu_alloc_map"])
    return mapped


async def test_fractional_sessions_share_a_real_gpu(tmp_path: Path) -> None:
    gpus = {g.uuid: g for g in smi_gpus() if g.mig_mode != "Enabled"}
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    async with real_cluster(
        f"sqlite+aiosqlite:///{tmp_path / 'manager.db'}",
        tmp_path,
        keep_scratch=True,
        agent_plugins_toml='allowed-compute-plugins = ["cuda"]\n',
    ) as client:
        agent = (await client.get("/agents")).json()["items"][0]
        capacity = Decimal(agent["availableSlots"]["cuda.shares"])
        assert capacity > 1, agent  # a real GPU has more than one share at the default units

        # A batch session holding half a share runs CUDA on the GPU it was given.
        # (PyTorch with CUDA needs more than 512m of memory to start.)
        await start(
            client, "probe", Decimal("0.5"), "4g", type="batch", startupCommand=f"python {probe}"
        )
        await wait_for(client, ["probe"], Counter({"TERMINATED": 1}))
        session = (await client.get("/session/probe")).json()
        logs = (await client.get("/session/probe/logs")).json()["result"]["logs"]
        assert session["result"] == "SUCCESS", (session, logs)
        seen = dict(line.split(" ", 1) for line in logs.splitlines())
        given = gpus[seen["visible"]]  # one GPU, by uuid
        # Enforced through the agent's MPS daemon (default units: 0.5 share = 1 GiB and
        # 0.5 x 8 of the GPU's SMs); CUDA reports no more free memory than the limit.
        sms = (torch_sm_counts() or {})[given.uuid]
        assert seen == {
            "visible": given.uuid,
            "count": "1",
            "name": given.name,
            "sum": str(1024**3),
            "threads": str(math.ceil(Decimal(400) / sms)),
            "limit": f"{given.uuid}=1024M",
            "free-within-limit": "True",
            # nvidia-smi in the session: its share; what it does not render, the real one
            "smi-total": "1024 MiB",
            "smi-q-total": f"{given.memory_mib} MiB",
        }, logs
        status = agent["computePlugins"]["cuda"]["status"]
        assert status["enforcement"] == "mps", status
        assert status["mps"].startswith("running (pid "), status

        # Two sessions of 0.5 share one device; the map shows both.
        for name in ("a", "b"):
            await start(client, name, Decimal("0.5"))
        await wait_for(client, ["a", "b"], Counter({"RUNNING": 2}))
        held = await allocation_map(client)
        assert sum(Decimal(v) for v in held.values()) == 1, held

        # What is left cannot take capacity - 0.5: it waits, then starts when "a" ends.
        await start(client, "big", capacity - Decimal("0.5"))
        statuses = await wait_for(client, ["a", "b", "big"], Counter({"RUNNING": 2, "PENDING": 1}))
        assert statuses["big"] == "PENDING"
        deadline = time.monotonic() + 30
        while not (why := (await client.get("/session/big/why")).json())["agents"]:
            assert time.monotonic() < deadline, why
            await asyncio.sleep(0.1)
        assert why["agents"][0].startswith("i-node01: cuda.shares needs"), why
        assert (await client.delete("/session/a")).json()["status"] == "TERMINATED"
        await wait_for(client, ["b", "big"], Counter({"RUNNING": 2}))
        held = await allocation_map(client)
        assert sum(Decimal(v) for v in held.values()) == capacity, held
