"""The storage proxy over real HTTP: folders, tus uploads, downloads, files, refusals."""

from __future__ import annotations

import asyncio
import io
import os
import zipfile
from email.utils import formatdate
from typing import Any

import httpx

from accelshare.protocol.storage import STORAGE_SECRET_HEADER

from .conftest import Running

TUS = {"Tus-Resumable": "1.0.0", "Content-Type": "application/offset+octet-stream"}


async def _ticket(storage: Running, op: str, body: dict[str, Any]) -> tuple[str, dict[str, str]]:
    assert storage.mgr is not None
    r = await storage.mgr.post(f"/v1/files/{op}", json={"volume": "volume1", **body})
    assert r.status_code == 200, r.text
    ticket = r.json()
    assert ticket["url"] == f"{storage.client_url}/{op}"
    return ticket["url"], {"token": ticket["token"]}


async def _patch(url: str, params: dict[str, str], offset: int, data: bytes) -> httpx.Response:
    async with httpx.AsyncClient(timeout=30) as http:
        return await http.patch(
            url, params=params, content=data, headers={**TUS, "Upload-Offset": str(offset)}
        )


async def _head(url: str, params: dict[str, str]) -> httpx.Response:
    async with httpx.AsyncClient(timeout=30) as http:
        return await http.head(url, params=params, headers={"Tus-Resumable": "1.0.0"})


def _problem(r: httpx.Response, status: int, type_: str) -> str:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/problem+json"
    assert r.json()["type"] == type_
    return str(r.json()["detail"])


async def test_the_secret_is_required(storage: Running) -> None:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{storage.manager_port}") as http:
        assert (await http.get("/v1/health")).json() == {"status": "ok"}
        r = await http.get("/v1/volumes", headers={STORAGE_SECRET_HEADER: "wrong"})
        assert "received another value" in _problem(r, 401, "bad-secret")


async def test_folder_life(storage: Running) -> None:
    assert storage.mgr is not None
    volumes = (await storage.mgr.get("/v1/volumes")).json()["volumes"]
    assert [(v["name"], v["capabilities"]) for v in volumes] == [("volume1", [])]
    fid = await storage.new_folder(quota=1000)
    await storage.new_folder()  # another
    ref = {"volume": "volume1", "folder_id": fid}
    # idempotent create of an empty folder
    again = {**ref, "quota_bytes": 1000}
    assert (await storage.mgr.post("/v1/folders/create", json=again)).status_code == 204
    (storage.folder(fid) / "a.txt").write_bytes(b"12345")
    r = await storage.mgr.post("/v1/folders/create", json=ref)
    _problem(r, 409, "exists")
    usage = (await storage.mgr.post("/v1/folders/usage", json=ref)).json()
    assert usage == {"file_count": 1, "used_bytes": 5, "quota_bytes": 1000}
    mount = (await storage.mgr.post("/v1/folders/mount", json=ref)).json()
    assert mount == {"path": str(storage.folder(fid))}
    target = "f" * 32
    r = await storage.mgr.post(
        "/v1/folders/clone",
        json={"source": ref, "target": {"volume": "volume1", "folder_id": target}},
    )
    assert r.status_code == 204, r.text
    assert (storage.folder(target) / "a.txt").read_bytes() == b"12345"
    assert (await storage.mgr.post("/v1/folders/delete", json=ref)).status_code == 204
    assert not storage.folder(fid).exists()
    assert (await storage.mgr.post("/v1/folders/delete", json=ref)).status_code == 204
    r = await storage.mgr.post("/v1/folders/usage", json=ref)
    _problem(r, 404, "no-folder")
    r = await storage.mgr.post("/v1/folders/usage", json={"volume": "nope", "folder_id": fid})
    assert "received 'nope'" in _problem(r, 404, "no-volume")
    r = await storage.mgr.post("/v1/folders/usage", json={"volume": "volume1", "folder_id": "x"})
    assert "folder_id" in _problem(r, 400, "bad-request")


async def test_tus_upload_start_resume_complete(storage: Running) -> None:
    fid = await storage.new_folder()
    data = os.urandom(3 * 1024 * 1024 + 17)
    url, params = await _ticket(
        storage, "upload", {"folder_id": fid, "path": "d/x.bin", "size": len(data)}
    )
    async with httpx.AsyncClient() as http:
        r = await http.options(url, params=params)
    assert r.headers["Tus-Version"] == "1.0.0"
    r = await _head(url, params)
    assert (r.status_code, r.headers["Upload-Offset"], r.headers["Upload-Length"]) == (
        200, "0", str(len(data)),
    )  # fmt: skip
    r = await _patch(url, params, 0, data[:1000])
    assert (r.status_code, r.headers["Upload-Offset"]) == (204, "1000")
    assert not (storage.folder(fid) / "d" / "x.bin").exists()
    r = await _patch(url, params, 5, data[5:10])
    assert "expected 1000, received 5" in _problem(r, 409, "upload-conflict")
    r = await _patch(url, params, 1000, data[1000:])
    assert (r.status_code, r.headers["Upload-Offset"]) == (204, str(len(data)))
    assert (storage.folder(fid) / "d" / "x.bin").read_bytes() == data
    assert (await _head(url, params)).headers["Upload-Offset"] == str(len(data))
    assert os.listdir(storage.volume_dir / ".accelshare" / "uploads") != []  # done marker only
    assert not any(
        n.endswith(".part") for n in os.listdir(storage.volume_dir / ".accelshare" / "uploads")
    )


async def test_an_interrupted_upload_is_never_visible_and_resumes(storage: Running) -> None:
    fid = await storage.new_folder()
    data = os.urandom(8 * 1024 * 1024)
    url, params = await _ticket(
        storage, "upload", {"folder_id": fid, "path": "big.bin", "size": len(data)}
    )
    # a client that sends half the body and vanishes
    _reader, writer = await asyncio.open_connection("127.0.0.1", storage.client_port)
    head = (
        f"PATCH /upload?token={params['token']} HTTP/1.1\r\nHost: x\r\nTus-Resumable: 1.0.0\r\n"
        f"Content-Type: application/offset+octet-stream\r\nUpload-Offset: 0\r\n"
        f"Content-Length: {len(data)}\r\n\r\n"
    ).encode()
    writer.write(head + data[: len(data) // 2])
    await writer.drain()
    writer.close()
    await writer.wait_closed()
    offset = 0
    for _ in range(200):
        offset = int((await _head(url, params)).headers["Upload-Offset"])
        if offset == len(data) // 2:
            break
        await asyncio.sleep(0.05)
    assert 0 < offset <= len(data) // 2
    assert os.listdir(storage.folder(fid)) == []  # nothing under the final name
    r = await _patch(url, params, offset, data[offset:])
    assert r.status_code == 204, r.text
    assert (storage.folder(fid) / "big.bin").read_bytes() == data


async def test_concurrent_uploads_of_one_name_end_with_one_whole_file(storage: Running) -> None:
    fid = await storage.new_folder()
    bodies = [bytes([n]) * (2 * 1024 * 1024) for n in range(4)]
    tickets = [
        await _ticket(storage, "upload", {"folder_id": fid, "path": "same.bin", "size": len(b)})
        for b in bodies
    ]
    results = await asyncio.gather(
        *(_patch(url, params, 0, body) for (url, params), body in zip(tickets, bodies, strict=True))
    )
    assert [r.status_code for r in results] == [204] * 4
    final = (storage.folder(fid) / "same.bin").read_bytes()
    assert final in bodies
    assert os.listdir(storage.folder(fid)) == ["same.bin"]


async def test_a_restart_keeps_finished_uploads_and_resumes_partial_ones(storage: Running) -> None:
    fid = await storage.new_folder()
    url, params = await _ticket(
        storage, "upload", {"folder_id": fid, "path": "done.txt", "size": 4}
    )
    assert (await _patch(url, params, 0, b"done")).status_code == 204
    url2, params2 = await _ticket(
        storage, "upload", {"folder_id": fid, "path": "half.txt", "size": 8}
    )
    assert (await _patch(url2, params2, 0, b"half")).status_code == 204
    await storage.restart()
    assert (storage.folder(fid) / "done.txt").read_bytes() == b"done"
    assert (await _head(url2, params2)).headers["Upload-Offset"] == "4"
    assert (await _patch(url2, params2, 4, b"more")).status_code == 204
    assert (storage.folder(fid) / "half.txt").read_bytes() == b"halfmore"


async def test_an_empty_file_needs_no_patch(storage: Running) -> None:
    fid = await storage.new_folder()
    url, params = await _ticket(storage, "upload", {"folder_id": fid, "path": "empty", "size": 0})
    assert (storage.folder(fid) / "empty").read_bytes() == b""
    assert (await _head(url, params)).headers["Upload-Offset"] == "0"


async def test_over_quota_uploads_are_refused(storage: Running) -> None:
    assert storage.mgr is not None
    fid = await storage.new_folder(quota=100)
    (storage.folder(fid) / "old").write_bytes(b"x" * 30)
    r = await storage.mgr.post(
        "/v1/files/upload", json={"volume": "volume1", "folder_id": fid, "path": "a", "size": 71}
    )
    assert "expected at most 70 bytes" in _problem(r, 413, "over-quota")
    await _ticket(storage, "upload", {"folder_id": fid, "path": "a", "size": 50})
    r = await storage.mgr.post(
        "/v1/files/upload", json={"volume": "volume1", "folder_id": fid, "path": "b", "size": 21}
    )
    assert "in open uploads 50" in _problem(r, 413, "over-quota")
    r = await storage.mgr.post(
        "/v1/folders/quota", json={"volume": "volume1", "folder_id": fid, "quota_bytes": None}
    )
    assert r.status_code == 204
    await _ticket(storage, "upload", {"folder_id": fid, "path": "b", "size": 10**9})


async def test_an_upload_cannot_exceed_its_declared_length(storage: Running) -> None:
    fid = await storage.new_folder()
    url, params = await _ticket(storage, "upload", {"folder_id": fid, "path": "a", "size": 4})
    r = await _patch(url, params, 0, b"too long")
    assert "at most 4 bytes" in _problem(r, 400, "bad-request")
    assert (await _head(url, params)).headers["Upload-Offset"] == "0"


async def test_range_downloads(storage: Running) -> None:
    fid = await storage.new_folder()
    data = os.urandom(3 * 1024 * 1024 + 5)
    (storage.folder(fid) / "f.bin").write_bytes(data)
    url, params = await _ticket(storage, "download", {"folder_id": fid, "path": "f.bin"})
    async with httpx.AsyncClient(timeout=30) as http:
        r = await http.get(url, params=params)
        assert r.status_code == 200
        assert r.content == data
        assert r.headers["Content-Disposition"].startswith('attachment; filename="f.bin"')
        modified = r.headers["Last-Modified"]
        r = await http.get(url, params=params, headers={"Range": "bytes=10-19"})
        assert (r.status_code, r.content) == (206, data[10:20])
        assert r.headers["Content-Range"] == f"bytes 10-19/{len(data)}"
        r = await http.get(url, params=params, headers={"Range": "bytes=1048570-"})
        assert (r.status_code, r.content) == (206, data[1048570:])
        r = await http.get(url, params=params, headers={"Range": "bytes=-7"})
        assert (r.status_code, r.content) == (206, data[-7:])
        r = await http.get(url, params=params, headers={"Range": f"bytes={len(data)}-"})
        assert (r.status_code, r.headers["Content-Range"]) == (416, f"bytes */{len(data)}")
        r = await http.get(url, params=params, headers={"Range": "bytes=5-", "If-Range": modified})
        assert (r.status_code, r.content) == (206, data[5:])
        stale = formatdate(0, usegmt=True)
        r = await http.get(url, params=params, headers={"Range": "bytes=5-", "If-Range": stale})
        assert (r.status_code, r.content) == (200, data)
        # a download token is not an upload token
        r = await http.head(url.replace("/download", "/upload"), params=params)
        assert r.status_code == 403


async def test_a_directory_downloads_as_a_zip(storage: Running) -> None:
    fid = await storage.new_folder()
    root = storage.folder(fid)
    (root / "d" / "sub").mkdir(parents=True)
    (root / "d" / "empty").mkdir()
    (root / "d" / "a.txt").write_text("A")
    (root / "d" / "sub" / "b.bin").write_bytes(os.urandom(2 * 1024 * 1024))
    os.symlink("/etc/passwd", root / "d" / "leak")
    assert storage.mgr is not None
    r = await storage.mgr.post(
        "/v1/files/download", json={"volume": "volume1", "folder_id": fid, "path": "d"}
    )
    assert "archive: expected true" in _problem(r, 400, "bad-request")
    url, params = await _ticket(
        storage, "download", {"folder_id": fid, "path": "d", "archive": True}
    )
    async with httpx.AsyncClient(timeout=30) as http:
        r = await http.get(url, params=params)
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/zip"
    with zipfile.ZipFile(io.BytesIO(r.content)) as archive:
        assert sorted(archive.namelist()) == ["a.txt", "empty/", "sub/b.bin"]
        assert archive.read("sub/b.bin") == (root / "d" / "sub" / "b.bin").read_bytes()


async def test_listing_pages(storage: Running) -> None:
    assert storage.mgr is not None
    fid = await storage.new_folder()
    names = [f"f{n:05d}" for n in range(1203)]
    for name in names:
        (storage.folder(fid) / name).write_bytes(b"")
    (storage.folder(fid) / "zdir").mkdir()
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        r = await storage.mgr.post(
            "/v1/files/list",
            json={"volume": "volume1", "folder_id": fid, "limit": 500, "cursor": cursor},
        )
        assert r.status_code == 200, r.text
        page = r.json()
        pages += 1
        seen += [item["name"] for item in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert pages == 3
    assert seen == [*names, "zdir"]
    assert page["items"][-1]["type"] == "dir"
    r = await storage.mgr.post(
        "/v1/files/list", json={"volume": "volume1", "folder_id": fid, "path": "f00001"}
    )
    assert "expected a directory" in _problem(r, 400, "bad-request")


async def test_a_name_that_is_not_utf8_is_listed_with_its_bytes(storage: Running) -> None:
    """A file name that is not UTF-8 (made outside the proxy) is listed with its bytes
    kept, byte for byte, and its neighbours listed as usual."""
    assert storage.mgr is not None
    fid = await storage.new_folder()
    folder = os.fsencode(storage.folder(fid))
    for raw in (b"caf\xe9.txt", "naïve.txt".encode()):
        with open(folder + b"/" + raw, "wb"):
            pass
    r = await storage.mgr.post("/v1/files/list", json={"volume": "volume1", "folder_id": fid})
    assert r.status_code == 200, r.text
    assert r.content.count(b"caf\xe9.txt") == 1  # the bytes as on disk
    assert "naïve.txt" in r.content.decode("utf-8", "replace")


async def test_file_operations(storage: Running) -> None:
    assert storage.mgr is not None
    fid = await storage.new_folder()
    ref = {"volume": "volume1", "folder_id": fid}
    r = await storage.mgr.post("/v1/files/mkdir", json={**ref, "paths": ["a/b"]})
    _problem(r, 404, "no-file")
    r = await storage.mgr.post("/v1/files/mkdir", json={**ref, "paths": ["a/b"], "parents": True})
    assert r.status_code == 204
    r = await storage.mgr.post("/v1/files/mkdir", json={**ref, "paths": ["a"]})
    _problem(r, 409, "exists")
    r = await storage.mgr.post("/v1/files/mkdir", json={**ref, "paths": ["a"], "exist_ok": True})
    assert r.status_code == 204
    (storage.folder(fid) / "a" / "b" / "f").write_text("x")
    r = await storage.mgr.post("/v1/files/move", json={**ref, "source": "a/b/f", "target": "a/g"})
    assert r.status_code == 204
    assert (storage.folder(fid) / "a" / "g").read_text() == "x"
    r = await storage.mgr.post("/v1/files/move", json={**ref, "source": "a/g", "target": "a/b"})
    _problem(r, 409, "exists")
    r = await storage.mgr.post("/v1/files/move", json={**ref, "source": "a", "target": "a/b/c"})
    _problem(r, 400, "bad-path")
    r = await storage.mgr.post("/v1/files/delete", json={**ref, "paths": ["a"]})
    _problem(r, 409, "not-empty")
    r = await storage.mgr.post("/v1/files/delete", json={**ref, "paths": ["a", "nope"]})
    _problem(r, 404, "no-file")
    assert (storage.folder(fid) / "a").exists()  # nothing deleted when one path is bad
    r = await storage.mgr.post("/v1/files/delete", json={**ref, "paths": ["a"], "recursive": True})
    assert r.status_code == 204
    assert os.listdir(storage.folder(fid)) == []


async def test_traversal_is_refused_everywhere(storage: Running) -> None:
    assert storage.mgr is not None
    fid = await storage.new_folder()
    ref = {"volume": "volume1", "folder_id": fid}
    outside = storage.volume_dir.parent / "outside"
    outside.mkdir()
    (outside / "secret").write_text("s")
    os.symlink(str(outside), storage.folder(fid) / "out")
    os.symlink("../../../../../outside", storage.folder(fid) / "rel")
    attempts: list[tuple[str, dict[str, Any]]] = [
        ("list", {"path": "../"}),
        ("list", {"path": "out"}),
        ("list", {"path": "rel"}),
        ("download", {"path": "out/secret"}),
        ("download", {"path": "/etc/passwd"}),
        ("download", {"path": "a\x00b"}),
        ("upload", {"path": "../x", "size": 1}),
        ("upload", {"path": "out/x", "size": 1}),
        ("mkdir", {"paths": ["rel/x"]}),
        ("move", {"source": "out/secret", "target": "got"}),
        ("move", {"source": "x", "target": "../../x"}),
        ("delete", {"paths": ["out/secret"]}),
    ]
    for op, body in attempts:
        r = await storage.mgr.post(f"/v1/files/{op}", json={**ref, **body})
        detail = _problem(r, 400, "bad-path")
        assert "expected" in detail, (op, body, detail)
        assert "received" in detail, (op, body, detail)
    assert (outside / "secret").read_text() == "s"
    assert sorted(os.listdir(outside)) == ["secret"]
    # deleting the link itself is fine and leaves its target alone
    r = await storage.mgr.post("/v1/files/delete", json={**ref, "paths": ["out"]})
    assert r.status_code == 204
    assert (outside / "secret").exists()


async def test_dst_dir_is_honoured_and_checked(storage: Running) -> None:
    """The official client may add ``dst_dir`` to the ticket's URL (Backend.AI's proxy
    takes the path relative to it)."""
    fid = await storage.new_folder()
    url, params = await _ticket(storage, "upload", {"folder_id": fid, "path": "f", "size": 2})
    r = await _patch(url, {**params, "dst_dir": "../.."}, 0, b"hi")
    assert "dst_dir: expected" in _problem(r, 400, "bad-path")
    r = await _patch(url, {**params, "dst_dir": "in/here"}, 0, b"hi")
    assert r.status_code == 204, r.text
    assert (storage.folder(fid) / "in" / "here" / "f").read_bytes() == b"hi"
    (storage.folder(fid) / "f").write_bytes(b"root")
    url, params = await _ticket(storage, "download", {"folder_id": fid, "path": "f"})
    async with httpx.AsyncClient() as http:
        r = await http.get(url, params={**params, "dst_dir": "in/here"})
        assert r.content == b"hi"
        assert (await http.get(url, params=params)).content == b"root"
