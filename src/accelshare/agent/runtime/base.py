"""What every kernel runtime takes and returns, and the protocol the agent core calls.

The agent core allocates a kernel's resources, renders its ``resource.txt`` and the
plugins' environment/devices, and hands one :class:`KernelSpec` to a runtime::

    runtime = ProcessRuntime(ProcessRuntimeConfig(scratch_root=Path("./scratch")))
    info = await runtime.create_kernel(KernelSpec(
        kernel_id="k-1", image="python", command=("-c", "print('hi')"),
        env={"BACKENDAI_MOCK_CUDA_DEVICES": "..."}, resource_txt=text,
        limits=ResourceLimits(cpu_count=Decimal(1), mem_bytes=2 << 30),
    ))
    info.state is KernelState.RUNNING
    await runtime.wait_exit("k-1")          # -> KernelInfo with .exit filled
    await runtime.destroy_kernel("k-1")     # SIGTERM, grace period, SIGKILL
    await runtime.scan_kernels()            # after a restart: every kernel, live or exited

Runtimes keep their truth on disk (the scratch dir) or in the engine (docker), never
only in memory, so a new runtime object after an agent restart sees the same kernels.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from .folder_mounts import FolderMount

__all__ = [
    "CONFIG_BIN_DIR",
    "STARTUP_SHELL",
    "ConfigFileLike",
    "DeviceNodeLike",
    "ExitReason",
    "ImageSource",
    "KernelExit",
    "KernelInfo",
    "KernelRuntime",
    "KernelSpec",
    "KernelState",
    "MountLike",
    "ResourceLimits",
]

KERNEL_ID_ENV = "ACCELSHARE_KERNEL_ID"
BACKENDAI_KERNEL_ID_ENV = "BACKENDAI_KERNEL_ID"
RESOURCE_TXT_ENV = "ACCELSHARE_RESOURCE_TXT"
KERNEL_ID_LABEL = "ai.accelshare.kernel-id"
AGENT_ID_LABEL = "ai.accelshare.agent-id"
CONFIG_BIN_DIR = "bin"
"""Plugins' executables live in ``config/bin``; the process runtime puts it first on PATH."""
STARTUP_SHELL = ("/bin/sh", "-c")
"""What runs a batch session's startup command, in every runtime and environment:
``/bin/sh -c <startup_command>``, as Backend.AI runs it."""


class KernelState(enum.StrEnum):
    RUNNING = "running"
    EXITED = "exited"


class ExitReason(enum.StrEnum):
    EXITED = "exited"  # the command ended by itself (exit_code tells how)
    KILLED = "killed"  # a signal nobody in accelshare sent
    OOM_KILLED = "oom-killed"  # the kernel went over its memory limit
    DESTROYED = "destroyed"  # destroy_kernel stopped it
    FAILED = "failed"  # it never started (bad command, limits that cannot be applied...)
    LOST = "lost"  # it ended while nothing could record how (exit code unknown)


@dataclass(frozen=True, slots=True)
class ResourceLimits:
    """Limits a runtime enforces (through cgroups, rlimits or the container engine).

    ``cpu_count`` is CPU *time* in cores (1.5 = one and a half cores' worth per period);
    ``cpuset_cpus`` pins the kernel to these core ids (the cpu plugin's devices).
    None / empty means "no limit".
    """

    cpu_count: Decimal | None = None
    cpuset_cpus: tuple[int, ...] = ()
    mem_bytes: int | None = None
    pids_max: int | None = None


class DeviceNodeLike(Protocol):
    """A host device node to pass into a container (``accelshare.accel.types.DeviceNode``)."""

    @property
    def host_path(self) -> str: ...
    @property
    def container_path(self) -> str: ...
    @property
    def permissions(self) -> str: ...


class ConfigFileLike(Protocol):
    """A file for the kernel's config dir (``accelshare.accel.types.ConfigFile``)."""

    @property
    def path(self) -> str: ...
    @property
    def text(self) -> str: ...
    @property
    def executable(self) -> bool: ...


class MountLike(Protocol):
    """A bind mount a plugin asks for (``accelshare.accel.types.Mount``)."""

    @property
    def source(self) -> str: ...
    @property
    def target(self) -> str: ...
    @property
    def read_only(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class KernelSpec:
    """Everything a runtime needs to start one kernel.

    * ``image``: process runtime: the name of a configured environment (``python``,
      ``shell``); docker runtime: an image reference.
    * ``command``: argv appended to the environment's command prefix (process) or the
      container command (docker); None keeps the kernel running until destroyed.
    * ``startup_command``: a batch session's command line, as one string, instead of
      ``command`` (giving both is an error): every runtime runs it as
      ``/bin/sh -c <startup_command>`` (:data:`STARTUP_SHELL`), as Backend.AI does,
      in the kernel's working directory (process: the environment's ``work-dir``;
      docker: the container's work dir) with the kernel's environment (``env``, the
      session's ``environ`` included; process: the environment's bin dir first on
      ``PATH``, so ``python`` is the environment's interpreter).  Its exit code is the
      kernel's.
    * ``env``: the plugins' environment variables plus anything the agent adds; the
      runtime adds the kernel id and ``resource.txt`` path on top.
    * ``resource_txt``: the rendered file (without ``CID``; the runtime appends it).
    * ``config_files``: the plugins' files, written into the config dir next to
      ``resource.txt`` (process runtime: ``config/bin`` goes first on the kernel's PATH
      when any file lies there; docker: they appear under ``/home/config``).
    * ``device_nodes``, ``mounts``, ``device_requests``: as the plugins return them
      (``device_requests`` entries in Docker's ``DeviceRequests`` shape).  Docker passes
      them to the engine; a sandboxed process kernel gets the device nodes and mounts
      bound, and the NVIDIA device nodes when it has device requests; an unsandboxed one
      sees the host's devices anyway.
    * ``folder_mounts``: storage folders (:mod:`.folder_mounts`): docker binds them at
      their ``kernel_path``; a sandboxed process kernel gets them bound, ``/home/work/<x>``
      at ``<work dir>/<x>``; an unsandboxed one gets ``rw`` folders under ``/home/work``
      as symlinks in its work dir and refuses the others.
    * ``ipc_host``: the host's IPC namespace (MPS clients need it): docker's ``IpcMode``;
      a sandboxed process kernel then keeps the host's IPC namespace.
    * ``agent_meta``: the agent's record of the kernel (session id, image, owner, labels,
      created_at, app ports), kept with the kernel's state for a restarted agent
      (:func:`accelshare.agent.state_files.read_kernel_meta`): the process runtime puts it
      in ``state/launch.json`` (``agent``), docker writes ``state/agent.json``; empty:
      nothing is kept.
    """

    kernel_id: str
    image: str
    resource_txt: str
    command: tuple[str, ...] | None = None
    config_files: tuple[ConfigFileLike, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    limits: ResourceLimits = field(default_factory=ResourceLimits)
    device_nodes: tuple[DeviceNodeLike, ...] = ()
    mounts: tuple[MountLike, ...] = ()
    folder_mounts: tuple[FolderMount, ...] = ()
    device_requests: tuple[Mapping[str, Any], ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    startup_command: str | None = None
    published_ports: tuple[tuple[int, int], ...] = ()
    ipc_host: bool = False
    agent_meta: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.command is not None and self.startup_command is not None:
            raise ValueError("a kernel takes a command or a startup command, not both")


@dataclass(frozen=True, slots=True)
class KernelExit:
    """How a kernel ended.

    ``exit_code`` follows Docker's convention: the command's status, or 128 + N when a
    signal N killed it (137 for SIGKILL); None when unknown (``LOST``, ``FAILED``).
    """

    reason: ExitReason
    exit_code: int | None = None
    signal: int | None = None
    oom_killed: bool = False
    error: str | None = None
    finished_at: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "reason": self.reason.value,
            "exit_code": self.exit_code,
            "signal": self.signal,
            "oom_killed": self.oom_killed,
            "error": self.error,
            "finished_at": self.finished_at,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> KernelExit:
        """Tolerant of missing keys and junk (the file may come from an older agent)."""
        try:
            reason = ExitReason(data.get("reason", ExitReason.EXITED))
        except ValueError:
            reason = ExitReason.EXITED
        exit_code = data.get("exit_code")
        signal = data.get("signal")
        finished_at = data.get("finished_at")
        error = data.get("error")
        return cls(
            reason=reason,
            exit_code=exit_code if isinstance(exit_code, int) else None,
            signal=signal if isinstance(signal, int) else None,
            oom_killed=data.get("oom_killed") is True,
            error=error if isinstance(error, str) else None,
            finished_at=float(finished_at) if isinstance(finished_at, int | float) else None,
        )


@dataclass(frozen=True, slots=True)
class KernelInfo:
    """A runtime's view of one kernel.

    ``cid`` is what ``resource.txt`` records as ``CID``: the container id (docker) or
    the kernel's process id (process).  ``scratch_dir`` is None for an *orphan*: a live
    process/container carrying an accelshare kernel label whose scratch dir is gone.
    ``limits`` says how each limit is enforced (``{"memory": "cgroup-v1", ...}``).
    """

    kernel_id: str
    runtime: str
    state: KernelState
    cid: str | None = None
    scratch_dir: Path | None = None
    exit: KernelExit | None = None
    pids: tuple[int, ...] = ()
    limits: Mapping[str, str] = field(default_factory=dict)

    @property
    def is_running(self) -> bool:
        return self.state is KernelState.RUNNING

    @property
    def is_orphan(self) -> bool:
        return self.scratch_dir is None


@runtime_checkable
class KernelRuntime(Protocol):
    """The calls the agent core makes.  All are safe to retry.

    * ``create_kernel``: idempotent by kernel id (a running kernel with that id is
      returned as is); raises ``KernelStartFailed`` when it cannot start and
      ``KernelConflict`` when the id belongs to an exited kernel not yet cleaned up.
    * ``destroy_kernel``: SIGTERM (docker: stop), then SIGKILL after ``grace_s``;
      returns the exited kernel; destroying an exited kernel just returns it.
    * ``scan_kernels``: every kernel this runtime can find (scratch dirs + live
      processes/containers with accelshare labels), each exactly once.
    * ``cleanup_kernel``: removes what is left (scratch dir, cgroup, container) of an
      exited kernel.
    """

    @property
    def name(self) -> str: ...

    @property
    def scratch_root(self) -> Path: ...

    async def create_kernel(self, spec: KernelSpec) -> KernelInfo: ...

    async def destroy_kernel(
        self, kernel_id: str, *, grace_s: float | None = None
    ) -> KernelInfo: ...

    async def get_kernel(self, kernel_id: str) -> KernelInfo: ...

    async def wait_exit(self, kernel_id: str, *, timeout_s: float | None = None) -> KernelInfo: ...

    async def scan_kernels(self) -> list[KernelInfo]: ...

    async def get_logs(self, kernel_id: str, *, tail_bytes: int | None = None) -> str: ...

    async def cleanup_kernel(self, kernel_id: str) -> None: ...

    async def close(self) -> None: ...


@runtime_checkable
class ImageSource(Protocol):
    """A runtime that can say which images a kernel may name (for the heartbeat).

    ``list_images``: docker -- the repo tags the engine holds (re-read on each call);
    process -- the configured environment names.  Raises ``RuntimeUnavailable`` when
    it cannot tell (the agent then keeps reporting the last list it had).
    """

    async def list_images(self) -> list[str]: ...
