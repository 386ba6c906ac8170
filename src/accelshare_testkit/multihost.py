"""A production-shaped cluster on test hosts in network namespaces (one machine).

    with MultiHostCluster(work_dir) as cluster:         # needs root, iproute2, PostgreSQL,
        cluster.start_services()                         # etcd and redis-server binaries
        cluster.start_manager()
        cluster.start_agent("gpu", mock_config=REPO / "configs/accelerator/two-fgpu.toml")
        cluster.start_agent("cpu", mock_config=None)     # no accelerator plugin
        async with cluster.client() as http: ...         # signed as the superadmin
        cluster.network.cut(cluster.hosts["gpu"])        # unplug a host

Layout (addresses on a random 10.X.Y.0/24)::

    srv  10.X.Y.10   PostgreSQL (its own cluster, initdb'd here), etcd, Redis, the manager
    <h>  10.X.Y.11.. one agent each (process runtime, their own scratch roots)
    this process 10.X.Y.1 (talks to the manager and to etcd like an operator would)

Everything runs as real processes of the real binaries; nothing listens on the real
machine's loopback or its network.  Stopping (or a failing test) kills every process and
removes the namespaces.  :func:`multihost_unavailable` says why it cannot run here.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

from accelshare.agent.runtime.procfs import find_marked_processes
from accelshare.client.auth import KeypairAuth
from accelshare.config import ConfigStore, open_config_store
from accelshare.config.settings import ConfigStoreSettings, EtcdSettings
from accelshare.manager.bootstrap import AdminCredentials
from accelshare_testkit.etcd_server import find_etcd_binary
from accelshare_testkit.redis_server import find_redis_binary

from .netns import Host, TestNetwork, netns_unavailable, wait_for_port

__all__ = ["CLUSTER_SECRET", "MultiHostCluster", "multihost_unavailable"]

CLUSTER_SECRET = "multihost-cluster-secret-0123456789abcdef"
MANAGER_PORT = 8081
AGENT_PORT = 6001


def _postgres_bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"))
    return Path(found[-1]).parent if found else None


def multihost_unavailable() -> str | None:
    """Why the multi-host cluster cannot run here (None: it can)."""
    reason = netns_unavailable()
    if reason is not None:
        return reason
    if _postgres_bin() is None:
        return "no PostgreSQL server binaries (apt-get install postgresql)"
    if shutil.which("runuser") is None:
        return "no runuser (util-linux) to start PostgreSQL as its own user"
    try:
        import pwd

        pwd.getpwnam("postgres")
    except KeyError:
        return "no 'postgres' system user (apt-get install postgresql)"
    if find_etcd_binary() is None:
        return "no etcd binary (apt-get install etcd-server)"
    if find_redis_binary() is None:
        return "no redis-server binary (apt-get install redis-server)"
    return None


class MultiHostCluster:
    def __init__(
        self, work_dir: Path, *, agent_timeout_s: float = 3.0, stale_bind_timeout_s: float = 5.0
    ) -> None:
        self.work_dir = work_dir
        self.agent_timeout_s = agent_timeout_s
        self.stale_bind_timeout_s = stale_bind_timeout_s
        self.network = TestNetwork()
        self.hosts: dict[str, Host] = {}
        self.server: Host | None = None
        self._pg_dir: Path | None = None
        self.manager_config: Path | None = None
        self.agent_configs: dict[str, Path] = {}
        self.agent_processes: dict[str, subprocess.Popen[Any]] = {}
        self.manager_process: subprocess.Popen[Any] | None = None

    # -- lifecycle ----------------------------------------------------------------------
    def __enter__(self) -> MultiHostCluster:
        self.network.__enter__()
        try:
            self.server = self.network.add_host("srv")
            self.network.attach_root()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self.network.close()  # stops every process started in a host, then the hosts
        # Kernels outlive their agents by design, and a sandboxed kernel is in a network
        # namespace of its own (not its host's, whose processes the network just killed):
        # end what is left of each agent's kernels.
        for folder in self.work_dir.glob("agent-*"):
            for pids in find_marked_processes(folder / "scratch").values():
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
        if self._pg_dir is not None:
            shutil.rmtree(self._pg_dir, ignore_errors=True)
            self._pg_dir = None

    @property
    def srv(self) -> Host:
        assert self.server is not None, "use MultiHostCluster as a context manager"
        return self.server

    @property
    def endpoint(self) -> str:
        return self.endpoint_at(MANAGER_PORT)

    def endpoint_at(self, port: int) -> str:
        return f"http://{self.srv.address}:{port}"

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELSHARE_", "BACKEND_"))}
        env["ACCELSHARE_CLUSTER_SECRET"] = CLUSTER_SECRET
        return env

    def _common_toml(self) -> str:
        return (
            f'[etcd]\naddr = "{self.srv.address}:2379"\nnamespace = "multihost"\n'
            f'[redis]\naddr = "{self.srv.address}:6379"\nnamespace = "multihost"\n'
            "stats-interval-s = 1.0\ntimeout-s = 1.0\n"
        )

    # -- the server host: PostgreSQL, etcd, Redis ---------------------------------------
    def start_services(self) -> None:
        self._start_postgres()
        etcd = find_etcd_binary()
        assert etcd is not None
        ip = self.srv.address
        (self.work_dir / "etcd").mkdir(parents=True, exist_ok=True)
        self.srv.popen(
            [
                etcd,
                "--name=multihost",
                f"--data-dir={self.work_dir / 'etcd' / 'data'}",
                f"--listen-client-urls=http://{ip}:2379",
                f"--advertise-client-urls=http://{ip}:2379",
                f"--listen-peer-urls=http://{ip}:2380",
                f"--initial-advertise-peer-urls=http://{ip}:2380",
                f"--initial-cluster=multihost=http://{ip}:2380",
                "--heartbeat-interval=50",
                "--election-timeout=500",
                "--max-txn-ops=10000",
                "--log-level=warn",
            ],
            log=self.work_dir / "etcd.log",
        )
        redis = find_redis_binary()
        assert redis is not None
        (self.work_dir / "redis").mkdir(parents=True, exist_ok=True)
        self.srv.popen(
            [
                redis,
                "--bind",
                ip,
                "--port",
                "6379",
                "--save",
                "",
                "--appendonly",
                "no",
                "--protected-mode",
                "no",
                "--dir",
                str(self.work_dir / "redis"),
            ],
            log=self.work_dir / "redis.log",
        )
        wait_for_port(ip, 2379, what="etcd")
        wait_for_port(ip, 6379, what="redis")

    def _start_postgres(self) -> None:
        bindir = _postgres_bin()
        assert bindir is not None
        # the postgres user must reach its data dir: not under pytest's 0700 tmp dirs
        self._pg_dir = Path(tempfile.mkdtemp(prefix="accelshare-pg-"))
        self._pg_dir.chmod(0o755)
        data = self._pg_dir / "data"
        data.mkdir()
        shutil.chown(data, "postgres", "postgres")
        initdb = subprocess.run(
            ["runuser", "-u", "postgres", "--", str(bindir / "initdb"), "-D", str(data),
             "-A", "trust", "-U", "postgres", "--no-sync"],
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )  # fmt: skip
        if initdb.returncode != 0:
            raise RuntimeError(f"initdb failed: {initdb.stderr[-2000:]}")
        with (data / "pg_hba.conf").open("a") as hba:
            hba.write(f"host all all {self.network.network} trust\n")
        self.srv.popen(
            ["runuser", "-u", "postgres", "--", str(bindir / "postgres"), "-D", str(data),
             "-c", f"listen_addresses={self.srv.address}", "-c", "port=5432",
             "-c", f"unix_socket_directories={data}", "-c", "fsync=off",
             "-c", "synchronous_commit=off", "-c", "full_page_writes=off"],
            log=self.work_dir / "postgres.log",
        )  # fmt: skip
        wait_for_port(self.srv.address, 5432, what="PostgreSQL")
        deadline = time.monotonic() + 30
        while True:
            created = self.srv.run(
                ["runuser", "-u", "postgres", "--", "psql", "-h", self.srv.address, "-U",
                 "postgres", "-c", "CREATE DATABASE accelshare"]
            )  # fmt: skip
            if created.returncode == 0 or "already exists" in created.stderr:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"cannot create the database: {created.stderr}")
            time.sleep(0.2)

    # -- the manager --------------------------------------------------------------------
    def write_manager_config(self, name: str = "manager", port: int = MANAGER_PORT) -> Path:
        state = self.work_dir / name
        config = self.work_dir / f"{name}.toml"
        config.write_text(
            f'[manager]\ndata-dir = "{state}"\nservice-addr = "{self.srv.address}:{port}"\n'
            f"agent-timeout = {self.agent_timeout_s}\nsweep-interval = 0.5\n"
            f"stale-bind-timeout = {self.stale_bind_timeout_s}\n"
            "schedule-interval = 1.0\n"
            f'[db]\nurl = "postgresql+asyncpg://postgres@{self.srv.address}:5432/accelshare"\n'
            f'[api]\nsession-cookie-secret-file = "{self.work_dir / "cookie-secret"}"\n'
            f'[bootstrap]\ncredentials-file = "{self.work_dir / "admin-credentials.env"}"\n'
            + self._common_toml()
        )
        return config

    def start_manager(
        self, name: str = "manager", port: int = MANAGER_PORT, *, timeout_s: float = 60
    ) -> subprocess.Popen[Any]:
        config = self.write_manager_config(name, port)
        process = self.srv.popen(
            [sys.executable, "-m", "accelshare.client.cli", "server", "manager", "--config",
             str(config)],
            log=self.work_dir / f"{name}.log",
            env=self._env(),
            cwd=self.work_dir,
        )  # fmt: skip
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if httpx.get(f"http://{self.srv.address}:{port}/health", timeout=2).is_success:
                    break
            except httpx.HTTPError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                log = (self.work_dir / f"{name}.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"the manager {name} did not start:\n{log}")
            time.sleep(0.1)
        if name == "manager":
            self.manager_process, self.manager_config = process, config
        return process

    def credentials(self) -> AdminCredentials:
        return AdminCredentials.from_env_file(self.work_dir / "admin-credentials.env")

    @asynccontextmanager
    async def client(self, endpoint: str | None = None) -> AsyncIterator[httpx.AsyncClient]:
        creds = self.credentials()
        async with httpx.AsyncClient(
            base_url=endpoint or self.endpoint,
            auth=KeypairAuth(creds.access_key, creds.secret_key),
            timeout=30,
        ) as http:
            yield http

    def config_store(self) -> ConfigStoreSettings:
        return ConfigStoreSettings(
            backend="etcd",
            etcd=EtcdSettings(addr=f"{self.srv.address}:2379", namespace="multihost"),
        )

    async def put_config(self, tree: dict[str, Any]) -> None:
        """``accelshare mgr etcd put-json ''`` of ``tree``, from this (operator's) host."""
        store: ConfigStore = await open_config_store(self.config_store())
        try:
            await store.put_prefix("", tree)
        finally:
            await store.close()

    # -- agents -------------------------------------------------------------------------
    def start_agent(
        self,
        name: str,
        *,
        mock_config: Path | None,
        cpus: int = 4,
        mem: str = "8g",
        endpoints: list[str] | None = None,
    ) -> subprocess.Popen[Any]:
        host = self.hosts.get(name) or self.network.add_host(name)
        self.hosts[name] = host
        folder = self.work_dir / f"agent-{name}"
        folder.mkdir(parents=True, exist_ok=True)
        plugins = '["mock"]' if mock_config is not None else "[]"
        mock_line = f'mock-accelerator-config = "{mock_config}"\n' if mock_config else ""
        urls = endpoints or [self.endpoint]
        config = folder / "agent.toml"
        config.write_text(
            f'[agent]\nid = "i-{name}"\nrpc-listen-addr = "{host.address}:{AGENT_PORT}"\n'
            f"allowed-compute-plugins = {plugins}\n{mock_line}heartbeat-interval-s = 0.5\n"
            f'[container]\nruntime = "process"\nscratch-root = "{folder / "scratch"}"\n'
            f"[resource]\nreserved-cpu = 0\nreserved-mem = 0\ncpu-count = {cpus}\n"
            f'memory-size = "{mem}"\n'
            f"[manager]\nendpoint = {json.dumps(urls)}\n" + self._common_toml()
        )
        process = host.popen(
            [sys.executable, "-m", "accelshare.agent", "--config", str(config)],
            log=folder / "agent.log",
            env=self._env(),
            cwd=folder,
        )
        self.agent_configs[name] = config
        self.agent_processes[name] = process
        return process

    async def wait_agents_alive(self, *names: str, timeout_s: float = 60) -> None:
        want = {f"i-{n}" for n in names}
        deadline = time.monotonic() + timeout_s
        async with self.client() as http:
            while True:
                items = (await http.get("/agents", params={"status": "ALIVE"})).json()["items"]
                if want <= {a["id"] for a in items}:
                    return
                for name in names:
                    process = self.agent_processes[name]
                    if process.poll() is not None:
                        log = (self.work_dir / f"agent-{name}" / "agent.log").read_text()
                        raise RuntimeError(f"agent {name} exited:\n{log[-3000:]}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"agents {sorted(want)} not ALIVE; seen {items}")
                await asyncio.sleep(0.2)
