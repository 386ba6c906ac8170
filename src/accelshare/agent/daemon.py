"""Running an agent as a daemon: config store, service, RPC server, signals.

``accelshare server agent [--config agent.toml] [--dev]`` (and ``python -m
accelshare.agent``) call :func:`run_agent`::

    load agent.toml (discovery order of accelshare.config.agent_file)
    resolve the cluster secret (accelshare.agent.secret)
    open the config store ([etcd] / [config-store] / environment; scopes node = agent id,
        sgroup = scaling group), load the plugins, close the store again
    restart recovery, then serve the RPC on rpc-listen-addr and heartbeat the manager
    SIGTERM / SIGINT: stop serving, stop heartbeats, flush events briefly, exit 0;
        kernels keep running and the next agent re-adopts them (with
        ``end_kernels_on_exit``, as ``accelshare dev up`` runs its agents: they are
        destroyed first and the next agent reports them exited)

Exit codes: 0 after a signal, 1 for a configuration or start error (one line on stderr;
configuration errors name the file, key, expected and received value).  The RPC socket
is bound before the plugins load, so an address in use fails fast.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import signal
import socket
import sys
from collections.abc import Callable, Generator

import httpx
import uvicorn

from accelshare.accel import PluginError
from accelshare.bus import RedisBus, load_bus_settings
from accelshare.config import ConfigFileError, ConfigStoreError, open_config_store
from accelshare.config.agent_file import AgentConfig, AgentConfigError, load_agent_config
from accelshare.config.settings import load_config_store_settings

from .rpc import create_rpc_app
from .runtime import KernelRuntimeError
from .secret import resolve_cluster_secret
from .service import AgentService
from .state_files import AgentLockError

__all__ = ["AgentStartError", "run_agent", "serve_agent", "start_agent_service"]

log = logging.getLogger(__name__)


class AgentStartError(RuntimeError):
    pass


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling (the daemon installs its handlers and
    exits 0 instead of re-raising the signal)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


async def start_agent_service(
    config: AgentConfig,
    secret: str | None,
    *,
    transport: httpx.AsyncBaseTransport | None = None,
) -> AgentService:
    """Open the config store agent.toml names, start the agent, close the store again
    (plugins read their options once, at start).  ``transport``: tests' fake manager."""
    settings = load_config_store_settings(config.source_path)
    bus_settings = load_bus_settings(config.source_path)
    store = await open_config_store(
        settings, scaling_group=config.agent.scaling_group, node_id=config.agent.id
    )
    bus = None
    if bus_settings.redis is not None:
        bus = RedisBus(bus_settings.redis, client_name=f"accelshare-agent-{config.agent.id}")
        log.info("agent %s: stats and events on %s", config.agent.id, bus_settings.describe())
    try:
        service = AgentService(
            config,
            store=store,
            secret=secret,
            transport=transport,
            bus=bus,
            bus_interval_s=bus_settings.redis.stats_interval_s if bus_settings.redis else 5.0,
        )
        await service.start()
    except BaseException:
        if bus is not None:
            await bus.close()
        raise
    finally:
        await store.close()
    return service


async def serve_agent(
    config: AgentConfig,
    *,
    secret: str | None,
    on_ready: Callable[[AgentService], None] | None = None,
    end_kernels_on_exit: bool = False,
) -> int:
    """Run until SIGTERM/SIGINT; returns the exit code."""
    if secret is None:
        log.warning(
            "no cluster secret: the RPC on %s accepts any local caller (dev mode)",
            config.agent.rpc_listen_addr,
        )
    host, _, port = config.agent.rpc_listen_addr.rpartition(":")
    sock = _bind(host.strip("[]"), int(port))
    try:
        service = await start_agent_service(config, secret)
    except BaseException:
        sock.close()
        raise
    server = _Server(
        uvicorn.Config(
            create_rpc_app(service, secret=secret),
            log_config=None,
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=5,
        )
    )
    loop = asyncio.get_running_loop()

    def request_stop(signum: int) -> None:
        log.info("agent %s: %s received, stopping", config.agent.id, signal.Signals(signum).name)
        if server.should_exit:
            server.force_exit = True
        server.should_exit = True

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, request_stop, signum)
    try:
        serving = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started and not serving.done():
            await asyncio.sleep(0.01)
        if server.started:
            log.info("agent %s: RPC listening on %s", config.agent.id, config.agent.rpc_listen_addr)
            service.start_reporting()
            if on_ready is not None:
                on_ready(service)
        await serving
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
        sock.close()
        await service.stop(end_kernels=end_kernels_on_exit)
    return 0


def _bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound before anything else starts (a clear error if taken)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as e:
        sock.close()
        raise AgentStartError(f"cannot listen on {host}:{port} (rpc-listen-addr): {e}") from e
    sock.set_inheritable(False)
    return sock


def _raise_fd_limit(wanted: int = 65536) -> None:
    """Each watched kernel holds a pidfd: lift the soft RLIMIT_NOFILE towards the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


def run_agent(
    config_path: str | None = None, *, dev: bool = False, end_kernels_on_exit: bool = False
) -> int:
    """Load the configuration and run the agent (blocking); returns the exit code."""
    _raise_fd_limit()
    try:
        config = load_agent_config(config_path)
        secret = resolve_cluster_secret(config, dev=dev)
    except AgentConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    for key in config.unknown_keys:
        log.warning("%s: unknown key %r ignored", config.source_path or "agent.toml", key)
    try:
        return asyncio.run(
            serve_agent(config, secret=secret, end_kernels_on_exit=end_kernels_on_exit)
        )
    except (
        AgentConfigError,
        ConfigFileError,
        ConfigStoreError,
        PluginError,
        AgentLockError,
        KernelRuntimeError,
        AgentStartError,
    ) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
