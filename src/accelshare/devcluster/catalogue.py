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

Environments built from a requirements list (:class:`PipEnvironment`): a venv *with*
pip, ``pip install -r`` from the package index, and a ``.accelshare-env.json`` marker
that records what was installed (a later build with the same requirements keeps it).
The ``jupyter:4`` environment of ``dev up`` (JupyterLab + NumPy, the ``jupyter``
service) is one; ``accelshare image build NAME:VERSION --requirements FILE`` builds
others.  They are built after the cluster is up (``dev up`` never waits for, nor fails
on, a download) and registered when the build succeeds.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

__all__ = [
    "DEMO_LIB_VERSIONS",
    "ENV_MARKER",
    "JUPYTER_PORT",
    "JUPYTER_REF",
    "SERVICE_PORTS_LABEL",
    "DemoImage",
    "EnvBuildError",
    "PipEnvironment",
    "build_environments",
    "build_pip_environment",
    "built_environments",
    "demo_images",
    "environment_tables",
    "envs_folder",
    "jupyter_environment",
    "parse_requirements",
    "pip_image",
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
    labels: dict[str, str] = field(default_factory=dict)
    # the environment's idle command (an interactive session's main process); () = default
    idle_command: tuple[str, ...] = ()


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
        if image.idle_command:
            out.append(f"idle-command = {json.dumps(list(image.idle_command))}")
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
                "labels": image.labels,
            },
        )
        if response.status_code == 409:
            continue  # registered by an earlier start; an admin may have changed it
        response.raise_for_status()
        added.append(image.ref)
    return added


# -- environments built from a requirements list -------------------------------------------
ENV_MARKER = ".accelshare-env.json"  # in the venv: what was installed (the build is done)
SERVICE_PORTS_LABEL = "ai.backend.service-ports"  # Backend.AI's label: "name:http:port,..."
JUPYTER_REF = "jupyter:4"
JUPYTER_PORT = 8888
JUPYTER_REQUIREMENTS = ("jupyterlab>=4,<5", "numpy")
_JUPYTER_FILES = Path(__file__).parent / "jupyter"
PIP_TIMEOUT_S = 900.0


class EnvBuildError(RuntimeError):
    """A requirements environment could not be built (pip's reason at the end)."""


@dataclass(frozen=True, slots=True)
class PipEnvironment:
    """An environment built with pip: ``ref`` (``name:version``), its requirements
    (pip requirement lines), the accelerators it supports, app services it declares."""

    ref: str
    requirements: tuple[str, ...]
    accelerators: tuple[str, ...] = ()
    description: str = ""
    services: tuple[tuple[str, int], ...] = ()  # (name, port): http services
    aliases: tuple[str, ...] = ()

    @property
    def folder_name(self) -> str:
        return self.ref.replace(":", "-").replace("/", "_")

    def requirements_key(self) -> str:
        text = "\n".join(self.requirements)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def parse_requirements(text: str, *, source: str = "requirements") -> tuple[str, ...]:
    """The requirement lines of a requirements file (comments and blanks dropped); an
    option line (``-r``, ``--index-url`` ...) is refused, naming the line."""
    lines = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("-"):
            raise ValueError(
                f"{source} line {number}: expected a requirement such as numpy==1.26.4,"
                f" got the option {line!r} (options are not supported)"
            )
        lines.append(line)
    if not lines:
        raise ValueError(f"{source}: expected at least one requirement, got none")
    return tuple(lines)


def env_is_built(venv: Path, env: PipEnvironment) -> bool:
    try:
        marker = json.loads((venv / ENV_MARKER).read_text())
    except (OSError, ValueError):
        return False
    return bool(marker.get("requirements_key") == env.requirements_key())


def build_pip_environment(
    venv: Path,
    env: PipEnvironment,
    *,
    python: str = sys.executable,
    timeout_s: float = PIP_TIMEOUT_S,
    log: Callable[[str], None] = lambda _msg: None,
    cancel: threading.Event | None = None,
) -> Path:
    """Create (or keep) ``venv`` with ``env``'s requirements installed by pip; the venv.

    Kept as it is when its marker records the same requirements.  On failure the
    half-built venv is removed (never left looking usable) and :class:`EnvBuildError`
    says why (pip's last lines).  Setting ``cancel`` kills the running step (``dev up``
    stopping)."""
    venv.parent.mkdir(parents=True, exist_ok=True)
    with (venv.parent / f".{venv.name}.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another cluster sharing the folder builds it
        if not env_is_built(venv, env):
            _build_locked(venv, env, python=python, timeout_s=timeout_s, log=log, cancel=cancel)
        if env.services:
            _install_app_files(venv)  # this accelshare's launcher, even in a kept venv
    return venv


def _install_app_files(venv: Path) -> None:
    """The Jupyter launcher (``bin/accelshare-jupyter``) and the example notebooks
    (``share/accelshare/``)."""
    launcher = venv / "bin" / "accelshare-jupyter"
    text = (_JUPYTER_FILES / "accelshare-jupyter").read_text()
    if not launcher.is_file() or launcher.read_text() != text:
        launcher.write_text(text)
        launcher.chmod(0o755)
    share = venv / "share" / "accelshare"
    share.mkdir(parents=True, exist_ok=True)
    for notebook in _JUPYTER_FILES.glob("*.ipynb"):
        shutil.copy2(notebook, share / notebook.name)


class _Cancelled(Exception):
    pass


def _run(
    argv: list[str], timeout_s: float, env: dict[str, str] | None, cancel: threading.Event | None
) -> None:
    """``argv`` in a process group of its own; raises CalledProcessError (its output
    kept), TimeoutExpired, or _Cancelled when ``cancel`` is set (the group killed)."""
    if cancel is not None and cancel.is_set():
        raise _Cancelled
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
    )
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            output, _ = proc.communicate(timeout=0.5)
            break
        except subprocess.TimeoutExpired:
            stopped = cancel is not None and cancel.is_set()
            if stopped or time.monotonic() > deadline:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
                if stopped:
                    raise _Cancelled from None
                raise subprocess.TimeoutExpired(argv, timeout_s) from None
    if proc.returncode != 0:
        raise subprocess.CalledProcessError(proc.returncode, argv, output=output)


def _build_locked(
    venv: Path,
    env: PipEnvironment,
    *,
    python: str,
    timeout_s: float,
    log: Callable[[str], None],
    cancel: threading.Event | None,
) -> Path:
    log(f"building environment {env.ref} in {venv} (pip install {' '.join(env.requirements)})")
    venv.parent.mkdir(parents=True, exist_ok=True)
    building = venv.with_name(venv.name + ".building")
    shutil.rmtree(building, ignore_errors=True)
    try:
        _run([python, "-m", "venv", "--clear", str(building)], 300.0, None, cancel)
        requirements = building / "requirements.txt"
        requirements.write_text("".join(f"{r}\n" for r in env.requirements))
        pip = [
            str(building / "bin" / "python"),
            *("-m", "pip", "install", "--disable-pip-version-check", "-q"),
            *("-r", str(requirements)),
        ]
        _run(pip, timeout_s, {**os.environ, "PIP_NO_INPUT": "1"}, cancel)
    except subprocess.CalledProcessError as e:
        shutil.rmtree(building, ignore_errors=True)
        tail = "\n".join((e.stderr or e.stdout or "").strip().splitlines()[-5:])
        raise EnvBuildError(
            f"environment {env.ref}: {' '.join(map(str, e.cmd[:4]))}... failed: {tail}"
        ) from None
    except _Cancelled:
        shutil.rmtree(building, ignore_errors=True)
        raise EnvBuildError(f"environment {env.ref}: the build was stopped") from None
    except subprocess.TimeoutExpired:
        shutil.rmtree(building, ignore_errors=True)
        raise EnvBuildError(
            f"environment {env.ref}: pip did not finish in {timeout_s:.0f} s"
        ) from None
    except OSError as e:
        shutil.rmtree(building, ignore_errors=True)
        raise EnvBuildError(f"environment {env.ref}: {e}") from None
    marker = {
        "ref": env.ref,
        "requirements": list(env.requirements),
        "requirements_key": env.requirements_key(),
        "accelerators": list(env.accelerators),
        "description": env.description,
        "services": [list(s) for s in env.services],
        "aliases": list(env.aliases),
    }
    (building / ENV_MARKER).write_text(json.dumps(marker, indent=1) + "\n")
    shutil.rmtree(venv, ignore_errors=True)
    building.rename(venv)
    # the venv's scripts name their interpreter by path: rewrite the build folder's name
    for script in (venv / "bin").iterdir():
        if script.is_file() and not script.is_symlink():
            try:
                text = script.read_text()
            except (UnicodeDecodeError, OSError):
                continue
            if str(building) in text:
                script.write_text(text.replace(str(building), str(venv)))
    pyvenv = venv / "pyvenv.cfg"
    if pyvenv.is_file():
        pyvenv.write_text(pyvenv.read_text().replace(str(building), str(venv)))
    return venv


def jupyter_environment() -> PipEnvironment:
    return PipEnvironment(
        JUPYTER_REF,
        JUPYTER_REQUIREMENTS,
        description="JupyterLab 4 with NumPy; opens as the Jupyter app",
        services=(("jupyter", JUPYTER_PORT),),
        aliases=("jupyter",),
    )


def envs_folder(data_dir: Path, env_cache: Path | None = None) -> Path:
    """The folder of the requirements environments: ``env_cache``, else
    ``<data-dir>/envs`` (next to the demo-lib ones)."""
    return env_cache if env_cache is not None else data_dir / "envs"


def service_ports_label(services: Sequence[tuple[str, int]]) -> str:
    """Backend.AI's ``ai.backend.service-ports`` value: ``jupyter:http:8888,...``."""
    return ",".join(f"{name}:http:{port}" for name, port in services)


def pip_image(envs: Path, env: PipEnvironment, accelerators: tuple[str, ...] = ()) -> DemoImage:
    """The catalogue entry (and agent.toml table) of a requirements environment built
    in ``envs/<name>-<version>``."""
    venv = envs / env.folder_name
    python = str(venv / "bin" / "python")
    return DemoImage(
        env.ref,
        python,
        prefix=str(venv),
        aliases=env.aliases,
        accelerators=accelerators or env.accelerators,
        description=env.description,
        labels=({SERVICE_PORTS_LABEL: service_ports_label(env.services)} if env.services else {}),
        idle_command=(python, str(venv / "bin" / "accelshare-jupyter")) if env.services else (),
    )


def built_environments(envs: Path) -> list[PipEnvironment]:
    """The requirements environments built in ``envs`` (each folder with a marker), in
    name order; a marker that cannot be read is skipped."""
    found = []
    for marker in sorted(envs.glob(f"*/{ENV_MARKER}")):
        try:
            data = json.loads(marker.read_text())
            env = PipEnvironment(
                str(data["ref"]),
                tuple(str(r) for r in data["requirements"]),
                accelerators=tuple(str(a) for a in data.get("accelerators", ())),
                description=str(data.get("description", "")),
                services=tuple((str(n), int(p)) for n, p in data.get("services", ())),
                aliases=tuple(str(a) for a in data.get("aliases", ())),
            )
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if marker.parent.name == env.folder_name:
            found.append(env)
    return found
