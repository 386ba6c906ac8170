"""Storage proxy benchmark: a big file up (tus) and down over loopback, the proxy's
memory while it streams, and paging through a directory of 100,000 files.

    .venv/bin/python bench/storage_bench.py [--size 2g] [--files 100000] [--dir /tmp]

Starts a real proxy (``accelshare server storage``) on a temporary volume under
``--dir``, then:

* upload: one tus PATCH of ``--size`` bytes (generated, sent in 4 MiB pieces);
* download: one GET of the file, read and dropped;
* for each, MB/s and the proxy's RSS growth (peak, sampled every 20 ms, over its RSS
  before the transfer);
* listing: ``--files`` empty files in one directory, paged with ``/v1/files/list`` at
  the largest page (5000), the time for all pages.

Targets (docs/storage.md): RSS growth < 64 MiB, >= 200 MB/s each way, listing < 1 s.
Exits 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil

from accelshare.common import BinarySize
from accelshare.protocol.storage import STORAGE_SECRET_HEADER

PIECE = 4 * 1024 * 1024
RSS_LIMIT = 64 * 1024 * 1024
RATE_TARGET = 200.0  # MB/s
LIST_TARGET_S = 1.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PeakRss:
    """The peak RSS of a process while in the ``with`` block."""

    def __init__(self, pid: int) -> None:
        self.proc = psutil.Process(pid)
        self.start = self.peak = self.proc.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, self.proc.memory_info().rss)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def growth(self) -> int:
        return int(self.peak - self.start)


def _body(size: int) -> Iterator[bytes]:
    block = os.urandom(PIECE)
    sent = 0
    while sent < size:
        piece = block[: min(PIECE, size - sent)]
        sent += len(piece)
        yield piece


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="2g", help="upload/download size (default 2g)")
    parser.add_argument("--files", type=int, default=100_000, help="files in the listed directory")
    parser.add_argument("--dir", default=None, help="where the temporary volume goes")
    args = parser.parse_args()
    size = int(BinarySize.finite_from_str(args.size))
    work = Path(tempfile.mkdtemp(prefix="storage-bench-", dir=args.dir))
    secret = secrets.token_urlsafe(24)
    mport, cport = _free_port(), _free_port()
    (work / "volume").mkdir()
    config = work / "storage.toml"
    config.write_text(
        f'[storage-proxy]\nnode-id = "bench"\nsecret = "{secret}"\n'
        f'manager-api = "127.0.0.1:{mport}"\nclient-api = "127.0.0.1:{cport}"\n'
        f'[volume.v]\npath = "{work / "volume"}"\n'
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "accelshare.client.cli", "server", "storage", "--config",
         str(config), "--log-level", "warning"],
    )  # fmt: skip
    failed = False
    try:
        mgr = httpx.Client(
            base_url=f"http://127.0.0.1:{mport}", headers={STORAGE_SECRET_HEADER: secret},
            timeout=600,
        )  # fmt: skip
        for _ in range(200):
            try:
                if mgr.get("/v1/health").status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.05)
        fid = uuid.uuid4().hex
        mgr.post("/v1/folders/create", json={"volume": "v", "folder_id": fid}).raise_for_status()
        ref = {"volume": "v", "folder_id": fid}
        client = httpx.Client(timeout=600)
        ticket = mgr.post("/v1/files/upload", json={**ref, "path": "big.bin", "size": size}).json()
        with PeakRss(proc.pid) as rss:
            started = time.perf_counter()
            r = client.patch(
                ticket["url"], params={"token": ticket["token"]}, content=_body(size),
                headers={"Tus-Resumable": "1.0.0", "Upload-Offset": "0",
                         "Content-Type": "application/offset+octet-stream"},
            )  # fmt: skip
            r.raise_for_status()
            up_s = time.perf_counter() - started
        up_rate, up_rss = size / up_s / 1e6, rss.growth
        ticket = mgr.post("/v1/files/download", json={**ref, "path": "big.bin"}).json()
        with PeakRss(proc.pid) as rss:
            started = time.perf_counter()
            got = 0
            with client.stream("GET", ticket["url"], params={"token": ticket["token"]}) as resp:
                resp.raise_for_status()
                for chunk in resp.iter_raw(PIECE):
                    got += len(chunk)
            down_s = time.perf_counter() - started
        assert got == size, (got, size)
        down_rate, down_rss = size / down_s / 1e6, rss.growth
        mgr.post("/v1/files/delete", json={**ref, "paths": ["big.bin"]}).raise_for_status()

        folder = work / "volume" / fid[:2] / fid[2:4] / fid / "many"
        folder.mkdir()
        for n in range(args.files):
            (folder / f"file-{n:06d}").touch()
        # the directory is now "settled" (listing caches only directories older than 2 s)
        time.sleep(2.5)
        timings = []
        for _ in range(2):
            started = time.perf_counter()
            cursor, count, pages = None, 0, 0
            while True:
                page = mgr.post(
                    "/v1/files/list",
                    json={**ref, "path": "many", "limit": 5000, "cursor": cursor},
                ).json()
                count += len(page["items"])
                pages += 1
                cursor = page["next_cursor"]
                if cursor is None:
                    break
            timings.append(time.perf_counter() - started)
            assert count == args.files, count
        first_page_s = timings  # whole listing, first (cold) and second pass
        mib = 1024 * 1024
        print(f"size {BinarySize(size)} over loopback")
        print(f"upload    {up_rate:8.1f} MB/s   proxy RSS growth {up_rss / mib:6.1f} MiB")
        print(f"download  {down_rate:8.1f} MB/s   proxy RSS growth {down_rss / mib:6.1f} MiB")
        print(
            f"listing   {args.files} files in {pages} pages: {first_page_s[0]:.3f} s cold,"
            f" {first_page_s[1]:.3f} s again"
        )
        for name, ok in (
            ("upload rate", up_rate >= RATE_TARGET),
            ("download rate", down_rate >= RATE_TARGET),
            ("upload RSS", up_rss < RSS_LIMIT),
            ("download RSS", down_rss < RSS_LIMIT),
            ("listing", first_page_s[0] < LIST_TARGET_S),
        ):
            if not ok:
                print(f"MISSED: {name}")
                failed = True
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
