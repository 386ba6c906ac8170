"""agent.toml errors in the user's terms: every key names what it takes (as TOML, never a
Python type) and echoes the value exactly as the file holds it; the docker-network key."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import AliasChoices, BaseModel

from accelshare.config.agent_file import (
    EXPECTED,
    AgentConfig,
    AgentConfigError,
    parse_agent_config,
)

SOURCE = "/etc/accelshare/agent.toml"
# Words of pydantic's own messages, which name Python types instead of TOML values.
PYTHON_WORDS = ("valid tuple", "valid string", "valid boolean", "valid integer", "valid number",
                "instance of", "dictionary", "Input should")  # fmt: skip


def schema_keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every key agent.toml accepts, dotted (``container.docker-network``)."""
    keys: list[str] = []
    for name, info in model.model_fields.items():
        if info.exclude:
            continue
        spellings = {info.alias or name}
        if isinstance(info.validation_alias, AliasChoices):
            spellings.update(str(choice) for choice in info.validation_alias.choices)
        for spelled in sorted(spellings):
            keys.append(prefix + spelled)
            sub = next(
                (
                    t
                    for t in (info.annotation, *getattr(info.annotation, "__args__", ()))
                    if isinstance(t, type) and issubclass(t, BaseModel)
                ),
                None,
            )
            if sub is not None:
                keys.extend(schema_keys(sub, f"{prefix}{spelled}."))
    return keys


def error_of(data: dict[str, Any]) -> AgentConfigError:
    with pytest.raises(AgentConfigError) as info:
        parse_agent_config(data, source=SOURCE)
    return info.value


def nest(key: str, value: Any) -> dict[str, Any]:
    """``nest("agent.id", 5)`` -> ``{"agent": {"id": 5}}``."""
    data: Any = value
    for part in reversed(key.split(".")):
        data = {part: data}
    return dict(data)


def test_every_key_has_a_description_in_toml_terms() -> None:
    keys = schema_keys(AgentConfig)
    assert "container.docker-network" in keys
    assert sorted(set(keys) - set(EXPECTED)) == []
    assert sorted(set(EXPECTED) - set(keys)) == []  # no stale entries either
    for key, text in EXPECTED.items():
        assert not any(word in text for word in PYTHON_WORDS), (key, text)


@pytest.mark.parametrize(
    "key", [k for k in EXPECTED if "." in k and k != "agent.allow-compute-plugins"]
)
def test_a_wrong_type_names_the_key_what_it_takes_and_the_value(key: str) -> None:
    # A TOML table where a scalar or a list belongs (a list where a table belongs).
    wrong: Any = [1] if key == "container.environments" else {"nested": 1}
    err = error_of(nest(key, wrong))
    assert (err.source, err.key) == (SOURCE, key)
    assert err.expected == EXPECTED[key]
    shown = "'(hidden)'" if key == "agent.cluster-secret" else repr(wrong)
    assert str(err) == f"{SOURCE}: key {key!r}: expected {EXPECTED[key]}, received {shown}"


@pytest.mark.parametrize(
    ("data", "key", "expected", "received"),
    [
        # The audit's two cases: a Python type named, a transformed value echoed.
        (
            {"agent": {"allocation-order": "cuda"}},
            "agent.allocation-order",
            'a list of plugin keys such as ["cuda", "cpu", "mem"]',
            "'cuda'",
        ),
        (
            {"agent": {"affinity-policy": "random"}},
            "agent.affinity-policy",
            '"INTERLEAVED" or "PREFER_SINGLE_NODE" (in any case)',
            "'random'",
        ),
        (
            {"agent": {"allocation-order": ["cuda", 1]}},
            "agent.allocation-order[1]",
            'a plugin key (a string) such as "cuda"',
            "1",
        ),
        (
            {"agent": {"allowed-compute-plugins": "mock"}},
            "agent.allowed-compute-plugins",
            'a list of plugin names such as ["mock"] or ["cuda"]',
            "'mock'",
        ),
        (
            {"agent": {"blocked-compute-plugins": ["cuda", None]}},
            "agent.blocked-compute-plugins[1]",
            'a plugin name (a string) such as "cuda"',
            "None",
        ),
        ({"agent": {"dev-mode": "yes"}}, "agent.dev-mode", "true or false", "'yes'"),
        (
            {"agent": {"heartbeat-interval-s": 0}},
            "agent.heartbeat-interval-s",
            "a number of seconds > 0 and <= 3600, such as 3.0",
            "0",
        ),
        (
            {"agent": {"mock-accelerator-config": 5}},
            "agent.mock-accelerator-config",
            'a file path such as "mock-accelerator.toml"',
            "5",
        ),
        (
            {"container": {"runtime": "Docker"}},
            "container.runtime",
            '"process" or "docker"',
            "'Docker'",
        ),
        (
            {"container": {"prespawn-launchers": 1.5}},
            "container.prespawn-launchers",
            "an integer from 0 to 16",
            "1.5",
        ),
        (
            {"container": {"rlimit-memory": "rss"}},
            "container.rlimit-memory",
            '"data" or "as"',
            "'rss'",
        ),
        (
            {"resource": {"reserved-mem": "-1g"}},
            "resource.reserved-mem",
            'a byte size such as "1g" or 1073741824',
            "'-1g'",
        ),
        (
            {"etcd": {"addr": "etcd"}},
            "etcd.addr",
            '"HOST:PORT" with a port in 1..65535, such as "127.0.0.1:2379"',
            "'etcd'",
        ),
        (
            {"agent": {"rpc-max-body-bytes": 100}},
            "agent.rpc-max-body-bytes",
            'a byte size of at least 1024 such as "4m" or 4194304',
            "100",
        ),
        (
            {"agent": {"rpc-max-body-bytes": "lots"}},
            "agent.rpc-max-body-bytes",
            'a byte size of at least 1024 such as "4m" or 4194304',
            "'lots'",
        ),
        (
            {"agent": {"cluster-secret": 12345678901234567}},
            "agent.cluster-secret",
            "a string of at least 16 characters",
            "'(hidden)'",
        ),
    ],
)
def test_bad_values_in_user_terms(
    data: dict[str, Any], key: str, expected: str, received: str
) -> None:
    err = error_of(data)
    assert str(err) == f"{SOURCE}: key {key!r}: expected {expected}, received {received}"


def test_rpc_body_limit_defaults_to_4_mib_and_takes_sizes() -> None:
    assert parse_agent_config({}, source=SOURCE).agent.rpc_max_body_bytes == 4 * 1024 * 1024
    config = parse_agent_config({"agent": {"rpc-max-body-bytes": "64k"}}, source=SOURCE)
    assert config.agent.rpc_max_body_bytes == 64 * 1024


def test_a_section_level_check_keeps_its_own_message() -> None:
    err = error_of({"agent": {"allowed-compute-plugins": ["a"], "allow-compute-plugins": ["b"]}})
    assert err.key == "agent"
    assert err.expected.startswith("only one of 'allowed-compute-plugins' and")


def test_a_section_that_is_not_a_table() -> None:
    err = error_of({"container": "docker"})
    assert (
        str(err) == f"{SOURCE}: key 'container': expected a table ([container]), received 'docker'"
    )


@pytest.mark.parametrize(
    "network", ["bridge", "host", "none", "default", "my-net_1.x", "container:other-box"]
)
def test_docker_network_accepts_modes_and_names(network: str) -> None:
    config = parse_agent_config({"container": {"docker-network": network}})
    assert config.container.docker_network == network
    assert config.unknown_keys == ()


def test_docker_network_defaults_to_bridge() -> None:
    assert parse_agent_config({}).container.docker_network == "bridge"


@pytest.mark.parametrize("network", ["", "container:", "-net", "my net", "a/b", 5])
def test_docker_network_refuses_what_the_engine_would(network: Any) -> None:
    err = error_of({"container": {"docker-network": network}})
    assert err.key == "container.docker-network"
    assert err.expected == EXPECTED["container.docker-network"]
    assert err.received == network


def test_kernel_user_defaults_to_the_work_user_and_takes_other_ids() -> None:
    default = parse_agent_config({}).container
    assert (default.kernel_uid, default.kernel_gid) == (1000, 1000)
    custom = parse_agent_config({"container": {"kernel-uid": 2001, "kernel-gid": 3002}})
    assert (custom.container.kernel_uid, custom.container.kernel_gid) == (2001, 3002)
    assert custom.unknown_keys == ()


@pytest.mark.parametrize(
    ("key", "value"),
    [("kernel-uid", 0), ("kernel-gid", 0), ("kernel-uid", -5), ("kernel-uid", "1000")],
)
def test_kernel_user_refuses_root_and_non_ids(key: str, value: Any) -> None:
    err = error_of({"container": {key: value}})
    assert str(err) == (
        f"{SOURCE}: key 'container.{key}': expected {EXPECTED[f'container.{key}']},"
        f" received {value!r}"
    )
    assert "not root" in err.expected
