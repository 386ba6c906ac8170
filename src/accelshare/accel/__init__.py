"""Compute plugins: the contract, the entry-point registry, cpu, mem, mock and cuda.

The agent's whole use of this package::

    from accelshare.accel import PluginContext, load_compute_plugins, build_alloc_map

    loaded = await load_compute_plugins(PluginContext(agent_config, store))
    maps = {key: build_alloc_map(p.inventory) for key, p in loaded.plugins.items()}
    ...
    allocation = maps["cuda"].allocate({"cuda.shares": Decimal("1.2")})
    res = loaded.plugins["cuda"].kernel_resources(allocation)
    # res.env -> kernel environment, res.resource_lines -> extra resource.txt lines,
    # res.device_nodes / mounts / device_requests -> docker runtime
    ...
    await loaded.close()

See :mod:`accelshare.accel.protocol` for the contract and ``docs/plugins.md``.
"""

from .describe import describe_inventory, describe_plugins
from .errors import (
    PluginConfigError,
    PluginError,
    PluginLoadError,
    PluginUnavailable,
    UnknownOptionError,
)
from .maps import build_alloc_map, device_slots
from .protocol import (
    ComputePlugin,
    ObservesAllocations,
    PluginContext,
    PluginFactory,
    ReportsStatus,
    validate_inventory,
)
from .registry import (
    BACKEND_AI_ALIASES,
    ENTRY_POINT_GROUP,
    INTRINSIC_PLUGINS,
    LoadedPlugins,
    PluginEntry,
    PluginSelection,
    installed_plugin_entries,
    load_compute_plugins,
    select_plugins,
)
from .types import (
    AttachedDevice,
    ConfigFile,
    Device,
    DeviceNode,
    KernelMetric,
    KernelResources,
    KernelStatTarget,
    MapStrategy,
    Measurement,
    Mount,
    NodeMetric,
    NumberFormat,
    PluginInventory,
    SlotMetadata,
    merge_kernel_env,
)

__all__ = [
    "BACKEND_AI_ALIASES",
    "ENTRY_POINT_GROUP",
    "INTRINSIC_PLUGINS",
    "AttachedDevice",
    "ComputePlugin",
    "ConfigFile",
    "Device",
    "DeviceNode",
    "KernelMetric",
    "KernelResources",
    "KernelStatTarget",
    "LoadedPlugins",
    "MapStrategy",
    "Measurement",
    "Mount",
    "NodeMetric",
    "NumberFormat",
    "ObservesAllocations",
    "PluginConfigError",
    "PluginContext",
    "PluginEntry",
    "PluginError",
    "PluginFactory",
    "PluginInventory",
    "PluginLoadError",
    "PluginSelection",
    "PluginUnavailable",
    "ReportsStatus",
    "SlotMetadata",
    "UnknownOptionError",
    "build_alloc_map",
    "describe_inventory",
    "describe_plugins",
    "device_slots",
    "installed_plugin_entries",
    "load_compute_plugins",
    "merge_kernel_env",
    "select_plugins",
    "validate_inventory",
]
