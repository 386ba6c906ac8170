"""The agent's host-port pool for app services (``[container] port-range``)."""

from __future__ import annotations

import socket

import pytest
from hypothesis import given
from hypothesis import strategies as st

from accelshare.agent.ports import (
    HostPortPool,
    PortRangeExhausted,
    declared_services,
    mappings_from_json,
    port_is_free,
    proxy_address,
)


def always_free(port: int) -> bool:
    return True


def test_declared_services_by_name_bad_ones_skipped() -> None:
    environ = {
        "BACKENDAI_SERVICE_PORT_WEB": "8080",
        "BACKENDAI_SERVICE_PORT_JUPYTER": "8888",
        "BACKENDAI_SERVICE_PORT_BAD!": "1",
        "BACKENDAI_SERVICE_PORT_NAN": "x",
        "BACKENDAI_SERVICE_PORT_BIG": "70000",
        "PATH": "/bin",
    }
    assert declared_services(environ) == [("jupyter", 8888), ("web", 8080)]


def test_same_declared_port_gets_distinct_host_ports_round_robin() -> None:
    pool = HostPortPool((30000, 30002), is_free=always_free)
    a = pool.allocate("k1", [("jupyter", 8888)])
    b = pool.allocate("k2", [("jupyter", 8888)])
    assert [m.host_port for m in a + b] == [30000, 30001]
    assert all(m.container_port == 8888 for m in a + b)
    assert pool.release("k1") == [30000]
    # The port just freed is the last one reused.
    assert [m.host_port for m in pool.allocate("k3", [("web", 80)])] == [30002]
    assert [m.host_port for m in pool.allocate("k4", [("web", 80)])] == [30000]


def test_exhausted_names_the_range_and_takes_nothing() -> None:
    pool = HostPortPool((30000, 30001), is_free=always_free)
    pool.allocate("k1", [("web", 80)])
    with pytest.raises(PortRangeExhausted, match=r"port range \[30000, 30001\]"):
        pool.allocate("k2", [("web", 80), ("lab", 81)])
    assert pool.ports_of("k2") == []
    assert pool.held == {30000: "k1"}


def test_ports_in_use_on_the_host_are_skipped() -> None:
    with socket.socket() as sock:
        sock.bind(("", 0))
        sock.listen()
        busy = int(sock.getsockname()[1])
        assert not port_is_free(busy)
        pool = HostPortPool((busy, min(busy + 50, 65535)))
        (mapping,) = pool.allocate("k1", [("web", 80)])
        assert mapping.host_port != busy


def test_reserve_after_restart_and_clashes() -> None:
    pool = HostPortPool((30000, 30009), is_free=always_free)
    assert pool.reserve("k1", [30003, 30004]) == []
    assert pool.reserve("k2", [30004]) == [30004]
    assert pool.ports_of("k1") == [30003, 30004]
    got = pool.allocate("k3", [(f"s{i}", 80) for i in range(8)])
    assert 30003 not in {m.host_port for m in got}
    assert 30004 not in {m.host_port for m in got}


def test_mappings_from_meta_skip_bad_entries() -> None:
    good = {"name": "web", "protocol": "http", "container_port": 8888, "host_port": 30001}
    found = mappings_from_json([good, {"name": "x"}, "junk", {**good, "host_port": 0}])
    assert [m.model_dump() for m in found] == [good]
    assert mappings_from_json(None) == []


def test_bad_range() -> None:
    with pytest.raises(ValueError, match="bad port range"):
        HostPortPool((31000, 30000))


@given(
    st.lists(
        st.tuples(st.sampled_from(["allocate", "release"]), st.integers(0, 5), st.integers(0, 4)),
        max_size=40,
    ),
    st.integers(1, 8),
)
def test_pool_invariants(steps: list[tuple[str, int, int]], size: int) -> None:
    """Whatever kernels come and go: every held port lies in the range and has one
    kernel, a kernel gets all its services or none, and the pool refuses only when full."""
    pool = HostPortPool((40000, 40000 + size - 1), is_free=always_free)
    held: dict[str, list[int]] = {}
    for action, kernel, services in steps:
        kernel_id = f"k{kernel}"
        if action == "release":
            assert sorted(pool.release(kernel_id)) == sorted(held.pop(kernel_id, []))
            continue
        free = size - sum(len(p) for p in held.values())
        try:
            got = pool.allocate(kernel_id, [(f"s{i}", 8000 + i) for i in range(services)])
        except PortRangeExhausted:
            assert services > free
            continue
        assert services <= free
        assert len({m.host_port for m in got}) == services
        held.setdefault(kernel_id, []).extend(m.host_port for m in got)
        owners = pool.held
        assert all(40000 <= p < 40000 + size for p in owners)
        assert {p: k for k, ports in held.items() for p in ports} == dict(owners)


def test_proxy_address_is_the_advertised_host_as_an_ip() -> None:
    assert proxy_address("http://10.0.0.5:6001") == "10.0.0.5"
    assert proxy_address("http://localhost:6001") == "127.0.0.1"
    assert proxy_address("http://[fd00::5]:6001") == "fd00::5"
    assert proxy_address("http://node01:6001", resolve={"node01": "10.0.0.7"}.__getitem__) == (
        "10.0.0.7"
    )


def _unresolvable(name: str) -> str:
    raise OSError(f"no such host {name}")


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("http://0.0.0.0:6001", "wildcard address.*rpc-advertise-url"),
        ("http://[::]:6001", "wildcard address"),
        ("http://node99:6001", "cannot resolve 'node99'.*no such host node99.*rpc-advertise-url"),
        ("http://:6001", "has no host"),
    ],
)
def test_proxy_address_refuses_what_the_proxy_cannot_reach(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        proxy_address(url, resolve=_unresolvable)
