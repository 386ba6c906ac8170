"""Storage folders through the manager against the real storage proxy
(``accelshare.storage``: both of its apps in process, over a temporary volume): the
manager's storage client, the proxy's contract and the SDK's tus upload agree."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from accelshare.client import AccelshareClient
from accelshare.client.config import ClientConfig
from accelshare.storage.app import StorageProxy, client_app, manager_app
from accelshare.storage.config import parse_storage_config

from .cluster import Cluster, running_cluster

SECRET = "real-proxy-secret-0123456789"
MANAGER_API = "http://127.0.0.1:16021"
CLIENT_API = "http://127.0.0.1:16022"


class ByHost(httpx.AsyncBaseTransport):
    """One transport for both of the proxy's apps, chosen by the request's port."""

    def __init__(self, routes: dict[int, httpx.AsyncBaseTransport]) -> None:
        self.routes = routes

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return await self.routes[request.url.port or 80].handle_async_request(request)


@dataclass
class Real:
    cluster: Cluster
    volume: Path
    transport: ByHost

    async def sdk(self, email: str) -> AccelshareClient:
        response = await self.cluster.admin.post(
            "/admin/users", json={"email": email, "password": "long enough password"}
        )
        keypair = response.json()["keypair"]
        config = ClientConfig("http://127.0.0.1:8081", keypair["access_key"], keypair["secret_key"])
        return AccelshareClient(
            config,
            transport=httpx.ASGITransport(app=self.cluster.app),
            storage_transport=self.transport,
        )


@pytest.fixture
async def real(tmp_path: Path) -> AsyncIterator[Real]:
    volume = tmp_path / "volume1"
    volume.mkdir()
    config = parse_storage_config(
        {
            "storage-proxy": {
                "node-id": "local",
                "secret": SECRET,
                "manager-api": MANAGER_API.removeprefix("http://"),
                "client-api": CLIENT_API.removeprefix("http://"),
                "token-ttl": 600,
            },
            "volume": {"volume1": {"path": str(volume)}},
        }
    )
    proxy = StorageProxy(config)
    proxy.prepare()
    transport = ByHost(
        {
            16021: httpx.ASGITransport(app=manager_app(proxy)),
            16022: httpx.ASGITransport(app=client_app(proxy)),
        }
    )
    async with running_cluster(
        f"sqlite+aiosqlite:///{tmp_path / 'manager.db'}",
        tmp_path / "state",
        storage_transport=transport,
    ) as cluster:
        store = cluster.manager.store
        await store.put("volumes/proxies/local/manager_api", MANAGER_API)
        await store.put("volumes/proxies/local/client_api", CLIENT_API)
        await store.put("volumes/proxies/local/secret", SECRET)
        await store.put("volumes/default_host", "local:volume1")
        yield Real(cluster, volume, transport)


async def test_round_trip_through_the_real_proxy(real: Real, tmp_path: Path) -> None:
    async with await real.sdk("alice@x.test") as alice:
        assert (await alice.folders.hosts())["allowed"] == ["local:volume1"]
        folder = await alice.folders.create("data")
        source = tmp_path / "blob.bin"
        payload = bytes(range(251)) * 4001
        source.write_bytes(payload)
        await alice.folders.upload("data", source, "in/blob.bin", chunk_bytes=100_000)
        info = await alice.folders.info("data")
        assert info["numFiles"] == 1
        assert info["used_bytes"] == len(payload)
        listing = await alice.folders.ls("data", "in")
        assert [(i["name"], i["size"], i["type"]) for i in listing] == [
            ("blob.bin", len(payload), "FILE")
        ]
        out = tmp_path / "out"
        out.mkdir()
        assert (await alice.folders.download("data", "in/blob.bin", out)).read_bytes() == payload
        made = await alice.folders.mkdir("data", ["d1", "d1"])
        assert [e["item"] for e in made["success"]] == ["d1"]
        assert [e["item"] for e in made["failed"]] == ["d1"]
        await alice.folders.move("data", "in/blob.bin", "d1/blob.bin")
        await alice.folders.rm("data", ["in"])
        assert {i["name"] for i in await alice.folders.ls("data")} == {"d1"}
        copy = await alice.folders.clone("data", "copy")
        assert {i["name"] for i in await alice.folders.ls("copy", "d1")} == {"blob.bin"}
        await alice.folders.delete("data")
        await alice.folders.purge("data")
        assert [f["name"] for f in await alice.folders.list_folders()] == ["copy"]
        assert copy["name"] == "copy"
        assert folder["host"] == "local:volume1"


async def test_the_real_proxy_refuses_traversal_and_over_quota(real: Real, tmp_path: Path) -> None:
    patched = await real.cluster.admin.patch(
        "/admin/resource-policies/default", json={"max_vfolder_size": 1000}
    )
    assert patched.status_code == 200, patched.text
    async with await real.sdk("bob@x.test") as bob:
        await bob.folders.create("small")
        http = bob._http
        for body in ({"path": "../x", "size": 1}, {"path": "/etc/passwd", "size": 1}):
            refused = await http.post("/folders/small/request-upload", json=body)
            assert refused.status_code == 400, refused.text
            problem: dict[str, Any] = refused.json()
            assert problem["detail"].startswith("path"), problem
        big = await http.post("/folders/small/request-upload", json={"path": "big", "size": 5000})
        assert big.status_code == 412, big.text
        assert "quota" in big.json()["detail"].lower()


async def test_a_mount_is_the_proxy_s_folder_path(real: Real) -> None:
    agent = await real.cluster.add_agent("i-node01")
    async with await real.sdk("carol@x.test") as carol:
        folder = await carol.folders.create("work")
        answer = await carol._http.post(
            "/session",
            json={
                "image": "python:3.11",
                "name": "m1",
                "enqueueOnly": True,
                "config": {"resources": {"cpu": 1, "mem": "1g"}, "mounts": ["work:ro"]},
            },
        )
        assert answer.status_code == 201, answer.text
        await real.cluster.wait_status(answer.json()["sessionId"], "RUNNING")
    (mount,) = agent.create_requests[-1].mounts
    assert mount.read_only
    assert mount.kernel_path == "/home/work/work"
    host_path = Path(mount.host_path)
    assert host_path.is_dir()
    assert real.volume in host_path.parents
    assert folder["id"] in str(host_path)
