"""The demo image catalogue of ``accelshare dev up`` (docs/images.md).

Two process-runtime environments whose library versions differ, built without any
download, plus the agent's own interpreter:

    image          alias      environment on the agents
    python:3.11    python     this Python (sys.executable); the mock accelerator's label
    demo-lib:1.0   -          <data-dir>/envs/demo-lib-1.0, a venv with demo-lib 1.0
    demo-lib:2.0   demo-lib   <data-dir>/envs/demo-lib-2.0, a venv with demo-lib 2.0

(``python:3.11`` is really ``python:<this interpreter's major.minor>``.)

Each venv is made with ``python -m venv --without-pip`` (no pip, no network) and the
package is installed the way an installer lays out a pure-Python wheel: the package
folder into ``site-packages`` plus a ``demo_lib-<v>.dist-info`` (METADATA, INSTALLER,
RECORD), so ``importlib.metadata.version("demo-lib")`` answers too.  The sources are
``demo_packages/demo-lib-<v>/`` next to this module.  Building is idempotent: an
environment whose dist-info is in place is kept.

``environment_tables`` gives the agent.toml tables; ``register`` adds the images to a
running manager (an image already there is left as it is).
"""

from __future__ import annotations

import json
import platform
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import httpx

__all__ = [
    "DEMO_LIB_VERSIONS",
    "DemoImage",
    "build_environments",
    "demo_images",
    "environment_tables",
    "python_ref",
    "register",
]

DEMO_LIB_VERSIONS = ("1.0", "2.0")
_SOURCES = Path(__file__).parent / "demo_packages"


@dataclass(frozen=True, slots=True)
class DemoImage:
    ref: str
    python: str  # the interpreter a kernel of this image runs
    prefix: str | None = None  # the environment's folder (its bin/ goes first on PATH)
    aliases: tuple[str, ...] = ()
    accelerators: tuple[str, ...] = ()
    description: str = ""
    min_slots: dict[str, str] = field(default_factory=dict)


def python_ref() -> str:
    return f"python:{sys.version_info.major}.{sys.version_info.minor}"


def env_dir(root: Path, version: str) -> Path:
    return root / "envs" / f"demo-lib-{version}"


def _site_packages(venv: Path) -> Path:
    found = sorted(venv.glob("lib/python*/site-packages"))
    if not found:
        raise RuntimeError(f"{venv}: no lib/python*/site-packages after `python -m venv`")
    return found[0]


def _install(venv: Path, version: str) -> None:
    """Lay out demo-lib ``version`` in the venv's site-packages (a wheel install)."""
    site = _site_packages(venv)
    source = _SOURCES / f"demo-lib-{version}" / "demo_lib"
    target = site / "demo_lib"
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
    info = site / f"demo_lib-{version}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: demo-lib\nVersion: {version}\n"
        "Summary: accelshare's demo package (two versions, two environments)\n"
    )
    (info / "INSTALLER").write_text("accelshare-dev-up\n")
    files = [p.relative_to(site).as_posix() for p in sorted(target.rglob("*")) if p.is_file()]
    records = [*files, *(f"{info.name}/{n}" for n in ("METADATA", "INSTALLER", "RECORD"))]
    (info / "RECORD").write_text("".join(f"{r},,\n" for r in records))


def build_environments(root: Path) -> dict[str, Path]:
    """Create (or keep) the demo venvs under ``root/envs``; version -> venv folder."""
    built: dict[str, Path] = {}
    for version in DEMO_LIB_VERSIONS:
        venv = env_dir(root, version)
        python = venv / "bin" / "python"
        if not python.exists():
            subprocess.run(
                [sys.executable, "-m", "venv", "--without-pip", "--clear", str(venv)],
                check=True,
                capture_output=True,
                timeout=120,
            )
        if not any(_site_packages(venv).glob(f"demo_lib-{version}.dist-info/RECORD")):
            _install(venv, version)
        built[version] = venv
    return built


def demo_images(root: Path, accelerators: tuple[str, ...] = ()) -> list[DemoImage]:
    """The demo catalogue; ``accelerators``: the labels of the python image (the
    development cluster's mock accelerator, so its GPU sessions keep working)."""
    images = [
        DemoImage(
            python_ref(),
            sys.executable,
            aliases=("python",),
            accelerators=accelerators,
            description=f"Python {python_ref().split(':')[1]}, the agent's own interpreter",
        )
    ]
    for version in DEMO_LIB_VERSIONS:
        venv = env_dir(root, version)
        latest = version == DEMO_LIB_VERSIONS[-1]
        images.append(
            DemoImage(
                f"demo-lib:{version}",
                str(venv / "bin" / "python"),
                prefix=str(venv),
                aliases=("demo-lib",) if latest else (),
                description=f"A virtualenv with demo-lib {version} (no accelerators)",
            )
        )
    return images


def environment_tables(images: list[DemoImage]) -> str:
    """The agent.toml ``[container.environments."<ref>"]`` tables of the images."""
    out = []
    for image in images:
        out.append(f"[container.environments.{json.dumps(image.ref)}]")
        out.append(f"command-prefix = [{json.dumps(image.python)}]")
        if image.prefix is not None:
            out.append(f"image-dir = {json.dumps(image.prefix)}")
            out.append(f"env = {{ VIRTUAL_ENV = {json.dumps(image.prefix)} }}")
        out.append("")
    return "\n".join(out)


def register(http: httpx.Client, images: list[DemoImage]) -> list[str]:
    """Add the images (signed superadmin client); the references added now."""
    added = []
    for image in images:
        response = http.post(
            "/admin/images",
            json={
                "ref": image.ref,
                "runtime": "process",
                # the agents run on this machine and report its architecture
                "architecture": platform.machine() or "x86_64",
                "accelerators": list(image.accelerators),
                "aliases": list(image.aliases),
                "description": image.description,
                "min_slots": image.min_slots,
            },
        )
        if response.status_code == 409:
            continue  # registered by an earlier start; an admin may have changed it
        response.raise_for_status()
        added.append(image.ref)
    return added
