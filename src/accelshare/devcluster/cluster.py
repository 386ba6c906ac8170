"""A local cluster: one manager and N agents as child processes on this machine.

::

    cluster = LocalCluster(DevClusterOptions(data_dir=Path("/tmp/x"), port=18081))
    cluster.start()              # files, config store, manager, agents; waits until usable
    cluster.client_env()         # {"ACCELSHARE_ENDPOINT": ..., "ACCELSHARE_CONFIG_STORE": ...}
    cluster.stop()               # agents (they end their kernels), then the manager;
                                 # SIGKILL after the grace

Start order and why:

1. the data dir, a lock (one ``dev up`` per data dir), the cluster secret (0600,
   created once), the mock accelerator file (copied), manager.toml and agent.toml;
2. the accelerator options in the shared config store (``allocation_mode`` etc.) —
   before any agent starts, since plugins read them once at start;
3. the storage proxy (``server storage``, one volume ``local:volume1`` under the data
   dir, its addresses and secret in the config store under ``volumes/``); wait for its
   ``GET /v1/health``;
4. the manager; wait for ``GET /health``; read the superadmin's keys from the
   credentials file its bootstrap wrote; write ``client.env`` (with the ``PATH`` of
   this Python's ``accelshare`` and the location of the config store);
5. the agents (``server agent --end-kernels-on-exit``); wait until each has sent a
   heartbeat since this start (``GET /agents``).

Synchronous (it blocks while waiting); call it from a thread inside an event loop.

Nothing outlives a stop: the agents destroy their kernels when they get SIGTERM, and
what is left of kernels under the data dir afterwards (those of an agent that had to be
SIGKILLed) is killed.  The state stays: the next start on the same data dir finds the
database, keys and configuration again, and its agents report the kernels that were
running as exited, so those sessions become TERMINATED; PENDING sessions stay queued.
``stop(destroy_sessions=True)`` destroys the sessions through the manager first
(throwaway clusters: tests, the demo, benchmarks).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import secrets
import shutil
import socket
import threading
import time
import tomllib
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import IO, Self

import httpx

from accelshare.accel.mock.config import MockConfig, load_mock_config
from accelshare.accel.options import PLUGIN_CONFIG_PREFIX
from accelshare.client.auth import KeypairAuth
from accelshare.client.config import ClientConfig
from accelshare.client.sync import SyncAccelshareClient
from accelshare.config import (
    ConfigStoreSettings,
    config_store_env,
    load_config_store_settings,
    open_config_store,
)
from accelshare.devcluster.catalogue import (
    DemoImage,
    EnvBuildError,
    PipEnvironment,
    build_environments,
    build_pip_environment,
    built_environments,
    demo_images,
    environment_tables,
    envs_folder,
    jupyter_environment,
    pip_image,
    register,
)
from accelshare.manager.bootstrap import AdminCredentials, BootstrapError

from .layout import (
    DEFAULT_MOCK_CONFIG,
    HOST,
    ClusterLayout,
    DevClusterOptions,
    accelerator_options,
    agent_ids,
    check_accelerator_options,
    cli_bin_dir,
    render_agent_toml,
    render_client_env,
    render_manager_toml,
    render_storage_toml,
    storage_store_keys,
)
from .processes import Daemon, child_env, reap_kernels, stop_daemons

__all__ = ["ClusterStartError", "LocalCluster", "free_port", "resolve_mock_config"]

Progress = Callable[[str], None]


class ClusterStartError(RuntimeError):
    """The cluster could not start; the message says why and what to do."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def resolve_mock_config(path: Path | None, *, cwd: Path | None = None) -> Path:
    """An explicit path must exist; the default is looked up in the working directory,
    then in the source checkout this package runs from."""
    if path is not None:
        if not path.is_file():
            raise ClusterStartError(f"--mock-config {path}: no such file")
        return path.resolve()
    here = (cwd or Path.cwd()) / DEFAULT_MOCK_CONFIG
    checkout = Path(__file__).resolve().parents[3] / DEFAULT_MOCK_CONFIG
    for candidate in (here, checkout):
        if candidate.is_file():
            return candidate.resolve()
    raise ClusterStartError(
        f"cannot find {DEFAULT_MOCK_CONFIG} (looked in {here.parent} and {checkout.parent});"
        " pass --mock-config FILE (a mock-accelerator.toml)"
    )


class LocalCluster:
    def __init__(self, options: DevClusterOptions, *, progress: Progress | None = None) -> None:
        self.options = options
        self.layout = ClusterLayout.of(options.data_dir)
        self.agent_ids = agent_ids(options.agents)
        self.manager: Daemon | None = None
        self.agents: list[Daemon] = []
        self.storage: Daemon | None = None
        self.storage_ports: tuple[int, int] | None = None  # (manager-facing, client-facing)
        self.credentials: AdminCredentials | None = None
        self.mock: MockConfig | None = None
        self.store_settings: ConfigStoreSettings | None = None
        self.images: list[DemoImage] = []  # the demo catalogue (set by _prepare)
        # built with pip after the start (environment, its catalogue entry)
        self.pip_images: list[tuple[PipEnvironment, DemoImage]] = []
        self.env_builder: threading.Thread | None = None
        self._stop_builds = threading.Event()
        self.env_build_errors: list[str] = []
        self._progress = progress or (lambda _msg: None)
        self._lock: IO[str] | None = None
        self._env = child_env()
        self._storage_secret = ""
        self.reaped = 0  # processes killed under the data dir by the last stop()

    @property
    def endpoint(self) -> str:
        return self.options.endpoint

    def client_config(self) -> ClientConfig:
        if self.credentials is None:
            raise ClusterStartError("the cluster has not started")
        return ClientConfig(self.endpoint, self.credentials.access_key, self.credentials.secret_key)

    def client_env(self) -> dict[str, str]:
        """What client.env exports: the endpoint, the superadmin's keypair and the
        variables that select the cluster's configuration store (``mgr etcd``)."""
        config = self.client_config()
        return {
            "ACCELSHARE_ENDPOINT": config.endpoint,
            "ACCELSHARE_ACCESS_KEY": config.access_key,
            "ACCELSHARE_SECRET_KEY": config.secret_key,
            **self.store_env(),
        }

    def store_env(self) -> dict[str, str]:
        """The variables that select this cluster's configuration store (the one its
        manager.toml names: the embedded file, or an etcd address)."""
        if self.store_settings is None:
            raise ClusterStartError("the cluster has not started")
        return config_store_env(self.store_settings)

    # -- start ----------------------------------------------------------------------------
    def start(self, *, timeout_s: float = 90.0) -> None:
        deadline = time.monotonic() + timeout_s
        try:
            self._prepare()
            self._start_storage(deadline)
            self._start_manager(deadline)
            self._start_agents(deadline)
            self._register_images()
        except BaseException:
            self.stop()
            raise
        if self.pip_images:
            self.env_builder = threading.Thread(
                target=self._build_pip_images, name="env-builder", daemon=True
            )
            self.env_builder.start()

    def _build_pip_images(self) -> None:
        """Build the requirements environments, then register each one that built (the
        cluster runs meanwhile; a failure is logged and leaves the image out)."""
        for env, image in self.pip_images:
            try:
                build_pip_environment(
                    Path(image.prefix or ""), env, log=self._progress, cancel=self._stop_builds
                )
                self._wait_reported(image.ref)
                self._register(image)
            except (EnvBuildError, httpx.HTTPError, ClusterStartError) as e:
                self.env_build_errors.append(str(e))
                self._progress(f"environment {image.ref} left out: {e}")
            else:
                self._progress(f"environment {image.ref} is ready")

    def _prepare(self) -> None:
        options, layout = self.options, self.layout
        if options.agents < 1:
            raise ClusterStartError(f"--agents {options.agents}: at least one agent is needed")
        problem = check_accelerator_options(options)
        if problem is not None:
            raise ClusterStartError(problem)
        source = resolve_mock_config(options.mock_config)
        self.mock = load_mock_config(source)
        layout.root.mkdir(parents=True, exist_ok=True)
        layout.logs.mkdir(exist_ok=True)
        self._take_lock()
        if not _port_is_free(options.port):
            raise ClusterStartError(
                f"port {options.port} on {HOST} is in use (another `accelshare dev up`?);"
                " stop it or pass --port"
            )
        if source != layout.mock_config:
            shutil.copyfile(source, layout.mock_config)
        self._write_secret()
        self._write_storage_toml()
        layout.manager_toml.write_text(render_manager_toml(layout, options))
        for agent_id in self.agent_ids:
            layout.agent_dir(agent_id).mkdir(parents=True, exist_ok=True)
        self._progress("preparing the demo environments (demo-lib 1.0 and 2.0)")
        build_environments(layout.root)
        self.images = demo_images(layout.root, (self.mock.slot_name,))
        envs = envs_folder(layout.root, options.env_cache)
        jupyter = jupyter_environment()
        for built in built_environments(envs):  # `image build` ones: registered at start
            if built.ref != jupyter.ref:
                self.images.append(pip_image(envs, built))
        if options.jupyter:
            # its agent.toml table now; the agents report it once its venv exists
            self.pip_images.append((jupyter, pip_image(envs, jupyter, (self.mock.slot_name,))))
        asyncio.run(self._configure_store())

    def _take_lock(self) -> None:
        handle = self.layout.lock.open("a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            owner = handle.read().strip() or "?"
            handle.close()
            raise ClusterStartError(
                f"another `accelshare dev up` (pid {owner}) runs on {self.layout.root};"
                " stop it first or pass another --data-dir"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        self._lock = handle

    def _write_secret(self) -> None:
        path = self.layout.cluster_secret
        if not path.exists():
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as out:
                out.write(secrets.token_urlsafe(32) + "\n")
        os.chmod(path, 0o600)

    def _write_storage_toml(self) -> None:
        """storage.toml with the previous run's ports when they are free (the addresses
        in the config store and in tickets stay the same), else free ones."""
        layout = self.layout
        path = layout.storage_secret
        if not path.exists():
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as out:
                out.write(secrets.token_urlsafe(32) + "\n")
        os.chmod(path, 0o600)
        secret = path.read_text().strip()
        ports: list[int] = []
        with contextlib.suppress(OSError, ValueError, tomllib.TOMLDecodeError, KeyError):
            section = tomllib.loads(layout.storage_toml.read_text())["storage-proxy"]
            for key in ("manager-api", "client-api"):
                port = int(str(section[key]).rpartition(":")[2])
                if _port_is_free(port) and port not in ports:
                    ports.append(port)
        if len(ports) != 2:
            ports = [free_port()]
            while len(ports) < 2:
                port = free_port()
                if port not in ports:
                    ports.append(port)
        self.storage_ports = (ports[0], ports[1])
        layout.volume_dir().mkdir(parents=True, exist_ok=True)
        fd = os.open(layout.storage_toml, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(render_storage_toml(layout, ports[0], ports[1], secret, self.options.port))
        self._storage_secret = secret

    def _start_storage(self, deadline: float) -> None:
        assert self.storage_ports is not None
        manager_port, _ = self.storage_ports
        self._progress(f"starting the storage proxy on {HOST}:{manager_port}")
        self.storage = Daemon(
            "storage",
            ["server", "storage", "--config", str(self.layout.storage_toml)],
            log=self.layout.log("storage"),
            cwd=self.layout.root,
            env=self._env,
        )
        self.storage.start()
        with httpx.Client(base_url=f"http://{HOST}:{manager_port}", timeout=2.0) as http:
            while True:
                code = self.storage.exit_code()
                if code is not None:
                    raise self._fail(self.storage, f"the storage proxy exited with status {code}")
                with contextlib.suppress(httpx.HTTPError):
                    if http.get("/v1/health").status_code == 200:
                        return
                if time.monotonic() > deadline:
                    raise self._fail(self.storage, "the storage proxy did not start in time")
                time.sleep(0.1)

    async def _configure_store(self) -> None:
        assert self.mock is not None
        settings = load_config_store_settings(self.layout.manager_toml, env=self._env)
        self.store_settings = settings
        store = await open_config_store(settings)
        try:
            prefix = f"{PLUGIN_CONFIG_PREFIX}/{self.mock.slot_name}"
            for option, value in accelerator_options(self.options).items():
                if value is None:
                    await store.delete(f"{prefix}/{option}")
                else:
                    await store.put(f"{prefix}/{option}", value)
            assert self.storage_ports is not None
            for key, value in storage_store_keys(*self.storage_ports, self._storage_secret).items():
                await store.put(key, value)
        finally:
            await store.close()

    def _fail(self, daemon: Daemon, what: str) -> ClusterStartError:
        return ClusterStartError(f"{what} (log: {daemon.log}):\n{daemon.tail()}")

    def _start_manager(self, deadline: float) -> None:
        self._progress(f"starting the manager on {self.endpoint}")
        self.manager = Daemon(
            "manager",
            ["server", "manager", "--config", str(self.layout.manager_toml)],
            log=self.layout.log("manager"),
            cwd=self.layout.root,
            env=self._env,
        )
        self.manager.start()
        with httpx.Client(base_url=self.endpoint, timeout=2.0) as http:
            while True:
                code = self.manager.exit_code()
                if code is not None:
                    raise self._fail(self.manager, f"the manager exited with status {code}")
                with contextlib.suppress(httpx.HTTPError):
                    if http.get("/health").status_code == 200:
                        break
                if time.monotonic() > deadline:
                    raise self._fail(self.manager, "the manager did not become healthy in time")
                time.sleep(0.1)
        try:
            self.credentials = AdminCredentials.from_env_file(self.layout.credentials)
        except (OSError, BootstrapError) as e:
            raise ClusterStartError(
                f"cannot read the superadmin's keys from {self.layout.credentials}: {e}"
            ) from e
        self._write_client_env()

    def _write_client_env(self) -> None:
        config = self.client_config()
        path = self.layout.client_env
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(
                render_client_env(
                    config.endpoint,
                    config.access_key,
                    config.secret_key,
                    bin_dir=cli_bin_dir(),
                    store_env=self.store_env(),
                )
            )
        os.chmod(path, 0o600)

    def _start_agents(self, deadline: float) -> None:
        since = datetime.now().astimezone()
        for agent_id in self.agent_ids:
            toml = self.layout.agent_toml(agent_id)
            port = self._agent_port(toml)
            toml.write_text(
                render_agent_toml(
                    self.layout,
                    self.options,
                    agent_id,
                    port,
                    environment_tables([*self.images, *(i for _, i in self.pip_images)]),
                )
            )
            daemon = Daemon(
                agent_id,
                ["server", "agent", "--config", str(toml), "--end-kernels-on-exit"],
                log=self.layout.log(agent_id),
                cwd=self.layout.root,
                env=self._env,
            )
            daemon.start()
            self.agents.append(daemon)
        self._progress(f"waiting for {len(self.agents)} agent(s) to register")
        config = self.client_config()
        auth = KeypairAuth(config.access_key, config.secret_key)
        with httpx.Client(base_url=self.endpoint, auth=auth, timeout=5.0) as http:
            while True:
                for daemon in self.agents:
                    code = daemon.exit_code()
                    if code is not None:
                        raise self._fail(daemon, f"agent {daemon.name} exited with status {code}")
                if self._registered(http, since):
                    return
                if time.monotonic() > deadline:
                    names = ", ".join(self.agent_ids)
                    raise ClusterStartError(
                        f"the agents ({names}) did not register in time; see their logs in"
                        f" {self.layout.logs}:\n{self.agents[0].tail()}"
                    )
                time.sleep(0.1)

    def _wait_reported(self, ref: str, timeout_s: float = 60.0) -> None:
        """Until every agent reports the environment just built (its next look at its
        environments, then a heartbeat): a session asked for once the catalogue has the
        image finds an agent that has it."""
        config = self.client_config()
        auth = KeypairAuth(config.access_key, config.secret_key)
        deadline = time.monotonic() + timeout_s
        with httpx.Client(base_url=self.endpoint, auth=auth, timeout=10.0) as http:
            while True:
                agents = http.get("/agents").raise_for_status().json()["items"]
                if agents and all(ref in (a.get("images") or ()) for a in agents):
                    return
                if time.monotonic() > deadline:
                    raise ClusterStartError(
                        f"no agent reported {ref} {timeout_s:.0f} s after it was built"
                    )
                if self._stop_builds.wait(0.2):
                    raise ClusterStartError("the cluster is stopping")

    def _register(self, *images: DemoImage) -> None:
        config = self.client_config()
        auth = KeypairAuth(config.access_key, config.secret_key)
        with httpx.Client(base_url=self.endpoint, auth=auth, timeout=10.0) as http:
            added = register(http, list(images))
        if added:
            self._progress(f"image catalogue: added {', '.join(added)}")

    def _register_images(self) -> None:
        """The demo catalogue in the manager (kept as it is when already there)."""
        config = self.client_config()
        auth = KeypairAuth(config.access_key, config.secret_key)
        with httpx.Client(base_url=self.endpoint, auth=auth, timeout=10.0) as http:
            added = register(http, self.images)
        if added:
            self._progress(f"image catalogue: added {', '.join(added)}")

    @staticmethod
    def _agent_port(toml: Path) -> int:
        """The port of the previous run when it is free (kernels keep pointing at their
        agent's address across restarts), else a free one."""
        with contextlib.suppress(OSError, ValueError, tomllib.TOMLDecodeError, KeyError):
            addr = tomllib.loads(toml.read_text())["agent"]["rpc-listen-addr"]
            port = int(str(addr).rpartition(":")[2])
            if _port_is_free(port):
                return port
        return free_port()

    def _registered(self, http: httpx.Client, since: datetime) -> bool:
        try:
            response = http.get("/agents", params={"status": "ALIVE"})
        except httpx.HTTPError:
            return False
        if response.status_code != 200:
            return False
        fresh = set()
        for item in response.json().get("items", []):
            beat = item.get("lastHeartbeat")
            if beat and datetime.fromisoformat(beat) >= since:
                fresh.add(item.get("id"))
        return fresh >= set(self.agent_ids)

    # -- while running --------------------------------------------------------------------
    def exited(self) -> Daemon | None:
        """The first daemon that is no longer running (None: all fine)."""
        others = [d for d in (self.manager, self.storage) if d is not None]
        for daemon in [*self.agents, *others]:
            if daemon.exit_code() is not None:
                return daemon
        return None

    # -- stop -----------------------------------------------------------------------------
    def destroy_sessions(self, *, timeout_s: float = 20.0) -> int:
        """End every live session (forced); returns how many there were."""
        with SyncAccelshareClient(self.client_config()) as client:
            live = client.sessions.list_all()
            for session in live:
                with contextlib.suppress(Exception):
                    client.sessions.destroy(session.session_id, forced=True)
            deadline = time.monotonic() + timeout_s
            while client.sessions.list_all() and time.monotonic() < deadline:
                time.sleep(0.1)
        return len(live)

    def stop(self, *, destroy_sessions: bool = False, grace_s: float = 20.0) -> list[str]:
        """Stop the agents (which end their kernels), then the manager (SIGTERM,
        SIGKILL after ``grace_s``), then kill any process left under the data dir.

        Returns the names of daemons that had to be killed.  Idempotent.
        """
        self._stop_builds.set()  # a pip build in progress is killed (and removed)
        if self.env_builder is not None:
            self.env_builder.join(timeout=10)
        if destroy_sessions and self.manager is not None and self.manager.is_running():
            with contextlib.suppress(Exception):
                self.destroy_sessions()
        killed = stop_daemons(self.agents, grace_s=grace_s)
        if self.manager is not None:
            killed += stop_daemons([self.manager], grace_s=grace_s)
        if self.storage is not None:
            killed += stop_daemons([self.storage], grace_s=grace_s)
        self.reaped = reap_kernels(self.layout.root)
        if self._lock is not None:
            self._lock.close()
            self._lock = None
        return killed

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
