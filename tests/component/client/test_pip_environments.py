"""Environments built from a requirements list (accelshare.devcluster.catalogue): pip
into a venv, offline (a wheel made here, ``--no-index``), the marker that makes a
rebuild a no-op, the failure that leaves nothing half-built, the jupyter image's
agent.toml table and catalogue labels, and ``accelshare admin image build``'s checks."""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import threading
import tomllib
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from accelshare.client.cli import app
from accelshare.devcluster.catalogue import (
    ENV_MARKER,
    SERVICE_PORTS_LABEL,
    EnvBuildError,
    PipEnvironment,
    build_pip_environment,
    built_environments,
    environment_tables,
    envs_folder,
    jupyter_environment,
    parse_requirements,
    pip_image,
)

Cli = Callable[..., Any]  # the conftest's `cli` fixture


def _wheel(folder: Path, name: str, version: str) -> Path:
    """A pure-Python wheel of ``name`` whose module says its version."""
    path = folder / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": f"__version__ = {version!r}\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    records = []
    for file, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        records.append(f"{file},sha256={digest.decode()},{len(text.encode())}")
    records.append(f"{info}/RECORD,,")
    with zipfile.ZipFile(path, "w") as wheel:
        for file, text in files.items():
            wheel.writestr(file, text)
        wheel.writestr(f"{info}/RECORD", "\n".join(records) + "\n")
    return path


@pytest.fixture
def offline_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """pip sees only a folder with tinylib 1.0 and 2.0 (no network)."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for version in ("1.0", "2.0"):
        _wheel(wheels, "tinylib", version)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    return wheels


def test_parse_requirements_keeps_requirements_and_refuses_options() -> None:
    text = "# two versions\nnumpy==1.26.4  # pinned\n\ntorch>=2\n"
    assert parse_requirements(text) == ("numpy==1.26.4", "torch>=2")
    with pytest.raises(
        ValueError, match=r"r.txt line 2: expected a requirement .* '--index-url x'"
    ):
        parse_requirements("numpy\n--index-url x\n", source="r.txt")
    with pytest.raises(ValueError, match="expected at least one requirement, got none"):
        parse_requirements("# nothing\n")


def test_two_versions_built_kept_and_listed(offline_index: Path, tmp_path: Path) -> None:
    envs = envs_folder(tmp_path / "data")
    assert envs == tmp_path / "data" / "envs"
    built = {}
    for version in ("1.0", "2.0"):
        env = PipEnvironment(f"tinylib:{version}", (f"tinylib=={version}",), ("cuda",), "tiny")
        venv = build_pip_environment(envs / env.folder_name, env)
        answer = subprocess.run(
            [str(venv / "bin" / "python"), "-c", "import tinylib; print(tinylib.__version__)"],
            capture_output=True,
            text=True,
            check=True,
        )
        assert answer.stdout.strip() == version
        built[version] = venv
    marker = json.loads((built["1.0"] / ENV_MARKER).read_text())
    assert marker["requirements"] == ["tinylib==1.0"]
    assert marker["accelerators"] == ["cuda"]
    # a second build with the same requirements keeps the venv (no pip at all)
    stamp = (built["1.0"] / ENV_MARKER).stat().st_mtime_ns
    env = PipEnvironment("tinylib:1.0", ("tinylib==1.0",), ("cuda",), "tiny")
    build_pip_environment(built["1.0"], env, python="/nonexistent/python")
    assert (built["1.0"] / ENV_MARKER).stat().st_mtime_ns == stamp
    found = built_environments(envs)
    assert [(e.ref, e.accelerators, e.description) for e in found] == [
        ("tinylib:1.0", ("cuda",), "tiny"),
        ("tinylib:2.0", ("cuda",), "tiny"),
    ]
    image = pip_image(envs, found[0])
    assert image.accelerators == ("cuda",)
    assert image.prefix == str(built["1.0"])


def test_a_failed_build_leaves_nothing_and_says_why(offline_index: Path, tmp_path: Path) -> None:
    env = PipEnvironment("nope:1", ("no-such-package-here==1",))
    venv = tmp_path / "envs" / env.folder_name
    with pytest.raises(
        EnvBuildError, match=r"environment nope:1: .*failed: .*no-such-package-here"
    ):
        build_pip_environment(venv, env)
    assert not venv.exists()
    assert list((tmp_path / "envs").glob("*.building")) == []
    assert built_environments(tmp_path / "envs") == []


def test_a_stopped_build_leaves_nothing(offline_index: Path, tmp_path: Path) -> None:
    """dev up stopping while it builds: the step is killed, the half-built venv removed."""
    stop = threading.Event()
    stop.set()
    env = PipEnvironment("tinylib:1.0", ("tinylib==1.0",))
    venv = tmp_path / "envs" / env.folder_name
    with pytest.raises(EnvBuildError, match=r"environment tinylib:1\.0: the build was stopped"):
        build_pip_environment(venv, env, cancel=stop)
    assert sorted(p.name for p in (tmp_path / "envs").iterdir()) == [".tinylib-1.0.lock"]


def test_jupyter_image_declares_its_service_and_runs_the_launcher(tmp_path: Path) -> None:
    env = jupyter_environment()
    assert env.ref == "jupyter:4"
    assert any(r.startswith("jupyterlab") for r in env.requirements)
    assert any(r.startswith("numpy") for r in env.requirements)
    image = pip_image(tmp_path / "envs", env, ("cuda",))
    assert image.labels == {SERVICE_PORTS_LABEL: "jupyter:http:8888"}
    assert image.aliases == ("jupyter",)
    assert image.accelerators == ("cuda",)
    table = tomllib.loads(environment_tables([image]))["container"]["environments"]["jupyter:4"]
    venv = tmp_path / "envs" / "jupyter-4"
    assert table["command-prefix"] == [str(venv / "bin" / "python")]
    assert table["image-dir"] == str(venv)
    assert table["idle-command"] == [
        str(venv / "bin" / "python"),
        str(venv / "bin" / "accelshare-jupyter"),
    ]


def test_the_launcher_and_example_notebook_go_into_a_service_environment(
    offline_index: Path, tmp_path: Path
) -> None:
    env = PipEnvironment("lab:1", ("tinylib==2.0",), services=(("jupyter", 8888),))
    venv = build_pip_environment(tmp_path / "envs" / env.folder_name, env)
    launcher = venv / "bin" / "accelshare-jupyter"
    assert launcher.stat().st_mode & 0o111
    notebook = json.loads((venv / "share" / "accelshare" / "train-small-model.ipynb").read_text())
    assert notebook["nbformat"] == 4
    sources = "".join("".join(c["source"]) for c in notebook["cells"])
    assert "import torch" in sources
    assert "numpy" in sources
    # the launcher's base URL follows the session (the proxy's path of the app)
    code = (
        f"import runpy; m = runpy.run_path({str(launcher)!r});"
        " print(m['base_url']({'ACCELSHARE_SESSION_ID': 's-1'}))"
    )
    answer = subprocess.run(
        [str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True, check=True
    )
    assert answer.stdout.strip() == "/session/s-1/apps/jupyter/"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["Bad:Ref!"], "NAME:VERSION 'Bad:Ref!': expected a lower-case name"),
        (["numpy"], "NAME:VERSION 'numpy'"),
        (["numpy:1", "--accelerators", "cuda,GPU!"], "--accelerators: expected names"),
        (["numpy:1", "--requirements", "/nonexistent/r.txt"], "cannot read it"),
    ],
)
def test_image_build_refuses_bad_arguments(args: list[str], message: str, tmp_path: Path) -> None:
    requirements = tmp_path / "r.txt"
    requirements.write_text("numpy\n")
    if "--requirements" not in args:
        args = [*args, "--requirements", str(requirements)]
    result = CliRunner().invoke(
        app, ["admin", "image", "build", *args, "--envs-dir", str(tmp_path / "envs")]
    )
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())
    assert not (tmp_path / "envs").exists()  # nothing built


def test_image_build_builds_and_adds_the_image(
    cli: Cli, offline_index: Path, tmp_path: Path
) -> None:
    """`admin image build` against the test cluster: the venv is built (offline), the
    image added with its accelerators and requirements, and the agent.toml table printed;
    building it again keeps the venv and the catalogue answers 409."""
    requirements = tmp_path / "tinylib-2.txt"
    requirements.write_text("# the newer one\ntinylib==2.0\n")
    envs = tmp_path / "envs"
    args = ["admin", "image", "build", "tinylib:2.0", "-r", str(requirements)]
    args += ["--accelerators", "cuda", "--description", "tiny 2", "--envs-dir", str(envs)]
    try:
        built = cli(*args)
        assert built.code == 0, built
        assert f"Image tinylib:2.0 built in {envs / 'tinylib-2.0'} and added." in built.stdout
        table = built.stdout[built.stdout.index("[container.environments") :]
        parsed = tomllib.loads(table)["container"]["environments"]["tinylib:2.0"]
        assert parsed["image-dir"] == str(envs / "tinylib-2.0")
        info = json.loads(cli("image", "info", "tinylib:2.0", "--json").stdout)
        assert info["accelerators"] == ["cuda"]
        assert info["description"] == "tiny 2"
        assert info["labels"] == {"accelshare.requirements": "tinylib==2.0"}
        assert [e.ref for e in built_environments(envs)] == ["tinylib:2.0"]
        again = cli(*args)
        assert again.code != 0, again
        assert "409" in again.stderr or "exists" in again.stderr, again
    finally:
        cli("admin", "image", "remove", "tinylib:2.0")
