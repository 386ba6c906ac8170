"""``nvidia-smi`` inside real process-runtime kernels of an in-process agent (mock GPUs).

The kernel waits for a ``go`` file in its working dir, so the test can make the mock
plugin tick its statistics first, then runs ``nvidia-smi`` the way a user in the
session's terminal would (found on PATH) and writes what it printed into its work dir.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable, Callable
from decimal import ROUND_FLOOR, Decimal
from pathlib import Path
from typing import Any

from accelshare.accel.mock import smi
from accelshare.accel.types import SESSION_SHARED_DIR

Factory = Callable[..., Any]
Eventually = Callable[..., Awaitable[Any]]

SCRIPT = (
    "while [ ! -e go ]; do sleep 0.05; done; "
    "command -v nvidia-smi > which.txt; "
    "nvidia-smi > table.txt 2>&1; "
    "nvidia-smi -L > list.txt 2>&1; "
    "nvidia-smi --query-gpu=index,uuid,memory.total,memory.used,utilization.gpu "
    "--format=csv,noheader,nounits > query.csv 2>&1; "
    "nvidia-smi --query-gpu=bogus --format=csv > bogus.txt 2>&1; echo $? > bogus.rc; "
    "touch done; exec sleep 60"
)


async def run_smi_in_kernel(
    agent: Any, slots: dict[str, str], scratch_root: Path, eventually: Eventually
) -> tuple[str, Path, dict[str, Any]]:
    """Start a kernel holding ``slots``, tick the stats, let it run nvidia-smi."""
    kernel_id = f"smi-{uuid.uuid4().hex[:10]}"
    report = await agent.create(kernel_id, slots, command=[SCRIPT])
    assert report["status"] == "RUNNING", report
    response = await agent.client.get("/v1/stats/node")  # one tick: writes the stats file
    assert response.status_code == 200
    stats = json.loads((scratch_root / SESSION_SHARED_DIR / smi.STATS_FILE).read_text())
    work = scratch_root / kernel_id / "work"
    (work / "go").touch()
    await eventually((work / "done").exists, timeout_s=20, what="nvidia-smi runs")
    return kernel_id, work, stats


async def test_nvidia_smi_in_a_half_gpu_session_shows_its_memory_share(
    agent_toml: Factory,
    set_mode: Factory,
    start_agent: Factory,
    eventually: Eventually,
    scratch_root: Path,
) -> None:
    path = agent_toml()
    await set_mode(path, "fractional")
    agent = await start_agent(path)
    # No stats bus in these agents: only the RPC call above ticks the statistics, so
    # the readings the kernel sees are the ones the test read.
    assert agent.service.bus_link is None
    kernel_id, work, stats = await run_smi_in_kernel(
        agent, {"cpu": "1", "mem": "1g", "cuda.shares": "0.5"}, scratch_root, eventually
    )
    (gpu,) = agent.service.registry.get(kernel_id).allocations["cuda.shares"]
    assert (work / "which.txt").read_text().strip() == str(
        scratch_root / kernel_id / "config" / "bin" / "nvidia-smi"
    )
    # two-fgpu: 2 GiB GPUs, unit_mem 2 GiB (1.0 share each): 0.5 share -> 1024 MiB.
    # The agent told the plugin what the kernel holds: its GPU is half allocated, the
    # other one free, and the kernel, alone on its GPU, accounts for all of its load.
    reading = stats["devices"][gpu]
    (other,) = set(stats["devices"]) - {gpu}
    assert reading["allocated"] == "0.5"
    assert Decimal(reading["util"]) >= 35  # 0.5 × U(70, 100)
    assert stats["devices"][other]["allocated"] == "0"
    assert Decimal(stats["devices"][other]["util"]) == 0
    util = int(Decimal(reading["util"]).to_integral_value(ROUND_FLOOR))
    device_used = Decimal(2 << 30) * Decimal(reading["mem_fraction"])
    used = int(min(Decimal(1 << 30), device_used).to_integral_value(ROUND_FLOOR))
    assert (work / "query.csv").read_text() == f"0, GPU-{gpu}, 1024, {used >> 20}, {util}\n"
    assert (work / "list.txt").read_text() == f"GPU 0: CUDA GPU (UUID: GPU-{gpu})\n"
    table = (work / "table.txt").read_text()
    assert f"{used >> 20}MiB / 1024MiB |" in table
    assert "GPU 0: 0.50 of 1.00 shares = 1024MiB of 2048MiB" in table
    assert (work / "bogus.rc").read_text().strip() == "2"
    assert (
        (work / "bogus.txt").read_text().startswith('Field "bogus" is not a valid field to query.')
    )


async def test_nvidia_smi_with_a_whole_gpu_and_without_any(
    agent_toml: Factory,
    start_agent: Factory,
    eventually: Eventually,
    scratch_root: Path,
) -> None:
    agent = await start_agent(agent_toml())  # discrete mode: cuda.device
    _, work, _ = await run_smi_in_kernel(
        agent, {"cpu": "1", "mem": "1g", "cuda.device": "1"}, scratch_root, eventually
    )
    index, _, total, _, _ = (work / "query.csv").read_text().strip().split(", ")
    assert (index, total) == ("0", "2048")  # the whole 2 GiB device
    plain = f"p-{uuid.uuid4().hex[:10]}"
    report = await agent.create(plain, {"cpu": "1", "mem": "1g"}, command=["exec sleep 60"])
    assert report["status"] == "RUNNING"
    config = scratch_root / plain / "config"
    assert not (config / "bin").exists()  # no GPU, no mock tool
    assert not (config / smi.DEVICES_FILE).exists()
