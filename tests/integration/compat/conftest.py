"""The official Backend.AI client against a real local accelshare cluster (issue #12).

* ``bai_client``: the client's own virtualenv, ``.venv-bai/`` at the repository root
  (``make bai-client``: Python 3.12 + ``backend.ai-client==25.5.2``; ``make test``
  builds it when a working python3.12 exists).  When it is missing and a python3.12
  exists, the fixture builds it with that same target (about 1.5 minutes, needs the
  package index).  ``ACCELSHARE_BAI_VENV`` points at another one.  The tests skip, with
  the reason, only when no python3.12 works here or the install fails.
* ``cluster``: a manager and one agent with the two-GPU mock
  (configs/accelerator/two-fgpu.toml: two devices of 1.0 ``cuda.shares`` each, quantum
  0.1), started once per session by the same code as ``accelshare dev up``.
* ``bai``: runs ``backend.ai ...`` (the client's console script) as a subprocess with
  ``BACKEND_ENDPOINT`` / ``BACKEND_ACCESS_KEY`` / ``BACKEND_SECRET_KEY`` /
  ``BACKEND_ENDPOINT_TYPE=api`` and its own HOME; ``bai.sdk(...)`` runs
  ``bai_sdk.py`` (next to this file) with the client's Python.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from accelshare.devcluster import DevClusterOptions, LocalCluster, free_port
from accelshare_testkit.kernel_exec import ExecResult

REPO = Path(__file__).resolve().parents[3]
HELPER = Path(__file__).with_name("bai_sdk.py")
CLIENT_VERSION = "25.5.2"
COMMAND_TIMEOUT_S = 180.0
INSTALL_TIMEOUT_S = 900.0
T = TypeVar("T")


def _python312() -> str | None:
    """A python3.12 that really runs (a pyenv shim without that version does not)."""
    candidates = [
        shutil.which("python3.12"),
        *sorted(glob.glob("/root/.pyenv/versions/3.12*/bin/python3.12")),
    ]
    for candidate in candidates:
        if not candidate:
            continue
        probe = subprocess.run(
            [candidate, "-c", "import sys; assert sys.version_info[:2] == (3, 12)"],
            capture_output=True,
            check=False,
        )
        if probe.returncode == 0:
            return candidate
    return None


def _client_version(python: Path) -> str | None:
    probe = subprocess.run(
        [str(python), "-c", "from ai.backend.client import __version__; print(__version__)"],
        capture_output=True,
        text=True,
        check=False,
    )
    return probe.stdout.strip() if probe.returncode == 0 else None


@pytest.fixture(scope="session")
def bai_client() -> Path:
    """The bin/ directory of a virtualenv with the official client (see the module doc)."""
    venv = Path(os.environ.get("ACCELSHARE_BAI_VENV") or REPO / ".venv-bai")
    python = venv / "bin" / "python"
    if python.exists() and _client_version(python) == CLIENT_VERSION:
        return venv / "bin"
    python312 = _python312()
    if python312 is None:
        pytest.skip(
            "the official Backend.AI client needs Python 3.12 and no working python3.12 is"
            f" installed here (and {venv} has no backend.ai-client {CLIENT_VERSION})"
        )
    if shutil.which("make") is None:
        pytest.skip(f"{venv} is missing and `make` is not installed to build it")
    started = time.monotonic()
    build = subprocess.run(
        ["make", "-s", "bai-client", f"BAI_VENV={venv}", f"PYTHON312={python312}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=INSTALL_TIMEOUT_S,
        check=False,
    )
    if build.returncode != 0 or _client_version(python) != CLIENT_VERSION:
        pytest.skip(
            f"could not install backend.ai-client {CLIENT_VERSION} into {venv} with"
            f" {python312} (`make bai-client`, {time.monotonic() - started:.0f} s):\n"
            f"{(build.stdout + build.stderr)[-2000:]}"
        )
    return venv / "bin"


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory, bai_client: Path) -> Iterator[LocalCluster]:
    data_dir = tmp_path_factory.mktemp("bai-cluster")
    local = LocalCluster(DevClusterOptions(data_dir=data_dir, port=free_port(), agents=1))
    try:
        local.start()
    except Exception as e:
        logs = Path(data_dir, "logs")
        tails = {p.name: p.read_text(errors="replace")[-3000:] for p in logs.glob("*.log")}
        pytest.fail(f"the local cluster did not start: {e}\n{tails}")
    yield local
    local.stop(destroy_sessions=True)


class Result(ExecResult):
    """A client command's exit code and output (``output``: stdout and stderr together;
    the client prints its status lines on stderr)."""

    __slots__ = ()

    def json(self) -> Any:
        return json.loads(self.stdout)


class Bai:
    """``backend.ai ...`` and the SDK helper, configured for one cluster."""

    def __init__(self, bin_dir: Path, env: dict[str, str], cwd: Path | None = None) -> None:
        self.bin_dir, self.env, self.cwd = bin_dir, env, cwd

    def as_user(self, access_key: str, secret_key: str) -> Bai:
        """The same client with another keypair."""
        env = {**self.env, "BACKEND_ACCESS_KEY": access_key, "BACKEND_SECRET_KEY": secret_key}
        return Bai(self.bin_dir, env, self.cwd)

    def in_dir(self, cwd: Path) -> Bai:
        """The same client run in ``cwd`` (``vfolder upload/download`` use it)."""
        return Bai(self.bin_dir, self.env, cwd)

    def _run(self, argv: list[str], cwd: Path | None = None, input: str | None = None) -> Result:
        done = subprocess.run(
            argv,
            input=input,
            env=self.env,
            cwd=cwd or self.cwd,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
            check=False,
        )
        return Result(done.returncode, done.stdout, done.stderr)

    def __call__(self, *args: str, cwd: Path | None = None, input: str | None = None) -> Result:
        """``input``: what to type (the answer to "Are you sure? [Y/n]")."""
        return self._run([str(self.bin_dir / "backend.ai"), *args], cwd, input)

    def ok(self, *args: str, cwd: Path | None = None, input: str | None = None) -> Result:
        result = self(*args, cwd=cwd, input=input)
        assert result.code == 0, f"backend.ai {' '.join(args)} failed: {result}"
        return result

    def sdk(self, action: str, **params: Any) -> Any:
        """Run ``bai_sdk.py ACTION PARAMS`` with the client's Python; its JSON answer."""
        result = self._run([str(self.bin_dir / "python"), str(HELPER), action, json.dumps(params)])
        assert result.code == 0, f"bai_sdk.py {action} {params} failed: {result}"
        return json.loads(result.stdout)

    def sessions(self) -> dict[str, str]:
        """name -> status of every session (``backend.ai --output json ps --all``)."""
        listed = self.ok(
            "--output", "json", "ps", "--all", "--limit", "100", "--format", "name,status"
        ).json()  # fmt: skip
        assert listed["total_count"] <= 100, "more sessions than one page: page through them"
        return {item["name"]: item["status"] for item in listed["items"]}

    def until(
        self, condition: Callable[[], T | None], *, timeout_s: float = 90.0, what: str = ""
    ) -> T:
        """Poll ``condition`` (each call is a client run) until it returns a value."""
        deadline = time.monotonic() + timeout_s
        while True:
            value = condition()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


@pytest.fixture
def bai(
    cluster: LocalCluster, bai_client: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Bai]:
    """The client for the cluster; every session still live afterwards is destroyed."""
    config = cluster.client_config()
    home = tmp_path_factory.mktemp("bai-home")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BACKEND_", "ACCELSHARE_"))}
    env.update(
        HOME=str(home),
        XDG_CACHE_HOME=str(home / ".cache"),
        XDG_CONFIG_HOME=str(home / ".config"),
        XDG_STATE_HOME=str(home / ".local/state"),
        BACKEND_ENDPOINT=config.endpoint,
        BACKEND_ENDPOINT_TYPE="api",
        BACKEND_ACCESS_KEY=config.access_key,
        BACKEND_SECRET_KEY=config.secret_key,
        PYTHONWARNINGS="ignore",
    )
    yield Bai(bai_client, env)
    cluster.destroy_sessions()
