"""Selecting the store: defaults, TOML file, environment."""

from __future__ import annotations

from pathlib import Path

import pytest

from accelshare.config import ConfigFileError, config_store_env, load_config_store_settings
from accelshare.config.settings import DEFAULT_EMBEDDED_PATH, parse_host_port


def _toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "agent.toml"
    path.write_text(text)
    return path


def test_default_is_the_embedded_store_under_dot_accelshare() -> None:
    settings = load_config_store_settings(env={})
    assert settings.backend == "embedded"
    assert settings.embedded.path == DEFAULT_EMBEDDED_PATH == Path(".accelshare/config-store.db")
    assert settings.namespace == "local"


def test_an_etcd_table_selects_etcd(tmp_path: Path) -> None:
    path = _toml(
        tmp_path,
        '[agent]\nid = "i-node01"\nscaling-group = "gpu"\n'
        '[etcd]\naddr = "10.0.0.5:2379"\nnamespace = "prod"\nuser = "root"\npassword = "pw"\n',
    )
    settings = load_config_store_settings(path, env={})
    assert settings.backend == "etcd"
    assert (settings.etcd.host, settings.etcd.port) == ("10.0.0.5", 2379)
    assert settings.namespace == "prod"
    assert settings.etcd.password is not None
    assert settings.etcd.password.get_secret_value() == "pw"
    assert "pw" not in repr(settings)
    assert (settings.node_id, settings.scaling_group) == ("i-node01", "gpu")


def test_backend_ai_style_addr_table(tmp_path: Path) -> None:
    path = _toml(tmp_path, '[etcd]\naddr = { host = "127.0.0.1", port = 2479 }\n')
    assert load_config_store_settings(path, env={}).etcd.addr == "127.0.0.1:2479"


def test_config_store_table(tmp_path: Path) -> None:
    path = _toml(
        tmp_path,
        '[etcd]\naddr = "10.0.0.5:2379"\n'
        '[config-store]\nbackend = "embedded"\npath = "/var/lib/x.db"\nnamespace = "dev"\n'
        "poll-interval-s = 0.2\n",
    )
    settings = load_config_store_settings(path, env={})
    assert settings.backend == "embedded"
    assert settings.embedded.path == Path("/var/lib/x.db")
    assert settings.embedded.poll_interval_s == 0.2
    assert settings.namespace == "dev"


def test_environment_overrides_the_file(tmp_path: Path) -> None:
    path = _toml(tmp_path, '[etcd]\naddr = "10.0.0.5:2379"\nnamespace = "prod"\n')
    settings = load_config_store_settings(
        path, env={"ACCELSHARE_CONFIG_STORE": "/tmp/s.db", "ACCELSHARE_CONFIG_NAMESPACE": "ns2"}
    )
    assert settings.backend == "embedded"
    assert settings.embedded.path == Path("/tmp/s.db")
    assert settings.namespace == "ns2"

    settings = load_config_store_settings(
        None,
        env={
            "ACCELSHARE_ETCD_ADDR": "etcd.local:2379",
            "ACCELSHARE_ETCD_USER": "u",
            "ACCELSHARE_ETCD_PASSWORD": "p",
        },
    )
    assert settings.backend == "etcd"
    assert settings.etcd.addr == "etcd.local:2379"
    assert settings.etcd.user == "u"


def test_both_environment_selectors_are_an_error() -> None:
    with pytest.raises(ConfigFileError, match="at most one"):
        load_config_store_settings(
            env={"ACCELSHARE_ETCD_ADDR": "h:1", "ACCELSHARE_CONFIG_STORE": "/tmp/x.db"}
        )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[etcd]\naddr = "host:port"\n', r"\[etcd\] addr"),
        ('[etcd]\naddr = "h:1"\nadress = "typo"\n', r"\[etcd\] adress: expected Extra inputs"),
        ('[config-store]\nbackend = "zookeeper"\n', r"\[config-store\] backend"),
        ('[config-store]\nbackend = "etcd"\n', r"expected an \[etcd\] table"),
        ("etcd = 3\n", r"\[etcd\]: expected a table"),
        ("[etcd\n", r"\(syntax\): expected valid TOML"),
    ],
)
def test_file_errors_name_the_file_and_key(tmp_path: Path, text: str, message: str) -> None:
    path = _toml(tmp_path, text)
    with pytest.raises(ConfigFileError, match=message) as excinfo:
        load_config_store_settings(path, env={})
    assert str(excinfo.value).startswith(str(path))


def test_a_manager_data_dir_places_the_embedded_store(tmp_path: Path) -> None:
    """`--config manager.toml` names the store the manager uses (<data-dir>/config-store.db)."""
    path = _toml(tmp_path, '[manager]\ndata-dir = "/srv/accelshare"\n')
    settings = load_config_store_settings(path, env={})
    assert settings.embedded.path == Path("/srv/accelshare/config-store.db")
    assert settings.location_source == f"{path} [manager] data-dir"
    # an explicit [config-store] path wins over the data dir
    path = _toml(
        tmp_path, '[manager]\ndata-dir = "/srv/a"\n[config-store]\npath = "/elsewhere.db"\n'
    )
    assert load_config_store_settings(path, env={}).embedded.path == Path("/elsewhere.db")
    path = _toml(tmp_path, "[manager]\ndata-dir = 3\n")
    with pytest.raises(ConfigFileError, match=r"\[manager\] data-dir: expected a folder"):
        load_config_store_settings(path, env={})


@pytest.mark.parametrize(
    ("text", "env", "expected"),
    [
        ("", {}, "the default"),
        ('[agent]\nid = "i-1"\n', {}, "the default"),
        ('[config-store]\npath = "/x.db"\n', {}, "{file} [config-store] path"),
        ('[etcd]\naddr = "h:1"\n', {}, "{file} [etcd] addr"),
        (
            '[etcd]\naddr = "h:1"\n',
            {"ACCELSHARE_CONFIG_STORE": "/s.db"},
            "$ACCELSHARE_CONFIG_STORE",
        ),
        (
            '[config-store]\npath = "/x.db"\n',
            {"ACCELSHARE_ETCD_ADDR": "h:1"},
            "$ACCELSHARE_ETCD_ADDR",
        ),
        ("", {"ACCELSHARE_CONFIG_NAMESPACE": "ns"}, "the default"),
    ],
)
def test_location_source_names_the_step_that_chose_the_store(
    tmp_path: Path, text: str, env: dict[str, str], expected: str
) -> None:
    path = _toml(tmp_path, text)
    settings = load_config_store_settings(path, env=env)
    assert settings.location_source == expected.format(file=path)


def test_config_store_env_selects_the_same_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a local cluster's client.env exports: read back, the same store, whatever
    the shell had set before (the other selector is emptied)."""
    monkeypatch.chdir(tmp_path)
    embedded = load_config_store_settings(
        _toml(tmp_path, '[config-store]\npath = "rel/store.db"\nnamespace = "dev"\n'), env={}
    )
    env = config_store_env(embedded)
    assert env == {
        "ACCELSHARE_CONFIG_STORE": str(tmp_path / "rel" / "store.db"),  # absolute
        "ACCELSHARE_ETCD_ADDR": "",
        "ACCELSHARE_CONFIG_NAMESPACE": "dev",
    }
    shell = {"ACCELSHARE_ETCD_ADDR": "old:2379", "ACCELSHARE_CONFIG_NAMESPACE": "old"}
    again = load_config_store_settings(env={**shell, **env})
    assert (again.backend, again.embedded.path, again.namespace) == (
        "embedded",
        tmp_path / "rel" / "store.db",
        "dev",
    )

    etcd = load_config_store_settings(
        _toml(tmp_path, '[etcd]\naddr = "10.0.0.5:2379"\nnamespace = "prod"\npassword = "pw"\n'),
        env={},
    )
    env = config_store_env(etcd)
    assert env == {
        "ACCELSHARE_ETCD_ADDR": "10.0.0.5:2379",
        "ACCELSHARE_CONFIG_STORE": "",
        "ACCELSHARE_CONFIG_NAMESPACE": "prod",
    }  # no credentials
    again = load_config_store_settings(env={"ACCELSHARE_CONFIG_STORE": "/x.db", **env})
    assert (again.backend, again.etcd.addr, again.namespace) == ("etcd", "10.0.0.5:2379", "prod")


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigFileError, match=r"missing\.toml: \(file\)"):
        load_config_store_settings(tmp_path / "missing.toml", env={})


@pytest.mark.parametrize(
    ("addr", "expected"),
    [
        ("h:1", ("h", 1)),
        ("h", ("h", 2379)),
        ("[::1]:2379", ("::1", 2379)),
        ("http://h:2", ("h", 2)),
    ],
)
def test_parse_host_port(addr: str, expected: tuple[str, int]) -> None:
    assert parse_host_port(addr) == expected


@pytest.mark.parametrize("addr", ["", "h:0", "h:x", ":2379"])
def test_parse_host_port_refuses(addr: str) -> None:
    with pytest.raises(ValueError, match="host:port"):
        parse_host_port(addr)
