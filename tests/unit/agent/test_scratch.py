"""Scratch dir layout, atomic writes, listing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from accelshare.agent.scratch import (
    ScratchDir,
    atomic_write_text,
    is_valid_kernel_id,
    list_kernel_ids,
    read_json,
)


def test_layout(tmp_path: Path) -> None:
    scratch = ScratchDir(tmp_path, "k-1")
    assert scratch.root == tmp_path / "k-1"
    assert scratch.resource_txt == tmp_path / "k-1" / "config" / "resource.txt"
    assert scratch.work_dir == tmp_path / "k-1" / "work"
    assert scratch.log_file == tmp_path / "k-1" / "logs" / "kernel.log"
    assert scratch.exit_file == tmp_path / "k-1" / "state" / "exit.json"
    assert not scratch.exists()
    scratch.prepare()
    scratch.prepare()  # idempotent
    assert all(
        d.is_dir()
        for d in (scratch.config_dir, scratch.work_dir, scratch.log_dir, scratch.state_dir)
    )
    scratch.remove()
    assert not scratch.exists()


def test_relative_root_is_made_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert ScratchDir(Path("scratch"), "k").root == tmp_path / "scratch" / "k"


@pytest.mark.parametrize(
    ("kernel_id", "valid"),
    [
        ("0d5b8f2e-6c0a-4e4b-9a59-0f6a1c7d2e11", True),
        ("k_1.a", True),
        ("", False),
        (".", False),
        ("..", False),
        ("../etc", False),
        ("a/b", False),
        ("-rf", False),
        ("x" * 129, False),
        ("with space", False),
    ],
)
def test_kernel_ids_are_path_safe(kernel_id: str, valid: bool, tmp_path: Path) -> None:
    assert is_valid_kernel_id(kernel_id) is valid
    if not valid:
        with pytest.raises(ValueError, match="Invalid kernel id"):
            ScratchDir(tmp_path, kernel_id)


def test_atomic_write_replaces_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "resource.txt"
    atomic_write_text(target, "A=1\n")
    atomic_write_text(target, "A=2\n", durable=True)
    assert target.read_text() == "A=2\n"
    assert os.listdir(tmp_path) == ["resource.txt"]


def test_list_kernel_ids_ignores_junk(tmp_path: Path) -> None:
    assert list_kernel_ids(tmp_path / "missing") == []
    for name in ("b", "a", ".hidden", "lost+found"):
        (tmp_path / name).mkdir()
    (tmp_path / "file").write_text("x")
    assert list_kernel_ids(tmp_path) == ["a", "b"]


def test_read_json_is_tolerant(tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    assert read_json(path) is None
    path.write_text("[1]")
    assert read_json(path) is None
    path.write_text("{broken")
    assert read_json(path) is None
    path.write_text('{"a": 1}')
    assert read_json(path) == {"a": 1}


def test_log_tail(tmp_path: Path) -> None:
    scratch = ScratchDir(tmp_path, "k")
    assert scratch.read_log_tail() == ""
    scratch.prepare()
    scratch.log_file.write_bytes(b"hello\nworld\n")
    assert scratch.read_log_tail() == "hello\nworld\n"
    assert scratch.read_log_tail(6) == "world\n"
    assert scratch.read_log_tail(1000) == "hello\nworld\n"
