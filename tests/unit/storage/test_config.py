"""storage.toml: errors name the key, the expected and the received value."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from accelshare.storage.config import StorageConfigError, load_storage_config, parse_storage_config

GOOD: dict[str, Any] = {
    "storage-proxy": {"node-id": "local", "secret": "s" * 20},
    "volume": {"volume1": {"path": "/srv/v1"}},
}


def _with(section: str, key: str, value: Any) -> dict[str, Any]:
    data = {k: dict(v) for k, v in GOOD.items()}
    if section == "volume":
        data["volume"] = {"volume1": {"path": "/srv/v1", key: value}}
    else:
        data[section][key] = value
    return data


def test_defaults() -> None:
    config = parse_storage_config(GOOD)
    assert config.storage_proxy.manager_api == "127.0.0.1:6021"
    assert config.storage_proxy.client_api == "127.0.0.1:6022"
    assert config.storage_proxy.public_client_url == "http://127.0.0.1:6022"
    assert config.volume["volume1"].backend == "vfs"
    assert "s" * 20 not in repr(config)


@pytest.mark.parametrize(
    ("data", "key", "expected", "received"),
    [
        (
            _with("storage-proxy", "token-ttl", "1h"),
            "storage-proxy.token-ttl",
            "whole seconds",
            "'1h'",
        ),
        (
            _with("storage-proxy", "manager-api", "6021"),
            "storage-proxy.manager-api",
            "HOST:PORT",
            "'6021'",
        ),
        (
            _with("storage-proxy", "client-url", "storage:6022"),
            "storage-proxy.client-url",
            "http://",
            "'storage:6022'",
        ),
        (
            _with("storage-proxy", "secret", "short"),
            "storage-proxy.secret",
            "16 characters",
            "(hidden)",
        ),
        (_with("storage-proxy", "sekret", "x"), "storage-proxy.sekret", "no such key", "'x'"),
        (_with("volume", "backend", "xfs"), "volume.volume1.backend", "'vfs'", "'xfs'"),
        (_with("volume", "path", "rel/dir"), "volume.volume1.path", "absolute", "'rel/dir'"),
        ({"storage-proxy": GOOD["storage-proxy"]}, "volume", "[volume.NAME]", "nothing"),
        ({**GOOD, "volume": {"bad name": {"path": "/x"}}}, "volume", "volume names", "bad name"),
    ],
)
def test_errors_name_the_key(data: dict[str, Any], key: str, expected: str, received: str) -> None:
    with pytest.raises(StorageConfigError) as caught:
        parse_storage_config(data, source="s.toml")
    message = str(caught.value)
    assert caught.value.key == key, message
    assert message.startswith(f"s.toml: key {key!r}: expected ")
    assert expected in message
    assert received in message


def test_a_file_that_is_not_toml(tmp_path: Path) -> None:
    path = tmp_path / "storage.toml"
    path.write_text("[storage-proxy\n")
    with pytest.raises(StorageConfigError, match="valid TOML"):
        load_storage_config(path)


def test_the_sample_config_is_valid() -> None:
    sample = Path(__file__).resolve().parents[3] / "configs" / "storage.toml"
    config = load_storage_config(sample)
    assert config.storage_proxy.node_id == "storage1"
    assert config.volume["volume1"].path == "/srv/accelshare/volume1"
