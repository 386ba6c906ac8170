"""A manager app (SQLite or PostgreSQL) with hollow agents, driven through its real API.

Nothing sleeps as an assertion: :meth:`Cluster.until` polls a condition with a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Generator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
from fastapi import FastAPI

from accelshare.api.app import create_manager_app
from accelshare.api.signing import sign_request
from accelshare.config import ConfigStore
from accelshare.config.embedded import EmbeddedBackend
from accelshare.manager.bootstrap import AdminCredentials
from accelshare.manager.clock import Clock, FrozenClock, utcnow
from accelshare.manager.config import ManagerConfig
from accelshare.manager.runtime import Manager
from accelshare_testkit.hollow_agent import HollowAgent, HollowCluster, HollowSpec

SECRET = "test-cluster-secret-0123456789abcdef"
T = TypeVar("T")


class Signer(httpx.Auth):
    def __init__(self, access_key: str, secret_key: str, clock: Clock = utcnow) -> None:
        self.access_key, self.secret_key, self.clock = access_key, secret_key, clock

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        request.headers.update(
            sign_request(
                access_key=self.access_key,
                secret_key=self.secret_key,
                method=request.method,
                path_query=request.url.raw_path.decode("ascii"),
                host=request.headers["host"],
                now=self.clock(),
            )
        )
        yield request


def manager_config(
    db_url: str | None,
    state: Path,
    *,
    db: dict[str, Any] | None = None,
    apps: dict[str, Any] | None = None,
    api: dict[str, Any] | None = None,
    **manager: Any,
) -> ManagerConfig:
    """``db_url=None``: the default layout, ``<state>/manager.db``; ``db``: more ``[db]``
    keys (``busy-timeout``...); ``apps``: ``[apps]`` keys; ``api``: ``[api]`` keys
    (``{"graphql": {...}, "login": {...}}``); ``manager``: ``[manager]`` keys."""
    return ManagerConfig.model_validate(
        {
            "apps": apps or {},
            "api": api or {},
            "manager": {
                "data-dir": str(state),
                "cluster-secret": SECRET,
                "schedule-interval": 30.0,
                "sweep-interval": 3600.0,
                **manager,
            },
            "db": ({} if db_url is None else {"url": db_url}) | (db or {}),
        }
    )


@dataclass
class Cluster:
    app: FastAPI
    config: ManagerConfig
    hollow: HollowCluster
    admin: httpx.AsyncClient  # signed as the bootstrap superadmin
    internal: httpx.AsyncClient  # what agents use to reach the manager
    creds: AdminCredentials
    clock: Clock
    agents: dict[str, HollowAgent] = field(default_factory=dict)

    @property
    def manager(self) -> Manager:
        manager = self.app.state.manager
        assert isinstance(manager, Manager)
        return manager

    def client(self, access_key: str, secret_key: str) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            transport=httpx.ASGITransport(app=self.app),
            base_url="http://127.0.0.1:8081",
            auth=Signer(access_key, secret_key, self.clock),
            timeout=60,
        )

    async def add_agent(self, agent_id: str, **spec: Any) -> HollowAgent:
        options = {k: spec.pop(k) for k in ("start_running", "send_events") if k in spec}
        agent = HollowAgent(
            HollowSpec(agent_id, **spec), cluster_secret=SECRET, manager=self.internal, **options
        )
        self.hollow.add(agent)
        self.agents[agent_id] = agent
        await agent.heartbeat()
        return agent

    async def create(
        self, resources: dict[str, Any], *, client: httpx.AsyncClient | None = None, **body: Any
    ) -> httpx.Response:
        payload = {"image": "python:3.11", "config": {"resources": resources}, **body}
        return await (client or self.admin).post("/session", json=payload)

    async def session(self, ref: str, client: httpx.AsyncClient | None = None) -> dict[str, Any]:
        response = await (client or self.admin).get(f"/session/{ref}")
        response.raise_for_status()
        body: dict[str, Any] = response.json()
        return body

    async def statuses(self, *refs: str) -> list[str]:
        return [(await self.session(r))["status"] for r in refs]

    async def until(
        self, condition: Callable[[], Awaitable[T]], *, timeout_s: float = 20.0, what: str = ""
    ) -> T:
        """Poll ``condition`` until it returns something truthy (no fixed sleeps)."""
        deadline = time.monotonic() + timeout_s
        while True:
            value = await condition()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what or condition}: last {value!r}")
            await self.manager.hub.wait(0.05)

    async def wait_status(self, ref: str, *wanted: str, timeout_s: float = 20.0) -> dict[str, Any]:
        async def check() -> dict[str, Any] | None:
            body = await self.session(ref)
            if body["status"] in ("TERMINATED", "CANCELLED") and body["status"] not in wanted:
                raise AssertionError(f"{ref} ended {body['status']}: {body['statusInfo']}")
            return body if body["status"] in wanted else None

        return await self.until(check, timeout_s=timeout_s, what=f"{ref} in {wanted}")

    async def gql(self, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
        response = await self.admin.post(
            "/admin/gql", json={"query": query, "variables": variables or {}}
        )
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        assert not body.get("errors"), body
        return body


@asynccontextmanager
async def running_cluster(
    db_url: str | None,
    state: Path,
    *,
    clock: Clock = utcnow,
    background: bool = True,
    hollow: HollowCluster | None = None,
    db: dict[str, Any] | None = None,
    apps: dict[str, Any] | None = None,
    api: dict[str, Any] | None = None,
    storage_transport: httpx.AsyncBaseTransport | None = None,
    **manager: Any,
) -> AsyncIterator[Cluster]:
    config = manager_config(db_url, state, db=db, apps=apps, api=api, **manager)
    store = ConfigStore(EmbeddedBackend(state / "config-store.db"))
    hollow = hollow or HollowCluster()
    app = await create_manager_app(
        config,
        clock=clock,
        config_store=store,
        agent_transport=hollow.transport,
        storage_transport=storage_transport,
        background=background,
    )
    creds = AdminCredentials.from_env_file(config.credentials_file)
    try:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with (
                httpx.AsyncClient(
                    transport=transport,
                    base_url="http://127.0.0.1:8081",
                    auth=Signer(creds.access_key, creds.secret_key, clock),
                    timeout=60,
                ) as admin,
                httpx.AsyncClient(
                    transport=transport, base_url="http://manager", timeout=60
                ) as internal,
            ):
                cluster = Cluster(app, config, hollow, admin, internal, creds, clock)
                try:
                    yield cluster
                finally:
                    for agent in cluster.agents.values():
                        await agent.settle()
                    await asyncio.sleep(0)
    finally:
        await store.close()


# -- a manager in its own process (``accelshare server manager``) -------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _ephemeral_low() -> int:
    """The lowest port the kernel hands out for outgoing connections and ``bind(0)``."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("", port))
        except OSError:
            return False
    return True


def free_ports_below_ephemeral(count: int = 1) -> int:
    """``p`` where ``p .. p + count - 1`` are free and below the ephemeral range: for a
    port chosen long before it is listened on (at import, or a range handed to an agent),
    which a port from ``bind(0)`` is not — any connection the suite opens meanwhile may
    be given it (one CI failure: "the rest used on the host")."""
    top = _ephemeral_low() - count
    span = max(1, top - 20000)
    start = random.randrange(span)
    for offset in range(0, 4000, count):
        port = 20000 + (start + offset) % span
        if all(_bindable(port + i) for i in range(count)):
            return port
    raise AssertionError(f"no {count} adjacent free ports below the ephemeral range")


class ManagerProcess:
    def __init__(self, config: Path, port: int, log: Path) -> None:
        self.config, self.port, self.log = config, port, log
        self.proc: subprocess.Popen[bytes] | None = None

    async def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "from accelshare.client.cli.server_manager import main; main()",
                "--config",
                str(self.config),
            ],
            stdout=self.log.open("ab"),
            stderr=subprocess.STDOUT,
            cwd=self.config.parent,
        )
        deadline = time.monotonic() + 60
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{self.port}") as client:
            while True:
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get("/health")).status_code == 200:
                        return
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError("the manager did not start:\n" + self.log.read_text())
                await asyncio.sleep(0.1)

    def kill(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


Frozen = tuple[Cluster, FrozenClock]
"""The ``frozen`` fixture (conftest.py): a cluster whose passes run by hand, and its clock."""
