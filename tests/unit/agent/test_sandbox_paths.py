"""The sandbox builder's string path checks agree with ``PurePosixPath``'s."""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from hypothesis import given
from hypothesis import strategies as st

from accelshare.agent.runtime.sandbox import _SYSTEM_DIRS, _under_system, _within

_PARTS = st.sampled_from(["usr", "usrx", "lib", "lib64", "etc", "tmp", "a", "..", ".", "", "us"])
#: absolute paths as a configuration may write them ("//" is a root of its own)
_PATHS = st.builds(
    lambda lead, parts: lead + "/".join(parts),
    st.sampled_from(["/", "//", "///"]),
    st.lists(_PARTS, max_size=5),
)


@given(_PATHS, _PATHS)
def test_within_is_is_relative_to(path: str, base: str) -> None:
    p, b = PurePosixPath(path), PurePosixPath(base)
    assert _within(str(p), str(b)) == p.is_relative_to(b), (str(p), str(b))


@given(_PATHS)
def test_under_system_matches_path_semantics(path: str) -> None:
    p = Path(path)
    expected = any(p == Path(s) or p.is_relative_to(s) for s in _SYSTEM_DIRS)
    assert _under_system(p) == expected
    assert _under_system(str(p)) == expected


def test_known_answers() -> None:
    assert _within("/usr/lib", "/usr")
    assert _within("/usr", "/usr")
    assert not _within("/usrx", "/usr")
    assert not _within("/usr", "/usr/lib")
    assert _within("/tmp/a", "/")
    assert not _within("//tmp", "/")
    assert _within("//tmp/a", "//tmp")
    assert _under_system("/lib64/x")
    assert not _under_system("/library")
    assert not _under_system("/")
