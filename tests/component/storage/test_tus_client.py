"""The official client's tus library (aiotusclient, in the Backend.AI client's virtualenv)
uploads through the proxy as `backend.ai vfolder upload` does: several PATCHes, then the
file whole under its name."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from .conftest import Running
from .test_storage_proxy import _ticket

REPO = Path(__file__).resolve().parents[3]

SCRIPT = """
import asyncio, sys
from aiotusclient import client
from yarl import URL

async def main():
    url = URL(sys.argv[1]).with_query({"token": sys.argv[2]})
    with open(sys.argv[3], "rb") as stream:
        uploader = client.TusClient().async_uploader(
            file_stream=stream, url=url, upload_checksum=False, chunk_size=256 * 1024
        )
        await uploader.upload()

asyncio.run(main())
"""


def _bai_python() -> Path:
    venv = Path(os.environ.get("ACCELSHARE_BAI_VENV") or REPO / ".venv-bai")
    python = venv / "bin" / "python"
    if not python.exists():
        pytest.skip(f"no official client virtualenv at {venv} (set ACCELSHARE_BAI_VENV)")
    return python


async def test_aiotusclient_uploads(storage: Running, tmp_path: Path) -> None:
    python = _bai_python()
    fid = await storage.new_folder()
    data = os.urandom(1024 * 1024 + 99)
    source = tmp_path / "local.bin"
    source.write_bytes(data)
    url, params = await _ticket(
        storage, "upload", {"folder_id": fid, "path": "sub/remote.bin", "size": len(data)}
    )
    proc = await asyncio.create_subprocess_exec(
        str(python), "-c", SCRIPT, url, params["token"], str(source),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, out.decode(errors="replace")
    assert (storage.folder(fid) / "sub" / "remote.bin").read_bytes() == data
