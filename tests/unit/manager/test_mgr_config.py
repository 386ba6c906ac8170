"""manager.toml: defaults, database URL forms, and errors that name file, key and value."""

from __future__ import annotations

from pathlib import Path

import pytest

from accelshare.manager.config import (
    ManagerConfig,
    ManagerConfigError,
    load_manager_config,
    normalize_db_url,
    parse_host_port,
)

REPO = Path(__file__).resolve().parents[3]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "manager.toml"
    path.write_text(text)
    return path


def test_defaults_are_an_embedded_sqlite_manager() -> None:
    config = load_manager_config(None)
    assert config.db_url.render_as_string() == "sqlite+aiosqlite:///.accelshare/manager.db"
    assert config.credentials_file == Path(".accelshare/admin-credentials.env")
    assert config.cookie_secret_file == Path(".accelshare/cookie-secret")
    assert config.api.max_clock_skew == 900
    assert config.api.graphql.model_dump() == {
        "max_depth": 20,
        "max_aliases": 30,
        "max_fields": 1000,
        "max_tokens": 5000,
    }
    assert config.api.login.model_dump() == {
        "window": 300.0,
        "max_failures_per_address": 30,
        "max_failures_per_account_address": 5,
        "max_failures_per_account": 50,
    }
    assert config.api.connections.model_dump() == {
        "max_event_streams_per_user": 32,
        "max_terminals_per_user": 16,
        "max_app_websockets_per_user": 64,
        "max_total": 2048,
        "retry_after": 5,
    }
    assert config.manager.service_host_port == ("127.0.0.1", 8081)
    assert config.bootstrap.admin_email == "admin@accelshare.local"


def test_the_sample_file_loads_with_the_defaults() -> None:
    sample = load_manager_config(REPO / "configs" / "manager.toml")
    assert sample.model_dump(exclude={"source"}) == ManagerConfig().model_dump(exclude={"source"})
    assert sample.source == REPO / "configs" / "manager.toml"


def test_data_dir_moves_every_derived_path(tmp_path: Path) -> None:
    config = load_manager_config(write(tmp_path, f'[manager]\ndata-dir = "{tmp_path}/state"\n'))
    assert config.db_url.database == f"{tmp_path}/state/manager.db"
    assert config.credentials_file == tmp_path / "state" / "admin-credentials.env"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            '[db]\nurl = "postgresql://u:p@db:5433/acc"\n',
            "postgresql+asyncpg://u:***@db:5433/acc",
            id="url-postgresql",
        ),
        pytest.param(
            '[db]\nurl = "postgres://db/acc"\n', "postgresql+asyncpg://db/acc", id="url-postgres"
        ),
        pytest.param(
            '[db]\nurl = "sqlite:////var/lib/acc.db"\n',
            "sqlite+aiosqlite:////var/lib/acc.db",
            id="url-sqlite",
        ),
        pytest.param(
            '[db]\ntype = "postgresql"\naddr = "10.0.0.1:6543"\nname = "backend"\n'
            'user = "postgres"\npassword = "p@ss"\n',
            "postgresql+asyncpg://postgres:***@10.0.0.1:6543/backend",
            id="backendai-form",
        ),
        pytest.param(
            '[db]\ntype = "postgresql"\naddr = { host = "h", port = 5 }\n',
            "postgresql+asyncpg://h:5/accelshare",
            id="backendai-addr-table",
        ),
    ],
)
def test_database_urls(tmp_path: Path, text: str, expected: str) -> None:
    assert load_manager_config(write(tmp_path, text)).db_url.render_as_string() == expected


def test_password_is_escaped_in_built_urls(tmp_path: Path) -> None:
    text = '[db]\ntype = "postgresql"\nuser = "u"\npassword = "p@ss/:w"\n'
    url = load_manager_config(write(tmp_path, text)).db_url
    assert url.password == "p@ss/:w"


def test_other_components_sections_are_left_alone(tmp_path: Path) -> None:
    config = load_manager_config(write(tmp_path, '[etcd]\naddr = "x"\n[logging]\nlevel = 1\n'))
    assert config.db.url is None


@pytest.mark.parametrize(
    ("text", "key", "fragment"),
    [
        pytest.param('[db]\nurl = "mysql://x/y"\n', "db.url", "unsupported database", id="mysql"),
        pytest.param('[db]\nurll = "x"\n', "db.urll", "unknown", id="typo"),
        pytest.param(
            "[api]\nmax-clock-skew = -1\n", "api.max-clock-skew", "greater than 0", id="skew"
        ),
        pytest.param(
            '[manager]\nservice-addr = "nope"\n', "manager.service-addr", "host:port", id="addr"
        ),
        pytest.param(
            '[bootstrap]\nadmin-email = "admin"\n', "bootstrap.admin-email", "email", id="email"
        ),
        pytest.param('[db]\npool-size = "big"\n', "db.pool-size", "integer", id="type"),
        pytest.param(
            "[api.graphql]\nmax-depth = 0\n",
            "api.graphql.max-depth",
            "greater than or equal to 1",
            id="graphql-depth",
        ),
        pytest.param(
            "[api.graphql]\nmax-alias = 3\n", "api.graphql.max-alias", "unknown", id="graphql-typo"
        ),
        pytest.param(
            "[api.login]\nwindow = 0\n", "api.login.window", "greater than 0", id="login-window"
        ),
        pytest.param(
            "[api.login]\nmax-failures-per-account = 0\n",
            "api.login.max-failures-per-account",
            "greater than or equal to 1",
            id="login-account",
        ),
        pytest.param(
            "[api.connections]\nmax-terminals-per-user = 0\n",
            "api.connections.max-terminals-per-user",
            "greater than or equal to 1",
            id="connections-terminals",
        ),
        pytest.param(
            "[api.connections]\nmax-streams = 3\n",
            "api.connections.max-streams",
            "unknown",
            id="connections-typo",
        ),
        pytest.param("[db\n", "<syntax>", "TOML", id="syntax"),
    ],
)
def test_errors_name_file_key_and_value(tmp_path: Path, text: str, key: str, fragment: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ManagerConfigError) as info:
        load_manager_config(path)
    assert info.value.field == key
    assert str(path) in str(info.value)
    assert key in str(info.value)
    assert fragment in str(info.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ManagerConfigError, match="an existing file"):
        load_manager_config(tmp_path / "absent.toml")


@pytest.mark.parametrize(
    ("value", "expected"),
    [("127.0.0.1:8081", ("127.0.0.1", 8081)), ("[::1]:80", ("::1", 80)), ("h:1", ("h", 1))],
)
def test_parse_host_port(value: str, expected: tuple[str, int]) -> None:
    assert parse_host_port(value) == expected


@pytest.mark.parametrize("value", ["h", "h:0", "h:99999", ":80", "h:x"])
def test_parse_host_port_refuses(value: str) -> None:
    with pytest.raises(ValueError, match="host:port"):
        parse_host_port(value)


def test_normalize_refuses_other_databases() -> None:
    with pytest.raises(ValueError, match="unsupported database 'mysql'"):
        normalize_db_url("mysql+pymysql://x/y")
    with pytest.raises(ValueError, match="not a database URL"):
        normalize_db_url("::::")
