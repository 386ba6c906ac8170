"""Choosing the bus: [redis] in the TOML file, the environment, and bad values."""

from __future__ import annotations

from pathlib import Path

import pytest

from accelshare.bus import GapTracker, load_bus_settings
from accelshare.bus.gap import Gap
from accelshare.config import ConfigFileError


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "manager.toml"
    path.write_text(text)
    return path


def test_no_redis_table_means_the_in_process_bus(tmp_path: Path) -> None:
    settings = load_bus_settings(_write(tmp_path, "[manager]\n"), env={})
    assert settings.redis is None
    assert settings.describe() == "the in-process bus"
    assert load_bus_settings(None, env={}).redis is None


def test_redis_table(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        '[redis]\naddr = "10.0.0.5:6380"\ndb = 2\nnamespace = "prod"\nstats-interval-s = 2.5\n',
    )
    settings = load_bus_settings(path, env={})
    assert settings.redis is not None
    assert (settings.redis.host, settings.redis.port, settings.redis.db) == ("10.0.0.5", 6380, 2)
    assert settings.redis.stats_interval_s == 2.5
    assert settings.redis.key("stats", "i-1") == "accelshare:prod:stats:i-1"
    assert settings.source == str(path)
    assert settings.describe() == "Redis at 10.0.0.5:6380 (db 2, namespace 'prod')"


def test_backendai_style_addr_table_and_default_port(tmp_path: Path) -> None:
    path = _write(tmp_path, '[redis]\naddr = { host = "redis.local", port = 7000 }\n')
    redis = load_bus_settings(path, env={}).redis
    assert redis is not None
    assert redis.addr == "redis.local:7000"
    path = _write(tmp_path, '[redis]\naddr = "redis://cache"\n')
    redis = load_bus_settings(path, env={}).redis
    assert redis is not None
    assert redis.addr == "cache:6379"


def test_environment_selects_and_overrides(tmp_path: Path) -> None:
    env = {
        "ACCELSHARE_REDIS_ADDR": "127.0.0.1:7001",
        "ACCELSHARE_REDIS_PASSWORD": "s3cret",
        "ACCELSHARE_REDIS_NAMESPACE": "ci",
    }
    settings = load_bus_settings(None, env=env)
    assert settings.redis is not None
    assert settings.redis.addr == "127.0.0.1:7001"
    assert settings.redis.namespace == "ci"
    assert settings.redis.password is not None
    assert settings.redis.password.get_secret_value() == "s3cret"
    assert "s3cret" not in repr(settings)  # never printed
    path = _write(tmp_path, '[redis]\naddr = "10.0.0.5:6379"\ndb = 3\n')
    merged = load_bus_settings(path, env={"ACCELSHARE_REDIS_ADDR": "127.0.0.1:7002"}).redis
    assert merged is not None
    assert (merged.addr, merged.db) == ("127.0.0.1:7002", 3)


@pytest.mark.parametrize(
    ("text", "key", "received"),
    [
        pytest.param(
            '[redis]\naddr = "host:notaport"\n', "[redis] addr", "host:notaport", id="addr"
        ),
        pytest.param("[redis]\ndb = 99\n", "[redis] db", "99", id="db-range"),
        pytest.param(
            "[redis]\nstats-interval-s = -1\n", "[redis] stats-interval-s", "-1", id="neg"
        ),
        pytest.param('[redis]\nnamespace = "a b"\n', "[redis] namespace", "a b", id="namespace"),
        pytest.param("[redis]\nadr = 1\n", "[redis] adr", "1", id="typo-key"),
        pytest.param('redis = "127.0.0.1"\n', "[redis]", "127.0.0.1", id="not-a-table"),
    ],
)
def test_bad_values_name_file_key_and_value(
    tmp_path: Path, text: str, key: str, received: str
) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(ConfigFileError) as info:
        load_bus_settings(path, env={})
    message = str(info.value)
    assert str(path) in message
    assert key in message
    assert received in message


def test_gap_tracker_counts_an_outage_once_and_reports_its_length() -> None:
    tracker = GapTracker()
    assert tracker.succeeded(now=0.0) is None  # nothing missed
    assert tracker.failed(now=5.0) is True  # an outage starts: log it
    assert tracker.failed(now=10.0) is False  # the same outage
    assert tracker.failed(now=15.0) is False
    assert tracker.succeeded(now=20.0) == Gap(missed=3, seconds=20.0)  # since the last ok tick
    assert tracker.succeeded(now=25.0) is None
    assert (tracker.missed_total, tracker.last_gap) == (3, Gap(missed=3, seconds=20.0))
    tracker.failed(now=30.0)
    assert tracker.succeeded(now=32.0) == Gap(missed=1, seconds=7.0)
    assert tracker.missed_total == 4  # kept across outages
    fresh = GapTracker()
    assert fresh.failed(now=3.0) is True
    assert fresh.succeeded(now=4.5) == Gap(missed=1, seconds=1.5)  # since the outage began
