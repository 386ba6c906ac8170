"""Backend.AI's ``storage_volume_list`` / ``storage_volume`` over a real storage proxy
(both of its APIs on uvicorn, two volumes), found through the configuration store's
``volumes/proxies/<name>/...`` keys."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import uvicorn

from accelshare.storage.app import StorageProxy, manager_app
from accelshare.storage.config import parse_storage_config
from accelshare.storage.serve import QuietServer

from .cluster import Cluster
from .test_mgr_admin_gql import make_user, ok, refused

SECRET = "volumes-test-secret-0123456789"
FIELDS = (
    "id proxy name backend path fsprefix capabilities hardware_metadata performance_metric usage"
)
LIST = (
    "query ($limit: Int!, $offset: Int!, $filter: String, $order: String) {"
    " storage_volume_list(limit: $limit, offset: $offset, filter: $filter, order: $order)"
    f" {{ items {{ {FIELDS} }} total_count }} }}"
)
DETAIL = f"query ($id: String!) {{ storage_volume(id: $id) {{ {FIELDS} }} }}"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
async def proxy(tmp_path: Path) -> AsyncIterator[tuple[str, Path]]:
    """A storage proxy ``store1`` with the volumes ``fast`` and ``bulk``: its URL."""
    volumes = {}
    for name in ("fast", "bulk"):
        (tmp_path / name).mkdir()
        volumes[name] = {"path": str(tmp_path / name)}
    port = _free_port()
    config = parse_storage_config(
        {
            "storage-proxy": {
                "node-id": "store1",
                "secret": SECRET,
                "manager-api": f"127.0.0.1:{port}",
                "client-api": f"127.0.0.1:{_free_port()}",
            },
            "volume": volumes,
        }
    )
    storage = StorageProxy(config)
    storage.prepare()
    server = QuietServer(
        uvicorn.Config(
            manager_app(storage), host="127.0.0.1", port=port, log_config=None, access_log=False
        )
    )
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}", tmp_path
    finally:
        server.should_exit = True
        await task


async def register(cluster: Cluster, name: str, url: str, secret: str = SECRET) -> None:
    store = cluster.manager.store
    await store.put(f"volumes/proxies/{name}/manager_api", url)
    await store.put(f"volumes/proxies/{name}/client_api", url)
    await store.put(f"volumes/proxies/{name}/secret", secret)


async def test_list_and_info(cluster: Cluster, proxy: tuple[str, Path]) -> None:
    url, root = proxy
    empty = await ok(cluster.admin, LIST, limit=10, offset=0)
    assert empty["storage_volume_list"] == {"items": [], "total_count": 0}

    await register(cluster, "store1", url)
    data = await ok(cluster.admin, LIST, limit=10, offset=0)
    page = data["storage_volume_list"]
    assert page["total_count"] == 2
    assert [v["id"] for v in page["items"]] == ["store1:bulk", "store1:fast"]
    bulk = page["items"][0]
    assert bulk["proxy"] == "store1"
    assert bulk["name"] == "bulk"
    assert bulk["backend"] == "vfs"
    assert bulk["path"] == str(root / "bulk")
    assert bulk["capabilities"] == []
    assert bulk["fsprefix"] is None
    assert bulk["hardware_metadata"] is None
    assert bulk["performance_metric"] is None
    usage = json.loads(bulk["usage"])
    assert usage["capacity_bytes"] > 0
    assert 0 <= usage["used_bytes"] <= usage["capacity_bytes"]

    second = await ok(cluster.admin, LIST, limit=1, offset=1)
    assert [v["id"] for v in second["storage_volume_list"]["items"]] == ["store1:fast"]
    assert second["storage_volume_list"]["total_count"] == 2

    detail = await ok(cluster.admin, DETAIL, id="store1:fast")
    assert detail["storage_volume"]["path"] == str(root / "fast")


async def test_refusals(cluster: Cluster, proxy: tuple[str, Path]) -> None:
    url, _ = proxy
    await register(cluster, "store1", url)

    message = await refused(cluster.admin, DETAIL, id="store1:nope")
    assert "no volume 'nope'" in message
    assert "store1:bulk" in message
    message = await refused(cluster.admin, DETAIL, id="other:fast")
    assert "no storage proxy 'other'" in message
    message = await refused(cluster.admin, DETAIL, id="fast")
    assert "expected <proxy>:<volume>" in message
    message = await refused(cluster.admin, LIST, limit=10, offset=0, filter='id == "x"')
    assert "filter" in message

    admin, _ = await make_user(cluster, "dadmin@example.com", role="admin")
    async with admin:
        message = await refused(admin, LIST, limit=10, offset=0)
        assert "superadmin" in message
        message = await refused(admin, DETAIL, id="store1:fast")
        assert "superadmin" in message


async def test_broken_proxies_are_named(cluster: Cluster, proxy: tuple[str, Path]) -> None:
    url, _ = proxy
    await register(cluster, "store1", url, secret="not-the-secret-0123456789")
    message = await refused(cluster.admin, LIST, limit=10, offset=0)
    assert "storage proxy 'store1'" in message
    assert "refused GET /v1/volumes (bad-secret)" in message

    await register(cluster, "store1", f"http://127.0.0.1:{_free_port()}")
    message = await refused(cluster.admin, LIST, limit=10, offset=0)
    assert "storage proxy 'store1'" in message
    assert "does not answer" in message

    await cluster.manager.store.delete("volumes/proxies/store1/secret")
    message = await refused(cluster.admin, LIST, limit=10, offset=0)
    assert "volumes/proxies/store1/secret" in message
