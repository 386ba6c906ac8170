"""The GPU as a session and as the host see it, on the real local cluster (conftest.py:
manager + one agent with the two-fgpu mock, fractional, 2 GiB = 1.0 share per GPU)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

Cli = Callable[..., Any]
AGENT = "i-dev-01"


def _sid(stdout: str) -> str:
    return stdout.split("Session ID ", 1)[1].split(maxsplit=1)[0]


def test_agent_info_shows_who_holds_how_much_of_each_gpu(cli: Cli) -> None:
    for name, shares in (("gpu-half", "0.5"), ("gpu-quarter", "0.3")):
        created = cli(
            "session", "create", "-r", "cpu=1", "-r", "mem=256", "-r", f"cuda.shares={shares}",
            "--name", name, "python",
        )  # fmt: skip
        assert "is created and ready." in created.stdout, created
    doc = json.loads(cli("agent", "info", AGENT, "--json").stdout)
    names = doc["kernelSessions"]
    assert sorted(names.values()) == ["gpu-half", "gpu-quarter"]
    held = {
        names[kernel]: (device["device_id"], amount)
        for device in doc["allocMap"]["maps"]["cuda"]["devices"]
        for kernel, amount in device["kernels"].items()
    }
    assert {name: amount for name, (_, amount) in held.items()} == {
        "gpu-half": "0.5",
        "gpu-quarter": "0.3",
    }
    info = cli("agent", "info", AGENT, "--full-ids")
    assert info.code == 0, info
    rows = {
        line.split()[2]: line.split()
        for line in info.stdout.split("who holds the devices", 1)[1].splitlines()
        if line.strip().startswith("c59395cd")
    }
    assert set(rows) == {"gpu-half", "gpu-quarter"}
    for name, amount, percent in (("gpu-half", "0.50", "50"), ("gpu-quarter", "0.30", "30")):
        row = rows[name]
        assert row[:2] == [held[name][0], "cuda.shares"]
        assert row[-5:] == [amount, "/", "1.00", percent, "%"]


def test_nvidia_smi_in_a_half_gpu_session_prints_its_memory_share(cli: Cli) -> None:
    script = (
        "nvidia-smi --query-gpu=index,memory.total --format=csv,noheader && nvidia-smi | grep MiB"
    )
    created = cli(
        "session", "create", "-r", "cpu=1", "-r", "mem=256", "-r", "cuda.shares=0.5",
        "--name", "smi-batch", "shell", "--", script,
    )  # fmt: skip
    assert created.code == 0, created
    sid = _sid(created.stdout)
    waited = cli("session", "wait", sid, "--status", "TERMINATED", "--timeout", "60")
    assert waited.code == 0, waited
    doc = json.loads(cli("session", "info", sid, "--json").stdout)
    logs = cli("session", "logs", sid).stdout
    assert doc["exitCode"] == 0, logs
    # 0.5 share x unit_mem 2 GiB = 1 GiB: the session's share, not the 2 GiB card.
    assert "0, 1024 MiB" in logs
    assert "GPU 0: 0.50 of 1.00 shares = 1024MiB of 2048MiB" in logs
