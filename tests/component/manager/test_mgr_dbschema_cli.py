"""``accelshare mgr dbschema oneshot|upgrade|show`` through typer's CliRunner."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from accelshare.client.cli.mgr_dbschema import dbschema_app
from accelshare.manager.schema import head_revision

# Mounted as in mgr.py: mgr_app.add_typer(dbschema_app, name="dbschema")
mgr = typer.Typer()
mgr.add_typer(dbschema_app, name="dbschema")


@pytest.fixture
def config_file(db_url: str, tmp_path: Path) -> Path:
    path = tmp_path / "manager.toml"
    path.write_text(f'[manager]\ndata-dir = "{tmp_path}/state"\n[db]\nurl = "{db_url}"\n')
    return path


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(mgr, ["dbschema", *args], env={"COLUMNS": "300"})
    return result.exit_code, result.output


def test_oneshot_then_upgrade_then_show(config_file: Path) -> None:
    code, out = run("show", "--config", str(config_file))
    assert code == 0, out
    assert "schema revision: (none)" in out or "does not exist yet" in out

    code, out = run("oneshot", "--config", str(config_file))
    assert code == 0, out
    assert f"schema revision: {head_revision()} — up to date" in out

    code, out = run("oneshot", "--config", str(config_file))
    assert code == 1
    assert "already has a schema" in out
    assert "dbschema upgrade" in out

    code, out = run("upgrade", "-f", str(config_file))
    assert code == 0, out
    assert "up to date" in out


def test_upgrade_creates_a_fresh_schema(config_file: Path) -> None:
    code, out = run("upgrade", "--config", str(config_file))
    assert code == 0, out
    assert f"schema revision: {head_revision()}" in out


def test_password_is_not_printed(tmp_path: Path) -> None:
    path = tmp_path / "manager.toml"
    path.write_text('[db]\nurl = "postgresql://u:hunter2@127.0.0.1:1/x"\n')
    code, out = run("show", "--config", str(path))
    assert code == 1
    assert "hunter2" not in out
    assert "cannot reach the database" in out


def test_bad_config_is_one_clear_line(tmp_path: Path) -> None:
    path = tmp_path / "manager.toml"
    path.write_text('[db]\nurl = "mysql://x/y"\n')
    code, out = run("upgrade", "--config", str(path))
    assert code == 2
    assert "db.url" in out
    assert "unsupported database 'mysql'" in out


def test_missing_config_file(tmp_path: Path) -> None:
    code, out = run("upgrade", "--config", str(tmp_path / "absent.toml"))
    assert code == 2
    assert "does not exist" in out


def test_help_lists_the_commands() -> None:
    code, out = run("--help")
    assert code == 0
    for command in ("oneshot", "upgrade", "show"):
        assert command in out


def test_show_does_not_create_a_sqlite_file(tmp_path: Path) -> None:
    path = tmp_path / "manager.toml"
    path.write_text(f'[manager]\ndata-dir = "{tmp_path}/state"\n')
    code, out = run("show", "--config", str(path))
    assert code == 0, out
    assert "does not exist yet" in out
    assert not (tmp_path / "state").exists()
