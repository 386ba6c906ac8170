"""Folder names, mount specifications and the storage client's reading of a proxy's
answers (no database, no proxy: httpx's mock transport)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from accelshare.manager.errors import InvalidRequest, ManagerError, Unavailable
from accelshare.manager.services.folders.names import (
    MountRequest,
    check_folder_name,
    parse_mount_specs,
)
from accelshare.manager.storage_client import ProxyAddress, StorageError, StorageProxy, split_host
from accelshare.protocol.storage import FolderRef, StorageErrorType

REF = FolderRef(volume="vol1", folder_id="ab" * 16)


@pytest.mark.parametrize("name", ["data", "a.b-c_d", "x" * 64, "with space inside", "데이터"])
def test_good_names(name: str) -> None:
    assert check_folder_name(name) == name


@pytest.mark.parametrize("name", ["", ".dot", "a/b", "x" * 65, "tab\there", " lead", 7, None])
def test_bad_names_name_the_field(name: Any) -> None:
    with pytest.raises(InvalidRequest) as caught:
        check_folder_name(name, field="new_name")
    assert caught.value.field == "new_name"
    assert caught.value.received == name


def test_mount_forms() -> None:
    assert parse_mount_specs(
        ["a", "b:/data/b", "c:/opt/c:ro", "d:ro", "e:rel"],
        {"a": "/x", "f": "/f:ro"},
        {"b": {"type": "bind", "permission": "ro"}, "a": {"permission": None}},
    ) == [
        MountRequest("a", "/x", False),
        MountRequest("b", "/data/b", True),
        MountRequest("c", "/opt/c", True),
        MountRequest("d", None, True),
        MountRequest("e", "/home/work/rel", False),
        MountRequest("f", "/f", True),
    ]


@pytest.mark.parametrize(
    ("mounts", "field"),
    [
        (["a:/x/../etc"], "mounts[0]"),
        (["ok", "a:/b:/c"], "mounts[1]"),
        (["a:/home/work"], "mounts[0]"),
        ([".hidden"], "mounts[0]"),
        ([""], "mounts[0]"),
    ],
)
def test_bad_mounts_name_the_entry(mounts: list[str], field: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse_mount_specs(mounts, None)
    assert caught.value.field == field


def test_split_host() -> None:
    assert split_host("p:v") == ("p", "v")
    for bad in ("p", ":v", "p:", "p:v:w"):
        with pytest.raises(InvalidRequest):
            split_host(bad)


def _proxy(handler: Any) -> StorageProxy:
    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    return StorageProxy(ProxyAddress("p", "http://mgr", "http://cli", "s3cret"), client)


async def test_the_secret_is_sent_and_a_problem_keeps_its_type() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(
            413,
            json={
                "type": "over-quota",
                "title": "over",
                "detail": "size: too big",
                "field": "size",
                "received": 11,
            },
        )

    with pytest.raises(StorageError) as caught:
        await _proxy(handler).usage(REF)
    assert seen[0].headers["X-Accelshare-Storage-Secret"] == "s3cret"
    assert seen[0].url.path == "/v1/folders/usage"
    assert caught.value.kind is StorageErrorType.OVER_QUOTA
    assert caught.value.status == 412
    assert caught.value.field == "size"


@pytest.mark.parametrize(
    "response",
    [
        httpx.Response(502, text="<html>bad gateway</html>"),
        httpx.Response(500, json={"type": "something-else", "detail": "boom"}),
        httpx.Response(200, json={"unexpected": True}),
    ],
)
async def test_answers_that_are_not_the_contract_are_503(response: httpx.Response) -> None:
    with pytest.raises(Unavailable) as caught:
        await _proxy(lambda _r: response).usage(REF)
    assert caught.value.extra["proxy"] == "p"


async def test_an_unreachable_proxy_is_503_naming_it() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    with pytest.raises(ManagerError) as caught:
        await _proxy(handler).volumes()
    assert caught.value.status == 503
    assert "'p' at http://mgr does not answer" in caught.value.detail
