"""agent.toml keys added for the daemon: defaults, validation, unknown-key detection."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from accelshare.agent import service_runtime
from accelshare.agent.service import resolve_scratch_root
from accelshare.agent.stats import rpc_url_of
from accelshare.config.agent_file import AgentConfigError, parse_agent_config


def test_defaults() -> None:
    config = parse_agent_config({})
    assert config.agent.cluster_secret is None
    assert config.agent.cluster_secret_file is None
    assert config.agent.dev_mode is False
    assert config.agent.heartbeat_interval_s == 3.0
    assert config.container.keep_scratch is False
    assert config.container.stop_grace_s == 5.0
    assert config.container.use_cgroups is True
    assert config.container.cgroup_parent == "accelshare"
    assert config.container.prespawn_launchers == 2
    assert config.container.launcher_fork_server is True
    assert config.container.start_in_background is False
    assert config.container.environments == {}
    assert rpc_url_of(config) == "http://127.0.0.1:6001"


def test_all_new_keys_parse_and_none_is_unknown(tmp_path: Path) -> None:
    data: dict[str, Any] = {
        "agent": {
            "cluster-secret-file": "secret",
            "dev-mode": True,
            "heartbeat-interval-s": 1,
            "rpc-advertise-url": "http://10.0.0.5:6001/",
        },
        "container": {
            "keep-scratch": True,
            "stop-grace-s": 0.5,
            "use-cgroups": False,
            "cgroup-parent": "/accelshare",
            "sandbox": "required",
            "sandbox-network": "outbound",
            "sandbox-ro-paths": ["/data/datasets"],
            "sandbox-syscall-filter": False,
            "rlimit-memory": "as",
            "docker-url": "unix:///run/docker.sock",
            "docker-network": "none",
            "prespawn-launchers": 0,
            "launcher-fork-server": False,
            "scratch-root": "kernels",
            "environments": {"torch": {"command-prefix": ["/opt/torch/bin/python"]}},
        },
    }
    config = parse_agent_config(data, source_path=tmp_path / "agent.toml")
    assert config.unknown_keys == ()
    assert config.agent.heartbeat_interval_s == 1.0
    assert config.container.docker_network == "none"
    assert config.container.launcher_fork_server is False
    assert config.container.sandbox == "required"
    assert config.container.sandbox_network == "outbound"
    assert config.container.sandbox_ro_paths == [Path("/data/datasets")]
    assert config.container.sandbox_syscall_filter is False
    assert rpc_url_of(config) == "http://10.0.0.5:6001"
    assert resolve_scratch_root(config) == tmp_path / "kernels"
    environments = service_runtime.environments(config)
    assert set(environments) == {"python", "shell", "torch"}
    assert environments["torch"].argv(("-c", "1")) == ("/opt/torch/bin/python", "-c", "1")


@pytest.mark.parametrize(
    ("data", "key"),
    [
        ({"agent": {"heartbeat-interval-s": 0}}, "agent.heartbeat-interval-s"),
        ({"agent": {"rpc-advertise-url": "10.0.0.5:6001"}}, "agent.rpc-advertise-url"),
        ({"container": {"cgroup-parent": "../x"}}, "container.cgroup-parent"),
        ({"container": {"stop-grace-s": -1}}, "container.stop-grace-s"),
        ({"container": {"prespawn-launchers": 99}}, "container.prespawn-launchers"),
        ({"container": {"launcher-fork-server": "yes"}}, "container.launcher-fork-server"),
        ({"container": {"sandbox": "on"}}, "container.sandbox"),
        ({"container": {"sandbox-network": "host"}}, "container.sandbox-network"),
        ({"container": {"sandbox-syscall-filter": "yes"}}, "container.sandbox-syscall-filter"),
        ({"container": {"sandbox-ro-paths": ["data"]}}, "container.sandbox-ro-paths"),
        ({"container": {"sandbox-ro-paths": "/data"}}, "container.sandbox-ro-paths"),
        ({"container": {"environments": {"x": "not a table"}}}, "container.environments.x"),
    ],
)
def test_bad_values_name_the_key(data: dict[str, Any], key: str) -> None:
    with pytest.raises(AgentConfigError) as info:
        parse_agent_config(data)
    assert info.value.key == key


def test_a_bad_environment_names_it(tmp_path: Path) -> None:
    config = parse_agent_config(
        {"container": {"environments": {"torch": {"command-prefix": []}}}},
        source_path=tmp_path / "agent.toml",
    )
    with pytest.raises(AgentConfigError) as info:
        service_runtime.environments(config)
    assert str(info.value) == (
        f"{tmp_path / 'agent.toml'}: key 'container.environments.torch.command-prefix': "
        'expected a non-empty list of strings such as ["/opt/venvs/torch/bin/python"], '
        "received []"
    )


def test_wildcard_listen_address_advertises_the_host_name() -> None:
    config = parse_agent_config({"agent": {"rpc-listen-addr": "0.0.0.0:6001"}})
    assert rpc_url_of(config).endswith(":6001")
    assert "0.0.0.0" not in rpc_url_of(config)
