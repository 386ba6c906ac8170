"""``accelshare server manager``: configuration errors stop it with a clear line."""

from __future__ import annotations

from pathlib import Path

import typer
from typer.testing import CliRunner

from accelshare.client.cli.server_manager import manager_command


def test_bad_config_is_one_clear_line(tmp_path: Path) -> None:
    config = tmp_path / "manager.toml"
    config.write_text('[db]\nurl = "mysql://x/y"\n')
    app = typer.Typer()
    app.command()(manager_command)
    result = CliRunner().invoke(app, ["--config", str(config)])
    assert result.exit_code == 2
    assert "db.url: unsupported database 'mysql'" in result.output


def test_help_names_the_options() -> None:
    app = typer.Typer()
    app.command()(manager_command)
    result = CliRunner().invoke(app, ["--help"])
    assert result.exit_code == 0
    assert "--config" in result.output
    assert "manager.toml" in result.output
