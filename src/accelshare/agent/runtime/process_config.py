"""The settings of the ``process`` runtime (:class:`ProcessRuntimeConfig`).

Kept apart from :mod:`.process` so that the runtime's parts (:mod:`.process_launch`,
:mod:`.process_state`, :mod:`.process_ports`, :mod:`.process_join`) read it without
importing the runtime that composes them.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from accelshare.accel.types import SESSION_SHARED_DIR

from .environments import ProcessEnvironment, default_environments
from .sandbox import SandboxConfig

__all__ = ["NODE_SHARED_DIR", "ProcessRuntimeConfig"]

#: Agent-wide files every kernel may read (the mock GPUs' statistics), under the scratch
#: root: a sandbox binds this folder read-only, never the scratch root itself.
NODE_SHARED_DIR = SESSION_SHARED_DIR


@dataclass(frozen=True, slots=True)
class ProcessRuntimeConfig:
    """Settings of the process runtime (from ``agent.toml`` ``[container]``).

    * ``use_cgroups``: False forces the rlimit fallback (tests, unprivileged agents).
    * ``cgroup_parent``: relative to the agent's own cgroup unless absolute.
    * ``rlimit_memory``: which rlimit enforces memory when cgroups cannot.
    * ``sandbox``: run each kernel in a bubblewrap sandbox (:mod:`.sandbox`): its own
      namespaces, an unprivileged user, only its own folders; None (the default here;
      the agent turns it on where the host can): the kernel runs as the agent's user on
      the host's filesystem and network.
    * ``publish_host``: where a sandboxed kernel's published app ports listen
      (``KernelSpec.published_ports``: the agent relays each host port to the kernel's
      own port inside its network namespace).  Without a sandbox a kernel listens on
      the host's network itself and publishes nothing.
    * ``passthrough_env``: the agent's own variables a kernel inherits (nothing else
      leaks from the agent's environment).
    * ``exec_helper``: the agent's exec helper (:mod:`.exec_helper`): the supervisor
      starts each kernel's process with it (``posix_spawn``, no Python in the kernel's
      process); None: a forked Python child.  (A sandbox's ``drop`` is
      :attr:`SandboxConfig.exec_helper`.)
    """

    scratch_root: Path
    environments: Mapping[str, ProcessEnvironment] = field(default_factory=default_environments)
    use_cgroups: bool = True
    cgroup_parent: str = "accelshare"
    rlimit_memory: Literal["data", "as"] = "data"
    sandbox: SandboxConfig | None = None
    # Sandboxed kernels' app ports are relayed from this host address (the one the app
    # proxy connects to) into their network namespaces (:mod:`.netns_forward`).
    publish_host: str = "127.0.0.1"
    stop_grace_s: float = 5.0
    start_timeout_s: float = 10.0
    kill_timeout_s: float = 10.0
    poll_interval_s: float = 0.02
    passthrough_env: tuple[str, ...] = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TERM")
    launcher_python: str = sys.executable
    # Keep this many launchers started ahead (interpreter up, modules imported), each
    # waiting for a launch file on stdin: a create then skips the ~20 ms Python start.
    # Two cover back-to-back creates (the one used is replaced at once, and needs that
    # long to start).  0 (default) starts a launcher per create; the agent uses 2 and
    # calls close() to stop the spares.
    prespawn_launchers: int = 0
    # One launcher kept up as a fork server (:mod:`.forkserver`): a create forks it
    # instead of starting an interpreter (~1 ms instead of 10-25 ms of CPU).  Spare
    # launchers are not started while it serves; a fresh launcher is the fallback.
    fork_server: bool = False
    exec_helper: Path | None = None
