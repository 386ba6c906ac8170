"""Kernel runtimes: ``process`` (default, no daemon) and ``docker`` (aiodocker).

The agent core talks to either through :class:`KernelRuntime`; see :mod:`.base` for
the data it passes (:class:`KernelSpec`) and gets back (:class:`KernelInfo`).  The
docker runtime is imported lazily (``accelshare.agent.runtime.docker``) so that the
process runtime works without aiodocker installed.
"""

from .base import (
    AGENT_ID_LABEL,
    BACKENDAI_KERNEL_ID_ENV,
    KERNEL_ID_ENV,
    KERNEL_ID_LABEL,
    RESOURCE_TXT_ENV,
    STARTUP_SHELL,
    DeviceNodeLike,
    ExitReason,
    ImageSource,
    KernelExit,
    KernelInfo,
    KernelRuntime,
    KernelSpec,
    KernelState,
    MountLike,
    ResourceLimits,
)
from .environments import EnvironmentConfigError, ProcessEnvironment, default_environments
from .errors import (
    ImageUnavailable,
    KernelConflict,
    KernelNotFound,
    KernelRuntimeError,
    KernelStartFailed,
    RuntimeUnavailable,
    UnknownEnvironment,
)
from .process import ProcessRuntime, ProcessRuntimeConfig

__all__ = [
    "AGENT_ID_LABEL",
    "BACKENDAI_KERNEL_ID_ENV",
    "KERNEL_ID_ENV",
    "KERNEL_ID_LABEL",
    "RESOURCE_TXT_ENV",
    "STARTUP_SHELL",
    "DeviceNodeLike",
    "EnvironmentConfigError",
    "ExitReason",
    "ImageSource",
    "ImageUnavailable",
    "KernelConflict",
    "KernelExit",
    "KernelInfo",
    "KernelNotFound",
    "KernelRuntime",
    "KernelRuntimeError",
    "KernelSpec",
    "KernelStartFailed",
    "KernelState",
    "MountLike",
    "ProcessEnvironment",
    "ProcessRuntime",
    "ProcessRuntimeConfig",
    "ResourceLimits",
    "RuntimeUnavailable",
    "UnknownEnvironment",
    "default_environments",
]
