"""Enforced fractions on a real NVIDIA GPU: the cuda plugin starts the real MPS control
daemon (``nvidia-cuda-mps-control``) and kernels run CUDA (PyTorch, in child processes)
with the environment the plugin gives them.

Skips without an NVIDIA GPU, PyTorch or the MPS control program (CI has none); run by
hand on a GPU machine (docs/plugins.md, "Checked on a real GPU").  The options make one
GPU worth 1.00 share (unit_mem = its memory, unit_proc = its SMs), so that 0.25 share is
a quarter of the GPU, as in the user guide's examples.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from accelshare.accel import PluginContext
from accelshare.accel.cuda import CudaPlugin
from accelshare.accel.cuda import create_plugin as create_cuda_plugin
from accelshare.accel.cuda.interposer import find_compiler
from accelshare.accel.cuda.mps import CONTROL_PROGRAM, find_control_program
from accelshare.accel.types import KernelStatTarget
from accelshare.config import ConfigStore
from accelshare.config.agent_file import parse_agent_config
from accelshare.config.embedded import EmbeddedBackend
from accelshare_testkit.gpu import (
    nvidia_gpu_unavailable,
    smi_gpus,
    torch_installed,
    torch_sm_counts,
)

pytestmark = [
    pytest.mark.skipif(
        (why := nvidia_gpu_unavailable()) is not None, reason=f"needs an NVIDIA GPU: {why}"
    ),
    pytest.mark.skipif(not torch_installed(), reason="the kernels run PyTorch"),
    pytest.mark.skipif(
        find_control_program(CONTROL_PROGRAM) is None, reason=f"no {CONTROL_PROGRAM}"
    ),
]

GIB = 2**30
BLOCK = 256 * 2**20

# A kernel's process: "info" says what CUDA reports (free and total memory, SMs); "fill" allocates 256 MiB blocks until CUDA runs out of memory, says
# how far it got, then holds them until its stdin closes; "loop" multiplies matrices for
# a while and says whether every result was right; "rate" measures bf16 matmul TFLOP/s.
CHILD = r"""
import json, sys, time, torch
mode, seconds = sys.argv[1], float(sys.argv[2])
free, total = torch.cuda.mem_get_info()
out = {"free": free, "total": total,
       "sms": torch.cuda.get_device_properties(0).multi_processor_count}
if mode == "info":
    print(json.dumps(out), flush=True)
elif mode == "fill":
    blocks = []
    try:
        while len(blocks) < 4096:
            blocks.append(torch.empty(256 << 20, dtype=torch.uint8, device="cuda"))
        out["oom"] = False
    except torch.OutOfMemoryError:
        out["oom"] = True
    out["allocated"] = len(blocks) * (256 << 20)
    print(json.dumps(out), flush=True)
    sys.stdin.read()
elif mode == "loop":
    a = torch.full((2048, 2048), 1.0 / 2048, device="cuda")
    ok, n, start = True, 0, time.monotonic()
    while time.monotonic() - start < seconds:
        ok = ok and bool(torch.allclose(a @ a, a, rtol=1e-4))
        n += 1
    out.update(iterations=n, ok=ok)
    print(json.dumps(out), flush=True)
elif mode == "rate":
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    n, start = 0, time.monotonic()
    while time.monotonic() - start < seconds:
        for _ in range(10):
            a @ b
        torch.cuda.synchronize()
        n += 10
    out["tflops"] = n * 2 * 8192**3 / (time.monotonic() - start) / 1e12
    print(json.dumps(out), flush=True)
"""


@pytest.fixture
async def plugin(tmp_path: Path) -> AsyncIterator[CudaPlugin]:
    gpu = next(g for g in smi_gpus() if g.mig_mode != "Enabled")
    sms = (torch_sm_counts() or {}).get(gpu.uuid)
    assert sms, "PyTorch could not tell the GPU's SM count"
    async with ConfigStore(EmbeddedBackend(tmp_path / "store.db")) as store:
        await store.put("config/plugins/accelerator/cuda/allocation_mode", "fractional")
        await store.put("config/plugins/accelerator/cuda/unit_mem", str(gpu.memory_mib * 2**20))
        await store.put("config/plugins/accelerator/cuda/unit_proc", str(sms))
        config = parse_agent_config({"container": {"scratch-root": str(tmp_path / "scratch")}})
        shared = await create_cuda_plugin(PluginContext(config, store, manage_services=True))
    assert shared.enforcement == "mps", shared.enforcement
    yield shared
    await shared.close()


def allocation(plugin: CudaPlugin, shares: str) -> dict[str, dict[str, Decimal]]:
    device = next(d for d in plugin.inventory.devices if d.slot_name == "cuda.shares")
    return {"cuda.shares": {device.device_id: Decimal(shares)}}


def kernel_env(plugin: CudaPlugin, shares: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_MPS_")}
    return {**env, **plugin.kernel_resources(allocation(plugin, shares)).env}


async def spawn(env: dict[str, str], mode: str, seconds: float = 0) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        CHILD,
        mode,
        str(seconds),
        env=env,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def first_line(proc: asyncio.subprocess.Process) -> dict[str, Any]:
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), 120)
    if not line:
        _, err = await proc.communicate()
        raise AssertionError(f"the kernel process failed: {err.decode()[-2000:]}")
    result: dict[str, Any] = json.loads(line)
    return result


async def finish(proc: asyncio.subprocess.Process) -> None:
    _, err = await asyncio.wait_for(proc.communicate(b""), 120)
    assert proc.returncode == 0, err.decode()[-2000:]


def report(name: str, **figures: object) -> None:
    """Figures for docs/plugins.md, in the test log (pytest -s or -rA shows them)."""
    print(f"MPS-FIGURES {name} {json.dumps(figures, default=str)}")


async def test_a_quarter_share_gets_a_quarter_of_memory_and_sms(plugin: CudaPlugin) -> None:
    device = next(d for d in plugin.inventory.devices if d.slot_name == "cuda.shares")
    env = kernel_env(plugin, "0.25")
    limit_mib = int(env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"].split("=")[1].removesuffix("M"))
    limit = limit_mib * 2**20
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    proc = await spawn(env, "fill")
    seen = await first_line(proc)
    try:
        # What CUDA reports free is bounded by the share (total: see the interposer's test).
        assert seen["free"] <= limit, seen
        assert seen["oom"], f"no out-of-memory error below the whole GPU: {seen}"
        assert limit - 2 * GIB <= seen["allocated"] <= limit, (seen, limit)
        # MPS hands out SMs in pairs (TPCs): a quarter of 132 SMs is 32 or 34.
        quarter = device.processors / 4
        assert quarter - 2 <= seen["sms"] <= math.ceil(quarter) + 2, seen
        assert proc.pid is not None
        stats = await plugin.kernel_stats(
            {"k": KernelStatTarget(allocation(plugin, "0.25"), frozenset({proc.pid}))}
        )
        used = next(m for m in stats if m.key == "cuda_mem").per_kernel["k"].value
        assert used >= seen["allocated"], (used, seen)  # NVML's MPS client list has the pid
    finally:
        await finish(proc)
    report(
        "quarter",
        limit_mib=limit_mib,
        allocated_mib=seen["allocated"] // 2**20,
        free_mib=seen["free"] // 2**20,
        total_mib=seen["total"] // 2**20,
        sms=seen["sms"],
        gpu_sms=device.processors,
        nvml_used_mib=int(used) // 2**20,
    )


async def test_one_sessions_out_of_memory_leaves_the_other_running(plugin: CudaPlugin) -> None:
    env = kernel_env(plugin, "0.25")
    steady = await spawn(env, "loop", 10)
    greedy = await spawn(env, "fill")
    try:
        seen = await first_line(greedy)
        assert seen["oom"], seen
    finally:
        await finish(greedy)
    result = await first_line(steady)
    await finish(steady)
    assert result["ok"], result
    assert result["iterations"] > 0, result
    report("neighbours", greedy_allocated_mib=seen["allocated"] // 2**20, steady=result)


async def test_a_quarter_share_computes_at_about_a_third_of_the_whole_gpu(
    plugin: CudaPlugin,
) -> None:
    whole = await spawn(kernel_env(plugin, "1"), "rate", 3)
    full = await first_line(whole)
    await finish(whole)
    quarter = await spawn(kernel_env(plugin, "0.25"), "rate", 3)
    part = await first_line(quarter)
    await finish(quarter)
    ratio = part["tflops"] / full["tflops"]
    report("rate", whole_tflops=full["tflops"], quarter_tflops=part["tflops"], ratio=ratio)
    # 25 % of the SMs; a partly used GPU clocks higher, so the rate is above 25 %.
    assert ratio <= 0.40, (full, part)
    assert part["sms"] < full["sms"]


async def test_a_killed_daemon_is_restarted_and_serves_kernels_again(plugin: CudaPlugin) -> None:
    daemon = plugin.mps
    assert daemon is not None
    assert daemon.pid is not None
    old = daemon.pid
    os.kill(old, signal.SIGKILL)
    for _ in range(200):
        if daemon.restarts >= 1 and daemon.state == "running":
            break
        await asyncio.sleep(0.1)
    assert daemon.restarts == 1, daemon.status()
    assert daemon.pid not in (None, old), daemon.status()
    proc = await spawn(kernel_env(plugin, "0.25"), "loop", 1)
    result = await first_line(proc)
    await finish(proc)
    assert result["ok"], result
    assert subprocess.run(["nvidia-smi", "-L"], check=False, capture_output=True).returncode == 0


SHIM_TESTS = Path(__file__).parent / "cuda_shim"


@pytest.mark.skipif(find_compiler() is None, reason="no C compiler (cc / $CC)")
async def test_the_interposer_reports_the_limit_as_total_memory(
    plugin: CudaPlugin, tmp_path: Path
) -> None:
    """cudaMemGetInfo's total = the kernel's limit with the agent's interposer preloaded:
    through the real driver's cuGetProcAddress (a C program, no PyTorch) and through
    PyTorch's CUDA runtime; without it, the whole GPU."""
    assert plugin.shim is not None
    assert plugin.shim.path is not None, plugin.shim.reason
    env = kernel_env(plugin, "0.25")
    assert env["LD_PRELOAD"] == str(plugin.shim.path)
    limit = int(env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"].split("=")[1].removesuffix("M")) * 2**20
    compiler = find_compiler()
    assert compiler is not None
    program = tmp_path / "real_mem_info"
    subprocess.run(
        [*compiler, "-o", str(program), str(SHIM_TESTS / "real_mem_info.c"), "-ldl"], check=True
    )

    def driver(environ: dict[str, str]) -> dict[str, int]:
        done = subprocess.run(
            [str(program)], env=environ, capture_output=True, text=True, timeout=120, check=False
        )
        assert done.returncode == 0, (done.stdout, done.stderr)
        return {k: int(v) for k, v in (f.split("=") for f in done.stdout.split())}

    plain = driver({k: v for k, v in env.items() if k != "LD_PRELOAD"})
    shimmed = driver(env)
    assert plain["total"] > limit, plain  # the whole GPU, as before
    assert shimmed["total"] == limit, (shimmed, limit)
    assert shimmed["free"] <= limit, shimmed
    proc = await spawn(env, "info")
    seen = await first_line(proc)
    await finish(proc)
    assert seen["total"] == limit, (seen, limit)  # torch.cuda.mem_get_info
    assert seen["free"] <= limit, seen
    report(
        "shim",
        limit_mib=limit // 2**20,
        driver_plain=plain,
        driver_shim=shimmed,
        torch_total_mib=seen["total"] // 2**20,
        torch_free_mib=seen["free"] // 2**20,
    )
