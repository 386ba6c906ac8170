"""The ``mock`` accelerator plugin (spec 03-mock-accelerator.md).

Devices come from ``mock-accelerator.toml``; the allocation mode and units come from
the config store.  Slots, for key ``cuda``::

    discrete:    cuda.device (count) = number of full devices (1 each)
    fractional:  cuda.shares (count) = sum of per-device shares
    either:      cuda.device:<profile>-mig (unique) per MIG profile, 1 per slice
    exclusive:   {cuda.device, cuda.shares, cuda.device:*-mig}

``device_mask`` removes devices (by device id, or by mother uuid for all slices of a
MIG-split GPU) from slots, allocation and stats; a mask entry matching no device is a
configuration error, a mask hiding every device is a warning logged at start.  In fractional
mode a device below one quantum of shares (e.g. 0.00 with a ``unit_mem`` larger than
its memory) is a configuration error naming the limiting option.

Statistics follow the allocations: the agent tells the plugin what every kernel holds
(:meth:`MockPlugin.observe_allocations`, before each node-stats tick) and each device's
readings are drawn around its allocated fraction (:mod:`accelshare.accel.stats`): a
free device shows 0 % and idle power/temperature, a fully allocated one runs hot.
Allocation is the only signal, since mocked devices run nothing (no per-kernel activity).
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Iterable, Mapping, Sequence
from decimal import Decimal
from pathlib import Path

from accelshare import __version__
from accelshare.common import Allocation, AllocationMode, SlotTypes

from ..accelerator import (
    Held,
    attached_devices,
    cuda_resource_lines,
    held_devices,
    kernel_metrics,
    node_metrics,
)
from ..errors import PluginConfigError
from ..options import (
    MIN_PROCESSOR_LIMIT,
    AcceleratorOptions,
    RawOptions,
    allocatable_shares,
    parse_accelerator_options,
    read_accelerator_options,
)
from ..protocol import PluginContext
from ..session_smi import smi_files, write_stats
from ..stats import DeviceLoad, MockStatsGenerator
from ..types import (
    SESSION_SHARED_DIR,
    AttachedDevice,
    ConfigFile,
    Device,
    KernelMetric,
    KernelResources,
    KernelStatTarget,
    NodeMetric,
    PluginInventory,
    SlotMetadata,
)
from . import smi
from .config import MockConfig, MockDeviceSpec, load_mock_config, mig_profile

__all__ = [
    "MOCK_DEFAULT_QUANTUM",
    "MockPlugin",
    "create_plugin",
    "device_loads",
    "mig_slot_name",
]

MOCK_DEFAULT_QUANTUM = Decimal("0.1")
log = logging.getLogger(__name__)


def mig_slot_name(model_name: str) -> str:
    """``MIG-10g`` -> ``cuda.device:10g-mig``."""
    return f"cuda.device:{mig_profile(model_name)}-mig"


def device_loads(
    inventory: PluginInventory,
    options: AcceleratorOptions,
    allocations: Iterable[Allocation],
) -> dict[str, DeviceLoad]:
    """What the kernels hold on each device, for the stats: the allocated fraction
    (shares held / the device's shares, at most 1; 1 for a whole device or MIG slice) and
    the memory the holdings may use (``unit_mem × shares`` per kernel, or the whole
    device; at most its memory).  Free devices are left out; entries that are not this
    plugin's devices are skipped."""
    held: dict[str, tuple[Device, Decimal, int]] = {}
    for allocation in allocations:
        for h in held_devices(inventory, allocation, strict=False):
            memory = options.limits(h.amount)[0] if h.is_shares else h.device.memory_bytes
            _, amount, held_bytes = held.get(h.device.device_id, (h.device, Decimal(0), 0))
            held[h.device.device_id] = (h.device, amount + h.amount, held_bytes + memory)
    loads: dict[str, DeviceLoad] = {}
    for device_id, (device, amount, held_bytes) in held.items():
        fraction = Decimal(1)
        if device.capacity > 0:
            fraction = min(Decimal(1), amount / device.capacity)
        loads[device_id] = DeviceLoad(fraction, min(held_bytes, device.memory_bytes))
    return loads


def _apply_mask(config: MockConfig, options: AcceleratorOptions) -> list[MockDeviceSpec]:
    mask = set(options.device_mask)
    known = {d.device_id for d in config.devices} | {d.mother_uuid for d in config.devices}
    unknown = sorted(mask - known)
    if unknown:
        raise PluginConfigError(
            options.source("device_mask"),
            "device_mask",
            "comma-separated ids of devices in "
            f"{config.source} (one of: {', '.join(sorted(known))})",
            ",".join(unknown),
        )
    return [d for d in config.devices if d.device_id not in mask and d.mother_uuid not in mask]


class MockPlugin:
    """A mocked accelerator; see the module docstring.  Only stats change over time,
    following what :meth:`observe_allocations` last said the kernels hold.

    ``stats_file``: where each node-stats tick is also written for the sessions' mock
    ``nvidia-smi`` (cuda key only; None: not written, the tool then shows 0 % / 0 MiB).
    ``python``: the interpreter the tool's wrapper runs (the agent's own).
    """

    def __init__(
        self,
        config: MockConfig,
        options: AcceleratorOptions,
        *,
        stats_file: Path | None = None,
        python: str = sys.executable,
    ) -> None:
        self.config = config
        self.options = options
        self.stats_file = stats_file if config.is_cuda else None
        self.python = python
        if config.is_cuda:
            smi.script_source()  # read (and cached) now, not while a kernel is created
        key, mode = config.slot_name, options.allocation_mode
        main_slot = f"{key}.device" if mode is AllocationMode.DISCRETE else f"{key}.shares"
        slot_types: dict[str, SlotTypes] = {main_slot: SlotTypes.COUNT}
        reason = (
            "required because allocation_mode = 'fractional'"
            if mode is AllocationMode.FRACTIONAL
            else "required in the discrete allocation mode"
        )
        subtype = main_slot.split(".", 1)[1]
        metadata: dict[str, SlotMetadata] = {
            main_slot: config.require_format(subtype, main_slot, reason)
        }
        devices: list[Device] = []
        for spec in _apply_mask(config, options):
            if spec.is_mig:
                slot = mig_slot_name(spec.model_name)
                slot_types.setdefault(slot, SlotTypes.UNIQUE)
                if slot not in metadata:
                    metadata[slot] = config.require_format(
                        slot.split(":", 1)[1],
                        slot,
                        "required because the devices include MIG slices",
                    )
                capacity = Decimal(1)
            else:
                slot = main_slot
                capacity = (
                    allocatable_shares(
                        options, spec.device_id, spec.memory_bytes, spec.subproc_count
                    )
                    if mode is AllocationMode.FRACTIONAL
                    else Decimal(1)
                )
            devices.append(
                Device(
                    device_id=spec.device_id,
                    slot_name=slot,
                    capacity=capacity,
                    model_name=spec.model_name,
                    numa_node=spec.numa_node,
                    memory_bytes=spec.memory_bytes,
                    processors=spec.subproc_count,
                    hw_location=spec.hw_location,
                    is_mig=spec.is_mig,
                    mother_id=spec.mother_uuid if spec.is_mig else "",
                )
            )
        exclusive = (
            frozenset({"cuda.device", "cuda.shares", "cuda.device:*-mig"})
            if config.is_cuda
            else frozenset()
        )
        settings = {
            "config_file": config.source,
            "device_plugin_name": config.device_plugin_name,
            **options.describe(),
            "stats_smoothing": config.stats_smoothing,
            "stats_seed": "none" if config.stats_seed is None else str(config.stats_seed),
        }
        self._inventory = PluginInventory(
            key=key,
            version=__version__,
            slot_types=slot_types,
            devices=tuple(devices),
            allocation_mode=mode,
            strategy="EVENLY",
            quantum_size=options.quantum_size if mode is AllocationMode.FRACTIONAL else None,
            exclusive_slot_types=exclusive,
            metadata=metadata,
            extra_info={f"{key}_support": True, **config.attributes},
            settings=settings,
        )
        # Logged once by create_plugin.
        self.warnings: tuple[str, ...] = ()
        if not devices:
            self.warnings = (
                f"mock: device_mask ({options.source('device_mask')}) hides every device of "
                f"{config.source}; the {key!r} plugin has no capacity",
            )
        self._stats = MockStatsGenerator(
            [(d.device_id, d.memory_bytes) for d in devices],
            smoothing=config.stats_smoothing,
            factor=config.stats_smoothing_factor,
            seed=config.stats_seed,
        )
        self._loads: dict[str, DeviceLoad] = {}

    @property
    def inventory(self) -> PluginInventory:
        return self._inventory

    def kernel_resources(self, allocation: Allocation) -> KernelResources:
        held = held_devices(self._inventory, allocation)
        if not held:
            return KernelResources()
        env_key = self.config.slot_name.upper().replace("-", "_")
        env = {
            f"BACKENDAI_MOCK_{env_key}_DEVICES": ",".join(h.device.device_id for h in held),
            f"BACKENDAI_MOCK_{env_key}_DEVICE_COUNT": str(len(held)),
        }
        lines: dict[str, str] = {}
        files: tuple[ConfigFile, ...] = ()
        attached = attached_devices(held, options=self.options)
        if self.config.is_cuda:
            env["TF_MIN_GPU_MULTIPROCESSOR_COUNT"] = str(MIN_PROCESSOR_LIMIT)
            lines = cuda_resource_lines(held, options=self.options)
            files = self.smi_files(held, attached)
        return KernelResources(
            env=env,
            resource_lines=lines,
            attached_devices=attached,
            config_files=files,
        )

    def smi_files(
        self, held: Sequence[Held], attached: Sequence[AttachedDevice]
    ) -> tuple[ConfigFile, ...]:
        """``bin/nvidia-smi``, its stand-alone copy and the devices file
        (:func:`accelshare.accel.session_smi.smi_files`)."""
        attributes = self.config.attributes
        return smi_files(
            held,
            attached,
            self.options,
            driver_version=str(attributes.get("nvidia_driver", "N/A")),
            cuda_version=str(attributes.get("cuda_runtime", "N/A")),
            stats_file=self.stats_file,
            python=self.python,
        )

    def observe_allocations(self, allocations: Mapping[str, Allocation]) -> None:
        """What every kernel holds now (kernel id -> allocation): the next ticks' load.
        Until the first call every device is free."""
        self._loads = device_loads(self._inventory, self.options, allocations.values())

    async def node_stats(self) -> Sequence[NodeMetric]:
        samples = self._stats.tick(self._loads)
        if self.stats_file is not None:
            await asyncio.to_thread(write_stats, self.stats_file, samples, who="mock")
        return node_metrics(self._inventory.key, samples)

    async def kernel_stats(self, kernels: Mapping[str, KernelStatTarget]) -> Sequence[KernelMetric]:
        samples = self._stats.current(self._loads)
        return kernel_metrics(self._inventory, self.options, samples, kernels)

    async def close(self) -> None:
        return None


async def load_mock_options(ctx: PluginContext, key: str) -> AcceleratorOptions:
    """Options from ``config/plugins/accelerator/<key>/`` and ``.../mock/``, option by
    option: the most specific scope wins, the plugin's own key within one scope (see
    :mod:`accelshare.accel.options`)."""
    raw = RawOptions()
    if ctx.store is not None:
        raw = await read_accelerator_options(ctx.store, key, fallback_keys=("mock",))
    return parse_accelerator_options(raw, default_quantum=MOCK_DEFAULT_QUANTUM)


async def create_plugin(ctx: PluginContext) -> MockPlugin:
    """Entry point ``mock``: read mock-accelerator.toml and the store's options."""
    config = load_mock_config(ctx.agent_config.mock_accelerator_path())
    options = await load_mock_options(ctx, config.slot_name)
    stats_file = ctx.agent_config.scratch_root_path() / SESSION_SHARED_DIR / smi.STATS_FILE
    plugin = MockPlugin(config, options, stats_file=stats_file)
    for warning in plugin.warnings:
        log.warning("%s", warning)
    return plugin
