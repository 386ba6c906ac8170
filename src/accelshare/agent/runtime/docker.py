"""The ``docker`` runtime: one container per kernel through the Docker Engine API (aiodocker).

A kernel's container::

    name     accelshare-<kernel_id>
    labels   ai.accelshare.kernel-id=<kernel_id>, ai.accelshare.agent-id=<agent id>, + spec labels
    image    the spec's image (pulled first when the engine lacks it: ``ensure_image``)
    cmd      the spec's command, ``/bin/sh -c <startup command>``, or an idle shell
             loop that stops on SIGTERM
    user     ``<kernel-uid>:<kernel-gid>`` (Backend.AI's ``work`` user, 1000:1000 by
             default), never root; the work folder is chowned to it at prepare
    security ``CapDrop: ["ALL"]``, ``SecurityOpt: ["no-new-privileges:true"]``,
             ``Privileged: false``
    env      the plugins' variables + ACCELSHARE_KERNEL_ID / BACKENDAI_KERNEL_ID /
             ACCELSHARE_RESOURCE_TXT=/home/config/resource.txt, HOME=/home/work
    mounts   <scratch>/config -> /home/config (ro), <scratch>/work -> /home/work (rw),
             + the plugins' mounts (the MPS pipe folder of enforced GPU shares)
             + the storage folders (``KernelSpec.folder_mounts``: ``ReadOnly`` for
             ``ro``; ``/home/work/<x>`` under the work folder, their mount points made
             there as the kernel's user); no other host path
    ports    each app service's container port published on ``publish_host`` only
             (the address the manager's app proxy connects to), never 0.0.0.0
    limits   NanoCpus, Memory (= MemorySwap: no swap), PidsLimit, CpusetCpus
    devices  the plugins' device nodes and DeviceRequests (real CUDA:
             ``{"Driver": "nvidia", "DeviceIDs": [...], "Capabilities": [["gpu"]]}``,
             see :func:`gpu_device_request`)
    ipc      the host's (``IpcMode: host``) when a plugin asks for it: MPS clients
             (enforced GPU fractions) share memory with the agent's MPS daemon

:func:`container_config` builds that request as pure data (tested without an engine).
The engine is the source of truth for running kernels; the scratch dir keeps what must
outlive a deleted container (``resource.txt``, the exit record and, saved at destroy,
the logs).  Restart recovery lists containers by label (:meth:`DockerRuntime.scan_kernels`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aiodocker
from aiodocker.containers import DockerContainer
from aiodocker.exceptions import DockerError

from ..resource_txt import with_container_id
from ..scratch import ScratchDir, list_kernel_ids, read_json
from .base import (
    AGENT_ID_LABEL,
    BACKENDAI_KERNEL_ID_ENV,
    KERNEL_ID_ENV,
    KERNEL_ID_LABEL,
    RESOURCE_TXT_ENV,
    STARTUP_SHELL,
    ExitReason,
    KernelExit,
    KernelInfo,
    KernelSpec,
    KernelState,
)
from .errors import (
    ImageUnavailable,
    KernelConflict,
    KernelNotFound,
    KernelStartFailed,
    RuntimeUnavailable,
)
from .execs import DockerExec
from .folder_mounts import check_host_folder, check_target, give_to_kernel_user
from .terminal import DockerTerminal

PYTHON_SCRIPT = (
    'if command -v python3 >/dev/null 2>&1; then exec python3 -c "$1"; fi; exec python -c "$1"'
)
"""The execute API's query mode in a container: the code (``$1``) with the image's Python."""

__all__ = [
    "DEFAULT_KERNEL_GID",
    "DEFAULT_KERNEL_UID",
    "SECURITY_HOST_CONFIG_KEYS",
    "DockerRuntime",
    "DockerRuntimeConfig",
    "container_config",
    "give_work_dir",
    "gpu_device_request",
    "repo_tags",
]

log = logging.getLogger(__name__)

_DEVICE_REQUEST_KEYS = frozenset({"Driver", "Count", "DeviceIDs", "Capabilities", "Options"})
#: ``HostConfig`` keys that decide the container's privileges: set by
#: :func:`container_config` only, never through ``DockerRuntimeConfig.host_config``.
SECURITY_HOST_CONFIG_KEYS = frozenset(
    {"Privileged", "CapAdd", "CapDrop", "SecurityOpt", "UsernsMode", "PortBindings", "Mounts"}
)
#: Backend.AI's ``work`` user of kernel containers.
DEFAULT_KERNEL_UID = 1000
DEFAULT_KERNEL_GID = 1000
MAX_ID = 2**31 - 1
DEFAULT_IDLE_COMMAND = (
    "/bin/sh",
    "-c",
    "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done",
)


@dataclass(frozen=True, slots=True)
class DockerRuntimeConfig:
    """Settings of the docker runtime.

    * ``docker_url``: ``unix:///path/docker.sock`` or ``tcp://...``; None uses
      ``DOCKER_HOST`` / the default socket.
    * ``agent_id``: labels every container, so that several agents can share one engine
      and each recovers only its own kernels.
    * ``network_mode``: e.g. ``"none"`` or a network name; None keeps the engine default.
    * ``host_config``: extra ``HostConfig`` keys merged in (``ShmSize``, ``Ulimits``...);
      none of :data:`SECURITY_HOST_CONFIG_KEYS`.
    * ``kernel_uid`` / ``kernel_gid``: the non-root user the kernel runs as (``User``),
      the owner of its work folder.
    * ``publish_host``: the host address app ports are published on: the one the
      manager's app proxy connects to (see :func:`accelshare.agent.ports.proxy_address`).
    """

    scratch_root: Path
    docker_url: str | None = None
    agent_id: str = "local"
    stop_grace_s: float = 5.0
    network_mode: str | None = None
    use_init: bool = False
    idle_command: tuple[str, ...] = DEFAULT_IDLE_COMMAND
    config_target: str = "/home/config"
    work_target: str = "/home/work"
    container_prefix: str = "accelshare-"
    host_config: Mapping[str, Any] = field(default_factory=dict)
    # An image absent from the engine is pulled before the container is created, at
    # most this long (the create RPC waits for it: keep it below the manager's
    # agent-rpc-timeout); 0 = never pull (an absent image is an error at once).
    pull_timeout_s: float = 20.0
    kernel_uid: int = DEFAULT_KERNEL_UID
    kernel_gid: int = DEFAULT_KERNEL_GID
    publish_host: str = "127.0.0.1"

    def __post_init__(self) -> None:
        for name in ("kernel_uid", "kernel_gid"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_ID:
                raise ValueError(
                    f"docker runtime: {name} must be an integer from 1 to {MAX_ID}"
                    f" (a non-root user), received {value!r}"
                )
        forbidden = sorted(SECURITY_HOST_CONFIG_KEYS & set(self.host_config))
        if forbidden:
            raise ValueError(
                f"docker runtime: host_config must not set {forbidden}: expected other"
                f" HostConfig keys (such as ShmSize), received {sorted(self.host_config)}"
            )
        if not self.publish_host or self.publish_host in ("0.0.0.0", "::"):
            raise ValueError(
                "docker runtime: publish_host must be the address the app proxy"
                f" connects to (such as 127.0.0.1), received {self.publish_host!r}"
            )

    @property
    def user(self) -> str:
        """The container's ``User`` (and the terminal exec's): ``"uid:gid"``."""
        return f"{self.kernel_uid}:{self.kernel_gid}"


def gpu_device_request(
    device_ids: Sequence[str], *, driver: str = "nvidia", capabilities: Sequence[str] = ("gpu",)
) -> dict[str, Any]:
    """A Docker ``DeviceRequest`` for these GPUs (what the cuda plugin returns for a kernel).

    ``gpu_device_request(["GPU-1a2b", "GPU-3c4d"])`` ==
    ``{"Driver": "nvidia", "DeviceIDs": ["GPU-1a2b", "GPU-3c4d"], "Capabilities": [["gpu"]]}``
    """
    if not device_ids:
        raise ValueError("a GPU device request needs at least one device id")
    return {"Driver": driver, "DeviceIDs": list(device_ids), "Capabilities": [list(capabilities)]}


def _device_request(request: Mapping[str, Any]) -> dict[str, Any]:
    unknown = set(request) - _DEVICE_REQUEST_KEYS
    if unknown:
        raise ValueError(
            f"device request has unknown keys {sorted(unknown)}: expected some of "
            f"{sorted(_DEVICE_REQUEST_KEYS)}"
        )
    if "Count" in request and request.get("DeviceIDs"):
        raise ValueError("a device request takes Count or DeviceIDs, not both")
    return {key: request[key] for key in sorted(request)}


def container_config(
    spec: KernelSpec, scratch: ScratchDir, config: DockerRuntimeConfig
) -> dict[str, Any]:
    """The ``POST /containers/create`` body for ``spec`` (pure; see the module docstring)."""
    kernel_id = spec.kernel_id
    env = {
        **spec.env,
        KERNEL_ID_ENV: kernel_id,
        BACKENDAI_KERNEL_ID_ENV: kernel_id,
        RESOURCE_TXT_ENV: f"{config.config_target}/resource.txt",
    }
    env.setdefault("HOME", config.work_target)
    mounts: list[dict[str, Any]] = [
        {
            "Type": "bind",
            "Source": str(scratch.config_dir),
            "Target": config.config_target,
            "ReadOnly": True,
        },
        {
            "Type": "bind",
            "Source": str(scratch.work_dir),
            "Target": config.work_target,
            "ReadOnly": False,
        },
    ]
    mounts += [
        {"Type": "bind", "Source": m.source, "Target": m.target, "ReadOnly": m.read_only}
        for m in spec.mounts
    ]
    for folder in spec.folder_mounts:
        relative = folder.work_relative()
        if relative is None:
            check_target(folder.name, folder.kernel_path, [config.config_target])
            target = folder.kernel_path
        else:
            target = f"{config.work_target.rstrip('/')}/{relative}"
        mounts.append(
            {
                "Type": "bind",
                "Source": folder.host_path,
                "Target": target,
                "ReadOnly": folder.read_only,
            }
        )
    host_config: dict[str, Any] = {
        "Mounts": mounts,
        "Privileged": False,
        "CapDrop": ["ALL"],
        "SecurityOpt": ["no-new-privileges:true"],
    }
    limits = spec.limits
    if limits.cpu_count is not None:
        host_config["NanoCpus"] = int(limits.cpu_count * 1_000_000_000)
    if limits.mem_bytes is not None:
        host_config["Memory"] = limits.mem_bytes
        host_config["MemorySwap"] = limits.mem_bytes  # no swap on top of the limit
    if limits.pids_max is not None:
        host_config["PidsLimit"] = limits.pids_max
    if limits.cpuset_cpus:
        host_config["CpusetCpus"] = ",".join(str(c) for c in sorted(set(limits.cpuset_cpus)))
    if spec.device_nodes:
        host_config["Devices"] = [
            {
                "PathOnHost": d.host_path,
                "PathInContainer": d.container_path,
                "CgroupPermissions": d.permissions,
            }
            for d in spec.device_nodes
        ]
    if spec.device_requests:
        host_config["DeviceRequests"] = [_device_request(r) for r in spec.device_requests]
    if spec.ipc_host:
        host_config["IpcMode"] = "host"
    if config.network_mode is not None:
        host_config["NetworkMode"] = config.network_mode
    exposed: dict[str, dict[str, Any]] = {}
    if spec.published_ports:
        # App services: container port -> the host port the agent gave it, on the
        # address the app proxy connects to only.
        bindings: dict[str, list[dict[str, str]]] = {}
        for container_port, host_port in spec.published_ports:
            key = f"{container_port}/tcp"
            exposed[key] = {}
            bindings.setdefault(key, []).append(
                {"HostIp": config.publish_host, "HostPort": str(host_port)}
            )
        host_config["PortBindings"] = bindings
    if config.use_init:
        host_config["Init"] = True
    host_config.update(config.host_config)
    command = spec.command if spec.command is not None else config.idle_command
    if spec.startup_command is not None:
        command = (*STARTUP_SHELL, spec.startup_command)
    body: dict[str, Any] = {
        "Image": spec.image,
        "User": config.user,
        "Cmd": list(command),
        "Env": [f"{key}={value}" for key, value in env.items()],
        "Labels": {**spec.labels, KERNEL_ID_LABEL: kernel_id, AGENT_ID_LABEL: config.agent_id},
        "WorkingDir": config.work_target,
        "Tty": False,
        "OpenStdin": False,
        "AttachStdin": False,
        "HostConfig": host_config,
    }
    if exposed:
        body["ExposedPorts"] = exposed
    return body


def repo_tags(images: Sequence[Mapping[str, Any]]) -> list[str]:
    """The names kernels can use, from ``GET /images/json``: every repo tag, sorted, once.

    Untagged images (``RepoTags`` null, empty or ``["<none>:<none>"]``) have no name
    a kernel could ask for and are left out.
    """
    tags: set[str] = set()
    for image in images:
        for tag in image.get("RepoTags") or ():
            if isinstance(tag, str) and tag and tag != "<none>:<none>":
                tags.add(tag)
    return sorted(tags)


def _exit_from_state(state: Mapping[str, Any], *, destroyed: bool) -> KernelExit:
    exit_code = state.get("ExitCode")
    oom_killed = state.get("OOMKilled") is True
    error = state.get("Error") or None
    if state.get("Status") == "created":
        error = error or "the container was created but never started"
        exit_code = None
    if destroyed:
        reason = ExitReason.DESTROYED
    elif oom_killed:
        reason = ExitReason.OOM_KILLED
    elif error:
        reason = ExitReason.FAILED
    else:
        reason = ExitReason.EXITED
    return KernelExit(
        reason=reason,
        exit_code=exit_code if isinstance(exit_code, int) else None,
        signal=exit_code - 128 if isinstance(exit_code, int) and exit_code > 128 else None,
        oom_killed=oom_killed,
        error=str(error) if error else None,
        finished_at=time.time(),
    )


def _is_running(state: Mapping[str, Any]) -> bool:
    """Running, paused or restarting; a container only ``created`` never ran (an agent
    died between create and start) and counts as failed."""
    return state.get("Status") in ("running", "paused", "restarting") or bool(state.get("Running"))


class DockerRuntime:
    """Kernels as containers.  Create it with :meth:`connect` (it checks the engine)."""

    def __init__(self, config: DockerRuntimeConfig, docker: aiodocker.Docker) -> None:
        self.config = config
        self._docker = docker
        self._root = Path(config.scratch_root).absolute()
        self._locks: dict[str, asyncio.Lock] = {}

    @classmethod
    async def connect(cls, config: DockerRuntimeConfig) -> DockerRuntime:
        """Open the engine connection; ``RuntimeUnavailable`` when no engine answers."""
        docker = aiodocker.Docker(url=config.docker_url)
        try:
            version = await docker.version()
        except (DockerError, OSError, ValueError) as e:
            await docker.close()
            where = config.docker_url or "the default Docker socket"
            raise RuntimeUnavailable(f"no Docker engine at {where}: {e}") from e
        log.info(
            "docker runtime: engine %s (API %s), scratch root %s",
            version.get("Version"),
            version.get("ApiVersion"),
            config.scratch_root,
        )
        return cls(config, docker)

    @property
    def name(self) -> str:
        return "docker"

    @property
    def scratch_root(self) -> Path:
        return self._root

    @property
    def docker(self) -> aiodocker.Docker:
        return self._docker

    def _lock(self, kernel_id: str) -> asyncio.Lock:
        return self._locks.setdefault(kernel_id, asyncio.Lock())

    def _container_name(self, kernel_id: str) -> str:
        return f"{self.config.container_prefix}{kernel_id}"

    def _scratch(self, kernel_id: str) -> ScratchDir:
        try:
            return ScratchDir(self._root, kernel_id)
        except ValueError as e:
            raise KernelNotFound(kernel_id) from e

    async def _inspect(self, kernel_id: str) -> dict[str, Any] | None:
        try:
            container = await self._docker.containers.get(self._container_name(kernel_id))
            return await container.show()
        except DockerError as e:
            if e.status == 404:
                return None
            raise

    # -- create ---------------------------------------------------------------------------
    async def create_kernel(self, spec: KernelSpec) -> KernelInfo:
        kernel_id = spec.kernel_id
        try:
            scratch = ScratchDir(self._root, kernel_id)
        except ValueError as e:
            raise KernelStartFailed(kernel_id, str(e)) from e
        async with self._lock(kernel_id):
            if scratch.exists():
                info = await self.get_kernel(kernel_id)
                if info.is_running:
                    log.info("kernel %s: already running (container %s)", kernel_id, info.cid)
                    return info
                raise KernelConflict(kernel_id, "has exited and its scratch dir was not cleaned up")
            log.info("kernel %s: preparing scratch dir %s", kernel_id, scratch.root)
            try:
                await asyncio.to_thread(self._prepare, scratch, spec)
            except (OSError, ValueError) as e:
                self._record(scratch, KernelExit(ExitReason.FAILED, error=str(e)))
                raise KernelStartFailed(kernel_id, str(e)) from e
            try:
                body = container_config(spec, scratch, self.config)
            except ValueError as e:
                self._record(scratch, KernelExit(ExitReason.FAILED, error=str(e)))
                raise KernelStartFailed(kernel_id, str(e)) from e
            try:
                await self.ensure_image(spec.image)
            except ImageUnavailable as e:
                self._record(scratch, KernelExit(ExitReason.FAILED, error=str(e)))
                log.error("kernel %s: %s", kernel_id, e)
                raise KernelStartFailed(kernel_id, str(e)) from e
            log.info("kernel %s: creating container from %s", kernel_id, spec.image)
            container: DockerContainer | None = None
            try:
                container = await self._docker.containers.create(
                    body, name=self._container_name(kernel_id)
                )
                await container.start()
                data = await container.show()
            except DockerError as e:
                error = f"docker: {e.message}"
                self._record(scratch, KernelExit(ExitReason.FAILED, error=error))
                if container is not None:
                    with contextlib.suppress(DockerError):
                        await container.delete(force=True, v=True)
                log.error("kernel %s: failed to start: %s", kernel_id, error)
                raise KernelStartFailed(kernel_id, error) from e
            container_id = str(data["Id"])
            await asyncio.to_thread(self._write_cid, scratch, container_id, spec.resource_txt)
            log.info("kernel %s: running as container %s", kernel_id, container_id[:12])
            return self._info_from_inspect(kernel_id, scratch, data)

    def _prepare(self, scratch: ScratchDir, spec: KernelSpec) -> None:
        # The plugins' files land under /home/config; the image's PATH is its own (no
        # config/bin on it: the mock nvidia-smi's wrapper names a host interpreter).
        new = scratch.prepare()
        scratch.write_resource_txt(spec.resource_txt, new=new)
        scratch.write_config_files(spec.config_files, new=new)
        if spec.agent_meta:
            scratch.write_json(scratch.meta_file, dict(spec.agent_meta), new=new)
        uid, gid = self.config.kernel_uid, self.config.kernel_gid
        give_work_dir(scratch.work_dir, uid, gid)
        for folder in spec.folder_mounts:
            give_to_kernel_user(check_host_folder(folder), uid, gid)
            relative = folder.work_relative()
            if relative is not None:  # the mount point, the kernel's, in its work folder
                target = scratch.work_dir / relative
                target.mkdir(parents=True, exist_ok=True)
                for made in (target, *target.parents):
                    if made == scratch.work_dir:
                        break
                    with contextlib.suppress(PermissionError):
                        os.chown(made, uid, gid)

    @staticmethod
    def _write_cid(scratch: ScratchDir, container_id: str, written: str | None = None) -> None:
        """Add ``CID=``: to the file as this agent wrote it (``written``: appended), or to
        the file as it is (a kernel found by the scan)."""
        with contextlib.suppress(OSError, UnicodeDecodeError):
            if written is not None:
                scratch.add_container_id(written, container_id)
                return
            text = scratch.read_resource_txt()
            updated = with_container_id(text, container_id)
            if updated != text:
                scratch.write_resource_txt(updated)

    def _record(self, scratch: ScratchDir, exit_: KernelExit) -> KernelExit:
        if exit_.finished_at is None:
            exit_ = replace(exit_, finished_at=time.time())
        with contextlib.suppress(OSError):
            scratch.write_json(scratch.exit_file, exit_.to_json())
        return exit_

    # -- inspect --------------------------------------------------------------------------
    def _info_from_inspect(
        self, kernel_id: str, scratch: ScratchDir | None, data: Mapping[str, Any]
    ) -> KernelInfo:
        state = data.get("State") or {}
        host_config = data.get("HostConfig") or {}
        limits = {
            key: f"docker {name}={host_config[name]}"
            for key, name in (
                ("cpu", "NanoCpus"),
                ("memory", "Memory"),
                ("pids", "PidsLimit"),
                ("cpuset", "CpusetCpus"),
            )
            if host_config.get(name)
        }
        pid = state.get("Pid")
        has_scratch = scratch is not None and scratch.exists()
        info = KernelInfo(
            kernel_id=kernel_id,
            runtime=self.name,
            state=KernelState.RUNNING,
            cid=str(data.get("Id")),
            scratch_dir=scratch.root if has_scratch and scratch is not None else None,
            pids=(pid,) if isinstance(pid, int) and pid > 0 else (),
            limits=limits,
        )
        if _is_running(state):
            return info
        destroyed = has_scratch and scratch is not None and _destroy_requested(scratch)
        exit_ = _exit_from_state(state, destroyed=destroyed)
        return replace(info, state=KernelState.EXITED, exit=exit_)

    def _info_without_container(self, scratch: ScratchDir) -> KernelInfo:
        """The container is gone: the exit record in the scratch dir, or ``LOST``."""
        data = read_json(scratch.exit_file)
        if data is None:
            log.warning(
                "kernel %s: container gone without an exit record (lost)", scratch.kernel_id
            )
            exit_ = self._record(
                scratch, KernelExit(ExitReason.LOST, error="the container disappeared")
            )
        else:
            exit_ = KernelExit.from_json(data)
        return KernelInfo(
            kernel_id=scratch.kernel_id,
            runtime=self.name,
            state=KernelState.EXITED,
            scratch_dir=scratch.root,
            exit=exit_,
        )

    async def get_kernel(self, kernel_id: str) -> KernelInfo:
        scratch = self._scratch(kernel_id)
        data = await self._inspect(kernel_id)
        if data is not None:
            if data.get("Config", {}).get("Labels", {}).get(AGENT_ID_LABEL) != self.config.agent_id:
                raise KernelNotFound(kernel_id)  # someone else's container with our name
            return self._info_from_inspect(kernel_id, scratch, data)
        if scratch.exists():
            return self._info_without_container(scratch)
        raise KernelNotFound(kernel_id)

    async def open_terminal(self, kernel_id: str, *, cols: int, rows: int) -> DockerTerminal:
        """``exec`` a shell with a tty in the kernel's container (see :mod:`.terminal`);
        ``KernelNotFound`` unless the kernel is running."""
        info = await self.get_kernel(kernel_id)
        if info.state is not KernelState.RUNNING:
            raise KernelNotFound(kernel_id)
        try:
            container = await self._docker.containers.get(self._container_name(kernel_id))
            return await DockerTerminal.start(
                container, cols=cols, rows=rows, user=self.config.user
            )
        except DockerError as e:
            if e.status in (404, 409):  # gone, or stopped since
                raise KernelNotFound(kernel_id) from None
            raise

    async def exec_in_kernel(self, kernel_id: str, argv: Sequence[str]) -> DockerExec:
        """``argv`` without a tty in the kernel's container, as the kernel's user (see
        :mod:`.execs`); ``KernelNotFound`` unless the kernel is running."""
        info = await self.get_kernel(kernel_id)
        if info.state is not KernelState.RUNNING:
            raise KernelNotFound(kernel_id)
        try:
            container = await self._docker.containers.get(self._container_name(kernel_id))
            return await DockerExec.start(container, argv, user=self.config.user)
        except DockerError as e:
            if e.status in (404, 409):  # gone, or stopped since
                raise KernelNotFound(kernel_id) from None
            raise

    def interpreter_argv(self, kernel_id: str, code: str) -> list[str]:
        """Run ``code`` with the image's Python (``python3``, else ``python``)."""
        return ["/bin/sh", "-c", PYTHON_SCRIPT, "sh", code]

    async def scan_kernels(self) -> list[KernelInfo]:
        filters = json.dumps(
            {"label": [KERNEL_ID_LABEL, f"{AGENT_ID_LABEL}={self.config.agent_id}"]}
        )
        containers = await self._docker.containers.list(all=True, filters=filters)
        by_kernel: dict[str, DockerContainer] = {}
        for listed in containers:
            kernel_id = (listed["Labels"] or {}).get(KERNEL_ID_LABEL)
            if isinstance(kernel_id, str):
                by_kernel[kernel_id] = listed
        kernel_ids = await asyncio.to_thread(list_kernel_ids, self._root)
        infos: list[KernelInfo] = []
        for kernel_id in sorted(set(kernel_ids) | set(by_kernel)):
            scratch = ScratchDir(self._root, kernel_id)
            found = by_kernel.get(kernel_id)
            if found is None:
                infos.append(self._info_without_container(scratch))
                continue
            try:
                data = await found.show()
            except DockerError as e:
                if e.status != 404:
                    raise
                infos.append(self._info_without_container(scratch))
                continue
            info = self._info_from_inspect(kernel_id, scratch, data)
            if info.is_orphan:
                log.warning("kernel %s: container without a scratch dir (orphan)", kernel_id)
            elif info.is_running and info.cid:
                await asyncio.to_thread(self._write_cid, scratch, info.cid)
            infos.append(info)
        return infos

    # -- wait / destroy -------------------------------------------------------------------
    async def wait_exit(self, kernel_id: str, *, timeout_s: float | None = None) -> KernelInfo:
        info = await self.get_kernel(kernel_id)
        if not info.is_running:
            return info
        container = self._docker.containers.container(self._container_name(kernel_id))
        try:
            await asyncio.wait_for(container.wait(), timeout_s)
        except TimeoutError:
            raise TimeoutError(f"kernel {kernel_id} still running after {timeout_s} s") from None
        except DockerError as e:
            if e.status != 404:
                raise
        return await self.get_kernel(kernel_id)

    async def destroy_kernel(self, kernel_id: str, *, grace_s: float | None = None) -> KernelInfo:
        grace = self.config.stop_grace_s if grace_s is None else grace_s
        async with self._lock(kernel_id):
            info = await self.get_kernel(kernel_id)
            scratch = self._scratch(kernel_id)
            has_scratch = scratch.exists()
            if has_scratch and info.is_running:
                scratch.write_json(
                    scratch.state_dir / "destroy.json", {"requested_at": time.time()}
                )
            container = self._docker.containers.container(self._container_name(kernel_id))
            if info.is_running:
                log.info("kernel %s: stopping container (grace %.1f s)", kernel_id, grace)
                with contextlib.suppress(DockerError):
                    await container.stop(t=math.ceil(grace))
            data = await self._inspect(kernel_id)
            if data is None:  # the container was already gone
                return info if not info.is_running else await self.get_kernel(kernel_id)
            final = self._info_from_inspect(kernel_id, scratch, data)
            if has_scratch:
                logs = await self._container_logs(container)
                await asyncio.to_thread(_append_log, scratch, logs)
                if final.exit is not None:
                    self._record(scratch, final.exit)
            with contextlib.suppress(DockerError):
                await container.delete(force=True, v=True)
            log.info(
                "kernel %s: container removed (%s, exit code %s)",
                kernel_id,
                final.exit.reason.value if final.exit else "?",
                final.exit.exit_code if final.exit else None,
            )
            return final

    async def _container_logs(self, container: DockerContainer) -> str:
        try:
            lines = await container.log(stdout=True, stderr=True)
        except DockerError:
            return ""
        return "".join(lines)

    # -- images -----------------------------------------------------------------------------
    async def ensure_image(self, image: str) -> bool:
        """Make sure the engine has ``image``: ``False`` when it had it, ``True`` when it
        was pulled now.  Raises :class:`ImageUnavailable` with the reason (the engine's
        pull error -- typically no registry reachable or no such repository --, the
        pull timeout, or pulling switched off)."""
        try:
            await self._docker.images.inspect(image)
            return False
        except DockerError as e:
            if e.status != 404:
                raise ImageUnavailable(image, f"the engine cannot inspect it: {e.message}") from e
        timeout_s = self.config.pull_timeout_s
        if timeout_s <= 0:
            raise ImageUnavailable(
                image, f"absent from the engine and pulling is off; run `docker pull {image}`"
            )
        log.info("image %s: absent from the engine; pulling (at most %ss)", image, timeout_s)
        try:
            await asyncio.wait_for(self._docker.images.pull(image), timeout=timeout_s)
        except DockerError as e:
            raise ImageUnavailable(
                image, f"absent from the engine and the pull failed: {e.message}"
            ) from e
        except TimeoutError:
            raise ImageUnavailable(
                image,
                f"absent from the engine and the pull took more than {timeout_s:g} s;"
                f" pull it on the agent host first (`docker pull {image}`)",
            ) from None
        log.info("image %s: pulled", image)
        return True

    async def list_images(self) -> list[str]:
        """The engine's images by repo tag (see :func:`repo_tags`); asked each call."""
        try:
            images = await self._docker.images.list()
        except (DockerError, OSError) as e:
            raise RuntimeUnavailable(f"cannot list the Docker engine's images: {e}") from e
        return repo_tags(images)

    # -- logs / cleanup -------------------------------------------------------------------
    async def get_logs(self, kernel_id: str, *, tail_bytes: int | None = None) -> str:
        if await self._inspect(kernel_id) is not None:
            container = self._docker.containers.container(self._container_name(kernel_id))
            try:
                text = "".join(await container.log(stdout=True, stderr=True))
            except DockerError:  # removed meanwhile (a destroy or an exit's cleanup), which
                text = None  # copied its logs to the scratch dir first: read them there
            if text is not None:
                if tail_bytes is not None:
                    text = text.encode()[-tail_bytes:].decode(errors="replace")
                return text
        scratch = self._scratch(kernel_id)
        if not scratch.exists():
            raise KernelNotFound(kernel_id)
        return await asyncio.to_thread(scratch.read_log_tail, tail_bytes)

    async def cleanup_kernel(self, kernel_id: str) -> None:
        async with self._lock(kernel_id):
            info = await self.get_kernel(kernel_id)
            if info.is_running:
                raise KernelConflict(kernel_id, "is still running; destroy it first")
            with contextlib.suppress(DockerError):
                await self._docker.containers.container(self._container_name(kernel_id)).delete(
                    force=True, v=True
                )
            await asyncio.to_thread(self._scratch(kernel_id).remove)
            log.info("kernel %s: scratch dir removed", kernel_id)
        self._locks.pop(kernel_id, None)

    async def close(self) -> None:
        """Close the engine connection (containers keep running)."""
        await self._docker.close()


def give_work_dir(work_dir: Path, uid: int, gid: int) -> None:
    """Make the kernel's work folder its user's (mode 0750), so that the non-root kernel
    can write there.  Needs root, or an agent running as that uid: otherwise an
    ``OSError`` that says which key to set."""
    try:
        os.chown(work_dir, uid, gid)
    except PermissionError as e:
        raise PermissionError(
            e.errno,
            f"cannot give the work folder {work_dir} to the kernel user {uid}:{gid}: the"
            f" agent runs as uid {os.geteuid()}, not root; run it as root or set"
            f" [container] kernel-uid = {os.geteuid()} (and kernel-gid)",
        ) from e
    os.chmod(work_dir, 0o750)


def _destroy_requested(scratch: ScratchDir) -> bool:
    return (scratch.state_dir / "destroy.json").exists()


def _append_log(scratch: ScratchDir, text: str) -> None:
    if text:
        with scratch.log_file.open("a", encoding="utf-8") as log_file:
            log_file.write(text)
