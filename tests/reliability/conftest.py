"""Fixtures of the reliability suite (issue #11): manager clusters reused from
``tests/component/manager/cluster.py`` (imported as ``component.manager.cluster``:
``tests/`` is on ``sys.path`` because this directory is a package).

``ACCELSHARE_RELIABILITY_FULL=1`` selects the long version (``make reliability``):
more repetitions and more generated inputs; the default is the short version that
runs with the normal test suite.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from component.manager.cluster import running_cluster

FULL = os.environ.get("ACCELSHARE_RELIABILITY_FULL", "") not in ("", "0")


def scaled(short: int, full: int) -> int:
    """``short`` in the normal run, ``full`` under ``ACCELSHARE_RELIABILITY_FULL=1``."""
    return full if FULL else short


@pytest.fixture
async def sqlite_cluster(tmp_path: Path) -> AsyncIterator[Any]:
    """A manager on SQLite with no agents and no background loops' surprises."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'manager.db'}"
    async with running_cluster(url, tmp_path / "state") as running:
        yield running
