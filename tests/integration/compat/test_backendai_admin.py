"""The official client's admin commands (backend.ai-client 25.5.2) against accelshare
(issue #30): users, keypairs, domains, groups, scaling groups, keypair resource
policies, images and agents, unchanged, as the cluster's superadmin.

The cluster is shared with the other compat tests, so every name made here starts with
``adm-`` and the assertions look for these rows only.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from .conftest import Bai

pytestmark = pytest.mark.integration

AGENT = "i-dev-01"


def out(bai: Bai, *args: str) -> Any:
    return bai.ok("--output", "json", *args).json()


def only(listing: dict[str, Any]) -> dict[str, Any]:
    assert len(listing["items"]) == 1, listing
    item: dict[str, Any] = listing["items"][0]
    return item


def test_admin_user_and_keypair_commands(bai: Bai) -> None:
    me = only(out(bai, "admin", "user", "info"))
    assert me["role"] == "superadmin"
    users = out(bai, "admin", "user", "list")
    assert users["total_count"] >= 1
    assert me["email"] in [u["email"] for u in users["items"]]

    bai.ok("admin", "user", "add", "default", "adm-carol@example.com", "long enough password",
           "--role", "user")  # fmt: skip
    carol = only(out(bai, "admin", "user", "info", "--email", "adm-carol@example.com"))
    assert carol["domain_name"] == "default"
    assert carol["status"] == "active"
    listed = out(bai, "admin", "user", "list", "--status", "active", "--limit", "100")
    assert "adm-carol@example.com" in [u["email"] for u in listed["items"]]
    bai.ok("admin", "user", "update", "adm-carol@example.com", "--full-name", "Carol Adm")
    assert only(out(bai, "admin", "user", "info", "--email", "adm-carol@example.com"))["status"] == "active"  # fmt: skip

    # keypairs: add (the secret shown once), list by user, info of the caller's own
    added = out(bai, "admin", "keypair", "add", "adm-carol@example.com", "default")
    assert added["ok"] is True, added
    keys = out(bai, "admin", "keypair", "list", "--user-id", "adm-carol@example.com")
    carol_keys = {k["access_key"]: k for k in keys["items"]}
    assert len(carol_keys) == 2  # the one made with the user, the one added
    for key in carol_keys.values():
        assert key["user_id"] == "adm-carol@example.com"
        assert key["full_name"] == "Carol Adm"  # user_info { full_name }
    mine = only(out(bai, "admin", "keypair", "info"))
    assert mine["user_id"] == me["email"]
    assert mine["is_admin"] is True

    some_key = sorted(carol_keys)[0]
    bai.ok("admin", "keypair", "deactivate", some_key)
    inactive = out(bai, "admin", "keypair", "list", "--user-id", "adm-carol@example.com",
                   "--is-active", "false")  # fmt: skip
    assert [k["access_key"] for k in inactive["items"]] == [some_key]
    bai.ok("admin", "keypair", "activate", some_key)

    bai.ok("admin", "user", "delete", "adm-carol@example.com")
    gone = only(out(bai, "admin", "user", "info", "--email", "adm-carol@example.com"))
    assert gone["status"] == "deleted"

    # Backend.AI's filter / order expressions (the client's own --help example's form)
    filtered = out(bai, "admin", "user", "list", "--filter",
                   'status == "DELETED" & role in ["USER", "ADMIN"] & email ilike "ADM-%"')  # fmt: skip
    assert [u["email"] for u in filtered["items"]] == ["adm-carol@example.com"]
    ordered = out(bai, "admin", "keypair", "list", "--filter",
                  'email == "adm-carol@example.com"', "--order", "-access_key")  # fmt: skip
    assert [k["access_key"] for k in ordered["items"]] == sorted(carol_keys, reverse=True)
    refused = bai("admin", "user", "list", "--filter", 'email ilike "%x%" &')
    assert refused.code != 0
    assert "filter at column 20: bad syntax" in refused.output


def test_admin_domain_group_commands(bai: Bai) -> None:
    bai.ok("admin", "domain", "add", "adm-lab", "--description", "the lab")
    domains = out(bai, "admin", "domain", "list")
    assert {"default", "adm-lab"} <= {d["name"] for d in domains["items"]}
    lab = only(out(bai, "admin", "domain", "info", "adm-lab"))
    assert lab["description"] == "the lab"
    assert lab["is_active"] is True
    bai.ok("admin", "domain", "update", "adm-lab", "--description", "the new lab")
    assert only(out(bai, "admin", "domain", "info", "adm-lab"))["description"] == "the new lab"

    made = out(bai, "admin", "group", "add", "adm-lab", "adm-team", "--description", "a team")
    assert made["ok"] is True, made
    groups = out(bai, "admin", "group", "list", "--domain-name", "adm-lab")
    assert [g["name"] for g in groups["items"]] == ["adm-team"]
    team = only(out(bai, "admin", "group", "info", "adm-team"))
    assert team["domain_name"] == "adm-lab"
    bai.ok("admin", "group", "update", team["id"], "--description", "the team")
    assert only(out(bai, "admin", "group", "info", team["id"]))["description"] == "the team"
    bai.ok("admin", "group", "delete", team["id"])
    assert only(out(bai, "admin", "group", "info", team["id"]))["is_active"] is False
    # purge asks "Are you sure?" on a terminal: the same mutation through the client's call
    purged = bai.sdk(
        "gql",
        query="mutation ($gid: UUID!) { purge_group(gid: $gid) { ok msg } }",
        variables={"gid": team["id"]},
    )
    assert purged["data"]["purge_group"]["ok"] is True, purged
    bai.ok("admin", "domain", "delete", "adm-lab")
    assert only(out(bai, "admin", "domain", "info", "adm-lab"))["is_active"] is False
    purged = bai.sdk(
        "gql",
        query="mutation ($name: String!) { purge_domain(name: $name) { ok msg } }",
        variables={"name": "adm-lab"},
    )
    assert purged["data"]["purge_domain"]["ok"] is True, purged


def test_admin_scaling_group_and_policy_commands(bai: Bai) -> None:
    bai.ok("admin", "scaling-group", "add", "adm-gpu", "--description", "GPUs")
    names = {s["name"] for s in out(bai, "admin", "scaling-group", "list")["items"]}
    assert {"default", "adm-gpu"} <= names
    gpu = only(out(bai, "admin", "scaling-group", "info", "adm-gpu"))
    assert gpu["description"] == "GPUs"
    assert gpu["scheduler"] == "fifo"
    bai.ok("admin", "scaling-group", "update", "adm-gpu", "--description", "more GPUs")
    assert only(out(bai, "admin", "scaling-group", "info", "adm-gpu"))["description"] == "more GPUs"
    bai.ok("admin", "scaling-group", "delete", "adm-gpu")

    bai.ok("admin", "keypair-resource-policy", "add", "adm-small",
           "--total-resource-slots", '{"cpu": "4"}', "--max-concurrent-sessions", "2")  # fmt: skip
    policies = out(bai, "admin", "keypair-resource-policy", "list")
    assert {"default", "adm-small"} <= {p["name"] for p in policies["items"]}
    small = only(out(bai, "admin", "keypair-resource-policy", "info", "adm-small"))
    assert small["max_concurrent_sessions"] == 2
    bai.ok("admin", "keypair-resource-policy", "update", "adm-small",
           "--max-concurrent-sessions", "3")  # fmt: skip
    small = only(out(bai, "admin", "keypair-resource-policy", "info", "adm-small"))
    assert small["max_concurrent_sessions"] == 3
    deleted = bai.sdk(  # `delete` asks "Are you sure?" on a terminal
        "gql",
        query="mutation ($name: String!) { delete_keypair_resource_policy(name: $name) { ok } }",
        variables={"name": "adm-small"},
    )
    assert deleted["data"]["delete_keypair_resource_policy"]["ok"] is True, deleted


def test_image_lists_and_agent_live_stats(bai: Bai) -> None:
    for args in (("image", "list"), ("admin", "image", "list")):
        images = out(bai, *args)["items"]
        assert images, args
        python = [i for i in images if i["name"] == "python"]
        assert python, images
        assert python[0]["registry"] is None  # the process runtime: no registry
        assert python[0]["digest"] is None

    agent = only(out(bai, "admin", "agent", "info", AGENT))
    assert agent["id"] == AGENT
    cpu = agent["cpu_cur_pct"]
    assert cpu is not None, agent  # measured by the agent's CPU plugin
    assert 0 <= float(cpu) <= 100
    plain = bai.ok("admin", "agent", "info", AGENT).stdout
    assert "cpu_util" in plain, plain  # the client's own formatting of live_stat
    assert json.dumps(None) not in agent.get("live_stat", "")
