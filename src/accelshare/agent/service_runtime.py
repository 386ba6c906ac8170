"""Building the agent's kernel runtime from ``agent.toml`` ``[container]``.

The docker runtime, or the process runtime with its environments and, where the host
can, its sandbox (:mod:`.runtime.sandbox`).  Without a sandbox the agent says loudly
that sessions are not isolated, and the reason is returned so that the agent holds one
user's sessions at a time.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
from pathlib import Path

from accelshare.config.agent_file import AgentConfig, AgentConfigError

from .ports import proxy_address
from .runtime import (
    EnvironmentConfigError,
    KernelRuntime,
    ProcessEnvironment,
    ProcessRuntime,
    ProcessRuntimeConfig,
    RuntimeUnavailable,
    default_environments,
)
from .runtime.exec_helper import prepare_exec_helper
from .runtime.sandbox import SandboxConfig, hidden_defaults, write_syscall_filter
from .runtime.sandbox import probe as probe_sandbox
from .stats import rpc_url_of

__all__ = ["environments", "make_runtime", "sandbox_config"]

log = logging.getLogger(__name__)


def environments(config: AgentConfig) -> dict[str, ProcessEnvironment]:
    """The process runtime's environments: the defaults and ``[container.environments]``."""
    found = default_environments()
    source = str(config.source_path or "agent.toml")
    for name, table in config.container.environments.items():
        try:
            found[name] = ProcessEnvironment.from_config(name, table)
        except EnvironmentConfigError as e:
            raise AgentConfigError(
                source, f"container.environments.{name}.{e.key}", e.expected, e.received
            ) from None
    return found


async def make_runtime(config: AgentConfig, scratch_root: Path) -> tuple[KernelRuntime, str | None]:
    """The runtime ``[container] runtime`` names, and why its sessions are not sandboxed
    (None: sandboxed, or the docker runtime)."""
    container = config.container
    if container.runtime == "docker":
        from .runtime.docker import DockerRuntime, DockerRuntimeConfig

        try:
            publish_host = await asyncio.to_thread(proxy_address, rpc_url_of(config))
        except ValueError as e:
            raise RuntimeUnavailable(f"docker runtime: {e}") from e
        docker = await DockerRuntime.connect(
            DockerRuntimeConfig(
                scratch_root=scratch_root,
                docker_url=container.docker_url,
                agent_id=config.agent.id,
                stop_grace_s=container.stop_grace_s,
                network_mode=container.docker_network,
                pull_timeout_s=container.docker_pull_timeout_s,
                kernel_uid=container.kernel_uid,
                kernel_gid=container.kernel_gid,
                publish_host=publish_host,
            )
        )
        return docker, None
    # The kernels' exec helper (compiled once per source; None: the Python way, logged)
    helper = (await asyncio.to_thread(prepare_exec_helper, scratch_root)).path
    sandbox, unsandboxed = await sandbox_config(config, scratch_root, exec_helper=helper)
    publish_host = "127.0.0.1"
    if sandbox is not None:
        try:
            publish_host = await asyncio.to_thread(proxy_address, rpc_url_of(config))
        except ValueError as e:
            raise RuntimeUnavailable(f"process runtime (sandboxed): {e}") from e
    runtime = ProcessRuntime(
        ProcessRuntimeConfig(
            scratch_root=scratch_root,
            environments=environments(config),
            use_cgroups=container.use_cgroups,
            cgroup_parent=container.cgroup_parent,
            rlimit_memory=container.rlimit_memory,
            sandbox=sandbox,
            publish_host=publish_host,
            stop_grace_s=container.stop_grace_s,
            prespawn_launchers=container.prespawn_launchers,
            fork_server=container.launcher_fork_server,
            exec_helper=helper,
        )
    )
    return runtime, unsandboxed


async def sandbox_config(
    config: AgentConfig, scratch_root: Path, *, exec_helper: Path | None = None
) -> tuple[SandboxConfig | None, str | None]:
    """The process runtime's sandbox (``[container] sandbox``), or None and why: then
    the agent says loudly that sessions are not isolated and holds one user's only.
    ``exec_helper``: the kernels change user with it rather than setpriv; a sandbox
    that cannot run it falls back to setpriv (logged)."""
    container = config.container
    if container.sandbox == "off":
        why = "[container] sandbox = 'off'"
    else:
        hidden = [config.source_path, config.agent.cluster_secret_file]
        syscall_filter = None
        problem = None
        if container.sandbox_syscall_filter:
            syscall_filter = scratch_root / ".sandbox" / "seccomp.bpf"
            try:
                await asyncio.to_thread(write_syscall_filter, syscall_filter)
            except OSError as e:
                if container.sandbox == "required":
                    problem = f"[container] sandbox-syscall-filter: {e}"
                else:  # a sandbox without the filter beats none at all
                    log.warning(
                        "SANDBOXES HAVE NO SYSCALL FILTER: %s (set [container]"
                        " sandbox-syscall-filter = false to silence this)",
                        e,
                    )
                    syscall_filter = None
        sandbox = SandboxConfig(
            uid=container.kernel_uid,
            gid=container.kernel_gid,
            network=container.sandbox_network,
            ro_paths=tuple(container.sandbox_ro_paths),
            hidden=hidden_defaults(p for p in hidden if p is not None),
            syscall_filter=syscall_filter,
            exec_helper=exec_helper,
        )
        if problem is None:
            problem = await asyncio.to_thread(probe_sandbox, sandbox)
            if problem is not None and exec_helper is not None:
                without = dataclasses.replace(sandbox, exec_helper=None)
                if await asyncio.to_thread(probe_sandbox, without) is None:
                    log.warning(
                        "kernel exec: the exec helper cannot change user in a sandbox (%s);"
                        " kernels change user with setpriv",
                        problem,
                    )
                    sandbox, problem = without, None
        if problem is None:
            uid, gid = sandbox.effective_ids()
            log.info(
                "sessions are sandboxed (bubblewrap): uid %d, gid %d, network %s,"
                " syscall filter %s%s",
                uid,
                gid,
                sandbox.network,
                "on" if syscall_filter else "off",
                ""
                if os.geteuid() == 0
                else " (the agent is not root: kernels run as its own user, in a user namespace)",
            )
            return sandbox, None
        if container.sandbox == "required":
            raise RuntimeUnavailable(f"[container] sandbox = 'required', but {problem}")
        why = problem
    log.warning(
        "SESSIONS ARE NOT SANDBOXED: %s. Kernels run as the agent's user (uid %d) and see"
        " the host's files and network; this agent accepts one user's sessions at a"
        " time. Install bubblewrap (apt-get install bubblewrap) and run the agent as"
        " root to isolate sessions (docs/agent-runtimes.md).",
        why,
        os.geteuid(),
    )
    return None, why
