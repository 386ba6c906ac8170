"""Where the cluster secret comes from, and when the agent may run without one.

Sources, first found wins::

    $ACCELSHARE_CLUSTER_SECRET           (environment: handy for containers and systemd)
    [agent] cluster-secret-file = PATH   (relative to agent.toml's folder; trailing newline
                                          stripped; keep it mode 0600)
    [agent] cluster-secret = "..."

Setting both ``cluster-secret`` and ``cluster-secret-file`` is an error.  Without any
secret the agent refuses to start, unless ``[agent] dev-mode = true`` (or ``--dev``)
*and* ``rpc-listen-addr`` is a loopback address: then the RPC is open to local processes
only and heartbeats carry no secret, and a warning says so at start.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from pathlib import Path

from accelshare.config.agent_file import AgentConfig, AgentConfigError

__all__ = ["ENV_CLUSTER_SECRET", "SecretError", "is_loopback", "resolve_cluster_secret"]

ENV_CLUSTER_SECRET = "ACCELSHARE_CLUSTER_SECRET"
MIN_SECRET_LENGTH = 16


class SecretError(AgentConfigError):
    """A missing or unusable cluster secret (the message never contains the secret)."""


def is_loopback(host_port: str) -> bool:
    host = host_port.rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _checked(secret: str, source: str, key: str) -> str:
    secret = secret.strip()
    if len(secret) < MIN_SECRET_LENGTH:
        raise SecretError(
            source, key, f"a secret of at least {MIN_SECRET_LENGTH} characters", "(hidden)"
        )
    return secret


def resolve_cluster_secret(
    config: AgentConfig, *, dev: bool = False, env: Mapping[str, str] | None = None
) -> str | None:
    """The secret, or None in dev mode on loopback; raises :class:`SecretError` otherwise."""
    env = os.environ if env is None else env
    source = str(config.source_path or "agent.toml")
    agent = config.agent
    if agent.cluster_secret is not None and agent.cluster_secret_file is not None:
        raise SecretError(
            source,
            "agent.cluster-secret-file",
            "only one of 'cluster-secret' and 'cluster-secret-file'",
            "both",
        )
    from_env = env.get(ENV_CLUSTER_SECRET)
    if from_env:
        return _checked(from_env, "environment", ENV_CLUSTER_SECRET)
    if agent.cluster_secret_file is not None:
        path = agent.cluster_secret_file
        path = path if path.is_absolute() else config.config_dir / path
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as e:
            raise SecretError(
                source, "agent.cluster-secret-file", "a readable file", f"{path}: {e.strerror}"
            ) from None
        return _checked(text, str(path), "agent.cluster-secret-file")
    if agent.cluster_secret is not None:
        return _checked(agent.cluster_secret, source, "agent.cluster-secret")
    if (dev or agent.dev_mode) and is_loopback(agent.rpc_listen_addr):
        return None
    if dev or agent.dev_mode:
        raise SecretError(
            source,
            "agent.rpc-listen-addr",
            "a loopback address (127.0.0.1, ::1, localhost) to run without a cluster secret "
            "in dev mode",
            agent.rpc_listen_addr,
        )
    raise SecretError(
        source,
        "agent.cluster-secret",
        f"a cluster secret (cluster-secret, cluster-secret-file or ${ENV_CLUSTER_SECRET}); "
        "or dev-mode = true with a loopback rpc-listen-addr",
    )
