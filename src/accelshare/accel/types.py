"""The data a compute plugin declares and returns: pure, immutable, JSON-friendly.

A plugin describes itself once, at load time, as a :class:`PluginInventory` (its key,
slots, devices, how its allocation map is built, UI metadata, extra info).  For each
kernel it answers :class:`KernelResources` (environment variables, extra
``resource.txt`` lines, device nodes, mounts and device requests for a container
runtime).  Stats come back as :class:`NodeMetric` / :class:`KernelMetric`.

Amounts are ``Decimal`` (exact); device ids and slot names are plain strings.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Literal, TypeAlias

from accelshare.common import Allocation, AllocationMode, SlotTypes

__all__ = [
    "SESSION_SHARED_DIR",
    "AttachedDevice",
    "ConfigFile",
    "Device",
    "DeviceNode",
    "KernelMetric",
    "KernelResources",
    "KernelStatTarget",
    "MapStrategy",
    "Measurement",
    "Mount",
    "NodeMetric",
    "NumberFormat",
    "PluginInventory",
    "SlotMetadata",
    "merge_kernel_env",
]

#: Under the agent's scratch root: files of the node that every session may read (the
#: mock GPUs' statistics for the sessions' nvidia-smi).  A sandboxed kernel sees this
#: folder read-only, never the scratch root itself (the other kernels' folders).
SESSION_SHARED_DIR = ".node"

#: Variables that list libraries: a plugin's value goes first, the value already there
#: (the request's own) after it, instead of being replaced.
_PREPENDED_ENV = frozenset({"LD_PRELOAD"})


def merge_kernel_env(env: dict[str, str], extra: Mapping[str, str]) -> None:
    """Add a plugin's ``extra`` variables to a kernel's ``env`` (in place): they replace
    what is there, but for ``LD_PRELOAD``, which they are put in front of.

    >>> env = {"LD_PRELOAD": "/opt/mine.so", "A": "1"}
    >>> merge_kernel_env(env, {"LD_PRELOAD": "/x/shim.so", "A": "2"})
    >>> env
    {'LD_PRELOAD': '/x/shim.so:/opt/mine.so', 'A': '2'}
    """
    for name, value in extra.items():
        before = env.get(name, "") if name in _PREPENDED_ENV else ""
        env[name] = f"{value}:{before}" if before.strip(" :") and value else value


MapStrategy: TypeAlias = Literal["FILL", "EVENLY"]
"""Name of an ``accelshare.alloc.AllocationStrategy`` member."""


@dataclass(frozen=True, slots=True)
class NumberFormat:
    binary: bool  # 2^10n suffixes instead of 10^3n
    round_length: int  # decimal places; 0 = integer

    def to_json(self) -> dict[str, Any]:
        return {"binary": self.binary, "round_length": self.round_length}


@dataclass(frozen=True, slots=True)
class SlotMetadata:
    """How the web console names and formats one slot (``GET /config/resource-slots/details``)."""

    slot_name: str
    human_readable_name: str
    description: str
    display_unit: str
    display_icon: str
    number_format: NumberFormat

    def to_json(self) -> dict[str, Any]:
        return {
            "slot_name": self.slot_name,
            "human_readable_name": self.human_readable_name,
            "description": self.description,
            "display_unit": self.display_unit,
            "number_format": self.number_format.to_json(),
            "display_icon": self.display_icon,
        }


@dataclass(frozen=True, slots=True)
class Device:
    """One allocatable unit: a CPU core, the memory root, a GPU, a MIG slice.

    ``slot_name`` is the one slot this device belongs to and ``capacity`` its amount in
    that slot (1 for a core, a whole device or a MIG slice; bytes for memory; shares in
    fractional mode).
    """

    device_id: str
    slot_name: str
    capacity: Decimal
    model_name: str
    numa_node: int
    memory_bytes: int
    processors: int
    hw_location: str = ""
    is_mig: bool = False
    mother_id: str = ""  # the physical device a MIG slice belongs to ("" otherwise)

    def to_json(self, *, is_shares: bool) -> dict[str, Any]:
        return {
            "device_id": self.device_id,
            "slot": self.slot_name,
            "capacity": str(self.capacity),
            "model_name": self.model_name,
            "numa_node": self.numa_node,
            "memory_bytes": self.memory_bytes,
            "processors": self.processors,
            "shares": str(self.capacity) if is_shares else None,
            "hw_location": self.hw_location,
            "is_mig": self.is_mig,
        }


@dataclass(frozen=True, slots=True)
class PluginInventory:
    """Everything a plugin declares once it has discovered its devices.

    The agent builds the plugin's allocation map from it
    (:func:`accelshare.accel.maps.build_alloc_map`), reports slot types, capacities
    and metadata to the manager, and the ``accelshare agent plugins`` command prints it.
    """

    key: str
    version: str
    slot_types: Mapping[str, SlotTypes]  # declaration order is kept
    devices: tuple[Device, ...]
    allocation_mode: AllocationMode
    strategy: MapStrategy
    quantum_size: Decimal | None  # fractional maps only
    exclusive_slot_types: frozenset[str]
    metadata: Mapping[str, SlotMetadata]  # slot name -> UI metadata
    extra_info: Mapping[str, Any] = field(default_factory=dict)
    settings: Mapping[str, str] = field(default_factory=dict)  # effective options, for display

    def capacities(self) -> dict[str, Decimal]:
        """Slot -> total capacity (the sum over its devices; 0 for a slot without devices)."""
        totals: dict[str, Decimal] = dict.fromkeys(self.slot_types, Decimal(0))
        for device in self.devices:
            totals[device.slot_name] = totals.get(device.slot_name, Decimal(0)) + device.capacity
        return totals

    def device(self, device_id: str) -> Device:
        for device in self.devices:
            if device.device_id == device_id:
                return device
        raise KeyError(device_id)


@dataclass(frozen=True, slots=True)
class AttachedDevice:
    """A device as a kernel sees it (for session details in the UI)."""

    device_id: str
    model_name: str
    memory_bytes: int
    processors: int


@dataclass(frozen=True, slots=True)
class ConfigFile:
    """A file a plugin puts into the kernel's config dir (next to ``resource.txt``).

    ``path`` is relative to ``<scratch>/<kernel>/config/`` (``/home/config`` in a docker
    container), ``/``-separated, without ``..``.  Executables go under ``bin/``: the
    process runtime puts ``config/bin`` first on the kernel's ``PATH`` (the mock
    ``nvidia-smi`` is shipped this way).
    """

    path: str
    text: str
    executable: bool = False

    def __post_init__(self) -> None:
        parts = self.path.split("/")
        if not self.path or self.path.startswith("/") or any(p in ("", ".", "..") for p in parts):
            raise ValueError(
                f"ConfigFile.path: expected a relative path inside the config dir "
                f"(e.g. 'bin/nvidia-smi'), received {self.path!r}"
            )
        if parts[0] == "resource.txt":
            raise ValueError("ConfigFile.path: 'resource.txt' is written by the agent itself")


@dataclass(frozen=True, slots=True)
class DeviceNode:
    """A host device node to pass into a container (docker ``HostConfig.Devices``)."""

    host_path: str
    container_path: str
    permissions: str = "rwm"


@dataclass(frozen=True, slots=True)
class Mount:
    source: str
    target: str
    read_only: bool = True


@dataclass(frozen=True, slots=True)
class KernelResources:
    """What a kernel gets from one plugin for one allocation.

    ``env`` goes into the kernel's environment in every runtime; ``resource_lines`` are
    appended to its ``resource.txt`` in this order; ``config_files`` are written next to
    ``resource.txt`` (see :class:`ConfigFile`); ``device_nodes``, ``mounts`` and
    ``device_requests`` (docker ``HostConfig.DeviceRequests`` entries) are for the docker
    runtime; ``cpu_set`` / ``memory_limit_bytes`` are the limits the intrinsic plugins
    derive (cgroup cpuset / memory limit in any runtime); ``ipc_host`` asks the docker
    runtime for the host's IPC namespace.
    """

    env: Mapping[str, str] = field(default_factory=dict)
    resource_lines: Mapping[str, str] = field(default_factory=dict)
    attached_devices: tuple[AttachedDevice, ...] = ()
    config_files: tuple[ConfigFile, ...] = ()
    device_nodes: tuple[DeviceNode, ...] = ()
    mounts: tuple[Mount, ...] = ()
    device_requests: tuple[Mapping[str, Any], ...] = ()
    cpu_set: tuple[int, ...] = ()
    memory_limit_bytes: int | None = None
    # docker: run in the host's IPC namespace (MPS clients share memory with the daemon)
    ipc_host: bool = False


@dataclass(frozen=True, slots=True)
class Measurement:
    """One reading; ``capacity`` is the ceiling it is measured against (None: no ceiling)."""

    value: Decimal
    capacity: Decimal | None = None


@dataclass(frozen=True, slots=True)
class NodeMetric:
    """A node-wide metric (``cuda_mem``, ``cpu_util``...) with its per-device readings."""

    key: str
    unit: str  # "bytes", "percent", "watts", "celsius", "msec"
    node: Measurement
    per_device: Mapping[str, Measurement]


@dataclass(frozen=True, slots=True)
class KernelMetric:
    key: str
    unit: str
    per_kernel: Mapping[str, Measurement]


@dataclass(frozen=True, slots=True)
class KernelStatTarget:
    """What the agent knows about one kernel when it asks for its stats."""

    allocation: Allocation
    pids: frozenset[int] = frozenset()
