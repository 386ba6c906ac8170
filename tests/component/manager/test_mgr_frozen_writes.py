"""While the manager is frozen for maintenance, GraphQL mutations and the REST routes that
change what the manager records are refused with the 503 ``server-frozen`` problem that
``POST /session`` gets (Backend.AI's ``server_status_required(ALL_ALLOWED)`` and its
GraphQL mutation middleware); queries and the operator's own tools go on, and after
unfreezing the same requests succeed.  The folder routes: test_mgr_folders.py."""

from __future__ import annotations

from typing import Any

import httpx

from .cluster import Cluster
from .test_mgr_api import make_user

FROZEN_TITLE = "The server is frozen due to maintenance. Please try again later."

CREATE_KEYPAIR = """mutation Add($user_id: String!, $input: KeyPairInput!) {
  create_keypair(user_id: $user_id, props: $input) { ok keypair { access_key } } }"""
KEYPAIRS_OF = """query Keys($email: String) {
  keypair_list(limit: 100, offset: 0, email: $email) { items { access_key } total_count } }"""
SET_PRIORITY = """mutation ($id: String!) {
  modify_compute_session(input: {id: $id, priority: 3}) { item { priority } } }"""


async def set_status(cluster: Cluster, status: str) -> None:
    response = await cluster.admin.put("/manager/status", json={"status": status})
    assert response.status_code == 204, response.text


def assert_frozen(response: httpx.Response) -> None:
    assert response.status_code == 503, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    body = response.json()
    assert body["type"].endswith("/server-frozen"), body
    assert body["title"] == FROZEN_TITLE
    assert (body["field"], body["expected"], body["received"]) == (
        "manager status",
        "running",
        "frozen",
    )


async def gql(client: httpx.AsyncClient, query: str, **body: Any) -> httpx.Response:
    return await client.post("/admin/gql", json={"query": query, **body})


async def keypairs_of(cluster: Cluster, email: str) -> list[str]:
    body = await cluster.gql(KEYPAIRS_OF, {"email": email})
    return sorted(item["access_key"] for item in body["data"]["keypair_list"]["items"])


async def test_graphql_mutations_are_refused_while_frozen_and_queries_go_on(
    cluster: Cluster,
) -> None:
    await cluster.add_agent("i-node01")
    _, keypair = await make_user(cluster, "kp@example.com")
    user, _ = await make_user(cluster, "u@example.com")
    async with user:
        holder = await cluster.create({"cpu": 4}, name="holder", maxWaitSeconds=10)
        assert holder.json()["status"] == "RUNNING", holder.text
        waiting = await cluster.create({"cpu": 6}, name="waiting", maxWaitSeconds=1, client=user)
        assert waiting.json()["status"] == "PENDING", waiting.text
        session = {"id": waiting.json()["sessionId"]}
        before = await keypairs_of(cluster, "kp@example.com")
        assert before == [keypair["access_key"]]
        add = {"user_id": "kp@example.com", "input": {"resource_policy": "default"}}
        await set_status(cluster, "frozen")

        assert_frozen(await gql(cluster.admin, CREATE_KEYPAIR, variables=add))
        assert await keypairs_of(cluster, "kp@example.com") == before  # nothing was made
        assert_frozen(await gql(user, SET_PRIORITY, variables=session))  # a user's too
        assert (await cluster.session("waiting", client=user))["priority"] != 3

        # the operation that runs is what counts: one document, a query and a mutation
        both = f"{KEYPAIRS_OF}\n{CREATE_KEYPAIR}"
        picked = await gql(
            cluster.admin, both, operationName="Keys", variables={"email": "kp@example.com"}
        )
        assert picked.status_code == 200, picked.text
        assert picked.json()["data"]["keypair_list"]["total_count"] == 1
        assert_frozen(await gql(cluster.admin, both, operationName="Add", variables=add))
        # a query that merely says "mutation" (an alias, a string) is a query
        wordy = await gql(
            cluster.admin,
            'query { mutation: keypair_list(limit: 1, offset: 0, email: "mutation") '
            "{ total_count } }",
        )
        assert wordy.status_code == 200, wordy.text
        assert wordy.json() == {"data": {"mutation": {"total_count": 0}}}
        # without operationName strawberry runs the document's first operation
        first = await gql(cluster.admin, both, variables={"email": "kp@example.com", **add})
        assert first.status_code == 200, first.text
        assert first.json()["data"]["keypair_list"]["total_count"] == 1
        mutation_first = f"{CREATE_KEYPAIR}\n{KEYPAIRS_OF}"
        assert_frozen(await gql(cluster.admin, mutation_first, variables=add))
        # an operation the document lacks: strawberry's own answer, not the freeze's
        missing = await gql(cluster.admin, both, operationName="Nope", variables=add)
        assert missing.status_code == 400, missing.text
        assert await keypairs_of(cluster, "kp@example.com") == before

        await set_status(cluster, "running")
        made = await gql(cluster.admin, CREATE_KEYPAIR, variables=add)
        assert made.status_code == 200, made.text
        assert not made.json().get("errors"), made.text
        new_key = made.json()["data"]["create_keypair"]["keypair"]["access_key"]
        assert await keypairs_of(cluster, "kp@example.com") == sorted([*before, new_key])
        moved = await gql(user, SET_PRIORITY, variables=session)
        assert moved.json() == {"data": {"modify_compute_session": {"item": {"priority": 3}}}}


async def _records(cluster: Cluster) -> dict[str, Any]:
    """What the refused requests would have changed (keypairs without ``last_used_at``,
    which every signed request moves)."""

    async def get(path: str) -> Any:
        response = await cluster.admin.get(path)
        assert response.status_code == 200, response.text
        return response.json()

    keypairs = [
        {k: v for k, v in item.items() if k != "last_used_at"}
        for item in (await get("/admin/keypairs"))["items"]
    ]
    session = await cluster.session("holder")
    return {
        "users": await get("/admin/users"),
        "keypairs": keypairs,
        "policies": await get("/admin/resource-policies"),
        "scaling groups": await get("/admin/scaling-groups"),
        "images": await get("/images"),
        "session": (session["sessionName"], session["status"]),
    }


async def test_rest_admin_writes_and_a_session_rename_are_refused_while_frozen(
    cluster: Cluster,
) -> None:
    await cluster.add_agent("i-node01")
    holder = await cluster.create({"cpu": 1}, name="holder", maxWaitSeconds=10)
    assert holder.json()["status"] == "RUNNING", holder.text
    _, keypair = await make_user(cluster, "kp@example.com")
    access_key = keypair["access_key"]
    # in an order that succeeds once unfrozen (a delete after its create)
    writes: list[tuple[str, str, dict[str, Any] | None]] = [
        ("POST", "/admin/users", {"email": "late@example.com", "password": "long enough pw"}),
        ("PATCH", "/admin/users/kp@example.com", {"full_name": "Changed"}),
        ("POST", "/admin/keypairs", {"user_email": "kp@example.com"}),
        ("PATCH", f"/admin/keypairs/{access_key}", {"is_active": False}),
        ("POST", "/admin/resource-policies", {"name": "spare-policy"}),
        ("PATCH", "/admin/resource-policies/spare-policy", {"idle_timeout": 60}),
        ("DELETE", "/admin/resource-policies/spare-policy", None),
        ("POST", "/admin/scaling-groups", {"name": "spare"}),
        ("PATCH", "/admin/scaling-groups/spare", {"description": "spare nodes"}),
        ("DELETE", "/admin/scaling-groups/spare", None),
        ("POST", "/admin/images", {"ref": "frozen-lib:1.0"}),
        ("PUT", "/admin/image-aliases/frozen-lib", {"target": "frozen-lib:1.0"}),
        ("DELETE", "/admin/image-aliases/frozen-lib", None),
        ("DELETE", "/admin/images/frozen-lib:1.0", None),
        ("POST", "/session/holder/rename?name=renamed", None),
        ("DELETE", f"/admin/keypairs/{access_key}", None),
        ("DELETE", "/admin/users/kp@example.com", None),
    ]
    before = await _records(cluster)
    await set_status(cluster, "frozen")

    for method, path, body in writes:
        response = await cluster.admin.request(method, path, json=body)
        assert response.status_code == 503, f"{method} {path}: {response.text}"
        assert_frozen(response)
    assert await _records(cluster) == before
    # the credentials are checked first: a stranger gets its 401, not the freeze
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=cluster.app), base_url="http://127.0.0.1:8081"
    ) as stranger:
        assert (await stranger.post("/admin/scaling-groups", json={"name": "x"})).status_code == 401
    # reads and the operator's tools go on
    announced = await cluster.admin.post(
        "/manager/announcement", json={"enabled": True, "message": "maintenance until 18:00"}
    )
    assert announced.status_code == 204, announced.text
    assert (await cluster.admin.get("/images/frozen-lib:1.0")).status_code == 404

    await set_status(cluster, "running")
    for method, path, body in writes:
        response = await cluster.admin.request(method, path, json=body)
        assert response.status_code < 300, f"{method} {path}: {response.text}"
    assert (await cluster.session("renamed"))["status"] == "RUNNING"
