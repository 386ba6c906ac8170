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


# -- a batch session's startup command (one string) -> argv -----------------------------------
@pytest.mark.parametrize(
    ("image", "startup", "argv"),
    [
        # python: the words are python's arguments
        ("python", "-c 'print(42)'", (sys.executable, "-c", "print(42)")),
        ("python", "run.py --epochs 3", (sys.executable, "run.py", "--epochs", "3")),
        ("python", "'my script.py'", (sys.executable, "my script.py")),
        # shell: the whole string is the script (operators, exit codes, quoting kept)
        ("shell", "echo hello", ("/bin/sh", "-c", "echo hello")),
        ("shell", "echo hello; exit 3", ("/bin/sh", "-c", "echo hello; exit 3")),
        ("shell", "echo 'a  b' | wc -c", ("/bin/sh", "-c", "echo 'a  b' | wc -c")),
    ],
)
def test_startup_command_in_builtin_environments(
    image: str, startup: str, argv: tuple[str, ...]
) -> None:
    assert default_environments()[image].startup_argv(startup) == argv


def test_startup_command_in_configured_environments() -> None:
    bash = ProcessEnvironment.from_config("bash", {"command-prefix": ["/bin/bash", "-c"]})
    assert bash.takes_script
    assert bash.startup_argv("x=1; echo $x") == ("/bin/bash", "-c", "x=1; echo $x")
    venv = ProcessEnvironment.from_config("torch", {"command-prefix": ["/opt/t/bin/python", "-u"]})
    assert not venv.takes_script
    assert venv.startup_argv("train.py --lr 0.1") == (
        "/opt/t/bin/python",
        "-u",
        "train.py",
        "--lr",
        "0.1",
    )


def test_unreadable_startup_command_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="closing quotation"):
        default_environments()["python"].startup_argv("-c 'print(1)")


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
