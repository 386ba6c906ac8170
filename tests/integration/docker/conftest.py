"""A private Docker engine for the docker-runtime tests, and a busybox image built locally.

``dockerd`` (Debian package ``docker.io``) is started once per test session with its own
``--data-root``, ``--exec-root``, pidfile and unix socket in a temporary directory, no
bridge network and no iptables rules, and ``--default-ulimit nofile=1024:1024`` (without
it containers fail to start on these machines), and a cgroup parent of its own.  It is stopped and its directory removed
at the end.  The image ``accelshare-test/busybox:1`` is imported from a rootfs tarball
made of a static busybox (Debian package ``busybox-static``): no registry is needed.

Tests are skipped, with the reason, only when no engine can start here (no ``dockerd``
binary, not root, or the daemon exits / does not answer); a broken image is an error.
"""

from __future__ import annotations

import contextlib
import http.client
import io
import os
import shutil
import signal
import socket
import struct
import subprocess
import tarfile
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from accelshare.agent.runtime.docker import DockerRuntime, DockerRuntimeConfig

IMAGE = "accelshare-test/busybox:1"
BUSYBOX_APPLETS = (
    "sh",
    "sleep",
    "cat",
    "echo",
    "env",
    "ls",
    "head",
    "tr",
    "true",
    "false",
    "mkdir",
    "id",
    "httpd",  # app services (test_docker_sessions.py)
)
START_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class DockerEngine:
    socket_path: Path
    root: Path

    @property
    def url(self) -> str:
        return f"unix://{self.socket_path}"


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, socket_path: Path, timeout: float = 30.0) -> None:
        super().__init__("localhost", timeout=timeout)
        self._socket_path = socket_path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(str(self._socket_path))
        self.sock = sock


def _request(
    engine_socket: Path, method: str, path: str, body: bytes | None = None, content_type: str = ""
) -> tuple[int, bytes]:
    conn = _UnixHTTPConnection(engine_socket)
    try:
        headers = {"Content-Type": content_type} if content_type else {}
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def _ping(engine_socket: Path) -> bool:
    try:
        status, _ = _request(engine_socket, "GET", "/_ping")
    except OSError:
        return False
    return status == 200


def _is_static_elf(path: Path) -> bool:
    """True for an x86-64/aarch64 ELF without a PT_INTERP (dynamic loader) header."""
    data = path.read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2:  # 64-bit only
        return False
    endian = "<" if data[5] == 1 else ">"
    phoff = struct.unpack_from(endian + "Q", data, 0x20)[0]
    phentsize, phnum = struct.unpack_from(endian + "HH", data, 0x36)
    for i in range(phnum):
        (p_type,) = struct.unpack_from(endian + "I", data, phoff + i * phentsize)
        if p_type == 3:  # PT_INTERP
            return False
    return True


def _busybox_rootfs_tar(busybox: Path) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for directory in ("bin", "tmp", "home", "etc"):
            info = tarfile.TarInfo(directory)
            info.type = tarfile.DIRTYPE
            info.mode = 0o1777 if directory == "tmp" else 0o755
            tar.addfile(info)
        tar.add(str(busybox), arcname="bin/busybox")
        for applet in BUSYBOX_APPLETS:
            link = tarfile.TarInfo(f"bin/{applet}")
            link.type = tarfile.SYMTYPE
            link.linkname = "busybox"
            tar.addfile(link)
        passwd = b"root:x:0:0:root:/root:/bin/sh\n"
        info = tarfile.TarInfo("etc/passwd")
        info.size = len(passwd)
        tar.addfile(info, io.BytesIO(passwd))
    return buffer.getvalue()


def _unmount_below(root: Path) -> None:
    """Lazy-unmount anything dockerd left mounted under ``root`` (deepest first)."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return
    prefix = str(root) + "/"
    points = [line.split()[4] for line in lines if len(line.split()) > 4]
    for point in sorted((p for p in points if p.startswith(prefix)), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], check=False, capture_output=True)


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)


@pytest.fixture(scope="session")
def docker_engine() -> Iterator[DockerEngine]:
    dockerd = shutil.which("dockerd")
    if dockerd is None:
        pytest.skip("no Docker engine: 'dockerd' not found (install Debian's docker.io)")
    if os.geteuid() != 0:
        pytest.skip("no Docker engine: dockerd needs root here")
    # A short path: unix socket paths are limited to 107 bytes.
    root = Path(tempfile.mkdtemp(prefix="asdk-", dir="/tmp"))
    engine = DockerEngine(socket_path=root / "docker.sock", root=root)
    log_path = root / "dockerd.log"
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(
            [
                dockerd,
                "--data-root",
                str(root / "data"),
                "--exec-root",
                str(root / "exec"),
                "--pidfile",
                str(root / "dockerd.pid"),
                "--host",
                engine.url,
                "--default-ulimit",
                "nofile=1024:1024",
                "--bridge=none",
                "--iptables=false",
                "--ip-masq=false",
                "--shutdown-timeout=2",
                "--cgroup-parent",
                f"/{root.name}",
            ],
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _ping(engine.socket_path):
            if process.poll() is not None or time.monotonic() > deadline:
                tail = log_path.read_text(errors="replace")[-1500:]
                pytest.skip(f"no Docker engine: dockerd did not start ({tail.strip()!r})")
            time.sleep(0.05)
        yield engine
    finally:
        _stop(process)
        _unmount_below(root)
        shutil.rmtree(root, ignore_errors=True)
        for parent in Path("/sys/fs/cgroup").glob(f"*/{root.name}"):
            with contextlib.suppress(OSError):
                parent.rmdir()  # the containers' cgroup parent, empty by now


@pytest.fixture(scope="session")
def busybox_image(docker_engine: DockerEngine) -> str:
    busybox = next(
        (Path(p) for p in ("/bin/busybox", "/usr/bin/busybox") if Path(p).exists()), None
    )
    if busybox is None or not _is_static_elf(busybox):
        pytest.skip("no static busybox to build the test image (install Debian's busybox-static)")
    repo, tag = IMAGE.split(":")
    status, body = _request(
        docker_engine.socket_path,
        "POST",
        f"/images/create?fromSrc=-&repo={repo}&tag={tag}",
        body=_busybox_rootfs_tar(busybox),
        content_type="application/x-tar",
    )
    assert status == 200, f"docker import failed: {status} {body[:500]!r}"
    return IMAGE


@pytest.fixture
async def docker_runtime(
    docker_engine: DockerEngine, busybox_image: str, tmp_path: Path
) -> AsyncIterator[DockerRuntime]:
    config = DockerRuntimeConfig(
        scratch_root=tmp_path / "scratch",
        docker_url=docker_engine.url,
        agent_id=f"test-{uuid.uuid4().hex[:8]}",
        network_mode="none",
        stop_grace_s=1.0,
    )
    runtime = await DockerRuntime.connect(config)
    try:
        yield runtime
    finally:
        with contextlib.suppress(Exception):
            for info in await runtime.scan_kernels():
                await runtime.destroy_kernel(info.kernel_id, grace_s=0)
        await runtime.close()
