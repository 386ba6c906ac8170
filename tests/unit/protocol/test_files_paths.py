"""Paths in a kernel's working folder (protocol/files.py): what is cleaned, what refused."""

from __future__ import annotations

import pytest

from accelshare.protocol.files import check_relative_path, from_kernel_path


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("", ""),
        (".", ""),
        ("a.txt", "a.txt"),
        ("a//b/./c.txt", "a/b/c.txt"),
        ("dir/", "dir"),
        ("..hidden", "..hidden"),  # a name that starts with dots is a name
    ],
)
def test_relative_paths_are_cleaned(given: str, expected: str) -> None:
    assert check_relative_path(given) == expected


@pytest.mark.parametrize(
    ("given", "why"),
    [
        ("..", "'..' is refused"),
        ("a/../../b", "'..' is refused"),
        ("/etc/passwd", "relative to the working folder"),
        ("a\x00b", "control characters"),
        ("a\tb", "control characters"),
        ("x" * 4097, "at most 4096"),
    ],
)
def test_refused_relative_paths_name_why(given: str, why: str) -> None:
    with pytest.raises(ValueError, match=r"^path: ") as caught:
        check_relative_path(given)
    assert why in str(caught.value)


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("/home/work", ""),
        ("/home/work/", ""),
        ("/home/work/data/x", "data/x"),
        ("data/x", "data/x"),
        (".", ""),
    ],
)
def test_kernel_paths_under_home_work(given: str, expected: str) -> None:
    assert from_kernel_path(given) == expected


@pytest.mark.parametrize("given", ["/etc", "/home/workshop/x", "/home", "/home/work/../x"])
def test_kernel_paths_elsewhere_are_refused(given: str) -> None:
    with pytest.raises(ValueError, match=r"^path: "):
        from_kernel_path(given)
