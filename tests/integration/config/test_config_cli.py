"""``accelshare mgr etcd ...`` against both backends, selected as the daemons select them."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from accelshare.client.cli import app
from accelshare.config import ConfigScopes, ConfigStore

from .conftest import Harness
from .test_config_store import NASTY_TREE

pytestmark = pytest.mark.integration


class Cli:
    """Runs ``accelshare mgr etcd ARGS --config <the harness's store>``."""

    def __init__(self, harness: Harness) -> None:
        self.harness = harness
        self.config = harness.config_toml()
        self.runner = CliRunner()

    def __call__(self, *args: str, stdin: str | None = None) -> Result:
        return self.runner.invoke(
            app, ["mgr", "etcd", *args, "--config", str(self.config)], input=stdin
        )

    def ok(self, *args: str, stdin: str | None = None) -> str:
        result = self(*args, stdin=stdin)
        assert result.exit_code == 0, result.output
        return result.stdout

    def fails(self, *args: str, stdin: str | None = None) -> str:
        """The one error line of a failing command."""
        result = self(*args, stdin=stdin)
        assert result.exit_code == 1, result.output
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, result.stderr
        assert lines[0].startswith("error: "), result.stderr
        return lines[0]

    def tree(self, prefix: str = "", *extra: str) -> Any:
        return json.loads(self.ok("get", "--prefix", prefix, *extra))


@pytest.fixture
def cli(harness: Harness) -> Cli:
    return Cli(harness)


def _library(harness: Harness) -> ConfigStore:
    return harness.store()


def test_put_get_delete(cli: Cli) -> None:
    cli.ok("put", "config/agent/max-container-count", "8")
    assert cli.ok("get", "config/agent/max-container-count") == "8\n"
    cli.ok("put", "config/empty", "")
    assert cli.ok("get", "config/empty") == "\n"
    cli.ok("delete", "config/agent/max-container-count")
    assert "no value at 'config/agent/max-container-count'" in cli.fails(
        "get", "config/agent/max-container-count"
    )


def test_put_json_then_get_prefix(cli: Cli, tmp_path: Path) -> None:
    """The operator's usual way to switch a plugin to fractional mode (spec 03)."""
    path = tmp_path / "mydevice-fractional-mode.json"
    path.write_text(
        '{"config": {"plugins": {"accelerator": {"cuda": {"allocation_mode": "fractional",'
        ' "unit_mem": 1073741824, "unit_proc": 10}}}}}'
    )
    cli.ok("put-json", "", str(path))
    assert cli.tree("config/plugins/accelerator/cuda") == {
        "allocation_mode": "fractional",
        "unit_mem": "1073741824",
        "unit_proc": "10",
    }
    assert cli.ok("get", "config/plugins/accelerator/cuda/unit_proc") == "10\n"
    assert cli.tree("nothing/here") == {}


def test_put_json_from_stdin_under_a_key(cli: Cli) -> None:
    cli.ok(
        "put-json", "config/plugins/scheduler", "-", stdin='{"fifo": {"num_retries_to_skip": 3}}'
    )
    assert cli.ok("get", "config/plugins/scheduler/fifo/num_retries_to_skip") == "3\n"


def test_backup_and_restore_reproduce_the_tree_exactly(cli: Cli, tmp_path: Path) -> None:
    cli.ok("put-json", "", "-", stdin=json.dumps(NASTY_TREE))
    cli.ok(
        "put", "config/plugins/accelerator/cuda/unit_mem", "2g", "--scope", "node", "--node", "i-1"
    )
    backup = tmp_path / "backup.json"
    backup.write_text(cli.ok("get", "--prefix", ""))

    cli.ok("delete", "--prefix", "")
    assert cli.tree() == {}
    cli.ok("put-json", "", str(backup))
    assert cli.ok("get", "--prefix", "") == backup.read_text()
    assert json.loads(backup.read_text())["config"] == NASTY_TREE["config"]


def test_put_json_replace_restores_over_a_changed_tree(cli: Cli, tmp_path: Path) -> None:
    cli.ok("put-json", "", "-", stdin='{"config": {"a": "1", "b": "2"}}')
    backup = tmp_path / "backup.json"
    backup.write_text(cli.ok("get", "--prefix", ""))
    cli.ok("put", "config/added-later", "x")
    cli.ok("put", "config/a", "changed")
    cli.ok("put-json", "", str(backup), "--replace")
    assert cli.tree() == {"config": {"a": "1", "b": "2"}}


def test_scopes(cli: Cli) -> None:
    key = "config/plugins/accelerator/cuda/allocation_mode"
    cli.ok("put", key, "discrete")
    cli.ok("put", key, "fractional", "--scope", "sgroup", "--sgroup", "gpu")
    assert cli.ok("get", key) == "discrete\n"  # get reads the global scope by default
    assert cli.ok("get", key, "--scope", "merged", "--sgroup", "gpu") == "fractional\n"
    assert cli.ok("get", key, "--scope", "merged", "--sgroup", "cpu") == "discrete\n"
    cli.ok("put", key, "node-level", "--scope", "node", "--node", "i-9")
    merged = ("--scope", "merged", "--sgroup", "gpu", "--node", "i-9")
    assert cli.ok("get", key, *merged) == "node-level\n"
    assert cli.tree("config", *merged)["plugins"]["accelerator"]["cuda"] == {
        "allocation_mode": "node-level"
    }
    cli.ok("delete", key, "--scope", "node", "--node", "i-9")
    assert cli.ok("get", key, *merged) == "fractional\n"


def test_move_subtree(cli: Cli) -> None:
    cli.ok("put-json", "old", "-", stdin='{"": "own", "x": {"y": "1"}}')
    assert "moved 2 key(s)" in cli.ok("move-subtree", "old", "new")
    assert cli.tree() == {"new": {"": "own", "x": {"y": "1"}}}
    assert "nothing to move" in cli.fails("move-subtree", "old", "elsewhere")
    assert "one contains the other" in cli.fails("move-subtree", "new", "new/inner")


def test_delete_prefix_in_a_scope(cli: Cli) -> None:
    cli.ok("put-json", "config", "-", "--scope", "sgroup", "--sgroup", "gpu", stdin='{"a": "1"}')
    cli.ok("put", "config/a", "global")
    cli.ok("delete", "config", "--prefix", "--scope", "sgroup", "--sgroup", "gpu")
    assert cli.tree() == {"config": {"a": "global"}}


@pytest.mark.parametrize(
    ("args", "stdin", "message"),
    [
        (("put-json", "x", "-"), "{bad json", "stdin is not valid JSON"),
        (("put-json", "x", "-"), "[1, 2]", "must hold a JSON object, got an array"),
        (("put-json", "x", "-"), '"text"', "must hold a JSON object, got a string"),
        (("put-json", "x", "-"), "42", "must hold a JSON object, got a number"),
        (("put-json", "x", "-"), '{"a": "1", "b": null}', "is null, which cannot be stored"),
        (("put-json", "x", "-"), '{"a": "1", "b": [1]}', "is a list, which cannot be stored"),
        (("put-json", "", "-"), '{"": "v", "a": "1"}', "the root cannot hold a value"),
        (("put-json", "x", "does-not-exist.json"), None, "cannot read does-not-exist.json"),
        (("put", "", "v"), None, "the key must not be empty"),
        (("put", "a//b", "v"), None, "empty path component"),
        (("get", ""), None, "the key must not be empty"),
        (("delete", ""), None, "the key must not be empty"),
        (("move-subtree", "", "x"), None, "the source key must not be empty"),
        (("put", "k", "v", "--scope", "sgroup"), None, "--scope sgroup needs --sgroup NAME"),
        (("put", "k", "v", "--scope", "node"), None, "--scope node needs --node ID"),
    ],
    ids=[
        "malformed-json",
        "json-array",
        "json-string",
        "json-number",
        "null-value",
        "list-value",
        "root-value",
        "missing-file",
        "put-empty-key",
        "put-empty-component",
        "get-empty-key",
        "delete-empty-key",
        "move-empty-key",
        "sgroup-without-name",
        "node-without-id",
    ],
)
def test_bad_input_is_one_clear_error_and_writes_nothing(
    cli: Cli, args: tuple[str, ...], stdin: str | None, message: str
) -> None:
    assert message in cli.fails(*args, stdin=stdin)
    assert cli.tree() == {}


def test_a_broken_config_file_is_named_in_the_error(cli: Cli, tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[etcd]\naddr = "nohost:notaport"\n')
    result = cli.runner.invoke(app, ["mgr", "etcd", "get", "x", "--config", str(bad)])
    assert result.exit_code == 1
    assert f"error: {bad}: [etcd] addr" in result.stderr


def test_the_store_can_be_selected_by_environment(
    harness: Harness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in harness.env().items():
        monkeypatch.setenv(name, value)
    runner = CliRunner()
    result = runner.invoke(app, ["mgr", "etcd", "put", "config/via-env", "yes"])
    assert result.exit_code == 0, result.output

    async def check() -> str | None:
        async with _library(harness) as store:
            return await store.get("config/via-env", scope=ConfigScopes.GLOBAL)

    assert asyncio.run(check()) == "yes"


def test_the_default_store_is_embedded_under_dot_accelshare(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("ACCELSHARE_ETCD_ADDR", "ACCELSHARE_CONFIG_STORE", "ACCELSHARE_CONFIG_NAMESPACE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    assert runner.invoke(app, ["mgr", "etcd", "put", "k", "v"]).exit_code == 0
    assert (tmp_path / ".accelshare" / "config-store.db").is_file()
    assert runner.invoke(app, ["mgr", "etcd", "get", "k"]).stdout == "v\n"


def test_an_unreachable_etcd_fails_fast_with_one_line(tmp_path: Path) -> None:
    from accelshare.config.testing import free_port

    config = tmp_path / "agent.toml"
    config.write_text(f'[etcd]\naddr = "127.0.0.1:{free_port()}"\ntimeout-s = 0.5\n')
    result = CliRunner().invoke(app, ["mgr", "etcd", "get", "k", "--config", str(config)])
    assert result.exit_code == 1
    assert result.stderr.startswith("error: etcd at 127.0.0.1:")
    assert "unreachable" in result.stderr
