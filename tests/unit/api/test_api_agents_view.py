"""What a domain admin sees of the agents' maps: other domains' kernels are anonymous."""

from __future__ import annotations

from typing import Any

import pytest

from accelshare.api.agents import hide_kernels, hide_other_domains, kernel_ids_in


def device(device_id: str, **kernels: str) -> dict[str, Any]:
    allocated = sum(float(a) for a in kernels.values())
    return {"device_id": device_id, "allocated": f"{allocated:g}", "kernels": kernels}


def alloc_map(*devices: dict[str, Any], agent: str = "i-1") -> dict[str, Any]:
    return {
        "agent_id": agent,
        "maps": {"cuda": {"key": "cuda", "kind": "fractional", "devices": list(devices)}},
        "source": "agent",
    }


def kernels_of(m: dict[str, Any]) -> list[dict[str, str]]:
    return [d["kernels"] for d in m["maps"]["cuda"]["devices"]]


def holder(name: str, domain: str) -> dict[str, str]:
    return {"sessionId": f"s-{name}", "sessionName": name, "domainName": domain}


def test_kernel_ids_in_collects_every_device() -> None:
    m = alloc_map(device("GPU1", k1="0.2", k9="0.4"), device("GPU2", k9="0.8"), device("GPU3"))
    assert kernel_ids_in(m) == {"k1", "k9"}
    assert kernel_ids_in({"agent_id": "i-1", "maps": {}}) == set()


def test_hidden_kernels_keep_one_name_and_their_amounts() -> None:
    m = alloc_map(device("GPU1", k1="0.2", k9="0.4", k8="0.1"), device("GPU2", k9="0.8"))
    tokens: dict[str, str] = {}
    hidden = hide_kernels(m, {"k1"}, tokens)
    assert kernels_of(hidden) == [
        {"k1": "0.2", "hidden-1": "0.4", "hidden-2": "0.1"},
        {"hidden-1": "0.8"},  # the same kernel on another device: the same name
    ]
    assert tokens == {"k9": "hidden-1", "k8": "hidden-2"}
    assert kernels_of(m)[0] == {"k1": "0.2", "k9": "0.4", "k8": "0.1"}  # input untouched
    assert hidden["agent_id"] == "i-1"
    assert hidden["source"] == "agent"
    assert hidden["maps"]["cuda"]["kind"] == "fractional"
    assert hidden["maps"]["cuda"]["devices"][0]["allocated"] == "0.7"
    # The same map gives the same names (the stream sends only what changed).
    assert hide_kernels(m, {"k1"}, {}) == hidden


@pytest.mark.parametrize(
    ("domain", "shown", "hidden"),
    [
        pytest.param("lab", {"k1"}, 2, id="admin-of-lab"),
        pytest.param("default", {"k2", "k3"}, 1, id="admin-of-default"),
        pytest.param("nobody", set(), 3, id="admin-of-an-empty-domain"),
    ],
)
def test_hide_other_domains(domain: str, shown: set[str], hidden: int) -> None:
    maps = [
        alloc_map(device("GPU1", k1="0.2", k2="0.4"), agent="i-1"),
        None,  # an agent that is not alive has no live map
        alloc_map(device("GPU1", k3="1"), agent="i-2"),
    ]
    holders = {
        "k1": holder("mine", "lab"),
        "k2": holder("alpha", "default"),
        "k3": holder("beta", "default"),
    }
    seen_maps, seen_holders = hide_other_domains(domain, maps, holders)
    assert seen_maps[1] is None
    assert len(seen_maps) == 3
    ids = set().union(*(kernel_ids_in(m) for m in seen_maps if m is not None))
    assert ids & set(holders) == shown
    assert len(ids - shown) == hidden
    assert {k: v for k, v in seen_holders.items() if k in holders} == {k: holders[k] for k in shown}
    anonymous = {k: v for k, v in seen_holders.items() if k not in holders}
    assert anonymous == {f"hidden-{i}": {"hidden": True} for i in range(1, hidden + 1)}
    # Nothing about the other sessions is left anywhere in the answer.
    text = repr((seen_maps, seen_holders))
    for kernel_id, who in holders.items():
        if kernel_id not in shown:
            assert f"'{kernel_id}'" not in text
            assert who["sessionName"] not in text
            assert who["sessionId"] not in text
