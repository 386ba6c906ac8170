"""Restart recovery, discovery side: which kernels are still here, and what do they hold?

On start the agent asks its runtime for every kernel it can find (scratch dirs + live
processes/containers carrying accelshare labels) and sorts them::

    report = await discover_kernels(runtime, slot_types)
    report.live            # running, resource.txt parsed: re-apply .allocations to the maps
    report.exited          # ended while the agent was away (exit code when recorded):
                           # report them exited, do not restore their allocations
    report.unrecoverable   # running, but the allocation cannot be read (orphan without a
                           # scratch dir, missing or corrupt resource.txt): keep tracking,
                           # log, let the operator decide

Every kernel the runtime reports lands in exactly one of the three lists, once (a
kernel id seen twice is a runtime bug and raises), so nothing is lost or
double-counted.  The allocation maps themselves are rebuilt by the agent core (it
clears them and applies :attr:`LiveKernel.allocations` in order).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

from accelshare.common import Allocation, SlotTypes

from .resource_txt import ResourceTxt, ResourceTxtError, parse_resource_txt
from .runtime.base import KernelInfo, KernelRuntime

__all__ = [
    "DiscoveryReport",
    "LiveKernel",
    "UnrecoverableKernel",
    "discover_kernels",
    "sort_kernels",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LiveKernel:
    info: KernelInfo
    resources: ResourceTxt

    @property
    def kernel_id(self) -> str:
        return self.info.kernel_id

    @property
    def allocations(self) -> Allocation:
        """``{slot: {device_id: amount}}`` as recorded in ``resource.txt``."""
        return self.resources.allocations


@dataclass(frozen=True, slots=True)
class UnrecoverableKernel:
    info: KernelInfo
    reason: str


@dataclass(frozen=True, slots=True)
class DiscoveryReport:
    live: tuple[LiveKernel, ...]
    exited: tuple[KernelInfo, ...]
    unrecoverable: tuple[UnrecoverableKernel, ...]

    def total_allocations(self) -> Allocation:
        """What the live kernels hold together: ``{slot: {device: sum}}`` (for checks)."""
        total: Allocation = {}
        for kernel in self.live:
            for slot, per_device in kernel.allocations.items():
                slot_total = total.setdefault(slot, {})
                for device, amount in per_device.items():
                    slot_total[device] = slot_total.get(device, Decimal(0)) + amount
        return total


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def sort_kernels(
    infos: list[KernelInfo],
    texts: Mapping[str, str | OSError],
    slot_types: Mapping[str, SlotTypes | str],
) -> DiscoveryReport:
    """Sort scanned kernels given the ``resource.txt`` text (or read error) of the live ones.

    Pure; :func:`discover_kernels` does the reading.  Raises ``ValueError`` when a kernel id
    appears twice.
    """
    seen: set[str] = set()
    live: list[LiveKernel] = []
    exited: list[KernelInfo] = []
    unrecoverable: list[UnrecoverableKernel] = []
    for info in sorted(infos, key=lambda i: i.kernel_id):
        if info.kernel_id in seen:
            raise ValueError(f"kernel {info.kernel_id} was reported twice by the runtime")
        seen.add(info.kernel_id)
        if not info.is_running:
            exited.append(info)
            continue
        if info.scratch_dir is None:
            unrecoverable.append(UnrecoverableKernel(info, "no scratch dir (orphan)"))
            continue
        source = str(info.scratch_dir / "config" / "resource.txt")
        text = texts.get(info.kernel_id)
        if text is None or isinstance(text, OSError):
            unrecoverable.append(UnrecoverableKernel(info, f"cannot read {source}: {text}"))
            continue
        try:
            resources = parse_resource_txt(text, slot_types, source=source)
        except ResourceTxtError as e:
            unrecoverable.append(UnrecoverableKernel(info, str(e)))
            continue
        live.append(LiveKernel(info, resources))
    return DiscoveryReport(tuple(live), tuple(exited), tuple(unrecoverable))


async def discover_kernels(
    runtime: KernelRuntime, slot_types: Mapping[str, SlotTypes | str]
) -> DiscoveryReport:
    """Scan ``runtime`` and read back every live kernel's allocation (see the module docstring).

    ``slot_types`` are the agent's known slot types; slots a changed plugin set no longer
    knows are still read (see :func:`parse_resource_txt`), so their kernels keep them.
    """
    infos = await runtime.scan_kernels()

    def read_all() -> dict[str, str | OSError]:
        texts: dict[str, str | OSError] = {}
        for info in infos:
            if info.is_running and info.scratch_dir is not None:
                try:
                    texts[info.kernel_id] = _read(info.scratch_dir / "config" / "resource.txt")
                except OSError as e:
                    texts[info.kernel_id] = e
                except UnicodeDecodeError as e:  # garbage bytes: unrecoverable, not a crash
                    texts[info.kernel_id] = OSError(
                        f"not UTF-8 text ({e.reason} at byte {e.start})"
                    )
        return texts

    texts = await asyncio.to_thread(read_all)
    report = sort_kernels(infos, texts, slot_types)
    for kernel in report.live:
        log.info(
            "kernel %s: re-adopted (%s %s), holds %s",
            kernel.kernel_id,
            kernel.info.runtime,
            kernel.info.cid,
            {slot: {d: str(a) for d, a in per.items()} for slot, per in kernel.allocations.items()},
        )
    for info in report.exited:
        exit_ = info.exit
        log.info(
            "kernel %s: exited while the agent was away (%s, exit code %s)",
            info.kernel_id,
            exit_.reason.value if exit_ else "unknown",
            exit_.exit_code if exit_ else None,
        )
    for bad in report.unrecoverable:
        log.error(
            "kernel %s: running but its allocation is unknown: %s", bad.info.kernel_id, bad.reason
        )
    return report
