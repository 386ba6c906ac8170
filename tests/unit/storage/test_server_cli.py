"""``accelshare server storage``: refuses a bad storage.toml or a missing volume, naming it."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from accelshare.client.cli.server import server_app

runner = CliRunner()


def test_help_lists_the_storage_command() -> None:
    result = runner.invoke(server_app, ["storage", "--help"])
    assert result.exit_code == 0
    for option in ("--config", "--log-level", "--json"):
        assert option in result.output


def test_a_config_error_exits_1_naming_the_key(tmp_path: Path) -> None:
    path = tmp_path / "storage.toml"
    path.write_text(
        '[storage-proxy]\nnode-id = "x"\nsecret = "0123456789abcdef"\ntoken-ttl = "1h"\n'
    )
    result = runner.invoke(server_app, ["storage", "--config", str(path)])
    assert result.exit_code == 1
    assert "storage-proxy.token-ttl" in result.output


def test_a_missing_volume_directory_exits_1(tmp_path: Path) -> None:
    path = tmp_path / "storage.toml"
    path.write_text(
        '[storage-proxy]\nnode-id = "x"\nsecret = "0123456789abcdef"\n'
        f'[volume.v]\npath = "{tmp_path / "absent"}"\n'
    )
    result = runner.invoke(server_app, ["storage", "--config", str(path)])
    assert result.exit_code == 1
    assert "absent is not a directory" in result.output
