from pathlib import Path

import pytest

from accelshare.client.config import DEFAULT_ENDPOINT, ClientConfigError, load_client_config


def test_env_names_and_backend_aliases() -> None:
    cfg = load_client_config(
        env={
            "BACKEND_ENDPOINT": "http://h:1/",
            "BACKEND_ACCESS_KEY": "AK",
            "ACCELSHARE_SECRET_KEY": "SK",
        }
    )
    assert (cfg.endpoint, cfg.access_key, cfg.secret_key) == ("http://h:1", "AK", "SK")
    assert "SK" not in repr(cfg)


def test_accelshare_names_win_over_backend_names() -> None:
    env = {
        "ACCELSHARE_ACCESS_KEY": "A1",
        "BACKEND_ACCESS_KEY": "B1",
        "ACCELSHARE_SECRET_KEY": "S",
    }
    cfg = load_client_config(env=env)
    assert cfg.access_key == "A1"
    assert cfg.endpoint == DEFAULT_ENDPOINT


def test_explicit_arguments_win() -> None:
    cfg = load_client_config(access_key="X", secret_key="Y", env={"ACCELSHARE_ACCESS_KEY": "A"})
    assert cfg.access_key == "X"


def test_env_file(tmp_path: Path) -> None:
    f = tmp_path / "client.env"
    f.write_text(
        "# written by accelshare dev up\nexport ACCELSHARE_ENDPOINT=http://127.0.0.1:9\n"
        "ACCELSHARE_ACCESS_KEY='AK'\nACCELSHARE_SECRET_KEY=\"SK\"\n\n"
    )
    cfg = load_client_config(env={"ACCELSHARE_CLIENT_CONFIG": str(f)})
    assert (cfg.endpoint, cfg.access_key, cfg.secret_key) == ("http://127.0.0.1:9", "AK", "SK")


def test_toml_file(tmp_path: Path) -> None:
    f = tmp_path / "client.toml"
    f.write_text('endpoint = "http://e:2"\naccess-key = "AK"\nsecret_key = "SK"\n')
    cfg = load_client_config(env={}, config_file=f)
    assert (cfg.endpoint, cfg.access_key) == ("http://e:2", "AK")


@pytest.mark.parametrize(
    ("name", "content", "match"),
    [
        ("c.toml", "endpoint = [", "not valid TOML"),
        ("c.toml", "access_key = 3", "key 'access_key': expected a string, received 3"),
        ("c.env", "NOEQUALS", "expected KEY=VALUE"),
    ],
)
def test_bad_files(tmp_path: Path, name: str, content: str, match: str) -> None:
    f = tmp_path / name
    f.write_text(content)
    with pytest.raises(ClientConfigError, match=match):
        load_client_config(env={}, config_file=f)


def test_missing_file_and_missing_keys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(ClientConfigError, match="does not exist"):
        load_client_config(env={}, config_file=tmp_path / "nope.toml")
    with pytest.raises(ClientConfigError, match=r"source \.accelshare/client\.env"):
        load_client_config(env={}, config_file=None)
