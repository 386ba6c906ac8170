"""The compute-plugin contract.

A plugin is published as an entry point in the group ``accelshare.compute_plugins``
whose object is a :class:`PluginFactory`: an async callable taking a
:class:`PluginContext` and returning a ready :class:`ComputePlugin`.  The factory does
the I/O of discovery (reading /sys, NVML, the mock TOML, the config store) once; the
plugin it returns is then mostly pure::

    async def create_plugin(ctx: PluginContext) -> ComputePlugin: ...   # the entry point

    plugin.inventory                      # PluginInventory: key, slots, devices, map spec,
                                          # UI metadata, extra info, version (pure data)
    plugin.kernel_resources(allocation)   # env vars, resource.txt lines, devices (pure)
    plugin.observe_allocations(held)      # optional (ObservesAllocations): before
                                          # each node_stats tick, what kernels hold
    await plugin.node_stats()             # per-node and per-device metrics (I/O)
    await plugin.kernel_stats(targets)    # per-kernel metrics (I/O)
    await plugin.close()

Compared with Backend.AI's 19-method ``AbstractComputePlugin``: no docker client is
passed around, restoring allocations is the agent's job (it reads ``resource.txt``
and calls the map's ``apply_allocation``), and the allocation map is built from the
inventory by :func:`accelshare.accel.maps.build_alloc_map`, not by each plugin.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

from accelshare.common import INTRINSIC_SLOTS, Allocation, AllocationMode, InvalidSlotName, SlotName
from accelshare.config.agent_file import AgentConfig
from accelshare.config.store import ConfigStore

from .errors import PluginLoadError
from .types import KernelMetric, KernelResources, KernelStatTarget, NodeMetric, PluginInventory

__all__ = [
    "ComputePlugin",
    "ObservesAllocations",
    "PluginContext",
    "PluginFactory",
    "ReportsStatus",
    "validate_inventory",
]


@dataclass(frozen=True, slots=True)
class PluginContext:
    """What a plugin factory may look at while it discovers its devices.

    ``store`` is None when there is no cluster configuration to read (every option
    takes its default).  ``manage_services`` is True only in the agent itself.  ``host_root`` is where ``/proc`` and ``/sys`` are read from,
    so tests can feed a fake tree.
    """

    agent_config: AgentConfig = field(default_factory=AgentConfig)
    store: ConfigStore | None = None
    host_root: Path = Path("/")
    # True in the agent: a plugin may start and supervise the host services it needs
    # (the cuda plugin's MPS control daemon).  Inspection commands leave it False.
    manage_services: bool = False


@runtime_checkable
class ReportsStatus(Protocol):
    """A plugin that reports how it is doing beside its fixed inventory (optional)."""

    def status(self) -> Mapping[str, str]:
        """Short texts for ``agent info`` (cuda: ``enforcement``, ``mps``); {} for none."""
        ...


@runtime_checkable
class ObservesAllocations(Protocol):
    """A plugin whose statistics follow what is allocated on its devices (optional).

    The agent calls :meth:`observe_allocations` before every ``node_stats()`` tick, so a
    simulated device (the mock plugin) can show the load of the sessions that hold it.
    """

    def observe_allocations(self, allocations: Mapping[str, Allocation]) -> None:
        """What every kernel holds now, by kernel id: this plugin's slots only
        (``{slot: {device_id: amount}}``), including kernels still starting."""
        ...


@runtime_checkable
class ComputePlugin(Protocol):
    """A loaded plugin.  See the module docstring for who calls what."""

    @property
    def inventory(self) -> PluginInventory:
        """What the plugin declares; fixed for the plugin's lifetime."""
        ...

    def kernel_resources(self, allocation: Allocation) -> KernelResources:
        """What a kernel gets for ``allocation`` (only this plugin's slots).

        Pure and deterministic: the same allocation always gives the same result, with
        devices listed in inventory order whatever order ``allocation`` has.
        """
        ...

    async def node_stats(self) -> Sequence[NodeMetric]:
        """One collection tick of node metrics (each with per-device readings)."""
        ...

    async def kernel_stats(self, kernels: Mapping[str, KernelStatTarget]) -> Sequence[KernelMetric]:
        """One collection tick of per-kernel metrics, keyed by kernel id."""
        ...

    async def close(self) -> None:
        """Release what the factory acquired (e.g. ``nvmlShutdown``); idempotent."""
        ...


class PluginFactory(Protocol):
    """The object an ``accelshare.compute_plugins`` entry point resolves to.

    Raises :class:`~accelshare.accel.errors.PluginUnavailable` when the machine has
    nothing for it to drive, :class:`~accelshare.accel.errors.PluginConfigError` for a
    bad configuration.
    """

    async def __call__(self, ctx: PluginContext, /) -> ComputePlugin: ...


def validate_inventory(inventory: PluginInventory) -> None:
    """Check a plugin's declaration; raise :class:`PluginLoadError` naming the problem.

    - every slot name parses and starts with ``<key>.`` (``cpu``/``mem`` may be their key)
    - every device is in a declared slot, device ids are unique
    - every declared slot has UI metadata
    - a fractional map has a positive quantum
    """
    key = inventory.key
    for slot in inventory.slot_types:
        try:
            parsed = SlotName(slot)
        except InvalidSlotName as e:
            raise PluginLoadError(f"compute plugin {key!r} declares an invalid slot: {e}") from e
        is_intrinsic = slot == key and key in INTRINSIC_SLOTS
        if not is_intrinsic and (parsed.device_name != key or not parsed.major_type):
            raise PluginLoadError(
                f"compute plugin {key!r} declares the slot {slot!r} outside its prefix "
                f"{key + '.'!r}; every slot of a plugin must be named '{key}.<kind>'"
            )
    seen: set[str] = set()
    for device in inventory.devices:
        if device.device_id in seen:
            raise PluginLoadError(
                f"compute plugin {key!r} reports the device id {device.device_id!r} twice"
            )
        seen.add(device.device_id)
        if device.slot_name not in inventory.slot_types:
            raise PluginLoadError(
                f"compute plugin {key!r}: device {device.device_id!r} is in the slot "
                f"{device.slot_name!r}, which the plugin does not declare"
            )
    missing = [slot for slot in inventory.slot_types if slot not in inventory.metadata]
    if missing:
        raise PluginLoadError(
            f"compute plugin {key!r} has no UI metadata for the slot(s) {', '.join(missing)}"
        )
    if inventory.allocation_mode is AllocationMode.FRACTIONAL and (
        inventory.quantum_size is None or inventory.quantum_size <= 0
    ):
        raise PluginLoadError(f"compute plugin {key!r}: a fractional map needs a quantum > 0")
