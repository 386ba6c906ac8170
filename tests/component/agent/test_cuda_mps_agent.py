"""A whole agent with the cuda plugin (a fake machine: FakeNvml, fake libcuda) and a fake
``nvidia-cuda-mps-control``: the agent starts the MPS daemon, a process-runtime kernel
holding shares runs with its MPS limits and an ``nvidia-smi`` that shows its share, the
heartbeat says how fractions are enforced, and the agent's stop quits the idle daemon."""

from __future__ import annotations

import os
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from accelshare.accel import PluginContext, PluginEntry
from accelshare.accel.cuda import LibcudaDriver, PynvmlLayer
from accelshare.accel.cuda import create_plugin as create_cuda_plugin
from accelshare.accel.cuda.fake import FakeGpu, FakeNvml
from accelshare.accel.cuda.interposer import find_compiler
from accelshare.agent.runtime.sandbox import SandboxConfig
from accelshare.agent.service import AgentService
from accelshare.config import open_config_store
from accelshare.config.agent_file import load_agent_config
from accelshare.config.settings import load_config_store_settings
from accelshare.protocol import CreateKernelRequest
from accelshare_testkit.fake_mps import install_fake_mps_control, read_calls

Eventually = Callable[..., Awaitable[Any]]
GIB = 2**30


def cuda_entry() -> PluginEntry:
    nvml = FakeNvml([FakeGpu.h100(0)])

    async def factory(ctx: PluginContext) -> Any:
        driver = LibcudaDriver(loader=nvml.libcuda().load)
        return await create_cuda_plugin(ctx, nvml=PynvmlLayer(nvml), driver=driver)

    return PluginEntry("cuda", "tests.fake_cuda:create_plugin", lambda: factory)


@pytest.mark.parametrize("sandboxed", [False, True], ids=["plain", "sandboxed"])
async def test_a_kernel_holding_shares_runs_with_its_mps_limits(
    agent_toml: Callable[..., Path],
    make_runtime: Callable[..., Any],
    scratch_root: Path,
    tmp_path: Path,
    eventually: Eventually,
    sandboxed: bool,
    sandbox_support: str | None,
) -> None:
    """... in a bubblewrap sandbox too, which binds the MPS pipe folder and the memory
    interposer's folder (read-only)."""
    if sandboxed and sandbox_support is not None:
        pytest.skip(sandbox_support)
    program = install_fake_mps_control(tmp_path / "bin")
    path = agent_toml(
        agent={"allowed-compute-plugins": ["cuda"]},
        cuda={"mps-control": str(program), "mps-check-interval-s": 0.05},
    )
    config = load_agent_config(path)
    store = await open_config_store(load_config_store_settings(path))
    await store.put("config/plugins/accelerator/cuda/allocation_mode", "fractional")
    await store.put("config/plugins/accelerator/cuda/unit_mem", str(80 * GIB))
    await store.put("config/plugins/accelerator/cuda/unit_proc", "132")
    entries = [
        PluginEntry.from_value("cpu", "accelshare.accel.cpu:create_plugin"),
        PluginEntry.from_value("mem", "accelshare.accel.mem:create_plugin"),
        cuda_entry(),
    ]
    service = AgentService(
        config,
        store=store,
        secret=None,
        runtime=make_runtime(sandbox=SandboxConfig()) if sandboxed else make_runtime(),
        plugin_entries=entries,
        report_to_manager=False,
    )
    await service.start()
    log_dir = scratch_root / ".mps" / "log"
    try:
        status = service.heartbeat().plugin_status["cuda"]
        assert status["enforcement"] == "mps"
        pid = int(status["mps_pid"])
        assert status["mps"] == f"running (pid {pid}, 0 restarts)"

        report = await service.create_kernel(
            CreateKernelRequest(
                kernel_id="k-mps",
                session_id="s",
                image="shell",
                requested_slots={"cpu": "1", "mem": "1g", "cuda.shares": "0.25"},
                startup_command=(
                    "nvidia-smi --query-gpu=uuid,memory.total --format=csv,noheader > smi.txt; "
                    "env | grep '^CUDA_' | sort > env.txt; "
                    # the memory interposer: preloaded, and readable where the kernel runs
                    'if test -r "$LD_PRELOAD"; then echo "$LD_PRELOAD"; fi > preload.tmp; '
                    "mv preload.tmp preload.txt"
                ),
            )
        )
        assert report.status == "RUNNING", report
        env_file = scratch_root / "k-mps" / "work" / "env.txt"
        preload_file = scratch_root / "k-mps" / "work" / "preload.txt"
        await eventually(preload_file.exists, what="the kernel wrote its environment")
        seen = dict(line.split("=", 1) for line in env_file.read_text().splitlines())
        gpu = "GPU-00000000-0000-0000-0000-000000000000"
        assert seen["CUDA_VISIBLE_DEVICES"] == gpu
        assert seen["CUDA_MPS_PIPE_DIRECTORY"] == str(scratch_root / ".mps" / "pipe")
        assert seen["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"{gpu}=20480M"
        assert seen["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
        # nvidia-smi in the session shows its share: 0.25 x 80 GiB
        smi_out = (scratch_root / "k-mps" / "work" / "smi.txt").read_text()
        assert smi_out == f"{gpu}, 20480 MiB\n"
        preload = preload_file.read_text().strip()
        if find_compiler() is not None:
            assert status["shim"].startswith("ready")
            assert preload == status["shim_path"]
            assert Path(preload).parent == scratch_root / ".mps" / "shim"
            kernel_log = scratch_root / "k-mps" / "logs" / "kernel.log"
            assert "preloaded" not in kernel_log.read_text()  # no ld.so complaint
        else:
            assert status["shim"].startswith("none (no C compiler")
            assert preload == ""

        os.kill(pid, signal.SIGKILL)  # the daemon dies: the agent starts it again
        await eventually(
            lambda: service.heartbeat().plugin_status["cuda"]["mps_restarts"] == "1",
            what="the daemon restarted",
        )
        assert service.heartbeat().plugin_status["cuda"]["mps"].startswith("running (pid ")
    finally:
        await service.stop(end_kernels=True)
        await store.close()
    commands = [c["commands"] for c in read_calls(log_dir) if c["commands"]]
    assert commands[-1] == ["quit"]  # no client left: the agent's stop quits it
    assert [c["argv"] for c in read_calls(log_dir) if c["argv"]] == [["-d"], ["-d"]]
