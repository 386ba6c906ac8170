"""How ``accelshare session create IMAGE -- WORDS...`` spells the startupCommand."""

from __future__ import annotations

import shlex

import pytest

from accelshare.client.cli.session import startup_command_line


@pytest.mark.parametrize(
    ("words", "line", "split"),
    [
        ([], None, None),
        # one word is a command line already (a shell script, a script name)
        (["echo hello; exit 3"], "echo hello; exit 3", None),
        (["run.py"], "run.py", ["run.py"]),
        # several words are quoted, so the agent's split gives the same words back
        (["-c", "print(42)"], "-c 'print(42)'", ["-c", "print(42)"]),
        (["echo", "hello"], "echo hello", ["echo", "hello"]),
        (["-c", "print('a b')"], "-c 'print('\"'\"'a b'\"'\"')'", ["-c", "print('a b')"]),
    ],
)
def test_startup_command_line(words: list[str], line: str | None, split: list[str] | None) -> None:
    assert startup_command_line(words) == line
    if split is not None:
        assert line is not None
        assert shlex.split(line) == split
