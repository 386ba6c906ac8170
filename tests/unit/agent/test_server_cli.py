"""``accelshare server agent``: the typer group the CLI root mounts."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from accelshare.client.cli.server import server_app

runner = CliRunner()


def test_help_lists_the_agent_command() -> None:
    result = runner.invoke(server_app, ["--help"])
    assert result.exit_code == 0
    assert "agent" in result.output
    result = runner.invoke(server_app, ["agent", "--help"])
    assert result.exit_code == 0
    for option in ("--config", "--dev", "--log-level"):
        assert option in result.output


def test_a_config_error_exits_1_with_one_line(tmp_path: Path) -> None:
    path = tmp_path / "agent.toml"
    path.write_text('[agent]\nheartbeat-interval-s = "soon"\n')
    result = runner.invoke(server_app, ["agent", "--config", str(path)])
    assert result.exit_code == 1
    assert "heartbeat-interval-s" in result.output


def test_a_missing_secret_exits_1(tmp_path: Path) -> None:
    path = tmp_path / "agent.toml"
    path.write_text('[agent]\nrpc-listen-addr = "0.0.0.0:6001"\n')
    result = runner.invoke(server_app, ["agent", "--config", str(path)], env={})
    assert result.exit_code == 1
    assert "cluster secret" in result.output
