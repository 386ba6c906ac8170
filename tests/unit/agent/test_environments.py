"""Process-runtime environments ("images")."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from accelshare.agent.runtime.environments import (
    EnvironmentConfigError,
    ProcessEnvironment,
    default_environments,
)


def test_builtin_environments() -> None:
    envs = default_environments()
    assert envs["python"].argv(("-c", "print(1)")) == (sys.executable, "-c", "print(1)")
    assert envs["shell"].argv(("echo $0", "a")) == ("/bin/sh", "-c", "echo $0", "a")
    assert envs["shell"].argv(None) == ("sleep", "infinity")  # no command: idle


def test_from_config() -> None:
    env = ProcessEnvironment.from_config(
        "torch",
        {"command-prefix": ["/opt/t/bin/python"], "image-dir": "/opt/t", "env": {"A": "1"}},
    )
    assert env.command_prefix == ("/opt/t/bin/python",)
    assert env.image_dir == Path("/opt/t")
    assert env.env == {"A": "1"}


@pytest.mark.parametrize(
    ("data", "key", "message"),
    [
        ({}, "command-prefix", "'command-prefix' must be a non-empty list of strings"),
        ({"command-prefix": []}, "command-prefix", "must be a non-empty list of strings"),
        ({"command-prefix": "python"}, "command-prefix", "must be a list of strings"),
        ({"command-prefix": ["x"], "env": {"A": 1}}, "env", "'env' must be a table of strings"),
        ({"command-prefix": ["x"], "image-dir": 3}, "image-dir", "'image-dir' must be a folder"),
        ({"command-prefix": ["x"], "idle-command": "sleep"}, "idle-command", "list of strings"),
    ],
)
def test_from_config_errors_name_the_environment_and_key(
    data: dict[str, object], key: str, message: str
) -> None:
    with pytest.raises(EnvironmentConfigError, match="environment 'bad'") as info:
        ProcessEnvironment.from_config("bad", data)
    assert message in str(info.value)
    assert (info.value.name, info.value.key) == ("bad", key)
    assert info.value.received == data.get(key, [])  # as written (nothing: an empty list)
    assert "such as" in info.value.expected


def test_an_environment_the_host_lacks_says_why(tmp_path: Path) -> None:
    have = ProcessEnvironment("python:x", (sys.executable,))
    assert have.missing() is None
    no_program = ProcessEnvironment("gone", (str(tmp_path / "venv" / "bin" / "python"),))
    assert (
        no_program.missing() == f"{tmp_path}/venv/bin/python is not an executable file on this host"
    )
    no_dir = ProcessEnvironment("nodir", (sys.executable,), image_dir=tmp_path / "absent")
    assert no_dir.missing() == f"its image dir {tmp_path}/absent is not a folder on this host"
    on_path = ProcessEnvironment("sh", ("sh", "-c"))
    assert on_path.missing() is None  # found on PATH


@pytest.mark.parametrize(
    "work_dir", ["", "{home}/x", "{work", 3], ids=["empty", "unknown-field", "unclosed", "number"]
)
def test_a_bad_work_dir_template_names_the_key(work_dir: object) -> None:
    with pytest.raises(EnvironmentConfigError) as caught:
        ProcessEnvironment.from_config("x", {"command-prefix": ["python"], "work-dir": work_dir})
    assert caught.value.key == "work-dir"
    assert caught.value.received == work_dir
