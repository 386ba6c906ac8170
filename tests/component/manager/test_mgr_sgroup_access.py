"""Scaling groups tied to domains, projects and keypairs (Backend.AI's ``sgroups_for_*``).

A session may use an active scaling group associated with its owner's domain, its
project or its owner's keypair; a scaling group an admin creates is open to nobody until
a superadmin associates it (GraphQL, as the official client does, or REST).
"""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from accelshare.manager.models import Group, Keypair, Session

from .cluster import Cluster
from .test_mgr_admin_gql import make_user, ok, refused

ASSOCIATE_DOMAIN = """mutation ($scaling_group: String!, $domain: String!) {
  associate_scaling_group_with_domain(scaling_group: $scaling_group, domain: $domain) { ok msg }
}"""
DISSOCIATE_DOMAIN = """mutation ($scaling_group: String!, $domain: String!) {
  disassociate_scaling_group_with_domain(scaling_group: $scaling_group, domain: $domain) { ok msg }
}"""
DISSOCIATE_ALL_DOMAIN = """mutation ($domain: String!) {
  disassociate_all_scaling_groups_with_domain(domain: $domain) { ok msg }
}"""
ASSOCIATE_GROUP = """mutation ($scaling_group: String!, $user_group: UUID!) {
  associate_scaling_group_with_user_group(scaling_group: $scaling_group, user_group: $user_group) {
    ok msg
  }
}"""
# the client 25.5.2 declares this one's group as a String
DISSOCIATE_GROUP = """mutation ($scaling_group: String!, $user_group: String!) {
  disassociate_scaling_group_with_user_group(scaling_group: $scaling_group,
    user_group: $user_group) { ok msg }
}"""
DISSOCIATE_ALL_GROUP = """mutation ($group_id: UUID!) {
  disassociate_all_scaling_groups_with_group(user_group: $group_id) { ok msg }
}"""
ASSOCIATE_KEYPAIR = """mutation ($scaling_group: String!, $access_key: String!) {
  associate_scaling_group_with_keypair(scaling_group: $scaling_group, access_key: $access_key) {
    ok msg
  }
}"""
DISSOCIATE_KEYPAIR = """mutation ($scaling_group: String!, $access_key: String!) {
  disassociate_scaling_group_with_keypair(scaling_group: $scaling_group,
    access_key: $access_key) { ok msg }
}"""


async def _project_id(cluster: Cluster, name: str = "default") -> str:
    async with cluster.manager.db.begin() as db:
        found = (await db.execute(sa.select(Group.id).where(Group.name == name))).scalar_one()
    return str(found)


async def _session_count(cluster: Cluster) -> int:
    async with cluster.manager.db.begin() as db:
        return (await db.execute(sa.select(sa.func.count()).select_from(Session))).scalar_one()


async def _gpu_cluster(cluster: Cluster) -> None:
    made = await cluster.admin.post("/admin/scaling-groups", json={"name": "gpu"})
    assert made.status_code == 201, made.text
    await cluster.add_agent("i-cpu")
    await cluster.add_agent("i-gpu", scaling_group="gpu")


async def _create(
    cluster: Cluster, client: httpx.AsyncClient, scaling_group: str | None = None, **body: Any
) -> httpx.Response:
    config = {} if scaling_group is None else {"scalingGroup": scaling_group}
    payload = {"image": "python:3.11", "config": {"resources": {"cpu": 1}, **config}, **body}
    return await client.post("/session", json={**payload, "enqueueOnly": True})


async def _refused(
    cluster: Cluster, client: httpx.AsyncClient, scaling_group: str
) -> dict[str, Any]:
    before = await _session_count(cluster)
    response = await _create(cluster, client, scaling_group)
    assert response.status_code == 400, response.text
    problem: dict[str, Any] = response.json()
    assert problem["field"] == "config.scalingGroup"
    assert problem["received"] == scaling_group
    assert await _session_count(cluster) == before  # nothing written
    return problem


async def _allowed(cluster: Cluster, client: httpx.AsyncClient, scaling_group: str) -> None:
    response = await _create(cluster, client, scaling_group)
    assert response.status_code == 201, response.text
    body = await cluster.session(response.json()["sessionId"])
    assert body["scalingGroup"] == scaling_group


async def test_a_new_scaling_group_opens_by_domain_project_or_keypair(cluster: Cluster) -> None:
    await _gpu_cluster(cluster)
    alice, alice_key = await make_user(cluster, "alice@example.com")
    bob, _ = await make_user(cluster, "bob@example.com")
    project = await _project_id(cluster)
    async with alice, bob:
        problem = await _refused(cluster, alice, "gpu")
        assert "not open to your sessions" in problem["detail"]
        assert "(available: default)" in problem["detail"]
        assert problem["expected"] == "one of default"
        await _allowed(cluster, alice, "default")

        # the domain: every user of it
        await ok(cluster.admin, ASSOCIATE_DOMAIN, scaling_group="gpu", domain="default")
        await _allowed(cluster, alice, "gpu")
        await _allowed(cluster, bob, "gpu")
        await ok(cluster.admin, DISSOCIATE_DOMAIN, scaling_group="gpu", domain="default")
        await _refused(cluster, alice, "gpu")

        # the project: sessions charged to it
        await ok(cluster.admin, ASSOCIATE_GROUP, scaling_group="gpu", user_group=project)
        await _allowed(cluster, alice, "gpu")
        await ok(cluster.admin, DISSOCIATE_GROUP, scaling_group="gpu", user_group=project)
        await _refused(cluster, alice, "gpu")

        # the keypair: that keypair's sessions only
        await ok(cluster.admin, ASSOCIATE_KEYPAIR, scaling_group="gpu", access_key=alice_key)
        await _allowed(cluster, alice, "gpu")
        await _refused(cluster, bob, "gpu")

        # an inactive scaling group is open to nobody
        off = await cluster.admin.patch("/admin/scaling-groups/gpu", json={"is_active": False})
        assert off.status_code == 200, off.text
        problem = await _refused(cluster, alice, "gpu")
        assert "Unknown scaling group 'gpu'" in problem["detail"]
        assert (await alice.get("/scaling-groups", params={"group": "default"})).json() == {
            "scaling_groups": [{"name": "default"}]
        }
        on = await cluster.admin.patch("/admin/scaling-groups/gpu", json={"is_active": True})
        assert on.status_code == 200, on.text
        await ok(cluster.admin, DISSOCIATE_KEYPAIR, scaling_group="gpu", access_key=alice_key)
        await _refused(cluster, alice, "gpu")


async def test_a_session_charged_to_an_unassociated_project_is_refused(cluster: Cluster) -> None:
    """The project counts only for the sessions charged to it."""
    await _gpu_cluster(cluster)
    made = await ok(
        cluster.admin,
        'mutation ($name: String!) { create_group(name: $name, props: {domain_name: "default"})'
        " { ok group { id } } }",
        name="lab",
    )
    lab = made["create_group"]["group"]["id"]
    alice, alice_key = await make_user(cluster, "alice@example.com")
    async with alice:
        users = await ok(
            cluster.admin,
            "mutation ($gid: UUID!, $props: ModifyGroupInput!) {"
            " modify_group(gid: $gid, props: $props) { ok msg } }",
            gid=lab,
            props={"user_update_mode": "add", "user_uuids": [await _user_id(cluster, alice_key)]},
        )
        assert users["modify_group"]["ok"] is True
        await ok(cluster.admin, ASSOCIATE_GROUP, scaling_group="gpu", user_group=lab)
        charged_to_lab = await _create(cluster, alice, "gpu", group="lab")
        assert charged_to_lab.status_code == 201, charged_to_lab.text
        to_default = await _create(cluster, alice, "gpu", group="default")
        assert to_default.status_code == 400, to_default.text
        assert to_default.json()["field"] == "config.scalingGroup"
        available = await alice.get("/scaling-groups", params={"group": "lab"})
        assert available.json() == {"scaling_groups": [{"name": "default"}, {"name": "gpu"}]}
        available = await alice.get("/scaling-groups", params={"group": "default"})
        assert available.json() == {"scaling_groups": [{"name": "default"}]}
        await ok(cluster.admin, DISSOCIATE_ALL_GROUP, group_id=lab)
        assert (await _create(cluster, alice, "gpu", group="lab")).status_code == 400


async def _user_id(cluster: Cluster, access_key: str) -> str:
    async with cluster.manager.db.begin() as db:
        found = await db.execute(sa.select(Keypair.user_id).where(Keypair.access_key == access_key))
        return str(found.scalar_one())


async def test_without_a_name_the_default_or_the_first_open_one(cluster: Cluster) -> None:
    await _gpu_cluster(cluster)
    alice, _ = await make_user(cluster, "alice@example.com")
    async with alice:
        await ok(cluster.admin, ASSOCIATE_DOMAIN, scaling_group="gpu", domain="default")
        first = await _create(cluster, alice)
        assert first.status_code == 201, first.text
        assert (await cluster.session(first.json()["sessionId"]))["scalingGroup"] == "default"

        await ok(cluster.admin, DISSOCIATE_DOMAIN, scaling_group="default", domain="default")
        second = await _create(cluster, alice)
        assert second.status_code == 201, second.text
        assert (await cluster.session(second.json()["sessionId"]))["scalingGroup"] == "gpu"

        await ok(cluster.admin, DISSOCIATE_ALL_DOMAIN, domain="default")
        before = await _session_count(cluster)
        none = await _create(cluster, alice)
        assert none.status_code == 400, none.text
        problem = none.json()
        assert problem["field"] == "config.scalingGroup"
        assert problem["received"] is None
        assert "No scaling group is open to your sessions" in problem["detail"]
        assert await _session_count(cluster) == before
        assert (await alice.get("/scaling-groups", params={"group": "default"})).json() == {
            "scaling_groups": []
        }


async def test_the_mutations_are_for_superadmins_and_idempotent(cluster: Cluster) -> None:
    await _gpu_cluster(cluster)
    project = await _project_id(cluster)
    dadmin, _ = await make_user(cluster, "dadmin@example.com", role="admin")
    alice, alice_key = await make_user(cluster, "alice@example.com")
    async with dadmin, alice:
        for client in (dadmin, alice):
            for document, variables in (
                (ASSOCIATE_DOMAIN, {"scaling_group": "gpu", "domain": "default"}),
                (DISSOCIATE_ALL_DOMAIN, {"domain": "default"}),
                (ASSOCIATE_GROUP, {"scaling_group": "gpu", "user_group": project}),
                (ASSOCIATE_KEYPAIR, {"scaling_group": "gpu", "access_key": alice_key}),
            ):
                assert "superadmin" in await refused(client, document, **variables)
            denied = await client.post(
                "/admin/scaling-groups/gpu/associations", json={"domain": "default"}
            )
            assert denied.status_code == 403
        await _refused(cluster, alice, "gpu")

        for _ in range(2):  # the second time: already associated, still ok
            answer = await ok(
                cluster.admin, ASSOCIATE_DOMAIN, scaling_group="gpu", domain="default"
            )
            assert answer["associate_scaling_group_with_domain"]["ok"] is True
            answer = await ok(
                cluster.admin, ASSOCIATE_GROUP, scaling_group="gpu", user_group=project
            )
            assert answer["associate_scaling_group_with_user_group"]["ok"] is True
        listed = await cluster.admin.get("/admin/scaling-groups/gpu/associations")
        assert listed.json() == {"domains": ["default"], "groups": [project], "keypairs": []}
        for _ in range(2):
            await ok(cluster.admin, DISSOCIATE_DOMAIN, scaling_group="gpu", domain="default")
        listed = await cluster.admin.get("/admin/scaling-groups/gpu/associations")
        assert listed.json() == {"domains": [], "groups": [project], "keypairs": []}


@pytest.mark.parametrize(
    ("document", "variables", "words"),
    [
        (
            ASSOCIATE_DOMAIN,
            {"scaling_group": "nope", "domain": "default"},
            "No scaling group 'nope'",
        ),
        (ASSOCIATE_DOMAIN, {"scaling_group": "gpu", "domain": "nope"}, "No domain 'nope'"),
        (DISSOCIATE_ALL_DOMAIN, {"domain": "nope"}, "No domain 'nope'"),
        (
            ASSOCIATE_GROUP,
            {"scaling_group": "gpu", "user_group": str(uuid.UUID(int=7))},
            f"No project (group) '{uuid.UUID(int=7)}'",
        ),
        (
            DISSOCIATE_GROUP,
            {"scaling_group": "gpu", "user_group": "not-a-uuid"},
            "No project (group) 'not-a-uuid'",
        ),
        (
            ASSOCIATE_KEYPAIR,
            {"scaling_group": "gpu", "access_key": "AKIANOSUCHKEY0000000"},
            "No keypair 'AKIANOSUCHKEY0000000'",
        ),
    ],
)
async def test_unknown_names_are_errors_naming_them(
    cluster: Cluster, document: str, variables: dict[str, str], words: str
) -> None:
    made = await cluster.admin.post("/admin/scaling-groups", json={"name": "gpu"})
    assert made.status_code == 201, made.text
    assert words in await refused(cluster.admin, document, **variables)


async def test_rest_associations_name_exactly_one_target(cluster: Cluster) -> None:
    made = await cluster.admin.post("/admin/scaling-groups", json={"name": "gpu"})
    assert made.status_code == 201, made.text
    path = "/admin/scaling-groups/gpu/associations"
    both = await cluster.admin.post(path, json={"domain": "default", "access_key": "AKIA"})
    assert both.status_code == 400
    assert both.json()["field"] == "domain|group|access_key"
    assert (await cluster.admin.delete(path)).status_code == 400
    opened = await cluster.admin.post(path, json={"domain": "default"})
    assert opened.json() == {"domains": ["default"], "groups": [], "keypairs": []}
    closed = await cluster.admin.delete(path, params={"domain": "default"})
    assert closed.json() == {"domains": [], "groups": [], "keypairs": []}
    unknown = await cluster.admin.get("/admin/scaling-groups/nope/associations")
    assert unknown.status_code == 404
    assert unknown.json()["field"] == "scaling_group"


async def test_deleting_a_scaling_group_or_a_domain_drops_its_associations(
    cluster: Cluster,
) -> None:
    made = await cluster.admin.post("/admin/scaling-groups", json={"name": "gpu"})
    assert made.status_code == 201, made.text
    await ok(cluster.admin, ASSOCIATE_DOMAIN, scaling_group="gpu", domain="default")
    deleted = await cluster.admin.delete("/admin/scaling-groups/gpu")
    assert deleted.status_code == 200, deleted.text
    again = await cluster.admin.post("/admin/scaling-groups", json={"name": "gpu"})
    assert again.status_code == 201, again.text
    listed = await cluster.admin.get("/admin/scaling-groups/gpu/associations")
    assert listed.json() == {"domains": [], "groups": [], "keypairs": []}


async def test_the_check_adds_no_statement_to_a_create(cluster: Cluster) -> None:
    """The association check rides on admission's one owner query (EXISTS columns): a
    create that uses an open scaling group, named or the default, runs no other statement
    over the association tables (no extra round trip)."""
    await cluster.add_agent("i-cpu")
    statements: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        statements.append(statement)

    engine = cluster.manager.db.engine.sync_engine
    sa.event.listen(engine, "before_cursor_execute", record)
    try:
        created = await _create(cluster, cluster.admin, "default")
        assert created.status_code == 201, created.text
        named = [s for s in statements if "sgroups_for" in s]
        statements.clear()
        unnamed = await _create(cluster, cluster.admin)
        assert unnamed.status_code == 201, unnamed.text
    finally:
        sa.event.remove(engine, "before_cursor_execute", record)
    assert len(named) == 1
    assert "FROM keypairs JOIN users" in named[0]
    assert len([s for s in statements if "sgroups_for" in s]) == 1
