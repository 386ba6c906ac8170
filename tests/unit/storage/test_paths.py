"""Paths inside a folder never lead out of it: lexical checks and the descriptor walk."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accelshare.protocol.storage import StorageErrorType
from accelshare.storage.errors import StorageError
from accelshare.storage.paths import split_relpath, walk


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("../x", "'..'"),
        ("a/../../x", "'..'"),
        ("a/..", "'..'"),
        ("/etc/passwd", "absolute"),
        ("a\x00b", "NUL"),
        ("x" * 256, "255 bytes"),
    ],
)
def test_bad_paths_are_refused_before_any_access(path: str, why: str) -> None:
    with pytest.raises(StorageError) as caught:
        split_relpath(path, field="source")
    assert caught.value.type is StorageErrorType.BAD_PATH
    assert caught.value.detail.startswith("source: expected")
    assert why in caught.value.detail


def test_good_paths_split_into_components() -> None:
    assert split_relpath("data/./train.csv") == ("data", "train.csv")
    assert split_relpath("a//b/") == ("a", "b")
    assert split_relpath(".") == ()
    with pytest.raises(StorageError, match="not the folder itself"):
        split_relpath(".", allow_root=False)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """outside/secret, folder/{data/file, in -> data, out -> ../outside, abs -> /etc,
    up -> data/../.. , loop -> loop}"""
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret").write_text("no")
    folder = tmp_path / "folder"
    (folder / "data").mkdir(parents=True)
    (folder / "data" / "file").write_text("yes")
    os.symlink("data", folder / "in")
    os.symlink("../outside", folder / "out")
    os.symlink("/etc", folder / "abs")
    os.symlink("data/../..", folder / "up")
    os.symlink("loop", folder / "loop")
    return folder


def _resolve(folder: Path, path: str, *, follow_last: bool = True) -> str:
    root = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fd, name = walk(root, split_relpath(path), follow_last=follow_last, shown=path)
    finally:
        os.close(root)
    try:
        where = os.readlink(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)
    return where if name is None else f"{where}/{name}"


def test_links_inside_the_folder_are_followed(tree: Path) -> None:
    assert _resolve(tree, "in/file") == str(tree / "data" / "file")
    assert _resolve(tree, "in") == str(tree / "data")


@pytest.mark.parametrize("path", ["out/secret", "out", "abs/passwd", "up/outside", "up"])
def test_links_leaving_the_folder_are_refused(tree: Path, path: str) -> None:
    with pytest.raises(StorageError) as caught:
        _resolve(tree, path)
    assert caught.value.type is StorageErrorType.BAD_PATH
    assert "leaving the folder" in caught.value.detail


def test_a_link_loop_is_refused(tree: Path) -> None:
    with pytest.raises(StorageError, match="symbolic links"):
        _resolve(tree, "loop/x")


def test_the_last_link_is_not_followed_when_asked(tree: Path) -> None:
    # deleting "out" deletes the link, not what it points at
    assert _resolve(tree, "out", follow_last=False) == str(tree / "out")


_names = st.sampled_from(["a", "b", "..", ".", "", "in", "out", "abs", "up", "data", "file", "x"])


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(parts=st.lists(_names, max_size=8), absolute=st.booleans(), follow=st.booleans())
def test_random_paths_never_escape(
    tree: Path, parts: list[str], absolute: bool, follow: bool
) -> None:
    path = ("/" if absolute else "") + "/".join(parts)
    try:
        where = _resolve(tree, path, follow_last=follow)
    except StorageError:
        return  # refused: fine
    # the directory reached is real (no link in it) and the name is one component
    assert Path(where).is_relative_to(tree.resolve()), (path, where)
    assert ".." not in Path(where).parts, (path, where)
    if follow and os.path.exists(where):
        assert Path(os.path.realpath(where)).is_relative_to(tree.resolve()), (path, where)
