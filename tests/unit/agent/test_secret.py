"""Where the cluster secret comes from, and when the agent may run without one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from accelshare.agent.secret import (
    ENV_CLUSTER_SECRET,
    SecretError,
    is_loopback,
    resolve_cluster_secret,
)
from accelshare.config.agent_file import parse_agent_config

SECRET = "s3cret-s3cret-s3cret"


def config(tmp_path: Path, **agent: Any) -> Any:
    return parse_agent_config({"agent": agent}, source_path=tmp_path / "agent.toml")


def test_from_the_file_key(tmp_path: Path) -> None:
    assert resolve_cluster_secret(config(tmp_path, **{"cluster-secret": SECRET}), env={}) == SECRET


def test_from_a_secret_file_relative_to_agent_toml(tmp_path: Path) -> None:
    (tmp_path / "secret").write_text(SECRET + "\n")
    cfg = config(tmp_path, **{"cluster-secret-file": "secret"})
    assert resolve_cluster_secret(cfg, env={}) == SECRET


def test_environment_wins(tmp_path: Path) -> None:
    cfg = config(tmp_path, **{"cluster-secret": SECRET})
    assert resolve_cluster_secret(cfg, env={ENV_CLUSTER_SECRET: "x" * 20}) == "x" * 20


@pytest.mark.parametrize(
    ("agent", "env", "message"),
    [
        pytest.param({}, {}, "expected a cluster secret", id="none"),
        pytest.param({"cluster-secret": "hunter2"}, {}, "at least 16", id="too-short"),
        pytest.param(
            {"cluster-secret": SECRET, "cluster-secret-file": "x"}, {}, "only one", id="both"
        ),
        pytest.param({"cluster-secret-file": "missing"}, {}, "a readable file", id="no-file"),
        pytest.param(
            {"dev-mode": True, "rpc-listen-addr": "0.0.0.0:6001"},
            {},
            "a loopback address",
            id="dev-not-loopback",
        ),
    ],
)
def test_refused(tmp_path: Path, agent: dict[str, Any], env: dict[str, str], message: str) -> None:
    with pytest.raises(SecretError, match=message) as info:
        resolve_cluster_secret(config(tmp_path, **agent), env=env)
    assert "hunter2" not in str(info.value)  # a secret is never echoed


def test_dev_mode_on_loopback_runs_without_a_secret(tmp_path: Path) -> None:
    assert resolve_cluster_secret(config(tmp_path, **{"dev-mode": True}), env={}) is None
    assert resolve_cluster_secret(config(tmp_path), dev=True, env={}) is None


@pytest.mark.parametrize(
    ("addr", "expected"),
    [
        ("127.0.0.1:6001", True),
        ("127.0.0.2:6001", True),
        ("[::1]:6001", True),
        ("localhost:6001", True),
        ("0.0.0.0:6001", False),
        ("10.0.0.5:6001", False),
        ("node01:6001", False),
    ],
)
def test_is_loopback(addr: str, expected: bool) -> None:
    assert is_loopback(addr) is expected
