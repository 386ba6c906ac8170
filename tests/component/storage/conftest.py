"""A storage proxy on real uvicorn servers (both APIs, free loopback ports) over a
temporary volume; ``restart()`` starts a fresh proxy process state on the same files."""

from __future__ import annotations

import asyncio
import socket
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from accelshare.protocol.storage import STORAGE_SECRET_HEADER
from accelshare.storage.app import StorageProxy, client_app, manager_app
from accelshare.storage.config import parse_storage_config
from accelshare.storage.serve import QuietServer

SECRET = "test-secret-0123456789"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Running:
    volume_dir: Path
    manager_port: int
    client_port: int
    proxy: StorageProxy | None = None
    servers: list[uvicorn.Server] = field(default_factory=list)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    mgr: httpx.AsyncClient | None = None

    @property
    def client_url(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    def config(self) -> dict[str, Any]:
        return {
            "storage-proxy": {
                "node-id": "local",
                "secret": SECRET,
                "manager-api": f"127.0.0.1:{self.manager_port}",
                "client-api": f"127.0.0.1:{self.client_port}",
                "token-ttl": 600,
            },
            "volume": {"volume1": {"path": str(self.volume_dir)}},
        }

    async def start(self) -> None:
        self.proxy = StorageProxy(parse_storage_config(self.config()))
        self.proxy.prepare()
        for app, port in ((manager_app(self.proxy), self.manager_port),
                          (client_app(self.proxy), self.client_port)):  # fmt: skip
            server = QuietServer(
                uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, access_log=False)
            )
            self.servers.append(server)
            self.tasks.append(asyncio.create_task(server.serve()))
        for started in self.servers:
            while not started.started:
                await asyncio.sleep(0.01)
        self.mgr = httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{self.manager_port}",
            headers={STORAGE_SECRET_HEADER: SECRET},
            timeout=30,
        )

    async def stop(self) -> None:
        if self.mgr is not None:
            await self.mgr.aclose()
        for server in self.servers:
            server.should_exit = True
        await asyncio.gather(*self.tasks, return_exceptions=True)
        self.servers.clear()
        self.tasks.clear()

    async def restart(self) -> None:
        await self.stop()
        await self.start()

    async def new_folder(self, quota: int | None = None) -> str:
        fid = uuid.uuid4().hex
        assert self.mgr is not None
        r = await self.mgr.post(
            "/v1/folders/create", json={"volume": "volume1", "folder_id": fid, "quota_bytes": quota}
        )
        assert r.status_code == 204, r.text
        return fid

    def folder(self, fid: str) -> Path:
        return self.volume_dir / fid[:2] / fid[2:4] / fid


@pytest.fixture
async def storage(tmp_path: Path) -> AsyncIterator[Running]:
    volume = tmp_path / "volume1"
    volume.mkdir()
    running = Running(volume, _free_port(), _free_port())
    await running.start()
    try:
        yield running
    finally:
        await running.stop()
