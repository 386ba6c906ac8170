"""The client-facing API's CORS (``cors-origins`` in storage.toml): the console, on the
manager's origin, uploads with tus and reads the answers; other origins get nothing."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from accelshare.protocol.storage import STORAGE_SECRET_HEADER
from accelshare.storage.app import StorageProxy, client_app, manager_app
from accelshare.storage.config import StorageConfigError, parse_storage_config

SECRET = "test-secret-0123456789"
CONSOLE = "http://127.0.0.1:8090"


def _config(volume: Path, origins: list[str] | None) -> dict[str, Any]:
    proxy: dict[str, Any] = {"node-id": "local", "secret": SECRET}
    if origins is not None:
        proxy["cors-origins"] = origins
    return {"storage-proxy": proxy, "volume": {"volume1": {"path": str(volume)}}}


async def _clients(
    tmp_path: Path, origins: list[str] | None
) -> tuple[httpx.AsyncClient, httpx.AsyncClient]:
    volume = tmp_path / "volume1"
    volume.mkdir(exist_ok=True)
    proxy = StorageProxy(parse_storage_config(_config(volume, origins)))
    proxy.prepare()
    mgr = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=manager_app(proxy)),
        base_url="http://proxy-manager",
        headers={STORAGE_SECRET_HEADER: SECRET},
    )
    client = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=client_app(proxy)), base_url="http://proxy-client"
    )
    return mgr, client


@pytest.fixture
async def apps(tmp_path: Path) -> AsyncIterator[tuple[httpx.AsyncClient, httpx.AsyncClient]]:
    mgr, client = await _clients(tmp_path, [CONSOLE])
    async with mgr, client:
        yield mgr, client


async def _upload_token(mgr: httpx.AsyncClient, size: int) -> str:
    fid = uuid.uuid4().hex
    created = await mgr.post("/v1/folders/create", json={"volume": "volume1", "folder_id": fid})
    assert created.status_code == 204, created.text
    ticket = await mgr.post(
        "/v1/files/upload",
        json={"volume": "volume1", "folder_id": fid, "path": "a.bin", "size": size},
    )
    assert ticket.status_code == 200, ticket.text
    token: str = ticket.json()["token"]
    return token


def _preflight(origin: str) -> dict[str, str]:
    return {
        "Origin": origin,
        "Access-Control-Request-Method": "PATCH",
        "Access-Control-Request-Headers": "tus-resumable, upload-offset, content-type",
    }


async def test_a_preflight_from_the_console_is_allowed(apps: Any) -> None:
    _mgr, client = apps
    answer = await client.options("/upload?token=x", headers=_preflight(CONSOLE))
    assert answer.status_code == 200
    assert answer.headers["access-control-allow-origin"] == CONSOLE
    assert "PATCH" in answer.headers["access-control-allow-methods"]
    allowed = answer.headers["access-control-allow-headers"].lower()
    assert "upload-offset" in allowed
    assert "tus-resumable" in allowed


async def test_a_preflight_from_another_origin_is_refused(apps: Any) -> None:
    _mgr, client = apps
    answer = await client.options("/upload?token=x", headers=_preflight("http://evil.example"))
    assert answer.status_code == 400
    assert "access-control-allow-origin" not in answer.headers


async def test_a_tus_patch_from_the_console_exposes_the_offset(apps: Any) -> None:
    mgr, client = apps
    token = await _upload_token(mgr, 5)
    answer = await client.patch(
        f"/upload?token={token}",
        content=b"hello",
        headers={
            "Origin": CONSOLE,
            "Tus-Resumable": "1.0.0",
            "Upload-Offset": "0",
            "Content-Type": "application/offset+octet-stream",
        },
    )
    assert answer.status_code == 204, answer.text
    assert answer.headers["upload-offset"] == "5"
    assert answer.headers["access-control-allow-origin"] == CONSOLE
    assert "upload-offset" in answer.headers["access-control-expose-headers"].lower()


async def test_an_error_carries_the_cors_headers_so_the_console_can_read_it(apps: Any) -> None:
    mgr, client = apps
    token = await _upload_token(mgr, 5)
    answer = await client.patch(
        f"/upload?token={token}",
        content=b"hello",
        headers={
            "Origin": CONSOLE,
            "Upload-Offset": "3",
            "Content-Type": "application/offset+octet-stream",
        },
    )
    assert answer.status_code == 409, answer.text
    assert "expected 0, received 3" in answer.json()["detail"]
    assert answer.headers["access-control-allow-origin"] == CONSOLE


async def test_without_cors_origins_no_origin_is_allowed(tmp_path: Path) -> None:
    mgr, client = await _clients(tmp_path, None)
    async with mgr, client:
        answer = await client.options("/upload", headers=_preflight(CONSOLE))
        assert "access-control-allow-origin" not in answer.headers
        # the tus discovery (no Origin) still answers, as the official client expects
        plain = await client.options("/upload")
        assert plain.status_code == 204
        assert plain.headers["tus-version"] == "1.0.0"
        assert "access-control-allow-origin" not in plain.headers


@pytest.mark.parametrize(
    "bad", ["console.example", "http://console.example/path", "ftp://x", 5, "http://a b"]
)
def test_a_bad_cors_origin_is_refused_by_name(tmp_path: Path, bad: Any) -> None:
    with pytest.raises(StorageConfigError) as caught:
        parse_storage_config(_config(tmp_path, [bad]))
    message = str(caught.value)
    assert "storage-proxy.cors-origins" in message
    assert "scheme://host[:port]" in message


def test_cors_origins_must_be_a_list(tmp_path: Path) -> None:
    with pytest.raises(StorageConfigError) as caught:
        parse_storage_config(_config(tmp_path, "http://a.example"))  # type: ignore[arg-type]
    assert "storage-proxy.cors-origins" in str(caught.value)
