"""`dev up`'s storage proxy: its generated storage.toml is valid and the config store
keys point the manager at it (Backend.AI's ``volumes/`` keys)."""

from __future__ import annotations

import tomllib
from pathlib import Path

from accelshare.devcluster.layout import ClusterLayout, render_storage_toml, storage_store_keys
from accelshare.storage.config import parse_storage_config


def test_the_generated_storage_toml_is_valid(tmp_path: Path) -> None:
    layout = ClusterLayout.of(tmp_path)
    text = render_storage_toml(layout, 40001, 40002, "s3cret-s3cret-s3cret")
    config = parse_storage_config(tomllib.loads(text))
    assert config.storage_proxy.node_id == "local"
    assert config.storage_proxy.manager_api == "127.0.0.1:40001"
    assert config.storage_proxy.public_client_url == "http://127.0.0.1:40002"
    assert config.volume["volume1"].path == str(tmp_path.resolve() / "storage" / "volume1")


def test_the_config_store_keys() -> None:
    assert storage_store_keys(40001, 40002, "s3cret") == {
        "volumes/proxies/local/manager_api": "http://127.0.0.1:40001",
        "volumes/proxies/local/client_api": "http://127.0.0.1:40002",
        "volumes/proxies/local/secret": "s3cret",
        "volumes/default_host": "local:volume1",
    }


def test_the_generated_storage_toml_lets_the_console_upload(tmp_path: Path) -> None:
    layout = ClusterLayout.of(tmp_path)
    text = render_storage_toml(layout, 40001, 40002, "s3cret-s3cret-s3cret", 8090)
    config = parse_storage_config(tomllib.loads(text))
    assert config.storage_proxy.cors_origins == (
        "http://127.0.0.1:8090",
        "http://localhost:8090",
    )
