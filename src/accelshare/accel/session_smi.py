"""The ``nvidia-smi`` a session sees, for the plugins that give one (agent side).

A kernel holding mock CUDA devices, or fractional shares of a real GPU, gets three
config files (see :mod:`accelshare.accel.mock.smi`, the tool itself)::

    config/bin/nvidia-smi        a shell wrapper: the stand-alone tool under the agent's
                                 interpreter (or the container's python3)
    config/bin/mock_smi.py       the tool (standard library only)
    config/mock-cuda-smi.json    the devices as the session sees them

so that ``nvidia-smi`` in the session shows its share: ``unit_mem × shares`` as each
device's memory, utilisation (and, on mock devices, memory use) scaled by its part of
the device's load.  Readings come from the node
statistics file the plugin rewrites on every stats tick (:func:`write_stats`).

For a real GPU the devices file also says ``fallback``: options the tool does not
render (``-q``, ``dmon``, unknown query fields ...) run the real ``nvidia-smi``, which
shows the whole device.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import tempfile
import time
from collections.abc import Mapping, Sequence
from decimal import Decimal
from pathlib import Path

from accelshare.common import AllocationMode

from .accelerator import Held
from .mock import smi
from .options import AcceleratorOptions
from .stats import DeviceSample
from .types import AttachedDevice, ConfigFile

__all__ = ["smi_files", "smi_wrapper", "write_stats"]

log = logging.getLogger(__name__)


def smi_wrapper(python: str, *, what: str = "mock CUDA devices") -> str:
    """The ``nvidia-smi`` shell wrapper: the stand-alone copy next to it (standard library
    only), run by the agent's interpreter when it is there (process runtime), else by the
    container's ``python3`` (docker runtime).  ``-I``: the session's PYTHON* variables and
    cwd change nothing.  The copy, not ``-m accelshare...``: the agent's interpreter need
    not have accelshare installed (an agent started with PYTHONPATH, which ``-I`` ignores)."""
    quoted = shlex.quote(python)
    script = f'"${{0%/*}}/{smi.SCRIPT_FILE}"'
    return (
        "#!/bin/sh\n"
        f"# accelshare nvidia-smi (sessions holding {what})\n"
        f'if [ -x {quoted} ]; then exec {quoted} -I {script} "$@"; fi\n'
        f'exec python3 -I {script} "$@"\n'
    )


def smi_files(
    held: Sequence[Held],
    attached: Sequence[AttachedDevice],
    options: AcceleratorOptions,
    *,
    driver_version: str,
    cuda_version: str,
    stats_file: Path | None,
    python: str,
    fallback: bool = False,
    what: str = "mock CUDA devices",
) -> tuple[ConfigFile, ...]:
    """``bin/nvidia-smi``, its stand-alone copy and the devices file.

    Each device shows what :func:`~accelshare.accel.accelerator.attached_devices` says
    the kernel sees: for a fractional holding ``unit_mem × shares`` bytes (the same
    number as ``CUDA_MEMORY_LIMITS`` and the MPS memory limit), for a whole device or
    MIG slice its whole memory.
    """
    fractional = options.allocation_mode is AllocationMode.FRACTIONAL
    devices = [
        smi.SmiDevice(
            device_id=h.device.device_id,
            name=h.device.model_name,
            bus_id=_bus_id(h.device.hw_location),
            memory_bytes=seen.memory_bytes,
            device_memory_bytes=h.device.memory_bytes,
            processors=seen.processors,
            shares=h.amount if h.is_shares else None,
            device_shares=h.device.capacity if fractional and not h.device.is_mig else None,
            is_mig=h.device.is_mig,
        )
        for h, seen in zip(held, attached, strict=True)
    ]
    doc = smi.devices_json(
        devices,
        driver_version=driver_version,
        cuda_version=cuda_version,
        stats_file=None if stats_file is None else str(stats_file),
        fallback=fallback,
    )
    return (
        ConfigFile("bin/nvidia-smi", smi_wrapper(python, what=what), executable=True),
        ConfigFile(f"bin/{smi.SCRIPT_FILE}", smi.script_source()),
        ConfigFile(smi.DEVICES_FILE, doc),
    )


def _bus_id(hw_location: str) -> str:
    """nvidia-smi's spelling of a sysfs PCI address: ``0000:17:00.0`` -> ``00000000:17:00.0``."""
    if not hw_location:
        return "N/A"
    domain, _, rest = hw_location.partition(":")
    return f"{domain.upper().rjust(8, '0')}:{rest.upper()}" if rest else hw_location


def write_stats(path: Path, samples: Mapping[str, DeviceSample], *, who: str) -> None:
    """Replace ``path`` with this tick's readings (atomically; a failure is logged only:
    the sessions' nvidia-smi then shows older or no readings, the agent goes on).

    The temporary-file-and-rename is written out here rather than taken from
    ``accelshare.agent.scratch``: plugins must not depend on the agent package."""
    readings = {
        device_id: smi.SmiReading(
            util=s.util if s.util is not None else Decimal(0),
            mem_fraction=s.mem_fraction,
            power=s.power,
            power_max=s.power_max,
            temperature=s.temperature,
            allocated=s.allocated,
        )
        for device_id, s in samples.items()
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write(smi.stats_json(readings, at=time.time()))
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    except OSError as e:
        log.warning("%s: cannot write the stats file for nvidia-smi %s: %s", who, path, e)
