"""How ``accelshare session create IMAGE -- WORDS...`` spells the startupCommand: a whole
command line, which the agent runs with ``/bin/sh -c``."""

from __future__ import annotations

import shlex

import pytest

from accelshare.client.cli.session import startup_command_line


@pytest.mark.parametrize(
    ("words", "line", "split"),
    [
        ([], None, None),
        # one word is a command line already (a shell script, a program)
        (["echo hello; exit 3"], "echo hello; exit 3", None),
        (["./run.sh"], "./run.sh", ["./run.sh"]),
        # several words are quoted, so the shell gives the same words back
        (["python", "-c", "print(42)"], "python -c 'print(42)'", ["python", "-c", "print(42)"]),
        (["echo", "hello"], "echo hello", ["echo", "hello"]),
        (["echo", "$HOME; exit 1"], "echo '$HOME; exit 1'", ["echo", "$HOME; exit 1"]),
        (
            ["python", "-c", "print('a b')"],
            "python -c 'print('\"'\"'a b'\"'\"')'",
            ["python", "-c", "print('a b')"],
        ),
    ],
)
def test_startup_command_line(words: list[str], line: str | None, split: list[str] | None) -> None:
    assert startup_command_line(words) == line
    if split is not None:
        assert line is not None
        assert shlex.split(line) == split
