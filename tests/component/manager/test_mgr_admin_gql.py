"""Backend.AI's admin GraphQL (issue #30) by role: a superadmin sees and edits
everything, a domain admin only its domain, a plain user only itself.

Two domains: ``default`` (the superadmin, a domain admin ``dadmin``, a user ``alice``)
and ``other`` (made through ``create_domain``, with the user ``bob``).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from .cluster import Cluster

USER_FIELDS = (
    "uuid username email need_password_change full_name description is_active status"
    " status_info created_at modified_at domain_name role groups { id name }"
    " allowed_client_ip totp_activated sudo_session_enabled main_access_key"
)
KEYPAIR_FIELDS = (
    "user_id user_info { full_name } projects access_key secret_key is_active is_admin"
    " created_at modified_at last_used resource_policy rate_limit concurrency_used"
)
USER_LIST = (
    "query ($limit: Int!, $offset: Int!, $status: String, $group_id: UUID, $filter: String,"
    " $order: String) { user_list(limit: $limit, offset: $offset, status: $status,"
    f" group_id: $group_id, filter: $filter, order: $order) {{ items {{ {USER_FIELDS} }} total_count }} }}"
)
KEYPAIR_LIST = (
    "query ($limit: Int!, $offset: Int!, $is_active: Boolean, $domain_name: String,"
    " $email: String) { keypair_list(limit: $limit, offset: $offset, is_active: $is_active,"
    f" domain_name: $domain_name, email: $email) {{ items {{ {KEYPAIR_FIELDS} }} total_count }} }}"
)


@dataclass
class World:
    cluster: Cluster
    superadmin: httpx.AsyncClient
    dadmin: httpx.AsyncClient
    alice: httpx.AsyncClient
    bob: httpx.AsyncClient
    keys: dict[str, str]  # email -> access key


async def gql(client: httpx.AsyncClient, query: str, **variables: Any) -> dict[str, Any]:
    response = await client.post("/admin/gql", json={"query": query, "variables": variables})
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def ok(client: httpx.AsyncClient, query: str, **variables: Any) -> dict[str, Any]:
    body = await gql(client, query, **variables)
    assert not body.get("errors"), body
    data: dict[str, Any] = body["data"]
    return data


async def refused(client: httpx.AsyncClient, query: str, **variables: Any) -> str:
    body = await gql(client, query, **variables)
    assert body.get("errors"), body
    message: str = body["errors"][0]["message"]
    return message


async def make_user(
    cluster: Cluster, email: str, role: str = "user", domain: str = "default"
) -> tuple[httpx.AsyncClient, str]:
    response = await cluster.admin.post(
        "/admin/users",
        json={
            "email": email,
            "password": "long enough password",
            "role": role,
            "domain_name": domain,
        },
    )
    assert response.status_code == 201, response.text
    keypair = response.json()["keypair"]
    return cluster.client(keypair["access_key"], keypair["secret_key"]), keypair["access_key"]


CREATE_DOMAIN = """mutation ($name: String!, $input: DomainInput!) {
  create_domain(name: $name, props: $input) { ok msg domain { name description is_active
    total_resource_slots allowed_vfolder_hosts allowed_docker_registries integration_id } }
}"""


@pytest.fixture
async def world(cluster: Cluster) -> AsyncIterator[World]:
    made = await ok(
        cluster.admin,
        CREATE_DOMAIN,
        name="other",
        input={"description": "the other lab", "is_active": True, "total_resource_slots": "{}"},
    )
    assert made["create_domain"]["domain"]["name"] == "other"
    dadmin, dkey = await make_user(cluster, "dadmin@example.com", role="admin")
    alice, akey = await make_user(cluster, "alice@example.com")
    bob, bkey = await make_user(cluster, "bob@example.com", domain="other")
    me = await ok(cluster.admin, "query { keypair { access_key user_id } }")
    keys = {
        me["keypair"]["user_id"]: me["keypair"]["access_key"],
        "dadmin@example.com": dkey,
        "alice@example.com": akey,
        "bob@example.com": bkey,
    }
    async with dadmin, alice, bob:
        yield World(cluster, cluster.admin, dadmin, alice, bob, keys)


async def emails(client: httpx.AsyncClient, **variables: Any) -> tuple[list[str], int]:
    data = await ok(client, USER_LIST, limit=variables.pop("limit", 100), offset=0, **variables)
    page = data["user_list"]
    return [u["email"] for u in page["items"]], page["total_count"]


async def test_user_list_by_role_with_pages_and_filters(world: World) -> None:
    su_email = next(iter(world.keys))  # the superadmin's
    everyone, total = await emails(world.superadmin)
    assert set(everyone) >= {su_email, "dadmin@example.com", "alice@example.com", "bob@example.com"}
    assert total == len(everyone)
    in_default, _ = await emails(world.dadmin)
    assert "bob@example.com" not in in_default
    assert {"dadmin@example.com", "alice@example.com"} <= set(in_default)
    assert await emails(world.alice) == (["alice@example.com"], 1)
    assert await emails(world.bob) == (["bob@example.com"], 1)

    # limit / offset / total_count
    first, total = await emails(world.superadmin, limit=2)
    assert len(first) == 2
    assert total == len(everyone)
    rest = await ok(world.superadmin, USER_LIST, limit=100, offset=2)
    assert [u["email"] for u in rest["user_list"]["items"]] == everyone[2:]

    # plain arguments; Backend.AI's statuses accelshare never uses match nothing
    assert await emails(world.superadmin, status="deleted") == ([], 0)
    assert await emails(world.superadmin, status="before-verification") == ([], 0)
    bad = await refused(world.superadmin, USER_LIST, limit=10, offset=0, status="sleepy")
    assert "status" in bad
    assert "sleepy" in bad
    # Backend.AI's filter / order expressions, within what the caller may see
    flt = 'email like "%@example.com" & role != "superadmin" & status != "before-verification"'
    assert await emails(world.superadmin, filter=flt, order="-email") == (
        ["dadmin@example.com", "bob@example.com", "alice@example.com"],
        3,
    )
    in_domain = sorted([su_email, "alice@example.com", "dadmin@example.com"])
    assert await emails(world.dadmin, filter='email ilike "%A%"', order="+email") == (
        in_domain,
        3,
    )
    assert await emails(world.alice, filter='domain_name == "other"') == ([], 0)
    assert await emails(world.superadmin, filter='role == "monitor"') == ([], 0)
    bad = await refused(world.superadmin, USER_LIST, limit=10, offset=0, filter='emial == "x"')
    assert "filter at column 1: unknown field of user_list" in bad
    bad = await refused(world.superadmin, USER_LIST, limit=10, offset=0, order="-password")
    assert "order at column 1: unknown field of user_list" in bad
    bad = await refused(world.superadmin, USER_LIST, limit=1001, offset=0)
    assert "limit" in bad
    assert "1001" in bad


async def test_user_fields_groups_and_nulls(world: World) -> None:
    data = await ok(world.alice, f"query {{ user {{ {USER_FIELDS} }} }}")
    me = data["user"]
    assert me["email"] == "alice@example.com"
    assert me["domain_name"] == "default"
    assert me["role"] == "user"
    assert me["status"] == "active"
    assert me["is_active"] is True
    assert [g["name"] for g in me["groups"]] == ["default"]
    for not_kept in ("need_password_change", "allowed_client_ip", "totp_activated",
                     "main_access_key", "description", "status_info"):  # fmt: skip
        assert me[not_kept] is None, not_kept
    by_uuid = await ok(
        world.dadmin, "query ($id: ID) { user_from_uuid(user_id: $id) { email } }", id=me["uuid"]
    )
    assert by_uuid["user_from_uuid"]["email"] == "alice@example.com"
    # others: a domain admin cannot see another domain's user, a user no one else
    other = "query ($email: String) { user(email: $email) { email } }"
    assert (await ok(world.dadmin, other, email="bob@example.com"))["user"] is None
    assert (await ok(world.alice, other, email="dadmin@example.com"))["user"] is None
    found = await ok(world.superadmin, other, email="BOB@example.com")
    assert found["user"]["email"] == "bob@example.com"


async def test_keypair_list_and_info_by_role(world: World) -> None:
    async def keys(client: httpx.AsyncClient, **variables: Any) -> dict[str, dict[str, Any]]:
        data = await ok(client, KEYPAIR_LIST, limit=100, offset=0, **variables)
        items = data["keypair_list"]["items"]
        assert data["keypair_list"]["total_count"] == len(items)
        return {k["user_id"]: k for k in items}

    assert set(await keys(world.superadmin)) >= set(world.keys)
    assert set(await keys(world.dadmin)) == set(world.keys) - {"bob@example.com"}
    assert set(await keys(world.alice)) == {"alice@example.com"}
    assert set(await keys(world.superadmin, domain_name="other")) == {"bob@example.com"}
    assert set(await keys(world.superadmin, email="alice@example.com")) == {"alice@example.com"}
    assert await keys(world.superadmin, is_active=False) == {}

    # Backend.AI's filter / order expressions, within what the caller may see
    filtered = (
        "query ($f: String, $o: String) { keypair_list(limit: 20, offset: 0, filter: $f,"
        " order: $o) { items { user_id } total_count } }"
    )
    page = await ok(
        world.dadmin, filtered, f='email like "%@example.com" & is_active == true', o="-email"
    )
    assert [k["user_id"] for k in page["keypair_list"]["items"]] == [
        "dadmin@example.com",
        "alice@example.com",
    ]
    assert page["keypair_list"]["total_count"] == 2
    mine = await ok(world.alice, filtered, f='email != "alice@example.com"', o=None)
    assert mine["keypair_list"] == {"items": [], "total_count": 0}
    alice_key = world.keys["alice@example.com"]
    exact = await ok(world.superadmin, filtered, f=f'access_key == "{alice_key}"', o="created_at")
    assert [k["user_id"] for k in exact["keypair_list"]["items"]] == ["alice@example.com"]
    bad = await refused(world.superadmin, filtered, f="is_admin == 1", o=None)
    assert "filter at column 13: wrong value for is_admin" in bad

    alice = (await keys(world.alice))["alice@example.com"]
    assert alice["access_key"] == world.keys["alice@example.com"]
    assert alice["secret_key"] is None  # shown once, at creation
    assert alice["projects"] == ["default"]
    assert alice["user_info"] == {"full_name": ""}
    assert alice["concurrency_used"] == 0
    assert alice["resource_policy"] == "default"
    assert alice["rate_limit"] is None
    assert alice["modified_at"] is None
    await world.cluster.manager.key_usage.idle()  # recorded off the request path
    alice = (await keys(world.alice))["alice@example.com"]
    assert alice["last_used"] is not None  # the requests above used the key

    info = "query ($k: String) { keypair(access_key: $k) { access_key user_id } }"
    bob_key = world.keys["bob@example.com"]
    assert (await ok(world.superadmin, info, k=bob_key))["keypair"]["user_id"] == "bob@example.com"
    assert (await ok(world.dadmin, info, k=bob_key))["keypair"] is None
    assert (await ok(world.alice, info, k=bob_key))["keypair"] is None
    alice_key = world.keys["alice@example.com"]
    assert (await ok(world.dadmin, info, k=alice_key))["keypair"]["user_id"] == "alice@example.com"


async def test_domains_and_groups_by_role(world: World) -> None:
    q = "query { domains { name description is_active total_resource_slots } }"
    assert [d["name"] for d in (await ok(world.superadmin, q))["domains"]] == ["default", "other"]
    assert [d["name"] for d in (await ok(world.dadmin, q))["domains"]] == ["default"]
    assert [d["name"] for d in (await ok(world.bob, q))["domains"]] == ["other"]
    one = "query ($n: String) { domain(name: $n) { name description } }"
    assert (await ok(world.dadmin, one, n="other"))["domain"] is None
    assert (await ok(world.superadmin, one, n="other"))["domain"]["description"] == "the other lab"

    made = await ok(
        world.dadmin,
        """mutation ($name: String!, $input: GroupInput!) {
          create_group(name: $name, props: $input) { ok group { id name domain_name } } }""",
        name="lab",
        input={"domain_name": "default", "description": "the lab", "total_resource_slots": "{}"},
    )
    lab = made["create_group"]["group"]
    assert (lab["name"], lab["domain_name"]) == ("lab", "default")
    denied = await refused(
        world.dadmin,
        """mutation ($name: String!, $input: GroupInput!) {
          create_group(name: $name, props: $input) { ok } }""",
        name="intruder",
        input={"domain_name": "other"},
    )
    assert "other" in denied

    groups = "query ($d: String) { groups(domain_name: $d) { id name domain_name is_active } }"
    names = {(g["domain_name"], g["name"]) for g in (await ok(world.superadmin, groups))["groups"]}
    assert names == {("default", "default"), ("default", "lab")}
    assert {g["name"] for g in (await ok(world.dadmin, groups))["groups"]} == {"default", "lab"}
    assert (await ok(world.dadmin, groups, d="other"))["groups"] == []
    # a user: the groups it belongs to
    assert [g["name"] for g in (await ok(world.alice, groups))["groups"]] == ["default"]

    # members: add alice to the lab; then her groups and the user list by group show it
    alice = (await ok(world.alice, "query { user { uuid } }"))["user"]["uuid"]
    modify = """mutation ($gid: UUID!, $input: ModifyGroupInput!) {
      modify_group(gid: $gid, props: $input) { ok msg } }"""
    await ok(world.dadmin, modify, gid=lab["id"], input={"user_update_mode": "add", "user_uuids": [alice]})  # fmt: skip
    assert await emails(world.dadmin, group_id=lab["id"]) == (["alice@example.com"], 1)
    mine = await ok(world.alice, "query { user { groups { name } } }")
    assert [g["name"] for g in mine["user"]["groups"]] == ["default", "lab"]
    await ok(world.dadmin, modify, gid=lab["id"], input={"name": "lab2", "description": "x"})
    got = await ok(world.alice, "query ($id: UUID!) { group(id: $id) { name description } }", id=lab["id"])  # fmt: skip
    assert got["group"] == {"name": "lab2", "description": "x"}
    # bob (other domain) cannot be added; the other domain's admin-less user cannot modify
    bob = (await ok(world.bob, "query { user { uuid } }"))["user"]["uuid"]
    bad = await refused(world.dadmin, modify, gid=lab["id"], input={"user_update_mode": "add", "user_uuids": [bob]})  # fmt: skip
    assert f"Unknown user(s) in the domain default: {bob}" in bad
    assert "admin" in await refused(world.alice, modify, gid=lab["id"], input={"name": "mine"})

    delete = "mutation ($gid: UUID!) { delete_group(gid: $gid) { ok } }"
    await ok(world.dadmin, delete, gid=lab["id"])
    assert (await ok(world.dadmin, got_q := "query ($id: UUID!) { group(id: $id) { is_active } }", id=lab["id"]))["group"] == {"is_active": False}  # fmt: skip
    purge = "mutation ($gid: UUID!) { purge_group(gid: $gid) { ok } }"
    await ok(world.dadmin, purge, gid=lab["id"])
    assert (await ok(world.superadmin, got_q, id=lab["id"]))["group"] is None


async def test_domain_mutations_are_superadmin_only(world: World) -> None:
    modify = """mutation ($name: String!, $input: ModifyDomainInput!) {
      modify_domain(name: $name, props: $input) { ok msg } }"""
    assert "superadmin" in await refused(world.dadmin, modify, name="default", input={"description": "x"})  # fmt: skip
    assert "superadmin" in await refused(world.dadmin, CREATE_DOMAIN, name="mine", input={})
    await ok(world.superadmin, modify, name="other", input={"description": "renamed lab", "total_resource_slots": json.dumps({"cpu": "8"})})  # fmt: skip
    got = await ok(world.superadmin, "query { domain(name: \"other\") { description total_resource_slots } }")  # fmt: skip
    assert got["domain"]["description"] == "renamed lab"
    assert json.loads(got["domain"]["total_resource_slots"]) == {"cpu": "8"}
    bad = await refused(world.superadmin, modify, name="other", input={"total_resource_slots": '{"warp": "1"}'})  # fmt: skip
    assert "warp" in bad
    bad = await refused(world.superadmin, modify, name="other", input={"integration_id": "x"})
    assert "integration_id" in bad
    assert "does not keep" in bad
    bad = await refused(world.superadmin, modify, name="other", input={"name": "renamed"})
    assert "name" in bad
    # delete deactivates; purge refuses while users remain
    await ok(world.superadmin, 'mutation { delete_domain(name: "other") { ok } }')
    q = 'query { domain(name: "other") { is_active } }'
    assert (await ok(world.superadmin, q))["domain"] == {"is_active": False}
    assert "users or groups" in await refused(world.superadmin, 'mutation { purge_domain(name: "other") { ok } }')  # fmt: skip


USER_CREATE = """mutation ($email: String!, $input: UserInput!) {
  create_user(email: $email, props: $input) { ok msg user { uuid email domain_name groups { name } } }
}"""
USER_MODIFY = """mutation ($email: String!, $input: ModifyUserInput!) {
  modify_user(email: $email, props: $input) { ok msg }
}"""


def user_input(domain: str, **extra: Any) -> dict[str, Any]:
    # what the client 25.5.2 sends by default
    return {
        "password": "long enough password",
        "role": "user",
        "status": "active",
        "need_password_change": False,
        "description": "",
        "domain_name": domain,
        "totp_activated": False,
        "sudo_session_enabled": False,
        **extra,
    }


async def test_user_mutations_by_role(world: World) -> None:
    made = await ok(world.dadmin, USER_CREATE, email="carol@example.com", input=user_input("default"))  # fmt: skip
    carol = made["create_user"]["user"]
    assert made["create_user"]["ok"] is True
    assert (carol["email"], carol["domain_name"]) == ("carol@example.com", "default")
    assert [g["name"] for g in carol["groups"]] == ["default"]  # the domain's first group
    # a domain admin cannot create in another domain, nor a superadmin, nor can a user
    assert "other" in await refused(world.dadmin, USER_CREATE, email="x@example.com", input=user_input("other"))  # fmt: skip
    denied = await refused(world.dadmin, USER_CREATE, email="y@example.com", input=user_input("default", role="superadmin"))  # fmt: skip
    assert "superadmin" in denied
    assert "admin" in await refused(world.alice, USER_CREATE, email="z@example.com", input=user_input("default"))  # fmt: skip
    # groups outside the user's domain (here: no such group) are refused, naming them
    stray = "00000000-0000-4000-8000-000000000001"
    bad = await refused(world.dadmin, USER_CREATE, email="g@example.com", input=user_input("default", group_ids=[stray]))  # fmt: skip
    assert f"Unknown group(s) in the domain default: {stray}" in bad
    # settings accelshare does not keep are refused, not dropped
    bad = await refused(world.superadmin, USER_CREATE, email="t@example.com", input=user_input("default", totp_activated=True))  # fmt: skip
    assert "totp_activated" in bad
    assert "does not keep" in bad

    await ok(world.dadmin, USER_MODIFY, email="carol@example.com", input={"full_name": "Carol C", "status": "inactive"})  # fmt: skip
    got = await ok(world.dadmin, 'query { user(email: "carol@example.com") { full_name status is_active } }')  # fmt: skip
    assert got["user"] == {"full_name": "Carol C", "status": "inactive", "is_active": False}
    assert "bob" in await refused(world.dadmin, USER_MODIFY, email="bob@example.com", input={"full_name": "B"})  # fmt: skip
    bad = await refused(world.dadmin, USER_MODIFY, email="carol@example.com", input={"domain_name": "other"})  # fmt: skip
    assert "domain_name" in bad

    delete = "mutation ($email: String!) { delete_user(email: $email) { ok msg } }"
    assert "bob" in await refused(world.dadmin, delete, email="bob@example.com")
    await ok(world.dadmin, delete, email="carol@example.com")
    got = await ok(world.superadmin, 'query { user(email: "carol@example.com") { status } }')
    assert got["user"] == {"status": "deleted"}
    purge = """mutation ($email: String!, $input: PurgeUserInput!) {
      purge_user(email: $email, props: $input) { ok } }"""
    assert "delete_user" in await refused(world.superadmin, purge, email="carol@example.com", input={})  # fmt: skip


async def test_keypair_mutations_by_role(world: World) -> None:
    create = """mutation ($user_id: String!, $input: KeyPairInput!) {
      create_keypair(user_id: $user_id, props: $input) { ok keypair { access_key secret_key user_id } } }"""
    made = await ok(world.dadmin, create, user_id="alice@example.com", input={"is_active": True, "is_admin": False, "rate_limit": 5000})  # fmt: skip
    key = made["create_keypair"]["keypair"]
    assert key["user_id"] == "alice@example.com"
    assert len(key["secret_key"]) == 40
    assert "bob" in await refused(world.dadmin, create, user_id="bob@example.com", input={})
    assert "admin" in await refused(world.alice, create, user_id="alice@example.com", input={})

    modify = """mutation ($k: String!, $input: ModifyKeyPairInput!) {
      modify_keypair(access_key: $k, props: $input) { ok msg } }"""
    await ok(world.dadmin, modify, k=key["access_key"], input={"is_active": False})
    data = await ok(world.dadmin, KEYPAIR_LIST, limit=10, offset=0, is_active=False)
    assert [k["access_key"] for k in data["keypair_list"]["items"]] == [key["access_key"]]
    bob_key = world.keys["bob@example.com"]
    assert bob_key in await refused(world.dadmin, modify, k=bob_key, input={"is_active": False})
    delete = "mutation ($k: String!) { delete_keypair(access_key: $k) { ok } }"
    await ok(world.dadmin, delete, k=key["access_key"])
    assert (await ok(world.superadmin, "query ($k: String) { keypair(access_key: $k) { access_key } }", k=key["access_key"]))["keypair"] is None  # fmt: skip


async def test_scaling_groups_and_policies(world: World) -> None:
    sg_fields = "name description is_active is_public created_at driver driver_opts scheduler scheduler_opts use_host_network wsproxy_addr wsproxy_api_token"  # fmt: skip
    listed = await ok(world.dadmin, f"query ($a: Boolean) {{ scaling_groups(is_active: $a) {{ {sg_fields} }} }}", a=None)  # fmt: skip
    assert [s["name"] for s in listed["scaling_groups"]] == ["default"]
    assert listed["scaling_groups"][0]["driver"] is None  # not kept
    assert "admin" in await refused(world.alice, "query { scaling_groups { name } }")
    create = """mutation ($name: String!, $input: CreateScalingGroupInput!) {
      create_scaling_group(name: $name, props: $input) { ok scaling_group { name scheduler } } }"""
    client_defaults = {"description": "", "is_active": True, "is_public": True, "driver": "static", "scheduler": "fifo", "use_host_network": False, "wsproxy_addr": None, "wsproxy_api_token": None, "driver_opts": "{}", "scheduler_opts": "{}"}  # fmt: skip
    assert "superadmin" in await refused(world.dadmin, create, name="gpu", input=client_defaults)
    made = await ok(world.superadmin, create, name="gpu", input=client_defaults)
    assert made["create_scaling_group"]["scaling_group"] == {"name": "gpu", "scheduler": "fifo"}
    bad = await refused(world.superadmin, create, name="k8s", input={**client_defaults, "driver": "kubernetes"})  # fmt: skip
    assert "driver" in bad
    assert "kubernetes" in bad
    modify = """mutation ($name: String!, $input: ModifyScalingGroupInput!) {
      modify_scaling_group(name: $name, props: $input) { ok } }"""
    await ok(world.superadmin, modify, name="gpu", input={"description": "GPUs", "scheduler": "drf"})  # fmt: skip
    got = await ok(world.dadmin, 'query { scaling_group(name: "gpu") { description scheduler } }')
    assert got["scaling_group"] == {"description": "GPUs", "scheduler": "drf"}
    await ok(world.superadmin, 'mutation { delete_scaling_group(name: "gpu") { ok } }')
    assert (await ok(world.dadmin, 'query { scaling_group(name: "gpu") { name } }'))["scaling_group"] is None  # fmt: skip

    krp_fields = "name created_at default_for_unspecified total_resource_slots max_session_lifetime max_concurrent_sessions idle_timeout max_containers_per_session allowed_vfolder_hosts max_pending_session_count max_pending_session_resource_slots max_concurrent_sftp_sessions"  # fmt: skip
    create = """mutation ($name: String!, $input: CreateKeyPairResourcePolicyInput!) {
      create_keypair_resource_policy(name: $name, props: $input) { ok resource_policy { name total_resource_slots } } }"""
    policy = {"default_for_unspecified": "UNLIMITED", "total_resource_slots": '{"cpu": "4"}', "max_session_lifetime": 0, "max_concurrent_sessions": 3, "max_concurrent_sftp_sessions": 0, "max_containers_per_session": 1, "idle_timeout": 0, "allowed_vfolder_hosts": "{}", "max_pending_session_count": 2, "max_pending_session_resource_slots": None}  # fmt: skip
    assert "superadmin" in await refused(world.dadmin, create, name="small", input=policy)
    made = await ok(world.superadmin, create, name="small", input=policy)
    assert json.loads(made["create_keypair_resource_policy"]["resource_policy"]["total_resource_slots"]) == {"cpu": "4"}  # fmt: skip
    every = f"query {{ keypair_resource_policies {{ {krp_fields} }} }}"
    assert [p["name"] for p in (await ok(world.dadmin, every))["keypair_resource_policies"]] == ["default", "small"]  # fmt: skip
    # a user: the policies of its own keypairs only
    assert [p["name"] for p in (await ok(world.alice, every))["keypair_resource_policies"]] == ["default"]  # fmt: skip
    mine = await ok(world.alice, "query { keypair_resource_policy { name max_session_lifetime max_containers_per_session } }")  # fmt: skip
    assert mine["keypair_resource_policy"] == {"name": "default", "max_session_lifetime": None, "max_containers_per_session": 1}  # fmt: skip
    assert (await ok(world.alice, 'query { keypair_resource_policy(name: "small") { name } }'))["keypair_resource_policy"] is None  # fmt: skip
    modify = """mutation ($name: String!, $input: ModifyKeyPairResourcePolicyInput!) {
      modify_keypair_resource_policy(name: $name, props: $input) { ok } }"""
    await ok(world.superadmin, modify, name="small", input={"max_concurrent_sessions": 5})
    bad = await refused(world.superadmin, modify, name="small", input={"max_session_lifetime": 3600})  # fmt: skip
    assert "max_session_lifetime" in bad
    assert "3600" in bad
    got = await ok(world.superadmin, 'query { keypair_resource_policy(name: "small") { max_concurrent_sessions } }')  # fmt: skip
    assert got["keypair_resource_policy"] == {"max_concurrent_sessions": 5}
    await ok(world.superadmin, 'mutation { delete_keypair_resource_policy(name: "small") { ok } }')  # fmt: skip


async def test_images_with_backendai_fields(world: World) -> None:
    for body in (
        {"ref": "python:3.11"},
        {"ref": "cr.example.org/lab/pytorch:1.5", "runtime": "docker"},
        {"ref": "ops:1", "runtime": "docker", "labels": {"ai.backend.features": "operation"}},
    ):
        added = await world.superadmin.post("/admin/images", json=body)
        assert added.status_code == 201, added.text
    fields = "id name registry architecture tag digest size_bytes aliases"
    q = f"query ($op: Boolean) {{ images(is_operation: $op) {{ {fields} }} }}"
    images = (await ok(world.alice, q, op=False))["images"]
    registries = {i["id"]: i["registry"] for i in images}
    assert registries == {
        "python:3.11": None,  # the process runtime's environments come from no registry
        "cr.example.org/lab/pytorch:1.5": "cr.example.org",
    }
    for image in images:
        assert image["digest"] is None
        assert image["size_bytes"] is None
    assert [i["id"] for i in (await ok(world.alice, q, op=True))["images"]] == ["ops:1"]
    assert len((await ok(world.alice, q, op=None))["images"]) == 3
    one = await ok(world.alice, "query ($r: String!, $a: String!) { image(reference: $r, architecture: $a) { id } }", r=images[0]["id"], a=images[0]["architecture"])  # fmt: skip
    assert one["image"] == {"id": images[0]["id"]}
