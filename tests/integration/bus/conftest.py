"""A real Redis per test module (Debian's redis-server on a free loopback port), so
tests can stop and restart it; each test gets its own namespace."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from accelshare.bus import RedisSettings
from accelshare_testkit.redis_server import RedisProcess, find_redis_binary


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisProcess]:
    if find_redis_binary() is None:
        pytest.skip("no redis-server binary: apt-get install redis-server")
    with RedisProcess(Path(tmp_path_factory.mktemp("redis"))) as server:
        yield server


@pytest.fixture
def redis_settings(redis_server: RedisProcess) -> RedisSettings:
    return RedisSettings(
        addr=redis_server.addr,
        namespace=f"t{uuid.uuid4().hex[:10]}",
        timeout_s=0.5,
        stats_interval_s=0.05,
    )
