"""Helpers for the tests that need a real NVIDIA GPU (they skip everywhere else, CI too).

The ground truth those tests compare the cuda plugin with comes from other tools than the
plugin's own code path: ``nvidia-smi`` (uuid, name, memory, bus id, driver, the compute
processes and their memory) and, in a child process, the CUDA runtime of PyTorch (the
streaming-multiprocessor count), so a test process of its own never creates a CUDA context.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from decimal import Decimal

__all__ = [
    "MIB",
    "SmiGpu",
    "expected_shares",
    "nvidia_gpu_unavailable",
    "smi_compute_apps",
    "smi_driver_version",
    "smi_gpus",
    "torch_installed",
    "torch_sm_counts",
]

MIB = 2**20


@dataclass(frozen=True, slots=True)
class SmiGpu:
    uuid: str  # "GPU-..."
    name: str
    memory_mib: int
    bus_id: str  # sysfs spelling, "0000:18:00.0"
    mig_mode: str  # "Enabled" / "Disabled" / "[N/A]"


def nvidia_gpu_unavailable() -> str | None:
    """Why the real-GPU tests skip here, or None when NVML and nvidia-smi see a GPU."""
    if shutil.which("nvidia-smi") is None:
        return "no nvidia-smi on PATH (no NVIDIA driver)"
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as e:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return f"NVML is not usable here: {e}"
    try:
        count = int(pynvml.nvmlDeviceGetCount())
    finally:
        pynvml.nvmlShutdown()
    return None if count else "NVML reports no GPU"


def _smi(*args: str) -> list[list[str]]:
    out = subprocess.run(
        ["nvidia-smi", *args, "--format=csv,noheader,nounits"],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    return [[cell.strip() for cell in row] for row in csv.reader(out.splitlines()) if row]


def _sysfs(bus_id: str) -> str:
    """nvidia-smi's ``00000000:18:00.0`` -> ``0000:18:00.0`` (spelt out here rather than
    taken from the plugin's ``nvml._sysfs_bus_id``: this is the ground truth it is checked
    against)."""
    domain, _, rest = bus_id.partition(":")
    return f"{int(domain, 16):04x}:{rest.lower()}"


def smi_gpus() -> list[SmiGpu]:
    rows = _smi("--query-gpu=uuid,name,memory.total,pci.bus_id,mig.mode.current")
    return [SmiGpu(u, n, int(m), _sysfs(b), mig) for u, n, m, b, mig in rows]


def smi_driver_version() -> str:
    return _smi("--query-gpu=driver_version")[0][0]


def smi_compute_apps() -> dict[int, int]:
    """pid -> MiB of device memory, summed over GPUs, as nvidia-smi lists them."""
    apps: dict[int, int] = {}
    for pid, used in _smi("--query-compute-apps=pid,used_memory"):
        apps[int(pid)] = apps.get(int(pid), 0) + int(used)
    return apps


def torch_sm_counts() -> dict[str, int] | None:
    """GPU uuid -> SM count from PyTorch's CUDA runtime in a child process (None: no torch)."""
    if not torch_installed():
        return None
    probe = (
        "import json, torch\n"
        "props = [torch.cuda.get_device_properties(i) for i in range(torch.cuda.device_count())]\n"
        "print(json.dumps({'GPU-' + str(p.uuid): p.multi_processor_count for p in props}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"the PyTorch probe failed: {done.stderr}")
    counts: dict[str, int] = json.loads(done.stdout)
    return counts


def torch_installed() -> bool:
    """Whether this interpreter has PyTorch (looked up, not imported: no CUDA context)."""
    return importlib.util.find_spec("torch") is not None


def expected_shares(memory_bytes: int, sms: int, unit_mem: int, unit_proc: int) -> Decimal:
    """``min(memory/unit_mem, SMs/unit_proc)`` truncated to 0.01 (docs/plugins.md), worked
    out here with plain integer division as an independent check of the plugin's rule."""
    hundredths = min(memory_bytes * 100 // unit_mem, sms * 100 // unit_proc)
    return Decimal(hundredths) / 100
