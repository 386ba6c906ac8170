"""From an allocated kernel to what a runtime starts: env, ``resource.txt``, limits (pure).

For each plugin holding something, ``plugin.kernel_resources(allocation)`` gives::

    env                      -> the kernel's environment (over the request's environ)
    resource_lines           -> resource.txt extra lines, after the *_SHARES lines
    cpu_set                  -> ResourceLimits.cpuset_cpus (only if the host has those cores)
    memory_limit_bytes       -> ResourceLimits.mem_bytes
    config_files             -> KernelSpec: files next to resource.txt (config/bin on PATH)
    device_nodes / mounts / device_requests -> KernelSpec (docker runtime)

The request's storage folders (``mounts``) become ``KernelSpec.folder_mounts`` (their
kernel paths checked and made absolute, see :mod:`.runtime.folder_mounts`) and the
``MOUNTS`` line of ``resource.txt`` (``host_path:kernel_path:ro|rw``, the kernel path as
the request gives it: ``/home/work/<x>`` stands for the kernel's work folder).

The request's environ never sets the agent's variables (``CUDA_VISIBLE_DEVICES``,
``NVIDIA_VISIBLE_DEVICES``, ``CUDA_MPS_*``, ``BACKENDAI_*`` but the service ports,
``ACCELSHARE_*``: :func:`accelshare.common.text_input.reserved_env_reason`): the
manager refuses them, and a request that carries one anyway (an older manager, a
hand-made RPC) has them dropped here, so a kernel holding no GPU cannot name one.

The requested ``cpu`` amount is the CPU-time limit (cores' worth per period).  A cpuset
naming cores this host does not have (a fixed ``[resource] cpu-count`` larger than the
machine, e.g. a test or hollow agent) is not applied: the cores are accounting units
there, and pinning to a missing core would fail the start.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from decimal import Decimal
from typing import Any

from accelshare.accel import ComputePlugin, ConfigFile, DeviceNode, Mount, merge_kernel_env
from accelshare.alloc import AllocationByMap
from accelshare.common import ResourceSlot, SlotTypes
from accelshare.common.text_input import reserved_env_reason
from accelshare.protocol import CreateKernelRequest

from .allocations import flatten_allocation
from .resource_txt import MountEntry, ResourceTxt, render_resource_txt
from .runtime.base import KERNEL_ID_LABEL, KernelSpec, ResourceLimits
from .runtime.folder_mounts import FolderMount, MountRefused, normalize_kernel_path

__all__ = ["SESSION_ID_ENV", "SESSION_ID_LABEL", "build_kernel_spec"]

SESSION_ID_ENV = "ACCELSHARE_SESSION_ID"
SESSION_ID_LABEL = "ai.accelshare.session-id"


def build_kernel_spec(
    request: CreateKernelRequest,
    requested: Mapping[str, Decimal],
    allocation: AllocationByMap,
    plugins: Mapping[str, ComputePlugin],
    slot_types: Mapping[str, SlotTypes],
    *,
    host_cpus: Set[int] | None = None,
) -> tuple[KernelSpec, ResourceTxt]:
    """The runtime spec and the ``resource.txt`` content for an allocated kernel."""
    env = {k: v for k, v in request.environ.items() if reserved_env_reason(k) is None}
    env[SESSION_ID_ENV] = request.session_id
    extra: list[tuple[str, str]] = []
    cpu_set: tuple[int, ...] = ()
    mem_bytes: int | None = None
    config_files: list[ConfigFile] = []
    device_nodes: list[DeviceNode] = []
    mounts: list[Mount] = []
    device_requests: list[Mapping[str, Any]] = []
    ipc_host = False
    for key, plugin in plugins.items():  # plugin order: cpu, mem, then accelerators
        per_slot = allocation.get(key)
        if not per_slot:
            continue
        res = plugin.kernel_resources(per_slot)
        merge_kernel_env(env, res.env)
        extra.extend(res.resource_lines.items())
        if res.cpu_set:
            cpu_set = res.cpu_set
        if res.memory_limit_bytes is not None:
            mem_bytes = res.memory_limit_bytes
        config_files.extend(res.config_files)
        device_nodes.extend(res.device_nodes)
        mounts.extend(res.mounts)
        device_requests.extend(res.device_requests)
        ipc_host = ipc_host or res.ipc_host
    if host_cpus is not None and not set(cpu_set) <= set(host_cpus):
        cpu_set = ()
    folders = folder_mounts(request)
    content = ResourceTxt(
        slots=ResourceSlot(requested),
        mounts=tuple(MountEntry(m.host_path, m.kernel_path, m.perm) for m in folders),
        allocations=flatten_allocation(allocation),
        extra_lines=tuple(extra),
    )
    text = render_resource_txt(content, slot_types)
    labels = {
        **request.labels,
        KERNEL_ID_LABEL: request.kernel_id,
        SESSION_ID_LABEL: request.session_id,
    }
    cpu = requested.get("cpu")
    spec = KernelSpec(
        kernel_id=request.kernel_id,
        image=request.image,
        resource_txt=text,
        command=tuple(request.command) if request.command is not None else None,
        config_files=tuple(config_files),
        startup_command=request.startup_command,
        env=env,
        limits=ResourceLimits(
            cpu_count=cpu if cpu is not None and cpu > 0 else None,
            cpuset_cpus=cpu_set,
            mem_bytes=mem_bytes,
        ),
        device_nodes=tuple(device_nodes),
        mounts=tuple(mounts),
        folder_mounts=folders,
        device_requests=tuple(device_requests),
        ipc_host=ipc_host,
        labels=labels,
    )
    return spec, content


def folder_mounts(request: CreateKernelRequest) -> tuple[FolderMount, ...]:
    """The request's storage folders with their kernel paths made absolute;
    ``MountRefused`` (a ``ValueError`` naming the mount) for a bad or repeated one."""
    folders: list[FolderMount] = []
    for mount in request.mounts:
        path = normalize_kernel_path(mount.name, mount.kernel_path)
        for other in folders:
            if other.name == mount.name:
                raise MountRefused(mount.name, "named twice")
            if path == other.kernel_path or path.startswith(other.kernel_path + "/"):
                raise MountRefused(
                    mount.name, f"kernel_path {path!r} lies in mount {other.name!r}'s"
                )
            if other.kernel_path.startswith(path + "/"):
                raise MountRefused(
                    mount.name, f"kernel_path {path!r} would cover mount {other.name!r}"
                )
        folders.append(FolderMount(mount.name, mount.host_path, path, mount.read_only))
    return tuple(folders)
