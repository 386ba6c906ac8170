"""The ``cuda`` plugin: real NVIDIA GPUs through NVML.

Devices: every GPU not in MIG mode (device id = its NVML uuid ``GPU-...``) and every
MIG instance of a GPU in MIG mode (``MIG-...``; the parent is then not a device).
Slots and exclusivity are those of the mock with key ``cuda``: ``cuda.device`` or
``cuda.shares`` by allocation mode, ``cuda.device:<profile>-mig`` (unique) per MIG
profile.  Options come from ``config/plugins/accelerator/cuda/`` (default quantum
0.01); shares follow the same unit_mem / unit_proc rule as the mock.

Streaming multiprocessors (SMs): NVML tells them for MIG instances only; a full GPU's
count comes from the CUDA driver API (:mod:`.driver`), matched by PCI bus id.  When
neither can tell (no ``libcuda.so.1``, the GPU hidden by ``CUDA_VISIBLE_DEVICES``):

    discrete    the device reports 0 processors; a warning is logged once at start
    fractional  PluginConfigError on allocation_mode: shares are min(memory/unit_mem,
                SMs/unit_proc) and a memory-only guess would overstate them (an 80 GB
                H100 would get 40.00 shares instead of min(40, 132/8) = 16.50)

A kernel gets ``CUDA_VISIBLE_DEVICES`` and ``NVIDIA_VISIBLE_DEVICES`` (uuids, which
CUDA accepts and which stay valid inside a container), a docker device request for the
nvidia driver with the same uuids, and the ``CUDA_*`` resource.txt lines, including
per-device memory/processor limits in fractional mode.

Fractional shares are enforced through NVIDIA MPS (:mod:`.mps`) when the agent's
``[cuda] enforce = "mps"`` (the default) and the agent could start its MPS control
daemon: such a kernel also gets the ``CUDA_MPS_*`` variables with its limits, the
daemon's pipe directory mounted and the host's IPC namespace (docker), and the memory
interposer (:mod:`.interposer`) as ``LD_PRELOAD`` when the agent could build it, so that
``cudaMemGetInfo`` reports its limit as the total memory.  Without MPS
(``enforce = "none"``, or the daemon missing with ``mps-missing = "warn"``) the limits
are advisory, and the agent says so at start and in ``agent info``.  A kernel holding
shares also gets the session ``nvidia-smi`` (:mod:`accelshare.accel.session_smi`) that
shows its share; what that tool does not render runs the real one.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
import sys
from collections.abc import Mapping, Sequence
from decimal import Decimal
from pathlib import Path

from accelshare import __version__
from accelshare.common import Allocation, AllocationMode, SlotTypes

from ..accelerator import (
    attached_devices,
    cuda_resource_lines,
    held_devices,
    kernel_metrics,
    node_metrics,
)
from ..errors import PluginConfigError, PluginUnavailable
from ..mock import smi
from ..options import (
    AcceleratorOptions,
    RawOptions,
    allocatable_shares,
    parse_accelerator_options,
    read_accelerator_options,
)
from ..protocol import PluginContext
from ..session_smi import smi_files, write_stats
from ..stats import TEMPERATURE_MAX_C, DeviceSample
from ..types import (
    SESSION_SHARED_DIR,
    ConfigFile,
    Device,
    KernelMetric,
    KernelResources,
    KernelStatTarget,
    Measurement,
    Mount,
    NodeMetric,
    NumberFormat,
    PluginInventory,
    SlotMetadata,
)
from .driver import CudaDriver, CudaDriverError, LibcudaDriver
from .interposer import PRELOAD_ENV, ShimState, prepare_shim
from .mps import (
    MpsDaemon,
    MpsUnavailable,
    describe_status,
    find_control_program,
    mps_client_env,
    mps_directories,
    mps_shares,
)
from .nvml import NvmlGpu, NvmlLayer, PynvmlLayer

__all__ = [
    "CUDA_DEFAULT_QUANTUM",
    "CudaPlugin",
    "create_plugin",
    "cuda_devices",
    "cuda_warnings",
    "mig_slot_name",
    "query_sm_counts",
    "with_sm_counts",
]

log = logging.getLogger(__name__)

CUDA_DEFAULT_QUANTUM = Decimal("0.01")
_SLOT_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
_FORMATS = {
    "device": ("GPU", "CUDA-capable GPU", "GPU", NumberFormat(binary=False, round_length=0)),
    "shares": ("GPU", "CUDA-capable GPU (fractional)", "fGPU", NumberFormat(False, 2)),
    "mig": ("MIG GPU", "CUDA-capable GPU (MIG slice)", "GPU", NumberFormat(False, 0)),
}


def mig_slot_name(profile: str) -> str:
    """``1g.5gb`` -> ``cuda.device:1g.5gb-mig``; characters a slot name cannot hold become
    ``-`` (H100's ``1g.10gb+me`` -> ``cuda.device:1g.10gb-me-mig``)."""
    return f"cuda.device:{_SLOT_UNSAFE.sub('-', profile)}-mig"


def _metadata(slot: str, kind: str) -> SlotMetadata:
    name, description, unit, number_format = _FORMATS[kind]
    if kind == "mig":
        description = f"{description} {slot.split(':', 1)[1].removesuffix('-mig')}"
    return SlotMetadata(slot, name, description, unit, "gpu1", number_format)


_NVML_SILENT = "NVML did not report it"


def with_sm_counts(
    gpus: Sequence[NvmlGpu], counts: Mapping[str, int | str]
) -> tuple[list[NvmlGpu], dict[str, str]]:
    """Fill in full GPUs' SM counts (pure): ``counts`` maps a GPU uuid to its SM count
    from the CUDA driver or to why the driver could not tell.

    Returns the GPUs and, for every GPU or MIG instance whose count is still unknown,
    the reason.  A count NVML already gave is kept.
    """
    filled: list[NvmlGpu] = []
    unknown: dict[str, str] = {}
    for gpu in gpus:
        current = gpu
        if not gpu.mig_enabled and gpu.multiprocessors is None:
            found = counts.get(gpu.uuid, "the CUDA driver was not asked")
            if isinstance(found, int):
                current = dataclasses.replace(gpu, multiprocessors=found)
            else:
                unknown[gpu.uuid] = f"{_NVML_SILENT} for a full GPU, and {found}"
        for mig in gpu.mig_instances if gpu.mig_enabled else ():
            if mig.multiprocessors is None:
                unknown[mig.uuid] = f"{_NVML_SILENT} (nvmlDeviceGetAttributes)"
        filled.append(current)
    return filled, unknown


def _unknown_sm_error(
    options: AcceleratorOptions, gpu: NvmlGpu, unknown: Mapping[str, str]
) -> PluginConfigError:
    why = unknown.get(gpu.uuid, _NVML_SILENT)
    return PluginConfigError(
        options.source("allocation_mode"),
        "allocation_mode",
        "'discrete' on this machine: fractional shares are min(memory/unit_mem, "
        f"SMs/unit_proc) and the SM count of {gpu.uuid} ({gpu.pci_bus_id}) is unknown "
        f"({why}); make libcuda.so.1 usable by the agent, or exclude the GPU with "
        "device_mask",
        options.allocation_mode.value,
    )


def cuda_devices(
    gpus: Sequence[NvmlGpu],
    options: AcceleratorOptions,
    *,
    unknown_sm: Mapping[str, str] | None = None,
) -> list[Device]:
    """Devices (pure): full GPUs and MIG instances, minus the masked ones.

    A mask entry may be a GPU uuid (with or without ``GPU-``; masks the GPU and its MIG
    instances) or a MIG uuid.  An entry matching nothing is a configuration error.  In
    fractional mode an unmasked full GPU with an unknown SM count is refused
    (``unknown_sm``: uuid -> why, for the message), and so is one below one quantum of
    shares.
    """
    unknown_sm = unknown_sm or {}
    mode = options.allocation_mode
    main_slot = "cuda.device" if mode is AllocationMode.DISCRETE else "cuda.shares"
    mask = set(options.device_mask)
    known: set[str] = set()
    devices: list[Device] = []
    for gpu in gpus:
        gpu_ids = {gpu.uuid, gpu.uuid.removeprefix("GPU-")}
        known |= gpu_ids
        gpu_masked = bool(gpu_ids & mask)
        if not gpu.mig_enabled:
            if gpu_masked:
                continue
            capacity = Decimal(1)
            if mode is AllocationMode.FRACTIONAL:
                if gpu.multiprocessors is None:
                    raise _unknown_sm_error(options, gpu, unknown_sm)
                capacity = allocatable_shares(
                    options, gpu.uuid, gpu.memory_bytes, gpu.multiprocessors
                )
            devices.append(
                Device(
                    device_id=gpu.uuid,
                    slot_name=main_slot,
                    capacity=capacity,
                    model_name=gpu.name,
                    numa_node=gpu.numa_node,
                    memory_bytes=gpu.memory_bytes,
                    processors=gpu.multiprocessors or 0,
                    hw_location=gpu.pci_bus_id,
                )
            )
            continue
        for mig in gpu.mig_instances:
            known.add(mig.uuid)
            if gpu_masked or mig.uuid in mask:
                continue
            devices.append(
                Device(
                    device_id=mig.uuid,
                    slot_name=mig_slot_name(mig.profile),
                    capacity=Decimal(1),
                    model_name=mig.name,
                    numa_node=gpu.numa_node,
                    memory_bytes=mig.memory_bytes,
                    processors=mig.multiprocessors or 0,
                    hw_location=gpu.pci_bus_id,
                    is_mig=True,
                    mother_id=gpu.uuid,
                )
            )
    unknown = sorted(mask - known)
    if unknown:
        raise PluginConfigError(
            options.source("device_mask"),
            "device_mask",
            f"comma-separated uuids of GPUs or MIG instances NVML reports "
            f"(one of: {', '.join(sorted(k for k in known if '-' in k))})",
            ",".join(unknown),
        )
    return devices


def cuda_warnings(
    devices: Sequence[Device], unknown_sm: Mapping[str, str], options: AcceleratorOptions
) -> list[str]:
    """What the factory logs once at start (pure): every device whose SM count is
    unknown, and a device_mask that hides every GPU."""
    warnings = [
        f"cuda: the SM count of {d.device_id} ({d.hw_location}) is unknown "
        f"({unknown_sm.get(d.device_id, _NVML_SILENT)}); it is reported as 0 processors, "
        "and allocation_mode=fractional would refuse to start"
        for d in devices
        if d.processors == 0
    ]
    if not devices:
        warnings.append(
            f"cuda: device_mask ({options.source('device_mask')}) hides every GPU; "
            "the plugin has no capacity"
        )
    return warnings


class CudaPlugin:
    """NVIDIA GPUs through an :class:`NvmlLayer` (real ``pynvml`` or a fake)."""

    def __init__(
        self,
        nvml: NvmlLayer,
        gpus: Sequence[NvmlGpu],
        options: AcceleratorOptions,
        *,
        driver_version: str = "",
        cuda_version: str = "",
        unknown_sm: Mapping[str, str] | None = None,
        mps: MpsDaemon | None = None,
        enforcement: str = "none",
        stats_file: Path | None = None,
        python: str = sys.executable,
    ) -> None:
        self._nvml = nvml
        self.options = options
        self.mps = mps
        # The memory interposer kernels holding shares preload (None: not tried).
        self.shim: ShimState | None = None
        # Each stats tick is also written here for the sessions' nvidia-smi (None: not).
        self.stats_file = stats_file
        self.python = python
        # How fractional shares are enforced: "mps", or "none" with the reason.
        self.enforcement = (
            enforcement if options.allocation_mode is AllocationMode.FRACTIONAL else ""
        )
        mode = options.allocation_mode
        main_slot = "cuda.device" if mode is AllocationMode.DISCRETE else "cuda.shares"
        devices = cuda_devices(gpus, options, unknown_sm=unknown_sm)
        self.warnings = tuple(cuda_warnings(devices, unknown_sm or {}, options))
        slot_types: dict[str, SlotTypes] = {main_slot: SlotTypes.COUNT}
        metadata = {main_slot: _metadata(main_slot, main_slot.split(".", 1)[1])}
        for device in devices:
            if device.is_mig and device.slot_name not in slot_types:
                slot_types[device.slot_name] = SlotTypes.UNIQUE
                metadata[device.slot_name] = _metadata(device.slot_name, "mig")
        self._inventory = PluginInventory(
            key="cuda",
            version=__version__,
            slot_types=slot_types,
            devices=tuple(devices),
            allocation_mode=mode,
            strategy="EVENLY",
            quantum_size=options.quantum_size if mode is AllocationMode.FRACTIONAL else None,
            exclusive_slot_types=frozenset({"cuda.device", "cuda.shares", "cuda.device:*-mig"}),
            metadata=metadata,
            extra_info={
                "cuda_support": True,
                "nvidia_driver": driver_version,
                "cuda_runtime": cuda_version,
                **({"fraction_enforcement": self.enforcement} if self.enforcement else {}),
            },
            settings=options.describe(),
        )

    @property
    def inventory(self) -> PluginInventory:
        return self._inventory

    def set_enforcement(self, enforcement: str, mps: MpsDaemon | None = None) -> None:
        """Record how shares are enforced (decided once at start, before the agent
        reads the inventory): ``mps``, or ``none (...)`` with the reason."""
        if self._inventory.allocation_mode is not AllocationMode.FRACTIONAL:
            return
        self.mps = mps
        self.enforcement = enforcement
        extra = {**self._inventory.extra_info, "fraction_enforcement": enforcement}
        self._inventory = dataclasses.replace(self._inventory, extra_info=extra)

    def set_shim(self, shim: ShimState) -> None:
        """Record the memory interposer (built or not) that kernels holding shares get."""
        self.shim = shim

    def kernel_resources(self, allocation: Allocation) -> KernelResources:
        held = held_devices(self._inventory, allocation)
        if not held:
            return KernelResources()
        uuids = [h.device.device_id for h in held]
        visible = ",".join(uuids)
        env = {"CUDA_VISIBLE_DEVICES": visible, "NVIDIA_VISIBLE_DEVICES": visible}
        mounts: tuple[Mount, ...] = ()
        mps_env: dict[str, str] = {}
        if self.mps is not None:
            mps_env = mps_client_env(mps_shares(held, self.options), self.mps.pipe_dir)
        if mps_env:
            env.update(mps_env)
            pipe = str(self.mps.pipe_dir) if self.mps is not None else ""
            mounts = (Mount(pipe, pipe, read_only=False),)
            if self.shim is not None and self.shim.path is not None:
                # cudaMemGetInfo's total = the limit; the folder at the same path inside
                # containers and sandboxes (read-only).
                env[PRELOAD_ENV] = str(self.shim.path)
                folder = str(self.shim.path.parent)
                mounts += (Mount(folder, folder, read_only=True),)
        attached = attached_devices(held, options=self.options)
        files: tuple[ConfigFile, ...] = ()
        if any(h.is_shares for h in held):
            # nvidia-smi in the session shows its share (the real one: the whole GPU).
            files = smi_files(
                held,
                attached,
                self.options,
                driver_version=str(self._inventory.extra_info["nvidia_driver"] or "N/A"),
                cuda_version=str(self._inventory.extra_info["cuda_runtime"] or "N/A"),
                stats_file=self.stats_file,
                python=self.python,
                fallback=True,
                what="shares of NVIDIA GPUs",
            )
        return KernelResources(
            env=env,
            resource_lines=cuda_resource_lines(held, options=self.options),
            attached_devices=attached,
            config_files=files,
            mounts=mounts,
            device_requests=({"Driver": "nvidia", "DeviceIDs": uuids, "Capabilities": [["gpu"]]},),
            ipc_host=bool(mps_env),
        )

    def status(self) -> dict[str, str]:
        """What ``agent info`` shows beside the inventory (changes while the agent runs)."""
        if not self.enforcement:
            return {}
        status = {"enforcement": self.enforcement}
        if self.mps is not None:
            daemon = self.mps.status()
            status.update({f"mps_{k}": v for k, v in daemon.items()})
            status["mps"] = describe_status(daemon)
        if self.shim is not None:
            status.update(self.shim.status())
        return status

    def _samples(self) -> dict[str, DeviceSample]:
        samples: dict[str, DeviceSample] = {}
        for device in self._inventory.devices:
            reading = self._nvml.sample(device.device_id)
            temperature = reading.temperature_c
            power_limit_w = Decimal(reading.power_limit_mw or 0) / 1000
            power_w = Decimal(reading.power_mw) / 1000 if reading.power_mw is not None else None
            if power_w is not None:
                power_limit_w = max(power_limit_w, power_w)
            samples[device.device_id] = DeviceSample(
                mem_used=reading.mem_used,
                mem_total=reading.mem_total,
                util=Decimal(reading.util_percent) if reading.util_percent is not None else None,
                power=power_w,
                temperature=Decimal(temperature) if temperature is not None else None,
                power_max=power_limit_w,
                temperature_max=Decimal(max(TEMPERATURE_MAX_C, temperature or 0)),
            )
        return samples

    async def node_stats(self) -> Sequence[NodeMetric]:
        samples = self._samples()
        if (
            self.stats_file is not None
            and self._inventory.allocation_mode is AllocationMode.FRACTIONAL
        ):
            await asyncio.to_thread(write_stats, self.stats_file, samples, who="cuda")
        return node_metrics("cuda", samples)

    async def kernel_stats(self, kernels: Mapping[str, KernelStatTarget]) -> Sequence[KernelMetric]:
        metrics = kernel_metrics(self._inventory, self.options, self._samples(), kernels)
        # With the kernels' pids, NVML tells the memory their processes really use.
        measured: dict[str, Measurement] = {}
        estimated = metrics[0].per_kernel
        for kernel_id, target in kernels.items():
            if not target.pids:
                measured[kernel_id] = estimated[kernel_id]
                continue
            used = 0
            for h in held_devices(self._inventory, target.allocation, strict=False):
                per_pid = self._nvml.process_memory(h.device.device_id)
                used += sum(v for pid, v in per_pid.items() if pid in target.pids)
            measured[kernel_id] = Measurement(Decimal(used), estimated[kernel_id].capacity)
        return [KernelMetric("cuda_mem", "bytes", measured), *metrics[1:]]

    async def close(self) -> None:
        try:
            if self.mps is not None:
                await self.mps.close()
        finally:
            self._nvml.close()


async def load_cuda_options(ctx: PluginContext) -> AcceleratorOptions:
    raw = RawOptions()
    if ctx.store is not None:
        raw = await read_accelerator_options(ctx.store, "cuda")
    return parse_accelerator_options(raw, default_quantum=CUDA_DEFAULT_QUANTUM)


def query_sm_counts(gpus: Sequence[NvmlGpu], driver: CudaDriver) -> dict[str, int | str]:
    """Ask the CUDA driver for the SM count of each full GPU NVML could not tell (I/O)."""
    counts: dict[str, int | str] = {}
    for gpu in gpus:
        if gpu.mig_enabled or gpu.multiprocessors is not None:
            continue
        try:
            counts[gpu.uuid] = driver.multiprocessor_count(gpu.pci_bus_id)
        except CudaDriverError as e:
            counts[gpu.uuid] = f"the CUDA driver cannot tell: {e}"
    return counts


async def create_plugin(
    ctx: PluginContext, *, nvml: NvmlLayer | None = None, driver: CudaDriver | None = None
) -> CudaPlugin:
    """Entry point ``cuda``.  No NVML library / driver / GPU: :class:`PluginUnavailable`.

    ``nvml`` / ``driver`` replace the real NVML and CUDA driver layers (tests pass
    ``PynvmlLayer(FakeNvml(...))`` and ``LibcudaDriver(loader=FakeLibcuda(...).load)``).
    """
    options = await load_cuda_options(ctx)
    layer: NvmlLayer = nvml if nvml is not None else PynvmlLayer(host_root=ctx.host_root)
    layer.open()
    try:
        discovered = layer.gpus()
        if not discovered:
            raise PluginUnavailable("cuda: NVML works but reports no GPU on this machine")
        counts = query_sm_counts(discovered, driver if driver is not None else LibcudaDriver())
        gpus, unknown_sm = with_sm_counts(discovered, counts)
        plugin = CudaPlugin(
            layer,
            gpus,
            options,
            driver_version=layer.driver_version(),
            cuda_version=layer.cuda_driver_version(),
            unknown_sm=unknown_sm,
            stats_file=(
                ctx.agent_config.scratch_root_path() / SESSION_SHARED_DIR / smi.STATS_FILE
                if ctx.manage_services
                else None
            ),
        )
    except BaseException:
        layer.close()
        raise
    for warning in plugin.warnings:
        log.warning("%s", warning)
    try:
        await _enforce_shares(plugin, ctx)
    except BaseException:
        await plugin.close()
        raise
    return plugin


_SILENCE = 'set [cuda] enforce = "none" in agent.toml to run advisory fractions knowingly'


async def _enforce_shares(plugin: CudaPlugin, ctx: PluginContext) -> None:
    """Start (or adopt) the MPS control daemon that enforces fractional shares, as the
    agent's ``[cuda]`` section says; only in the agent (``ctx.manage_services``)."""
    inventory = plugin.inventory
    if inventory.allocation_mode is not AllocationMode.FRACTIONAL:
        return
    settings = ctx.agent_config.cuda
    if settings.enforce == "none":
        plugin.set_enforcement('none ([cuda] enforce = "none": fractions are advisory)')
        log.warning('cuda: fractional shares are advisory ([cuda] enforce = "none")')
        return
    shared = [d.device_id for d in inventory.devices if d.slot_name == "cuda.shares"]
    if not shared:
        plugin.set_enforcement("not needed (no shared GPU: MIG instances are whole devices)")
        return
    if not ctx.manage_services:
        plugin.set_enforcement("mps (started by the agent)")
        return
    program = find_control_program(settings.mps_control)
    reason = ""
    if program is None:
        reason = (
            f"{settings.mps_control} was not found (PATH, /usr/local/nvidia/bin, /usr/bin); "
            "it ships with the NVIDIA driver's utilities"
        )
    else:
        pipe_dir, log_dir = mps_directories(ctx.agent_config.mps_dir_path())
        daemon = MpsDaemon(
            program,
            pipe_dir,
            log_dir,
            devices=shared,
            check_interval_s=settings.mps_check_interval_s,
        )
        try:
            await daemon.start()
        except MpsUnavailable as e:
            reason = str(e)
        else:
            daemon.supervise()
            plugin.set_enforcement("mps", daemon)
            shim_dir = ctx.agent_config.mps_dir_path() / "shim"
            plugin.set_shim(await asyncio.to_thread(prepare_shim, shim_dir))
            return
    if settings.mps_missing == "refuse":
        source = str(ctx.agent_config.source_path or "agent.toml")
        raise PluginConfigError(
            source,
            "cuda.mps-missing",
            f"MPS to enforce fractional shares, which failed: {reason} "
            '(or mps-missing = "warn", or enforce = "none")',
            "refuse",
        )
    plugin.set_enforcement(f"none (MPS unavailable: {reason})")
    log.warning(
        "cuda: FRACTIONAL SHARES ARE NOT ENFORCED: %s. A session can use more GPU memory "
        "and SMs than its share until MPS runs; %s",
        reason,
        _SILENCE,
    )
