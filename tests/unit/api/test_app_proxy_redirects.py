"""Which redirects of an app the proxy puts under its prefix (``/session/{ref}/apps/{name}``):
an app's own absolute paths, but not a path already under the prefix (an app that knows
its base URL, as Jupyter does) nor another origin."""

from __future__ import annotations

import pytest

from accelshare.api.app_proxy import _needs_prefix

PREFIX = "/session/nb/apps/jupyter"  # as the browser spelled it (a name)
CANONICAL = "/session/0b3f/apps/jupyter"  # the session's id, as Jupyter's base URL


@pytest.mark.parametrize(
    ("location", "expected"),
    [
        ("/lab", True),
        ("/", True),
        ("/session/other/apps/jupyter/lab", True),  # another session: the app's own path
        ("/session/nb/apps/jupyter-two/lab", True),  # not the prefix, just a similar path
        (f"{PREFIX}/lab", False),
        (f"{CANONICAL}/lab?reset", False),
        (CANONICAL, False),
        ("lab", False),  # relative: the browser resolves it under the prefix already
        ("//evil.example/x", False),
        ("https://example.com/x", False),
    ],
)
def test_needs_prefix(location: str, expected: bool) -> None:
    assert _needs_prefix(location, PREFIX, CANONICAL) is expected
