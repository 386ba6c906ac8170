"""agent.toml: discovery order, schema, errors naming file/key/expected/received."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from accelshare.config.agent_file import (
    AgentConfig,
    AgentConfigError,
    agent_config_candidates,
    find_agent_config,
    load_agent_config,
    parse_agent_config,
)

from .builders import REPO

GIB = 2**30


def test_defaults() -> None:
    config = AgentConfig()
    assert config.agent.id.startswith("i-")
    assert (config.agent.region, config.agent.scaling_group) == ("local", "default")
    assert config.agent.rpc_listen_addr == "127.0.0.1:6001"
    assert config.agent.allowed_compute_plugins is None
    assert config.agent.blocked_compute_plugins == ()
    assert config.agent.allocation_order == ("cuda", "rocm", "tpu", "cpu", "mem")
    assert config.agent.affinity_policy == "INTERLEAVED"
    assert (config.container.runtime, config.container.scratch_root) == ("process", Path("scratch"))
    assert (config.resource.reserved_cpu, config.resource.reserved_mem) == (1, GIB)
    assert config.resource.cpu_count is None
    assert config.resource.memory_size is None
    assert config.manager.endpoint == "http://127.0.0.1:8081"
    assert config.etcd is None
    assert config.source_path is None


def test_sample_agent_toml() -> None:
    config = load_agent_config(REPO / "configs" / "agent.toml")
    assert config.agent.id == "i-node01"
    assert config.agent.allowed_compute_plugins == ("mock",)
    assert config.source_path == (REPO / "configs" / "agent.toml").resolve()
    assert (
        config.mock_accelerator_path() == REPO / "configs" / "accelerator" / "mock-accelerator.toml"
    )
    assert config.unknown_keys == ()


def test_full_file() -> None:
    config = parse_agent_config(
        {
            "agent": {
                "id": "i-x",
                "allow-compute-plugins": ["ai.backend.accelerator.mock"],
                "blocked-compute-plugins": ["cuda"],
                "affinity-policy": "prefer_single_node",
                "allocation-order": ["rocm", "cpu", "mem"],
            },
            "container": {"runtime": "docker", "scratch-root": "/var/scratch"},
            "resource": {
                "reserved-cpu": 0,
                "reserved-mem": "512m",
                "cpu-count": 16,
                "memory-size": "32g",
            },
            "manager": {"endpoint": "https://mgr:8081"},
            "etcd": {"addr": "10.0.0.1:2379", "namespace": "prod", "user": "agent"},
            "config-store": {"backend": "etcd"},
        }
    )
    assert config.agent.allowed_compute_plugins == ("ai.backend.accelerator.mock",)
    assert config.agent.blocked_compute_plugins == ("cuda",)
    assert config.agent.affinity_policy == "PREFER_SINGLE_NODE"
    assert config.container.scratch_root == Path("/var/scratch")
    assert config.resource.reserved_mem == 512 * 2**20
    assert (config.resource.cpu_count, config.resource.memory_size) == (16, 32 * GIB)
    assert config.etcd is not None
    assert config.etcd.namespace == "prod"
    assert config.unknown_keys == ()


def test_unknown_keys_are_listed_not_fatal() -> None:
    config = parse_agent_config(
        {"agent": {"allowed-compute-plugin": ["mock"]}, "logging": {"level": "INFO"}}
    )
    assert config.unknown_keys == ("agent.allowed-compute-plugin", "logging")
    assert config.agent.allowed_compute_plugins is None


def test_mock_accelerator_path(tmp_path: Path) -> None:
    (tmp_path / "agent.toml").write_text('[agent]\nid = "i-1"\n')
    config = load_agent_config(tmp_path / "agent.toml")
    assert config.mock_accelerator_path() == tmp_path.resolve() / "mock-accelerator.toml"
    (tmp_path / "agent.toml").write_text('[agent]\nmock-accelerator-config = "gpu/two.toml"\n')
    config = load_agent_config(tmp_path / "agent.toml")
    assert config.mock_accelerator_path() == tmp_path.resolve() / "gpu" / "two.toml"
    (tmp_path / "agent.toml").write_text('[agent]\nmock-accelerator-config = "/abs/m.toml"\n')
    assert load_agent_config(tmp_path / "agent.toml").mock_accelerator_path() == Path("/abs/m.toml")


def test_discovery_order(tmp_path: Path) -> None:
    cwd, home = tmp_path / "cwd", tmp_path / "home"
    cwd.mkdir()
    assert agent_config_candidates(cwd=cwd, home=home) == [
        cwd / "agent.toml",
        home / ".config/accelshare/agent.toml",
        Path("/etc/accelshare/agent.toml"),
    ]
    user = home / ".config/accelshare/agent.toml"
    user.parent.mkdir(parents=True)
    user.write_text('[agent]\nid = "i-home"\n')
    if not Path("/etc/accelshare/agent.toml").exists():
        assert find_agent_config(cwd=cwd, home=tmp_path / "nobody") is None
        assert load_agent_config(cwd=cwd, home=tmp_path / "nobody").source_path is None
    assert load_agent_config(cwd=cwd, home=home).agent.id == "i-home"
    (cwd / "agent.toml").write_text('[agent]\nid = "i-cwd"\n')
    assert load_agent_config(cwd=cwd, home=home).agent.id == "i-cwd"
    explicit = tmp_path / "explicit.toml"
    explicit.write_text('[agent]\nid = "i-explicit"\n')
    assert load_agent_config(explicit, cwd=cwd, home=home).agent.id == "i-explicit"


def test_explicit_missing_file(tmp_path: Path) -> None:
    with pytest.raises(AgentConfigError, match=r"expected an existing agent\.toml file"):
        load_agent_config(tmp_path / "nope.toml")


def test_bad_toml_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "agent.toml"
    path.write_text("[agent\n")
    with pytest.raises(AgentConfigError) as info:
        load_agent_config(path)
    assert info.value.source == str(path)
    assert "valid TOML" in str(info.value)


@pytest.mark.parametrize(
    ("data", "key", "received"),
    [
        ({"resource": {"reserved-cpu": -1}}, "resource.reserved-cpu", "-1"),
        ({"resource": {"reserved-cpu": True}}, "resource.reserved-cpu", "True"),
        ({"resource": {"reserved-cpu": "1"}}, "resource.reserved-cpu", "'1'"),
        ({"resource": {"reserved-mem": "-1g"}}, "resource.reserved-mem", "'-1g'"),
        ({"resource": {"reserved-mem": "lots"}}, "resource.reserved-mem", "'lots'"),
        ({"resource": {"cpu-count": 0}}, "resource.cpu-count", "0"),
        ({"resource": {"memory-size": 0}}, "resource.memory-size", "0"),
        ({"agent": {"rpc-listen-addr": "6001"}}, "agent.rpc-listen-addr", "'6001'"),
        ({"agent": {"rpc-listen-addr": "h:99999"}}, "agent.rpc-listen-addr", "'h:99999'"),
        ({"agent": {"affinity-policy": "random"}}, "agent.affinity-policy", "'random'"),
        ({"agent": {"allowed-compute-plugins": "mock"}}, "agent.allowed-compute-plugins", "'mock'"),
        ({"agent": {"allocation-order": ["cuda", 1]}}, "agent.allocation-order[1]", "1"),
        ({"agent": {"id": ""}}, "agent.id", "''"),
        ({"agent": 5}, "agent", "5"),
        ({"container": {"runtime": "k8s"}}, "container.runtime", "'k8s'"),
        ({"manager": {"endpoint": "mgr:8081"}}, "manager.endpoint", "'mgr:8081'"),
        ({"etcd": {"addr": "x"}}, "etcd.addr", "'x'"),
    ],
)
def test_bad_values(data: dict[str, Any], key: str, received: str) -> None:
    with pytest.raises(AgentConfigError) as info:
        parse_agent_config(data, source="/etc/accelshare/agent.toml")
    err = info.value
    assert (err.source, err.key) == ("/etc/accelshare/agent.toml", key)
    assert str(err).startswith(f"/etc/accelshare/agent.toml: key {key!r}: expected ")
    assert str(err).endswith(f"received {received}")


def test_both_spellings_of_the_allow_list_is_an_error() -> None:
    with pytest.raises(AgentConfigError, match="only one of"):
        parse_agent_config(
            {"agent": {"allowed-compute-plugins": ["mock"], "allow-compute-plugins": ["cuda"]}}
        )
