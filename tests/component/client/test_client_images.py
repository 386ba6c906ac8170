"""The demo image catalogue of ``accelshare dev up`` (the cluster of conftest.py is
started by the same code): one session per demo environment prints its own library
version, aliases resolve, the catalogue is listed and managed from the CLI."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from accelshare.devcluster.catalogue import DEMO_LIB_VERSIONS, python_ref

Cli = Callable[..., Any]

PRINT_VERSION = (
    "import demo_lib, importlib.metadata as m, sys;"
    " print('demo-lib', demo_lib.__version__, m.version('demo-lib'), sys.prefix)"
)


def _sid(stdout: str) -> str:
    return stdout.split("Session ID ", 1)[1].split(maxsplit=1)[0]


@pytest.mark.parametrize(
    ("image", "version"),
    [("demo-lib:1.0", "1.0"), ("demo-lib:2.0", "2.0"), ("demo-lib", DEMO_LIB_VERSIONS[-1])],
    ids=["1.0", "2.0", "alias"],
)
def test_a_session_per_demo_environment_reports_its_own_version(
    cli: Cli, image: str, version: str
) -> None:
    created = cli(
        "session", "create", "-r", "cpu=1", "-r", "mem=256", image,
        "--", "python", "-c", PRINT_VERSION,
    )  # fmt: skip
    assert created.code == 0, created
    sid = _sid(created.stdout)
    waited = cli("session", "wait", sid, "--status", "TERMINATED", "--timeout", "60")
    assert waited.code == 0, waited
    info = json.loads(cli("session", "info", sid, "--json").stdout)
    assert info["image"] == f"demo-lib:{version}"  # the alias resolved at creation
    assert info["exitCode"] == 0, info
    logs = cli("session", "logs", sid).stdout
    line = next(ln for ln in logs.splitlines() if ln.startswith("demo-lib "))
    words = line.split()
    assert words[1:3] == [version, version], logs  # module and installed metadata agree
    assert words[3].endswith(f"envs/demo-lib-{version}"), logs  # its own venv


def test_the_catalogue_is_listed_and_an_image_without_cuda_is_refused_cuda(cli: Cli) -> None:
    images = json.loads(cli("image", "list", "--json").stdout)
    by_ref = {i["ref"]: i for i in images}
    assert {python_ref(), "demo-lib:1.0", "demo-lib:2.0"} <= set(by_ref)
    assert by_ref[python_ref()]["aliases"] == ["python"]
    assert by_ref["demo-lib:2.0"]["aliases"] == ["demo-lib"]
    assert by_ref["demo-lib:1.0"]["accelerators"] == []
    refused = cli("session", "create", "-r", "cuda.shares=0.5", "demo-lib:1.0")
    assert refused.code != 0, refused
    assert "does not support cuda" in refused.stderr, refused


def test_admin_image_commands(cli: Cli) -> None:
    added = cli(
        "admin",
        "image",
        "add",
        "demo-lib:9.9",
        "--alias",
        "demo9",
        "--min",
        "cpu=2",
        "--description",
        "no agent has it",
    )
    assert added.code == 0, added
    assert added.stdout.strip() == "Image demo-lib:9.9 added."
    info = json.loads(cli("admin", "image", "info", "demo9", "--json").stdout)
    assert info["ref"] == "demo-lib:9.9"
    assert info["min_slots"] == {"cpu": "2"}
    assert cli("admin", "image", "alias", "demo9", "demo-lib:1.0").code == 0
    assert json.loads(cli("image", "info", "demo9", "--json").stdout)["ref"] == "demo-lib:1.0"
    assert cli("admin", "image", "unalias", "demo9").code == 0
    removed = cli("admin", "image", "remove", "demo-lib:9.9")
    assert removed.stdout.strip() == "Image demo-lib:9.9 removed."
    missing = cli("image", "info", "demo-lib:9.9")
    assert missing.code != 0
    assert "No image or alias" in missing.stderr
