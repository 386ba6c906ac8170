"""The deployment kit stays true: the production TOML files load with the daemons' own
loaders (a misspelt or moved key fails here), the systemd units run commands that exist
with the options they pass, and the halfstack compose file publishes the ports its
header tells operators to put in their configuration."""

from __future__ import annotations

import configparser
import re
import shlex
from pathlib import Path

import yaml
from typer.testing import CliRunner

from accelshare.bus import load_bus_settings
from accelshare.client.cli import app
from accelshare.config.agent_file import load_agent_config
from accelshare.config.settings import load_config_store_settings
from accelshare.manager.config import load_manager_config

REPO = Path(__file__).resolve().parents[2]
PRODUCTION = REPO / "configs" / "production"
DEPLOY = REPO / "deploy"


def test_the_production_manager_toml_loads() -> None:
    path = PRODUCTION / "manager.toml"
    config = load_manager_config(path)
    assert config.db_url.get_backend_name() == "postgresql"
    assert config.api.session_cookie_secure is True
    assert config.api.session_cookie_secret_file is not None  # shared by the replicas
    assert config.manager.cluster_secret is None  # secrets stay out of the file
    store = load_config_store_settings(path, env={})
    assert (store.backend, store.etcd.addr) == ("etcd", "etcd.internal:2379")
    bus = load_bus_settings(path, env={})
    assert bus.redis is not None
    assert bus.redis.addr == "redis.internal:6379"
    assert "password" not in path.read_text().split("[redis]", 1)[1].split("#", 1)[0]


def test_the_production_agent_toml_loads() -> None:
    path = PRODUCTION / "agent.toml"
    config = load_agent_config(path)
    assert config.unknown_keys == ()  # every key is one the agent knows
    assert config.container.runtime == "docker"
    assert config.agent.allowed_compute_plugins == ("cuda",)
    assert config.manager.endpoints == ("http://manager.internal:8081",)
    assert config.agent.cluster_secret is None
    assert load_config_store_settings(path, env={}).backend == "etcd"
    bus = load_bus_settings(path, env={}).redis
    assert bus is not None
    assert bus.namespace == "prod"


def _unit(name: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read(DEPLOY / "systemd" / name)
    return parser


def _check_command(line: str) -> None:
    words = shlex.split(line)
    assert words[0] == "/opt/accelshare/venv/bin/accelshare"
    # the subcommand and options exist: --help of exactly this command line succeeds
    result = CliRunner().invoke(app, [*words[1:], "--help"])
    assert result.exit_code == 0, (line, result.output)
    for option in (w for w in words[1:] if w.startswith("--")):
        assert option in result.output, (line, option)


def test_the_systemd_units_run_real_commands() -> None:
    manager = _unit("accelshare-manager.service")
    _check_command(manager["Service"]["ExecStart"])
    _check_command(manager["Service"]["ExecStartPre"])
    assert manager["Service"]["UMask"] == "0077"
    agent = _unit("accelshare-agent.service")
    _check_command(agent["Service"]["ExecStart"])
    # stopping the agent must not kill the sessions' processes (restart recovery)
    assert agent["Service"]["KillMode"] == "process"
    for unit in (manager, agent):
        assert unit["Service"]["EnvironmentFile"] == "/etc/accelshare/cluster-secret.env"


def test_the_halfstack_publishes_the_ports_its_header_promises() -> None:
    path = DEPLOY / "halfstack" / "docker-compose.yml"
    text = path.read_text()
    compose = yaml.safe_load(text)
    published = {
        name: {int(p.split(":")[1]) for p in service.get("ports", [])}
        for name, service in compose["services"].items()
    }
    header = "\n".join(line for line in text.splitlines() if line.startswith("#"))
    promised = {
        "postgres": int(re.search(r"@127\.0\.0\.1:(\d+)/accelshare", header).group(1)),  # type: ignore[union-attr]
        "etcd": int(re.search(r'\[etcd\] addr = "127\.0\.0\.1:(\d+)"', header).group(1)),  # type: ignore[union-attr]
        "redis": int(re.search(r'\[redis\] addr = "127\.0\.0\.1:(\d+)"', header).group(1)),  # type: ignore[union-attr]
    }
    for name, port in promised.items():
        assert port in published[name], (name, port, published[name])
    for service in compose["services"].values():
        assert "healthcheck" in service
        assert all(p.startswith("127.0.0.1:") for p in service.get("ports", []))
