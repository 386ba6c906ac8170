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


def _make_store(harness: Harness) -> None:
    """What a running cluster's daemons have done: the embedded store's file exists
    (``mgr etcd`` refuses a missing one; etcd always exists)."""

    async def touch() -> None:
        async with harness.store() as store:
            await store.get("config")

    asyncio.run(touch())


class Cli:
    """Runs ``accelshare mgr etcd ARGS --config <the harness's store>`` (which exists)."""

    def __init__(self, harness: Harness) -> None:
        self.harness = harness
        self.config = harness.config_toml()
        self.runner = CliRunner()
        _make_store(harness)

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
    _make_store(harness)
    for name, value in harness.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    result = runner.invoke(app, ["mgr", "etcd", "put", "config/via-env", "yes"])
    assert result.exit_code == 0, result.output

    async def check() -> str | None:
        async with _library(harness) as store:
            return await store.get("config/via-env", scope=ConfigScopes.GLOBAL)

    assert asyncio.run(check()) == "yes"


# -- a missing store is refused; --create; --verbose ------------------------------------

STORE_VARIABLES = ("ACCELSHARE_ETCD_ADDR", "ACCELSHARE_CONFIG_STORE", "ACCELSHARE_CONFIG_NAMESPACE")
EVERY_COMMAND = [
    ("get", "--prefix", ""),
    ("get", "k"),
    ("put", "k", "v"),
    ("put-json", "", "-"),
    ("delete", "k"),
    ("delete", "--prefix", ""),
    ("move-subtree", "a", "b"),
]
EVERY_COMMAND_IDS = ["get-prefix", "get", "put", "put-json", "delete", "delete-prefix", "move"]


@pytest.fixture
def empty_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The working directory: a folder without a store, and no store variables set."""
    for name in STORE_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    monkeypatch.chdir(folder)
    return folder


def _etcd(*args: str, env: dict[str, str] | None = None, stdin: str | None = None) -> Result:
    return CliRunner().invoke(app, ["mgr", "etcd", *args], env=env, input=stdin)


def _one_error(result: Result) -> str:
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: "), result.stderr
    return lines[0]


def _tree(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.mark.parametrize("args", EVERY_COMMAND, ids=EVERY_COMMAND_IDS)
def test_no_store_in_the_folder_is_refused_and_nothing_is_made(
    empty_folder: Path, args: tuple[str, ...]
) -> None:
    """Run from a folder that is not the cluster's: no new, empty store behind the
    operator's back (issue #33: `get --prefix ''` printed {} and put-json wrote into it)."""
    error = _one_error(_etcd(*args, stdin='{"config": {"a": "1"}}'))
    assert error.startswith(
        f"error: no configuration store at ./.accelshare/config-store.db (in {empty_folder}):"
        " pass --config FILE, or set ACCELSHARE_CONFIG_STORE"
    ), error
    assert "run from the cluster's folder" in error
    assert ("--create makes a new, empty store there" in error) == (args[0] in ("put", "put-json"))
    assert _tree(empty_folder) == []  # not even the .accelshare folder


@pytest.mark.parametrize("command", ["put", "put-json"])
def test_create_makes_the_default_store(empty_folder: Path, command: str) -> None:
    args = ("put", "config/k", "v") if command == "put" else ("put-json", "config", "-")
    result = _etcd(*args, "--create", stdin='{"k": "v"}')
    assert result.exit_code == 0, result.output
    assert (empty_folder / ".accelshare" / "config-store.db").is_file()
    assert _etcd("get", "config/k").stdout == "v\n"  # now it exists: no --create needed
    assert _etcd("put", "config/k", "w").exit_code == 0
    assert _etcd("get", "--prefix", "").stdout == '{\n  "config": {\n    "k": "w"\n  }\n}\n'


def test_a_missing_store_named_by_a_config_file_is_refused(empty_folder: Path) -> None:
    store = empty_folder / "nowhere" / "store.db"
    config = empty_folder / "agent.toml"
    config.write_text(f'[config-store]\npath = "{store}"\n')
    error = _one_error(_etcd("get", "--prefix", "", "--config", str(config)))
    assert error == (
        f"error: no configuration store at {store}"
        f" (from {config} [config-store] path): check the path"
    )
    error = _one_error(_etcd("put", "k", "v", "--config", str(config)))
    assert error.endswith("check the path; --create makes a new, empty store there")
    assert _tree(empty_folder) == ["agent.toml"]
    assert _etcd("put", "k", "v", "--config", str(config), "--create").exit_code == 0
    assert _etcd("get", "k", "--config", str(config)).stdout == "v\n"


def test_a_config_file_that_names_no_store_says_so(empty_folder: Path) -> None:
    config = empty_folder / "agent.toml"
    config.write_text('[agent]\nid = "i-1"\n')
    error = _one_error(_etcd("get", "k", "--config", str(config)))
    assert error.startswith(
        f"error: no configuration store at ./.accelshare/config-store.db"
        f" (in {empty_folder}; {config} names none): pass --config FILE"
    ), error
    assert _tree(empty_folder) == ["agent.toml"]


def test_manager_toml_names_the_store_in_its_data_dir(empty_folder: Path) -> None:
    """`--config manager.toml` reaches the store the manager uses: <data-dir>/config-store.db."""
    data_dir = empty_folder / "data"
    config = empty_folder / "manager.toml"
    config.write_text(f'[manager]\ndata-dir = "{data_dir}"\n')
    error = _one_error(_etcd("get", "k", "--config", str(config)))
    assert f"{data_dir / 'config-store.db'} (from {config} [manager] data-dir)" in error
    assert _etcd("put", "k", "v", "--config", str(config), "--create").exit_code == 0
    assert (data_dir / "config-store.db").is_file()


def test_the_store_variable_points_at_a_store_from_any_folder(
    empty_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = tmp_path / "cluster" / "config-store.db"
    env = {"ACCELSHARE_CONFIG_STORE": str(store)}
    error = _one_error(_etcd("put", "k", "v", env=env))
    assert error == (
        f"error: no configuration store at {store} (from $ACCELSHARE_CONFIG_STORE):"
        " check the path; --create makes a new, empty store there"
    )
    assert not store.parent.exists()
    assert _etcd("put", "k", "v", "--create", env=env).exit_code == 0
    assert store.is_file()
    other = tmp_path / "another folder"
    other.mkdir()
    monkeypatch.chdir(other)
    assert _etcd("get", "k", env=env).stdout == "v\n"
    assert _tree(other) == []
    assert _tree(empty_folder) == []
    # a relative path is relative to the working directory, and shown with it
    error = _one_error(_etcd("get", "k", env={"ACCELSHARE_CONFIG_STORE": "rel/store.db"}))
    assert f"at ./rel/store.db in {other} (from $ACCELSHARE_CONFIG_STORE)" in error


@pytest.mark.parametrize("args", EVERY_COMMAND, ids=EVERY_COMMAND_IDS)
def test_verbose_names_the_store_on_stderr(cli: Cli, args: tuple[str, ...], tmp_path: Path) -> None:
    cli.ok("put-json", "", "-", stdin='{"a": {"x": "1"}, "k": "v"}')
    result = cli(*args, "--verbose", stdin='{"config": {"a": "1"}}')
    assert result.exit_code == 0, result.output
    harness = cli.harness
    if harness.etcd is not None:
        where = f"etcd at {harness.etcd.addr}"
        selected = f"{cli.config} [etcd] addr"
    else:
        where = f"the embedded store at {harness.db_path}"
        selected = f"{cli.config} [config-store] path"
    assert result.stderr == f"using {where} (namespace {harness.namespace!r}; from {selected})\n"
    assert "using" not in result.stdout  # stdout stays the command's own output
    quiet = cli(*args, stdin='{"config": {"a": "1"}}')
    assert "using" not in quiet.stderr


def test_verbose_names_the_default_and_the_variable(empty_folder: Path) -> None:
    assert _etcd("put", "k", "v", "--create").exit_code == 0
    result = _etcd("get", "k", "-v")
    default = empty_folder / ".accelshare" / "config-store.db"
    assert result.stderr == (
        f"using the embedded store at {default} (namespace 'local'; from the default)\n"
    )
    env = {"ACCELSHARE_CONFIG_STORE": str(default), "ACCELSHARE_CONFIG_NAMESPACE": "other"}
    result = _etcd("get", "--prefix", "", "-v", env=env)
    assert result.stderr == (
        f"using the embedded store at {default}"
        " (namespace 'other'; from $ACCELSHARE_CONFIG_STORE)\n"
    )
    assert result.stdout == "{}\n"  # another namespace of the same file


def test_the_variable_overriding_a_config_file_is_a_warning(
    empty_folder: Path, tmp_path: Path
) -> None:
    """A shell that sourced a local cluster's client.env has ACCELSHARE_CONFIG_STORE; it
    wins over --config (as for the daemons), and the command says so."""
    cluster_store = tmp_path / "cluster.db"
    file_store = tmp_path / "file.db"
    config = tmp_path / "agent.toml"
    config.write_text(f'[config-store]\npath = "{file_store}"\n')
    env = {"ACCELSHARE_CONFIG_STORE": str(cluster_store)}
    result = _etcd("put", "k", "v", "--create", "--config", str(config), env=env)
    assert result.exit_code == 0, result.output
    assert result.stderr == (
        f"warning: $ACCELSHARE_CONFIG_STORE overrides {config} [config-store] path"
        f" (the embedded store at {file_store}); using the embedded store at {cluster_store};"
        " unset the variable to use the file's\n"
    )
    assert cluster_store.exists()
    assert not file_store.exists()


def test_an_unreachable_etcd_fails_fast_with_one_line(tmp_path: Path) -> None:
    from accelshare_testkit.servers import free_port

    config = tmp_path / "agent.toml"
    config.write_text(f'[etcd]\naddr = "127.0.0.1:{free_port()}"\ntimeout-s = 0.5\n')
    result = CliRunner().invoke(app, ["mgr", "etcd", "get", "k", "--config", str(config)])
    assert result.exit_code == 1
    assert result.stderr.startswith("error: etcd at 127.0.0.1:")
    assert "unreachable" in result.stderr
