"""The pure core (common, alloc, sched) must not import any I/O library."""

import subprocess
import sys

import pytest

IO_MODULES = [
    "asyncio",
    "socket",
    "ssl",
    "sqlite3",
    "subprocess",
    "http",
    "urllib.request",
    "sqlalchemy",
    "httpx",
    "fastapi",
    "starlette",
    "aetcd",
    "grpc",
    "redis",
    "aiodocker",
    "psutil",
    "pynvml",
]


@pytest.mark.parametrize("package", ["accelshare.common", "accelshare.alloc", "accelshare.sched"])
def test_pure_package_imports_no_io_library(package: str) -> None:
    code = (
        f"import sys, {package}\n"
        f"bad = [m for m in {IO_MODULES!r} if m in sys.modules]\n"
        "print(','.join(bad))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "", f"{package} imports I/O modules: {result.stdout}"
