"""Scratch dir layout, atomic writes, listing."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

import pytest

from accelshare.agent.scratch import (
    ScratchDir,
    atomic_write_text,
    is_valid_kernel_id,
    list_kernel_ids,
    read_json,
    write_new_text,
)


def test_layout(tmp_path: Path) -> None:
    scratch = ScratchDir(tmp_path, "k-1")
    assert scratch.root == tmp_path / "k-1"
    assert scratch.resource_txt == tmp_path / "k-1" / "config" / "resource.txt"
    assert scratch.work_dir == tmp_path / "k-1" / "work"
    assert scratch.log_file == tmp_path / "k-1" / "logs" / "kernel.log"
    assert scratch.exit_file == tmp_path / "k-1" / "state" / "exit.json"
    assert not scratch.exists()
    assert scratch.prepare() is True  # made here: its files are new
    assert scratch.prepare() is False  # idempotent
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


def test_prepare_makes_a_missing_scratch_root(tmp_path: Path) -> None:
    scratch = ScratchDir(tmp_path / "a" / "b", "k")
    assert scratch.prepare() is True
    assert scratch.state_dir.is_dir()


@dataclass(frozen=True)
class _File:
    path: str
    text: str
    executable: bool = False


def test_new_files_are_created_in_place_with_their_mode(tmp_path: Path) -> None:
    old_umask = os.umask(0o077)  # the mode asked for wins over the agent's umask
    try:
        scratch = ScratchDir(tmp_path, "k")
        assert scratch.prepare()
        scratch.write_resource_txt("A=1\n", new=True)
        scratch.write_config_files(
            [_File("bin/tool", "#!/bin/sh\n", executable=True), _File("x.json", "{}")], new=True
        )
        scratch.write_json(scratch.launch_file, {"a": 1}, new=True)
    finally:
        os.umask(old_umask)
    assert scratch.read_resource_txt() == "A=1\n"
    assert stat.S_IMODE(scratch.resource_txt.stat().st_mode) == 0o644
    assert stat.S_IMODE((scratch.config_dir / "bin" / "tool").stat().st_mode) == 0o755
    assert stat.S_IMODE((scratch.config_dir / "x.json").stat().st_mode) == 0o644
    assert read_json(scratch.launch_file) == {"a": 1}
    assert sorted(os.listdir(scratch.config_dir)) == ["bin", "resource.txt", "x.json"]
    with pytest.raises(FileExistsError):  # never over a file that is there
        scratch.write_resource_txt("A=2\n", new=True)
    assert scratch.read_resource_txt() == "A=1\n"
    with pytest.raises(ValueError, match="leaves the config dir"):
        scratch.write_config_files([_File("../state/evil", "x")], new=True)
    assert not (scratch.state_dir / "evil").exists()


def test_a_failed_new_write_leaves_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def full(fd: int, data: bytes) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(OSError, match="No space"):
        write_new_text(tmp_path / "f", "x")
    assert os.listdir(tmp_path) == []


def test_container_id_is_appended_in_place(tmp_path: Path) -> None:
    scratch = ScratchDir(tmp_path, "k")
    scratch.prepare()
    written = "CPU_SHARES=0:1\n"
    scratch.write_resource_txt(written, new=True)
    inode = scratch.resource_txt.stat().st_ino
    scratch.add_container_id(written, "4242")
    assert scratch.read_resource_txt() == "CPU_SHARES=0:1\nCID=4242\n"
    assert scratch.resource_txt.stat().st_ino == inode  # no temporary file, no rename
    scratch.add_container_id(written, "4242")  # the file is no longer `written`: no second line
    assert scratch.read_resource_txt() == "CPU_SHARES=0:1\nCID=4242\n"
    assert os.listdir(scratch.config_dir) == ["resource.txt"]


def test_container_id_of_a_changed_file_replaces_it(tmp_path: Path) -> None:
    scratch = ScratchDir(tmp_path, "k")
    scratch.prepare()
    scratch.resource_txt.write_text("CPU_SHARES=0:1\nCID=1\n")  # not what the agent wrote
    scratch.add_container_id("CPU_SHARES=0:1\n", "4242")
    assert scratch.read_resource_txt() == "CPU_SHARES=0:1\nCID=4242\n"
    scratch.resource_txt.write_text("CPU_SHARES=0:1")  # no final newline, as written
    scratch.add_container_id("CPU_SHARES=0:1", "7")
    assert scratch.read_resource_txt() == "CPU_SHARES=0:1\nCID=7\n"
