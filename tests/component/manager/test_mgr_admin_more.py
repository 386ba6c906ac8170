"""The rest of the official client's admin commands: the announcement, Backend.AI's etcd
routes, image aliases through GraphQL, and the refusals (501 problems and GraphQL
errors naming what to use instead)."""

from __future__ import annotations

import pytest

from .cluster import Cluster
from .test_mgr_admin_gql import make_user, ok, refused

ALIAS = (
    "mutation ($alias: String!, $target: String!, $architecture: String) {"
    " alias_image(alias: $alias, target: $target, architecture: $architecture) { ok msg } }"
)
DEALIAS = "mutation ($alias: String!) { dealias_image(alias: $alias) { ok msg } }"
IMAGE = "query ($r: String!) { image(reference: $r) { name aliases } }"


async def test_announcement(cluster: Cluster) -> None:
    assert (await cluster.admin.get("/manager/announcement")).json() == {
        "enabled": False,
        "message": "",
    }
    posted = await cluster.admin.post(
        "/manager/announcement", json={"enabled": True, "message": "maintenance at 18:00"}
    )
    assert posted.status_code == 204, posted.text
    user, _ = await make_user(cluster, "u@example.com")
    async with user:
        seen = (await user.get("/manager/announcement")).json()
        assert seen == {"enabled": True, "message": "maintenance at 18:00"}
        denied = await user.post("/manager/announcement", json={"enabled": False})
        assert denied.status_code == 403
    assert await cluster.manager.store.get("manager/announcement") == "maintenance at 18:00"

    empty = await cluster.admin.post("/manager/announcement", json={"enabled": True})
    assert empty.status_code == 400
    assert empty.json()["field"] == "message"
    huge = await cluster.admin.post(
        "/manager/announcement", json={"enabled": True, "message": "x" * 10_001}
    )
    assert huge.status_code == 400
    assert "at most 10000" in huge.json()["detail"]

    removed = await cluster.admin.post("/manager/announcement", json={"enabled": False})
    assert removed.status_code == 204
    assert (await cluster.admin.get("/manager/announcement")).json()["enabled"] is False


async def test_backendai_etcd_routes(cluster: Cluster) -> None:
    async def call(route: str, **body: object) -> dict[str, object]:
        response = await cluster.admin.post(f"/config/{route}", json=body)
        assert response.status_code == 200, response.text
        answer: dict[str, object] = response.json()
        return answer

    assert await call("set", key="adm/one", value="x") == {"result": "ok"}
    assert await call("set", key="adm/n", value=1) == {"result": "ok"}
    assert await call("set", key="adm/tree", value={"a": "1", "b": {"c": "2"}}) == {"result": "ok"}
    assert await call("get", key="adm/one") == {"result": "x"}
    assert await call("get", key="adm/n") == {"result": "1"}
    assert await call("get", key="adm/tree/b/c") == {"result": "2"}
    assert await call("get", key="adm", prefix=True) == {
        "result": {"one": "x", "n": "1", "tree": {"a": "1", "b": {"c": "2"}}}
    }
    assert await call("delete", key="adm/one") == {"result": "ok"}
    assert await call("get", key="adm/one") == {"result": None}
    assert await call("delete", key="adm", prefix=True) == {"result": "ok"}
    assert await call("get", key="adm", prefix=True) == {"result": {}}

    bad = await cluster.admin.post("/config/set", json={"key": "adm/x", "value": [1]})
    assert bad.status_code == 400
    assert "value" in bad.text
    user, _ = await make_user(cluster, "u@example.com")
    async with user:
        denied = await user.post("/config/get", json={"key": "volumes", "prefix": True})
        assert denied.status_code == 403


@pytest.mark.parametrize(
    ("method", "path", "feature"),
    [
        ("GET", "/license", "license"),
        ("GET", "/resource/usage/month", "usage-statistics"),
        ("GET", "/resource/usage/period", "usage-statistics"),
        ("GET", "/resource/stats/user/month", "usage-statistics"),
        ("POST", "/resource/recalculate-usage", "recalculate-usage"),
        ("GET", "/resource/container-registries", "container-registries"),
        ("GET", "/config/docker-registries", "container-registries"),
        ("POST", "/manager/scheduler/operation", "scheduler-operation"),
    ],
)
async def test_refused_routes_say_what_to_use(
    cluster: Cluster, method: str, path: str, feature: str
) -> None:
    response = await cluster.admin.request(method, path)
    assert response.status_code == 501, response.text
    problem = response.json()
    assert problem["feature"] == feature
    assert problem["title"] == "Not supported by accelshare"
    assert "docs/compatibility.md" in problem["detail"]


async def test_folder_types(cluster: Cluster) -> None:
    """``admin resource vfolder-types``: user and project (group) folders."""
    response = await cluster.admin.get("/config/vfolder-types")
    assert response.status_code == 200, response.text
    assert response.json() == ["user", "group"]


async def test_image_alias_and_dealias(cluster: Cluster) -> None:
    added = await cluster.admin.post("/admin/images", json={"ref": "python:3.11"})
    assert added.status_code == 201, added.text
    made = await ok(cluster.admin, ALIAS, alias="py-latest", target="python:3.11")
    assert made["alias_image"]["ok"] is True
    assert "py-latest" in (await ok(cluster.admin, IMAGE, r="py-latest"))["image"]["aliases"]

    message = await refused(
        cluster.admin, ALIAS, alias="py-arm", target="python:3.11", architecture="aarch64"
    )
    assert message.startswith("architecture:")
    assert "aarch64" in message
    message = await refused(cluster.admin, ALIAS, alias="nothing", target="no-such-image")
    assert "no-such-image" in message

    user, _ = await make_user(cluster, "u@example.com")
    async with user:
        assert "superadmin" in await refused(user, DEALIAS, alias="py-latest")

    gone = await ok(cluster.admin, DEALIAS, alias="py-latest")
    assert gone["dealias_image"]["ok"] is True
    assert "py-latest" not in (await ok(cluster.admin, IMAGE, r="python:3.11"))["image"]["aliases"]
    assert "py-latest" in await refused(cluster.admin, DEALIAS, alias="py-latest")


@pytest.mark.parametrize(
    ("document", "variables", "says"),
    [
        (
            "mutation ($r: String) { rescan_images(registry: $r) { ok msg task_id } }",
            {"r": "docker.io"},
            "accelshare admin image add",
        ),
        (
            'query { quota_scope(storage_host_name: "local:volume1", quota_scope_id: "user:x")'
            " { quota_scope_id details { hard_limit_bytes } } }",
            {},
            "quota scopes",
        ),
        (
            "query { vfolder_host_permissions { vfolder_host_permission_list } }",
            {},
            "folder host permissions",
        ),
    ],
)
async def test_refused_graphql_says_what_to_use(
    cluster: Cluster, document: str, variables: dict[str, str], says: str
) -> None:
    message = await refused(cluster.admin, document, **variables)
    assert message.startswith("Not supported by accelshare: ")
    assert says in message
    assert "docs/compatibility.md" in message
