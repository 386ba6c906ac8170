"""The pure core (common, alloc, sched) must not load any I/O library.

Each package is walked in a fresh interpreter: every one of its modules is imported,
and no module of :data:`IO_MODULES` (nor a submodule of one) may have been loaded by
them.  import-linter (``make lint``) checks the same packages statically; this test also
catches what a dependency loads on their behalf.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import accelshare

IO_MODULES = [
    # the standard library's I/O and concurrency
    "asyncio",
    "socket",
    "ssl",
    "select",
    "selectors",
    "sqlite3",
    "subprocess",
    "multiprocessing",
    "concurrent.futures",
    "http",
    "urllib.request",
    "ftplib",
    "smtplib",
    # third-party I/O packages this project depends on
    "sqlalchemy",
    "alembic",
    "httpx",
    "fastapi",
    "starlette",
    "uvicorn",
    "websockets",
    "strawberry",
    "aetcd",
    "grpc",
    "redis",
    "aiodocker",
    "aiosqlite",
    "asyncpg",
    "psutil",
    "pynvml",
]

PURE_PACKAGES = ["accelshare.common", "accelshare.alloc", "accelshare.sched"]

_WALK = """
import importlib, json, pkgutil, sys
package, io_modules = sys.argv[1], json.loads(sys.argv[2])
before = set(sys.modules)
root = importlib.import_module(package)
imported = [package]
for info in pkgutil.walk_packages(root.__path__, package + "."):
    importlib.import_module(info.name)
    imported.append(info.name)
loaded = set(sys.modules) - before
bad = [io for io in io_modules if any(m == io or m.startswith(io + ".") for m in loaded)]
print(json.dumps({"imported": imported, "bad": bad}))
"""


def _modules_on_disk(package: str) -> set[str]:
    root = Path(accelshare.__file__).parent.parent
    directory = root.joinpath(*package.split("."))
    names = set()
    for path in directory.rglob("*.py"):
        parts = path.relative_to(root).with_suffix("").parts
        names.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


@pytest.mark.parametrize("package", PURE_PACKAGES)
def test_every_module_of_the_pure_core_loads_no_io_library(package: str) -> None:
    result = subprocess.run(
        [sys.executable, "-c", _WALK, package, json.dumps(IO_MODULES)],
        capture_output=True,
        text=True,
        check=True,
    )
    report = json.loads(result.stdout)
    assert set(report["imported"]) == _modules_on_disk(package)  # the walk missed none
    assert report["bad"] == [], f"{package} loads I/O modules: {report['bad']}"
