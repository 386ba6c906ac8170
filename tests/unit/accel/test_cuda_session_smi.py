"""``nvidia-smi`` in sessions holding shares of a real GPU (the cuda plugin over a fake
machine): the share as the memory total, and the real tool for what it does not render."""

from __future__ import annotations

import json
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

from accelshare.accel.cuda import CudaPlugin
from accelshare.accel.cuda.fake import FakeGpu, FakeNvml
from accelshare.accel.mock import smi

from .builders import DISCRETE, FRACTIONAL, cuda_plugin

H100 = "GPU-00000000-0000-0000-0000-000000000000"


def write_config(
    tmp_path: Path, plugin: CudaPlugin, allocation: dict[str, dict[str, Decimal]]
) -> Path:
    """The kernel's config dir as the agent writes it; its bin/nvidia-smi."""
    config = tmp_path / "config"
    for file in plugin.kernel_resources(allocation).config_files:
        target = config / file.path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(file.text)
        if file.executable:
            target.chmod(0o755)
    (config / "resource.txt").write_text("")
    return config / "bin" / "nvidia-smi"


def fractional_h100() -> CudaPlugin:
    plugin = cuda_plugin(FRACTIONAL, FakeNvml([FakeGpu.h100(0)]))
    plugin.python = sys.executable
    return plugin


def run(wrapper: Path, *args: str, path: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(wrapper), *args],
        env={"PATH": path},
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )


def test_a_share_of_a_real_gpu_shows_its_memory_in_nvidia_smi(tmp_path: Path) -> None:
    plugin = fractional_h100()  # 80 GiB, 132 SMs: 16.50 shares in default units
    wrapper = write_config(tmp_path, plugin, {"cuda.shares": {H100: Decimal("0.5")}})
    doc = json.loads((wrapper.parent.parent / smi.DEVICES_FILE).read_text())
    assert doc["fallback"] is True
    assert [d["device_id"] for d in doc["devices"]] == [H100]
    result = run(
        wrapper,
        "--query-gpu=index,uuid,name,memory.total,pci.bus_id",
        "--format=csv,noheader",
        path=f"{wrapper.parent}:/usr/bin:/bin",
    )
    assert result.returncode == 0, result.stderr
    # 0.5 x unit_mem (2 GiB) = 1024 MiB, not the GPU's 81920 MiB
    assert result.stdout == f"0, {H100}, NVIDIA H100 80GB HBM3, 1024 MiB, 00000000:17:00.0\n"


def test_what_the_tool_does_not_render_runs_the_real_nvidia_smi(tmp_path: Path) -> None:
    plugin = fractional_h100()
    wrapper = write_config(tmp_path, plugin, {"cuda.shares": {H100: Decimal("0.5")}})
    driver = tmp_path / "driver-bin"
    driver.mkdir()
    real = driver / "nvidia-smi"
    real.write_text('#!/bin/sh\necho "real nvidia-smi: $*"\n')
    real.chmod(0o755)
    path = f"{wrapper.parent}:{driver}:/usr/bin:/bin"  # the session's PATH: ours first
    result = run(wrapper, "-q", "-d", "MEMORY", path=path)
    assert (result.returncode, result.stdout) == (0, "real nvidia-smi: -q -d MEMORY\n")
    result = run(wrapper, "--query-gpu=clocks.sm", "--format=csv", path=path)
    assert result.stdout == "real nvidia-smi: --query-gpu=clocks.sm --format=csv\n"
    table = run(wrapper, path=path)
    assert "/ 1024MiB |" in table.stdout  # the default table is ours: the share
    # No real tool on PATH: the tool's own message and exit code.
    empty = tmp_path / "empty"
    empty.mkdir()
    alone = run(wrapper, "-q", path=f"{wrapper.parent}:{empty}")
    assert alone.returncode == 2
    assert "Invalid combination of input arguments" in alone.stderr


def test_whole_gpus_keep_the_real_nvidia_smi(tmp_path: Path) -> None:
    plugin = cuda_plugin(DISCRETE, FakeNvml([FakeGpu.h100(0)]))
    assert plugin.kernel_resources({"cuda.device": {H100: Decimal(1)}}).config_files == ()


def test_mock_devices_never_fall_back(tmp_path: Path) -> None:
    """The mock's devices file has no fallback: there is no real GPU to show."""
    config = tmp_path / "config"
    config.mkdir()
    (config / smi.DEVICES_FILE).write_text(
        smi.devices_json([], driver_version="x", cuda_version="y", stats_file=None)
    )
    driver = tmp_path / "driver-bin"
    driver.mkdir()
    (driver / "nvidia-smi").write_text("#!/bin/sh\n")
    (driver / "nvidia-smi").chmod(0o755)
    assert smi.real_tool(config, str(driver)) is None
    (config / smi.DEVICES_FILE).write_text(json.dumps({"fallback": True}))
    assert smi.real_tool(config, f"{config / 'bin'}:{driver}") == str(driver / "nvidia-smi")
    assert smi.real_tool(None, str(driver)) is None
