"""A running kernel's working folder through the agent's RPC (``PUT/GET
/v1/kernels/{id}/files``, ``GET .../files/list``): a whole in-process agent with real
process-runtime kernels."""

from __future__ import annotations

import io
import os
import tarfile
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from accelshare.agent.runtime.sandbox import SandboxConfig

Factory = Callable[..., Any]
Eventually = Callable[..., Awaitable[Any]]
KERNEL_UID, KERNEL_GID = SandboxConfig().effective_ids()


async def _running(agent: Any, command: str = "exec sleep 60", **extra: Any) -> str:
    kernel_id = f"f-{uuid.uuid4().hex[:10]}"
    body = {
        "kernel_id": kernel_id,
        "session_id": f"s-{kernel_id}",
        "image": "shell",
        "requested_slots": {"cpu": "1", "mem": "1g"},
        "command": [command],
        **extra,
    }
    response = await agent.client.post("/v1/kernels", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "RUNNING", response.json()["reason"]
    return kernel_id


def _work(scratch_root: Path, kernel_id: str) -> Path:
    return scratch_root / kernel_id / "work"


async def test_upload_list_and_download(
    agent_toml: Factory, start_agent: Factory, scratch_root: Path, sandbox_support: str | None
) -> None:
    agent = await start_agent(agent_toml())
    kernel_id = await _running(agent)
    files = f"/v1/kernels/{kernel_id}/files"
    payload = os.urandom(3 * 1024 * 1024 + 17)

    async def chunks() -> Any:  # streamed (chunked), not one body
        for start in range(0, len(payload), 1 << 20):
            yield payload[start : start + (1 << 20)]

    put = await agent.client.put(files, params={"path": "sub/dir/blob.bin"}, content=chunks())
    assert put.status_code == 200, put.text
    assert put.json() == {"path": "sub/dir/blob.bin", "size": len(payload)}
    target = _work(scratch_root, kernel_id) / "sub" / "dir" / "blob.bin"
    assert target.read_bytes() == payload
    if sandbox_support is None and os.geteuid() == 0:  # written as the kernel's user
        for path in (target, target.parent, target.parent.parent):
            assert (path.stat().st_uid, path.stat().st_gid) == (KERNEL_UID, KERNEL_GID)
    # no temporary file left next to it
    assert sorted(os.listdir(target.parent)) == ["blob.bin"]
    again = await agent.client.put(files, params={"path": "sub/dir/blob.bin"}, content=b"new")
    assert again.status_code == 200
    assert target.read_bytes() == b"new"

    listing = await agent.client.get(f"{files}/list", params={"path": "sub/dir"})
    assert listing.status_code == 200
    (entry,) = listing.json()["files"]
    assert entry["filename"] == "blob.bin"
    assert entry["size"] == 3
    assert entry["mode"].startswith("-rw")
    root = await agent.client.get(f"{files}/list", params={"path": ""})
    assert "sub" in {e["filename"] for e in root.json()["files"]}

    single = await agent.client.get(files, params={"path": "sub/dir/blob.bin"})
    assert single.status_code == 200
    assert single.headers["content-type"] == "application/x-tar"
    with tarfile.open(fileobj=io.BytesIO(single.content)) as tar:
        assert tar.getnames() == ["blob.bin"]
        member = tar.extractfile("blob.bin")
        assert member is not None
        assert member.read() == b"new"
    folder = await agent.client.get(files, params={"path": "sub"})
    with tarfile.open(fileobj=io.BytesIO(folder.content)) as tar:
        assert tar.getnames() == ["sub", "sub/dir", "sub/dir/blob.bin"]
    missing = await agent.client.get(files, params={"path": "nope.txt"})
    assert missing.status_code == 404
    await agent.destroy(kernel_id)
    gone = await agent.client.get(f"{files}/list", params={"path": ""})
    assert gone.status_code == 404
    assert "not running" in gone.json()["detail"]


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("../escape.txt", "'..' is refused"),
        ("a/../../escape.txt", "'..' is refused"),
        ("/etc/passwd", "relative to the working folder"),
        ("a\x00b", "control characters"),
        ("a\nb", "control characters"),
    ],
)
async def test_paths_leaving_the_folder_are_refused(
    agent_toml: Factory, start_agent: Factory, scratch_root: Path, path: str, why: str
) -> None:
    agent = await start_agent(agent_toml())
    kernel_id = await _running(agent)
    files = f"/v1/kernels/{kernel_id}/files"
    for response in (
        await agent.client.put(files, params={"path": path}, content=b"x"),
        await agent.client.get(files, params={"path": path}),
        await agent.client.get(f"{files}/list", params={"path": path}),
    ):
        assert response.status_code == 400, response.text
        assert why in response.json()["detail"]
    assert not (scratch_root / kernel_id / "escape.txt").exists()
    assert not (scratch_root / "escape.txt").exists()


async def test_symlinks_made_by_the_kernel_are_not_followed_out(
    agent_toml: Factory,
    start_agent: Factory,
    scratch_root: Path,
    tmp_path: Path,
    eventually: Eventually,
) -> None:
    agent = await start_agent(agent_toml())
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("host secret\n")
    kernel_id = await _running(agent)
    work = _work(scratch_root, kernel_id)
    (work / "escape").symlink_to(outside)  # what a kernel could make in its own folder
    (work / "link.txt").symlink_to(outside / "secret.txt")
    files = f"/v1/kernels/{kernel_id}/files"
    put = await agent.client.put(files, params={"path": "escape/planted.txt"}, content=b"x")
    assert put.status_code == 409
    assert "symlink" in put.json()["detail"]
    assert not (outside / "planted.txt").exists()
    listed = await agent.client.get(f"{files}/list", params={"path": "escape"})
    assert listed.status_code == 409
    through = await agent.client.get(files, params={"path": "escape/secret.txt"})
    assert through.status_code == 409
    # the link itself: archived as a link, its target never read
    link = await agent.client.get(files, params={"path": "link.txt"})
    assert link.status_code == 200
    with tarfile.open(fileobj=io.BytesIO(link.content)) as tar:
        (member,) = tar.getmembers()
        assert member.issym()
        assert member.linkname == str(outside / "secret.txt")
    assert b"host secret" not in link.content
    # uploading over the link replaces the link, never writes its target
    over = await agent.client.put(files, params={"path": "link.txt"}, content=b"mine")
    assert over.status_code == 200
    assert (outside / "secret.txt").read_text() == "host secret\n"
    assert not (work / "link.txt").is_symlink()


async def test_an_upload_over_the_limit_is_413_and_leaves_nothing(
    agent_toml: Factory, start_agent: Factory, scratch_root: Path
) -> None:
    agent = await start_agent(agent_toml(container={"file-upload-max-bytes": "64k"}))
    kernel_id = await _running(agent)
    files = f"/v1/kernels/{kernel_id}/files"

    async def chunks() -> Any:
        for _ in range(10):
            yield b"x" * 16384

    streamed = await agent.client.put(files, params={"path": "big.bin"}, content=chunks())
    assert streamed.status_code == 413
    assert "file-upload-max-bytes" in streamed.json()["detail"]
    assert "65536" in streamed.json()["detail"]
    declared = await agent.client.put(files, params={"path": "big.bin"}, content=b"y" * 70000)
    assert declared.status_code == 413
    assert os.listdir(_work(scratch_root, kernel_id)) == []
    fits = await agent.client.put(files, params={"path": "ok.bin"}, content=b"z" * 65536)
    assert fits.status_code == 200


async def test_files_in_mounted_folders_land_in_the_folder(
    agent_toml: Factory,
    start_agent: Factory,
    tmp_path: Path,
    sandbox_support: str | None,
) -> None:
    if sandbox_support is not None:
        pytest.skip(sandbox_support)
    agent = await start_agent(agent_toml())
    rw, ro = tmp_path / "rw", tmp_path / "ro"
    rw.mkdir()
    ro.mkdir()
    (ro / "in.txt").write_text("read me\n")
    mounts = [
        {"name": "data", "host_path": str(rw), "kernel_path": "/home/work/data"},
        {"name": "ro", "host_path": str(ro), "kernel_path": "/home/work/ro", "read_only": True},
    ]
    kernel_id = await _running(agent, mounts=mounts)
    files = f"/v1/kernels/{kernel_id}/files"
    put = await agent.client.put(files, params={"path": "data/up.txt"}, content=b"into rw")
    assert put.status_code == 200
    assert (rw / "up.txt").read_bytes() == b"into rw"
    refused = await agent.client.put(files, params={"path": "ro/up.txt"}, content=b"x")
    assert refused.status_code == 409
    assert "read-only mount" in refused.json()["detail"]
    assert not (ro / "up.txt").exists()
    listed = await agent.client.get(f"{files}/list", params={"path": "ro"})
    assert [e["filename"] for e in listed.json()["files"]] == ["in.txt"]
    whole = await agent.client.get(files, params={"path": ""})
    with tarfile.open(fileobj=io.BytesIO(whole.content)) as tar:
        names = set(tar.getnames())
    assert {"work/data/up.txt", "work/ro/in.txt"} <= names
