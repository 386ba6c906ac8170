"""The GraphQL root fields of the official client that accelshare lacked: ``forget_image``
and ``forget_image_by_id`` work (a superadmin removes an image from the catalogue), and
every root field of a feature accelshare does not have answers the clear refusal of
:data:`accelshare.api.gql_refused.REFUSED_ROOT_FIELDS` instead of graphql-core's
"Cannot query field" (the folder lists ``vfolder_own_list`` & co.: test_mgr_folders.py)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from accelshare.api.gql import schema
from accelshare.api.gql_refused import REFUSED_ROOT_FIELDS

from .cluster import Cluster
from .test_mgr_admin_gql import gql, make_user, ok, refused
from .test_mgr_frozen_writes import assert_frozen, set_status

FORGET_BY_ID = """mutation ($image_id: String!) {
  forget_image_by_id(image_id: $image_id) { ok msg image { id name tag aliases architecture } } }"""
FORGET = """mutation ($reference: String!, $architecture: String!) {
  forget_image(reference: $reference, architecture: $architecture) { ok msg image { id } } }"""
IMAGE = "query ($r: String!) { image(reference: $r) { id aliases } }"


async def add_image(cluster: Cluster, ref: str, **body: Any) -> None:
    response = await cluster.admin.post("/admin/images", json={"ref": ref, **body})
    assert response.status_code == 201, response.text


async def test_forget_image_removes_it_with_its_aliases(cluster: Cluster) -> None:
    await add_image(cluster, "forget-me:1.0", aliases=["forget-me-alias"])
    await add_image(cluster, "forget-me:2.0", architecture="aarch64")
    kept = await ok(cluster.admin, IMAGE, r="forget-me:2.0")

    # the client's `image forget REF`: the id is the reference (an alias names it too)
    by_id = await ok(cluster.admin, FORGET_BY_ID, image_id="forget-me-alias")
    assert by_id["forget_image_by_id"] == {
        "ok": True,
        "msg": "forget-me:1.0 is forgotten",
        "image": {
            "id": "forget-me:1.0",
            "name": "forget-me",
            "tag": "1.0",
            "aliases": ["forget-me-alias"],
            "architecture": "x86_64",
        },
    }
    assert (await ok(cluster.admin, IMAGE, r="forget-me:1.0"))["image"] is None
    assert (await ok(cluster.admin, IMAGE, r="forget-me-alias"))["image"] is None
    assert (await cluster.admin.get("/images/forget-me:1.0")).status_code == 404

    # `image forget REF --arch ARCH`: another architecture than the image's is refused
    wrong = await refused(cluster.admin, FORGET, reference="forget-me:2.0", architecture="x86_64")
    assert wrong == (
        "forget_image(architecture): forget-me:2.0 is an image for aarch64; expected"
        " 'aarch64', received 'x86_64'"
    )
    assert await ok(cluster.admin, IMAGE, r="forget-me:2.0") == kept
    done = await ok(cluster.admin, FORGET, reference="forget-me:2.0", architecture="aarch64")
    assert done["forget_image"] == {
        "ok": True,
        "msg": "forget-me:2.0 is forgotten",
        "image": {"id": "forget-me:2.0"},
    }
    assert (await ok(cluster.admin, IMAGE, r="forget-me:2.0"))["image"] is None


async def test_forget_image_needs_a_superadmin_and_a_known_image(cluster: Cluster) -> None:
    await add_image(cluster, "forget-kept:1.0")
    user, _ = await make_user(cluster, "u@example.com")
    admin, _ = await make_user(cluster, "dadmin@example.com", role="admin")
    async with user, admin:
        for client in (user, admin):
            denied = await refused(client, FORGET_BY_ID, image_id="forget-kept:1.0")
            assert denied.startswith("This needs the superadmin role"), denied
            assert (await ok(client, IMAGE, r="forget-kept:1.0"))["image"] is not None
    unknown = await refused(cluster.admin, FORGET_BY_ID, image_id="no-such-image:1.0")
    assert unknown == "No image or alias 'no-such-image:1.0'"
    unknown = await refused(
        cluster.admin, FORGET, reference="no-such-image:1.0", architecture="x86_64"
    )
    assert unknown == "No image or alias 'no-such-image:1.0'"


async def test_forget_image_is_refused_while_frozen(cluster: Cluster) -> None:
    await add_image(cluster, "forget-frozen:1.0")
    await set_status(cluster, "frozen")
    try:
        assert_frozen(
            await cluster.admin.post(
                "/admin/gql",
                json={"query": FORGET_BY_ID, "variables": {"image_id": "forget-frozen:1.0"}},
            )
        )
    finally:
        await set_status(cluster, "running")
    assert (await ok(cluster.admin, IMAGE, r="forget-frozen:1.0"))["image"] is not None


def _document(name: str) -> str:
    """The field with arguments, variables and a nested sub-selection of fields no type
    has: the refusal must be its only error."""
    kind = "query" if REFUSED_ROOT_FIELDS[name].root == "Query" else "mutation"
    return (
        f"{kind} ($v: String, $n: Int) {{ {name}(x: $v, first: $n, id: 1)"
        " { edges { node { no_such_field row_id } } count ok msg } }"
    )


@pytest.mark.parametrize("name", sorted(REFUSED_ROOT_FIELDS))
async def test_refused_root_fields_say_what_to_use(cluster: Cluster, name: str) -> None:
    refusal = REFUSED_ROOT_FIELDS[name]
    body = await gql(cluster.admin, _document(name), v="x", n=3)
    assert body["data"] is None
    assert [e["message"] for e in body["errors"]] == [refusal.message]
    assert refusal.message.startswith(f"Not supported by accelshare: {refusal.feature}. ")
    assert refusal.message.endswith(" (see docs/compatibility.md)")


@pytest.mark.parametrize(
    ("document", "variables", "feature"),
    [
        # the client's own documents (ai.backend.client 25.5.2, func/*.py)
        (
            "query($limit:Int, $after:String, $offset:Int, $before:String, $filter: String,"
            " $order: String) { networks(first:$limit, offset:$offset, after:$after,"
            " before:$before filter:$filter, order:$order) { edges { node { id row_id name"
            " project created_at } cursor } count } }",
            {"limit": 20, "offset": 0, "after": None, "before": None},
            "inter-session networks",
        ),
        (
            "query($limit:Int!, $offset:Int!, $filter:String, $order:String) {"
            " endpoint_list(limit:$limit, offset:$offset, filter:$filter, order:$order) {"
            " items { endpoint_id name image model domain project resource_group"
            " resource_slots url open_to_public } total_count } }",
            {"limit": 20, "offset": 0},
            "model serving",
        ),
        (
            "query { customized_images { id name registry architecture tag size_bytes"
            " customized_image { id } } }",
            {},
            "customized images (sessions committed as images)",
        ),
        (
            "query($id: String!) { group_node(id: $id) { registry_quota } }",
            {"id": "Z3JvdXBfbm9kZTp4"},
            "container registry quotas",
        ),
        (
            "mutation($id: String!) { untag_image_from_registry(id: $id) { ok msg } }",
            {"id": "x"},
            "untagging images in a registry",
        ),
        (
            "query { vfolder_host_permission_list }",
            {},
            "folder host permissions",
        ),
    ],
)
async def test_the_clients_refused_documents(
    cluster: Cluster, document: str, variables: dict[str, Any], feature: str
) -> None:
    user, _ = await make_user(cluster, "u@example.com")
    async with user:  # any role: the refusal comes before anything runs
        for client in (cluster.admin, user):
            body = await gql(client, document, **variables)
            assert body["data"] is None
            assert len(body["errors"]) == 1, body
            assert body["errors"][0]["message"].startswith(
                f"Not supported by accelshare: {feature}. "
            )


async def test_other_unknown_fields_keep_graphql_cores_message(cluster: Cluster) -> None:
    assert await refused(cluster.admin, "query { no_such_root { x } }") == (
        "Cannot query field 'no_such_root' on type 'Query'."
    )
    # a refused mutation asked as a query, a refused name below the root: not the table's
    assert await refused(cluster.admin, "query { create_network { ok } }") == (
        "Cannot query field 'create_network' on type 'Query'."
    )
    assert await refused(cluster.admin, "query { images { networks } }") == (
        "Cannot query field 'networks' on type 'ImageNode'."
    )
    typo = await refused(cluster.admin, "query { vfolder_own_lists(limit: 1) { total_count } }")
    assert typo.startswith("Cannot query field 'vfolder_own_lists' on type 'Query'. Did you mean")
    # one refused field among valid ones: the document is refused as a whole
    body = await gql(cluster.admin, "query { images { id } networks { count } }")
    assert body["data"] is None
    assert [e["message"] for e in body["errors"]] == [REFUSED_ROOT_FIELDS["networks"].message]
    # every other validation rule still runs
    both = await gql(cluster.admin, "query { networks { count } images { no_such } }")
    assert [e["message"] for e in both["errors"]] == [
        REFUSED_ROOT_FIELDS["networks"].message,
        "Cannot query field 'no_such' on type 'ImageNode'.",
    ]


def test_the_table_names_only_fields_the_schema_lacks() -> None:
    graphql_schema = schema._schema
    defined = set(graphql_schema.query_type.fields)  # type: ignore[union-attr]
    assert graphql_schema.mutation_type is not None
    defined |= set(graphql_schema.mutation_type.fields)
    assert not set(REFUSED_ROOT_FIELDS) & defined
    assert {"vfolder_own_list", "forget_image", "forget_image_by_id"} <= defined


async def test_cost_limits_and_the_freeze_come_before_the_refusal(cluster: Cluster) -> None:
    aliased = " ".join(f"a{i}: networks {{ count }}" for i in range(40))
    too_complex = await cluster.admin.post("/admin/gql", json={"query": f"query {{ {aliased} }}"})
    assert too_complex.status_code == 400, too_complex.text
    assert too_complex.json()["limit"] == "max-aliases"
    await set_status(cluster, "frozen")
    try:
        response: httpx.Response = await cluster.admin.post(
            "/admin/gql", json={"query": 'mutation { create_network(name: "n") { ok } }'}
        )
        assert_frozen(response)
        # a query is not frozen: its refusal is the table's
        still = await gql(cluster.admin, "query { networks { count } }")
        assert still["errors"][0]["message"] == REFUSED_ROOT_FIELDS["networks"].message
    finally:
        await set_status(cluster, "running")
