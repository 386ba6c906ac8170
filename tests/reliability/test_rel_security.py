"""Security: every endpoint's role, signature attacks, cross-user access, secrets.

The role matrix walks the OpenAPI document, so a route added later is checked too: it
must be classified in :data:`ROUTE_ROLES` (public, cluster secret, or the least role),
refuse anonymous callers unless public, and give each role (user, admin, superadmin)
exactly what the table says.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import stat
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from accelshare.api.gql_limits import GraphQLLimits
from accelshare.api.signing import sign_request
from accelshare.manager.clock import utcnow
from accelshare.manager.config import ENV_CLUSTER_SECRET
from component.manager.cluster import SECRET, Cluster, running_cluster

# Every documented operation and who may call it: "public" (anyone), "cluster-secret"
# (agents only: no user signature opens it), or the least role.  The walk below fails on
# an operation of the OpenAPI document missing here (classify a new route when you add
# it) and on an entry the document no longer has.
ROUTE_ROLES: dict[tuple[str, str], str] = {
    ("GET", "/"): "public",
    ("GET", "/health"): "public",
    ("GET", "/metrics"): "public",
    ("POST", "/auth/login"): "public",
    ("GET", "/whoami"): "user",
    ("GET", "/auth/role"): "user",
    ("POST", "/auth/logout"): "user",
    ("GET", "/auth/csrf"): "user",  # a login cookie's token; signed: 403
    ("GET", "/manager/announcement"): "user",
    ("POST", "/manager/announcement"): "superadmin",
    ("GET", "/manager/status"): "superadmin",
    ("PUT", "/manager/status"): "superadmin",
    ("GET", "/scaling-groups"): "user",  # the projects the caller belongs to
    ("POST", "/session"): "user",
    ("GET", "/sessions"): "user",
    ("GET", "/session/{ref}"): "user",
    ("DELETE", "/session/{ref}"): "user",
    ("GET", "/session/{ref}/logs"): "user",
    ("GET", "/session/{ref}/why"): "user",
    ("GET", "/session/{ref}/events"): "user",
    ("POST", "/session/{ref}"): "user",  # Backend.AI's execute API (owner or superadmin)
    ("PATCH", "/session/{ref}"): "user",  # restart
    ("POST", "/session/{ref}/rename"): "user",
    ("GET", "/session/{ref}/status-history"): "user",
    ("POST", "/session/{ref}/upload"): "user",  # session files (owner or superadmin)
    # storage folders: any user; who may use which folder is checked per folder (a 404
    # as if it did not exist, or a 403 for a read-only share), not by role
    ("DELETE", "/folders"): "user",
    ("DELETE", "/folders/invitations/delete"): "user",
    ("DELETE", "/folders/{name}/delete-files"): "user",
    ("DELETE", "/folders/{name}/unshare"): "user",
    ("GET", "/folders"): "user",
    ("GET", "/config/vfolder-types"): "user",
    ("GET", "/folders/_/all_hosts"): "user",
    ("GET", "/folders/_/allowed_types"): "user",
    ("GET", "/folders/_/hosts"): "user",
    ("GET", "/folders/_/id"): "user",
    ("GET", "/folders/invitations/list"): "user",
    ("GET", "/folders/{name}"): "user",
    ("GET", "/folders/{name}/files"): "user",
    ("POST", "/folders"): "user",
    ("POST", "/folders/delete-from-trash-bin"): "user",
    ("POST", "/folders/invitations/accept"): "user",
    ("POST", "/folders/purge"): "user",
    ("POST", "/folders/restore-from-trash-bin"): "user",
    ("POST", "/folders/{name}/clone"): "user",
    ("POST", "/folders/{name}/invite"): "user",
    ("POST", "/folders/{name}/leave"): "user",
    ("POST", "/folders/{name}/mkdir"): "user",
    ("POST", "/folders/{name}/move-file"): "user",
    ("POST", "/folders/{name}/rename"): "user",
    ("POST", "/folders/{name}/rename-file"): "user",
    ("POST", "/folders/{name}/request-download"): "user",
    ("POST", "/folders/{name}/request-upload"): "user",
    ("POST", "/folders/{name}/share"): "user",
    ("POST", "/folders/{name}/update-options"): "user",
    ("GET", "/folders/_/shared"): "user",  # the shares of the folders the caller manages
    ("POST", "/folders/_/shared"): "user",
    ("POST", "/folders/_/change-ownership"): "superadmin",
    ("GET", "/session/{ref}/download"): "user",
    ("POST", "/session/{ref}/download"): "user",
    ("GET", "/session/{ref}/files"): "user",
    ("GET", "/events/session"): "user",  # Backend.AI's session events
    ("GET", "/events/background-task"): "user",
    ("GET", "/stream/session/{ref}/apps"): "user",
    ("GET", "/events/sessions"): "user",
    ("GET", "/config/resource-slots"): "user",
    ("GET", "/config/resource-slots/details"): "user",
    ("GET", "/config/resource-slots/limits"): "user",
    ("POST", "/admin/gql"): "user",  # each query checks its own role (see the GraphQL test)
    ("GET", "/agents"): "admin",  # read-only; other domains' sessions anonymised
    ("GET", "/agents/{agent_id}"): "admin",
    ("GET", "/agents/{agent_id}/alloc-map"): "admin",
    ("GET", "/agents/{agent_id}/stats"): "admin",
    ("GET", "/events/agents"): "admin",
    ("GET", "/admin/users"): "admin",
    ("POST", "/admin/users"): "admin",
    ("PATCH", "/admin/users/{email}"): "admin",
    ("DELETE", "/admin/users/{email}"): "admin",
    ("GET", "/admin/keypairs"): "admin",
    ("POST", "/admin/keypairs"): "admin",
    ("PATCH", "/admin/keypairs/{access_key}"): "admin",
    ("DELETE", "/admin/keypairs/{access_key}"): "admin",
    ("GET", "/admin/etcd"): "superadmin",
    ("PUT", "/admin/etcd"): "superadmin",
    ("DELETE", "/admin/etcd"): "superadmin",
    ("POST", "/config/get"): "superadmin",  # Backend.AI's etcd routes
    ("POST", "/config/set"): "superadmin",
    ("POST", "/config/delete"): "superadmin",
    ("GET", "/admin/resource-policies"): "superadmin",
    ("POST", "/admin/resource-policies"): "superadmin",
    ("PATCH", "/admin/resource-policies/{name}"): "superadmin",
    ("DELETE", "/admin/resource-policies/{name}"): "superadmin",
    ("GET", "/admin/scaling-groups"): "superadmin",
    ("POST", "/admin/scaling-groups"): "superadmin",
    ("PATCH", "/admin/scaling-groups/{name}"): "superadmin",
    ("DELETE", "/admin/scaling-groups/{name}"): "superadmin",
    ("GET", "/admin/scaling-groups/{name}/associations"): "superadmin",
    ("POST", "/admin/scaling-groups/{name}/associations"): "superadmin",
    ("DELETE", "/admin/scaling-groups/{name}/associations"): "superadmin",
    ("GET", "/images"): "user",
    ("GET", "/images/{name}"): "user",
    ("POST", "/admin/images"): "superadmin",
    ("DELETE", "/admin/images/{name}"): "superadmin",
    ("PUT", "/admin/image-aliases/{alias}"): "superadmin",
    ("DELETE", "/admin/image-aliases/{alias}"): "superadmin",
    # a session's apps: its owner (and the superadmin; domain admins get 403 "not-owner",
    # by design: docs/manager.md); the WebSocket routes are tested in test_mgr_terminal.py
    ("GET", "/session/{ref}/apps"): "user",
    **{
        (method, "/session/{ref}/apps/{name}/{path}"): "user"
        for method in ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
    },
    ("POST", "/internal/agents/heartbeat"): "cluster-secret",
    ("POST", "/internal/agents/events"): "cluster-secret",
}
RANK = {"user": 0, "admin": 1, "superadmin": 2}
# Live event streams never end; an in-process client would wait for their end, so
# only the refusals are checked there.
ENDLESS = {"/events/sessions", "/events/agents", "/events/session"}


def operations(app: Any) -> list[tuple[str, str, str]]:
    """(method, concrete path, templated path) for every documented operation."""
    found = []
    for template, item in app.openapi()["paths"].items():
        path = re.sub(r"\{[^}]+\}", "x-probe", template)
        found.extend((method.upper(), path, template) for method in item if method != "parameters")
    return found


async def make_user(
    cluster: Cluster, email: str, role: str = "user", domain: str | None = None
) -> tuple[httpx.AsyncClient, dict[str, Any]]:
    body: dict[str, Any] = {"email": email, "password": "long enough password", "role": role}
    if domain:
        body["domain_name"] = domain
    response = await cluster.admin.post("/admin/users", json=body)
    assert response.status_code == 201, response.text
    keypair = response.json()["keypair"]
    return cluster.client(keypair["access_key"], keypair["secret_key"]), keypair


async def test_every_endpoint_refuses_who_lacks_the_role(sqlite_cluster: Cluster) -> None:
    """Every operation of the OpenAPI document, as nobody, a user, an admin and the
    superadmin: refused with 401 (anonymous) or 403 ``insufficient-role`` below its
    role; at or above it never an ``insufficient-role`` 403 and never a 5xx."""
    cluster = sqlite_cluster
    user, _ = await make_user(cluster, "u@example.com")
    admin, _ = await make_user(cluster, "a@example.com", role="admin")
    ops = operations(cluster.app)
    documented = {(method, template) for method, _, template in ops}
    assert sorted(documented - set(ROUTE_ROLES)) == [], "classify these routes in ROUTE_ROLES"
    assert sorted(set(ROUTE_ROLES) - documented) == [], "stale entries in ROUTE_ROLES"
    checked: dict[str, int] = {"anonymous": 0, "user": 0, "admin": 0, "superadmin": 0}
    async with user, admin:
        callers = (("user", user), ("admin", admin), ("superadmin", cluster.admin))
        for method, path, template in ops:
            need = ROUTE_ROLES[(method, template)]
            if need == "public":
                if template not in ENDLESS:
                    anyone = await cluster.admin.request(method, path, auth=None, json={})
                    assert anyone.status_code not in (401, 403), (method, template, anyone.text)
                    assert anyone.status_code < 500, (method, template, anyone.text)
                continue
            anonymous = await cluster.admin.request(method, path, auth=None, json={})
            assert anonymous.status_code == 401, (method, template, anonymous.text)
            assert anonymous.headers["content-type"] == "application/problem+json"
            checked["anonymous"] += 1
            for role, client in callers:
                if need == "cluster-secret":  # a user's signature, even the superadmin's
                    response = await client.request(method, path, json={})
                    assert response.status_code == 401, (role, method, template, response.text)
                    checked[role] += 1
                    continue
                if template in ENDLESS and RANK[role] >= RANK[need]:
                    continue
                response = await client.request(method, path, json={})
                refused = response.status_code == 403
                if RANK[role] < RANK[need]:
                    assert refused, (role, method, template, response.status_code)
                    assert response.json()["reason"] == "insufficient-role"
                else:
                    insufficient = refused and response.json().get("reason") == "insufficient-role"
                    assert not insufficient, (role, method, template, response.text)
                    assert response.status_code < 500, (role, method, template, response.text)
                checked[role] += 1
    non_public = sum(1 for role in ROUTE_ROLES.values() if role != "public")
    assert checked["anonymous"] == non_public, checked
    # every caller went through every non-public operation but the endless streams
    for role in ("user", "admin", "superadmin"):
        skipped = sum(
            1
            for (method, template), need in ROUTE_ROLES.items()
            if template in ENDLESS and need in RANK and RANK[role] >= RANK[need]
        )
        assert checked[role] == non_public - skipped, (role, checked)


async def test_internal_endpoints_need_the_cluster_secret(sqlite_cluster: Cluster) -> None:
    cluster = sqlite_cluster
    agent = await cluster.add_agent("i-node01")
    body = agent.heartbeat_message().model_dump_json()
    creds = cluster.creds
    for path in ("/internal/agents/heartbeat", "/internal/agents/events"):
        for headers in (
            {},
            {"X-Accelshare-Cluster-Secret": ""},
            {"X-Accelshare-Cluster-Secret": SECRET[:-1]},
            {"X-Accelshare-Cluster-Secret": SECRET + "x"},
            {"X-Accelshare-Cluster-Secret": creds.secret_key},  # a user's secret is not it
        ):
            response = await cluster.internal.post(
                path, content=body, headers={"Content-Type": "application/json", **headers}
            )
            assert response.status_code == 401, (path, headers, response.text)
        # a superadmin's signature does not open the agents' endpoints either
        signed = await cluster.admin.post(path, content=body)
        assert signed.status_code == 401, (path, signed.text)


def _signed(
    cluster: Cluster,
    *,
    method: str = "GET",
    path_query: str = "/sessions",
    host: str = "127.0.0.1:8081",
    delta: timedelta = timedelta(0),
    access_key: str | None = None,
    secret_key: str | None = None,
) -> dict[str, str]:
    return sign_request(
        access_key=access_key or cluster.creds.access_key,
        secret_key=secret_key or cluster.creds.secret_key,
        method=method,
        path_query=path_query,
        host=host,
        now=utcnow() + delta,
    )


async def test_signature_attacks(sqlite_cluster: Cluster) -> None:
    cluster = sqlite_cluster
    _, keypair = await make_user(cluster, "victim@example.com")
    raw = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=cluster.app), base_url="http://127.0.0.1:8081"
    )
    cases: list[tuple[str, str, str, dict[str, str], str]] = [
        # (case, method, path sent, headers, reason)
        ("good", "GET", "/sessions", _signed(cluster), ""),
        (
            "expired",
            "GET",
            "/sessions",
            _signed(cluster, delta=-timedelta(minutes=16)),
            "date-expired",
        ),
        (
            "future",
            "GET",
            "/sessions",
            _signed(cluster, delta=timedelta(minutes=16)),
            "date-in-future",
        ),
        ("other-path", "GET", "/agents", _signed(cluster), "signature-mismatch"),
        (
            "other-method",
            "DELETE",
            "/session/nope",
            _signed(cluster, path_query="/session/nope"),
            "signature-mismatch",
        ),
        (
            "wrong-host",
            "GET",
            "/sessions",
            _signed(cluster, host="evil.example"),
            "signature-mismatch",
        ),
        (
            "tampered-query",
            "GET",
            "/sessions?limit=1000",
            _signed(cluster, path_query="/sessions?limit=1"),
            "signature-mismatch",
        ),
        (
            "added-query",
            "GET",
            "/sessions?status=all",
            _signed(cluster),
            "signature-mismatch",
        ),
        (
            "unknown-key",
            "GET",
            "/sessions",
            _signed(cluster, access_key="AKIAUNKNOWNUNKNOWN00"),
            "unknown-access-key",
        ),
        (
            "another-users-key-my-secret",
            "GET",
            "/sessions",
            _signed(cluster, access_key=keypair["access_key"]),
            "signature-mismatch",
        ),
    ]
    async with raw:
        for case, method, path, headers, reason in cases:
            response = await raw.request(method, path, headers=headers)
            if not reason:
                assert response.status_code == 200, (case, response.text)
                continue
            assert response.status_code == 401, (case, response.text)
            assert response.headers["content-type"] == "application/problem+json", case
            assert response.json()["reason"] == reason, (case, response.json())
        # a date header that was changed after signing
        headers = _signed(cluster)
        headers["Date"] = _signed(cluster, delta=timedelta(minutes=1))["Date"]
        response = await raw.get("/sessions", headers=headers)
        assert response.json()["reason"] == "signature-mismatch"
        # inactive key and inactive user: refused even with a good signature
        patched = await cluster.admin.patch(
            f"/admin/keypairs/{keypair['access_key']}", json={"is_active": False}
        )
        assert patched.status_code == 200
        signed = _signed(
            cluster, access_key=keypair["access_key"], secret_key=keypair["secret_key"]
        )
        response = await raw.get("/sessions", headers=signed)
        assert response.json()["reason"] == "inactive-access-key"
        await cluster.admin.patch(
            f"/admin/keypairs/{keypair['access_key']}", json={"is_active": True}
        )
        deleted = await cluster.admin.delete("/admin/users/victim@example.com")
        assert deleted.status_code == 200, deleted.text
        signed = _signed(
            cluster, access_key=keypair["access_key"], secret_key=keypair["secret_key"]
        )
        response = await raw.get("/sessions", headers=signed)
        assert response.status_code == 401
        assert response.json()["reason"] in ("inactive-access-key", "inactive-user")


async def test_only_the_api_versions_spoken_are_accepted(sqlite_cluster: Cluster) -> None:
    """A correctly signed request in another API version: 400 listing the versions (the
    one Backend.AI's 25.x client negotiates stays accepted)."""
    cluster = sqlite_cluster
    raw = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=cluster.app), base_url="http://127.0.0.1:8081"
    )
    async with raw:
        for version in ("v4.20190315", "v9.20250722", "v8.20240915 ", "x" * 300):
            headers = sign_request(
                access_key=cluster.creds.access_key,
                secret_key=cluster.creds.secret_key,
                method="GET",
                path_query="/sessions",
                host="127.0.0.1:8081",
                now=utcnow(),
                api_version=version,
            )
            response = await raw.get("/sessions", headers=headers)
            assert response.status_code == 400, (version, response.text)
            problem = response.json()
            assert problem["reason"] == "unsupported-version"
            assert problem["supported"] == ["v8.20240915"]
            assert "this manager speaks v8.20240915" in problem["detail"]
        response = await raw.get("/sessions", headers=_signed(cluster))
        assert response.status_code == 200, response.text
        assert (await raw.get("/")).json()["version"] == "v8.20240915"


async def test_cross_user_access_is_refused(sqlite_cluster: Cluster) -> None:
    cluster = sqlite_cluster
    await cluster.add_agent("i-node01")
    alice, _ = await make_user(cluster, "alice@example.com")
    bob, _ = await make_user(cluster, "bob@example.com")
    async with alice, bob:
        created = await cluster.create(
            {"cuda.shares": "0.1"}, client=alice, name="alices", maxWaitSeconds=10
        )
        assert created.json()["status"] == "RUNNING", created.text
        sid = created.json()["sessionId"]
        kernel = (await alice.get(f"/session/{sid}")).json()["kernels"][0]["kernelId"]
        for path in (
            f"/session/{sid}",
            f"/session/{sid}/logs",
            f"/session/{sid}/why",
            f"/session/{sid}/events",
            "/session/alices",
            f"/session/{kernel}",
        ):
            response = await bob.get(path)
            assert response.status_code == 404, (path, response.text)
            assert response.headers["content-type"] == "application/problem+json", path
            assert "kernels" not in response.json(), path
            assert "hollow kernel" not in response.text, path  # no log line leaks
        assert (await bob.delete(f"/session/{sid}")).status_code == 404
        assert (await bob.delete("/session/alices")).status_code == 404
        listed = (await bob.get("/sessions", params={"status": "all"})).json()
        assert listed["total"] == 0
        for path in ("/agents/i-node01/alloc-map", "/agents/i-node01", "/agents/i-node01/stats"):
            response = await bob.get(path)
            assert response.status_code == 403, (path, response.text)
            assert "0.1" not in response.text
        gql = await bob.post(
            "/admin/gql",
            json={"query": "{ compute_session_list { total_count items { name status } } }"},
        )
        assert gql.json()["data"]["compute_session_list"]["total_count"] == 0
        # alice's session survived bob's attempts
        assert (await alice.get(f"/session/{sid}")).json()["status"] == "RUNNING"


@pytest.mark.parametrize(
    "name",
    [
        "CUDA_VISIBLE_DEVICES",
        "NVIDIA_VISIBLE_DEVICES",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
        "BACKENDAI_MOCK_CUDA_DEVICES",
        "BACKENDAI_MOCK_CUDA_DEVICE_COUNT",
        "ACCELSHARE_RESOURCE_TXT",
    ],
)
async def test_a_request_cannot_set_the_accelerators_environment(
    sqlite_cluster: Cluster, name: str
) -> None:
    """A session holding no GPU cannot name one through its environment: 400 naming the
    variable, nothing created."""
    cluster = sqlite_cluster
    await cluster.add_agent("i-node01")
    user, _ = await make_user(cluster, "gpuless@example.com")
    async with user:
        response = await cluster.create(
            {"cpu": "1"}, client=user, name="sneaky", config={"environ": {name: "GPU-0"}}
        )
        assert response.status_code == 400, response.text
        problem = response.json()
        assert response.headers["content-type"] == "application/problem+json"
        assert problem["field"] == "config.environ"
        assert f"{name} is set by the agent" in problem["detail"]
        assert (await user.get("/sessions", params={"status": "all"})).json()["total"] == 0
        # the app services' variables stay the creator's to declare
        response = await cluster.create(
            {"cpu": "1"},
            client=user,
            name="fine",
            config={"environ": {"BACKENDAI_SERVICE_PORT_WEB": "8080", "MY_VAR": "a\tb\nc"}},
        )
        assert response.status_code == 201, response.text


@pytest.mark.parametrize(
    ("body", "field", "detail"),
    [
        pytest.param(
            {"startupCommand": "echo hi\u0000; rm -rf ~"},
            "startupCommand",
            "startupCommand holds the control character U+0000 at position 7",
            id="nul-in-startup-command",
        ),
        pytest.param(
            {"startupCommand": "echo \u001b]0;title\u0007"},
            "startupCommand",
            "U+001B at position 5",
            id="escape-in-startup-command",
        ),
        pytest.param(
            {"config": {"environ": {"A": "x\u0000y"}}},
            "config.environ",
            "config.environ.A holds the control character U+0000 at position 1",
            id="nul-in-environ-value",
        ),
        pytest.param(
            {"config": {"environ": {"A\u0000B": "1"}}},
            "config.environ",
            "is not an environment variable name: expected a POSIX variable name",
            id="nul-in-environ-name",
        ),
        pytest.param(
            {"config": {"environ": {"MY-VAR": "1"}}},
            "config.environ",
            "'MY-VAR' is not an environment variable name",
            id="environ-name-not-posix",
        ),
        pytest.param(
            {"name": "mine\n"}, "name", "a session name is 1-64 letters", id="session-name-newline"
        ),
    ],
)
async def test_control_characters_and_bad_names_are_refused_at_the_api(
    sqlite_cluster: Cluster, body: dict[str, Any], field: str, detail: str
) -> None:
    cluster = sqlite_cluster
    await cluster.add_agent("i-node01")
    payload: dict[str, Any] = {"image": "python:3.11", "name": "ctl", **body}
    payload["config"] = {"resources": {"cpu": "1"}, **payload.get("config", {})}
    response = await cluster.admin.post("/session", json=payload)
    assert response.status_code == 400, response.text
    problem = response.json()
    assert problem["field"] == field, problem
    assert detail in problem["detail"], problem
    listed = (await cluster.admin.get("/sessions", params={"status": "all"})).json()
    assert listed["total"] == 0


async def test_emails_are_one_account_regardless_of_case(sqlite_cluster: Cluster) -> None:
    cluster = sqlite_cluster
    _, keypair = await make_user(cluster, "UserA@Example.com")
    body = {"email": "usera@example.com", "password": "long enough password"}
    clash = await cluster.admin.post("/admin/users", json=body)
    assert clash.status_code == 409, clash.text
    assert clash.json()["field"] == "email"
    assert clash.json()["detail"] == (
        "A user with the email usera@example.com exists (UserA@Example.com: addresses"
        " differ only in case)"
    )
    users = (await cluster.admin.get("/admin/users")).json()["items"]
    assert [u["email"] for u in users if u["email"].lower() == "usera@example.com"] == [
        "UserA@Example.com"
    ]
    # Any spelling names the one account: the login, the admin routes.
    raw = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=cluster.app), base_url="http://127.0.0.1:8081"
    )
    async with raw:
        login = await raw.post(
            "/auth/login", json={"email": "USERA@EXAMPLE.COM", "password": "long enough password"}
        )
        assert login.status_code == 200, login.text
        assert login.json()["email"] == "UserA@Example.com"
    keypairs = await cluster.admin.get(
        "/admin/keypairs", params={"user_email": "usera@EXAMPLE.com"}
    )
    assert [k["access_key"] for k in keypairs.json()["items"]] == [keypair["access_key"]]
    patched = await cluster.admin.patch("/admin/users/USERA@example.com", json={"full_name": "A"})
    assert patched.json()["user"]["email"] == "UserA@Example.com", patched.text


@pytest.mark.parametrize(
    ("method", "path", "body", "field"),
    [
        ("POST", "/admin/users", {"email": "a\u0000b@example.com"}, "email"),
        ("POST", "/admin/users", {"email": "ab@example.com\u001b[0m"}, "email"),
        ("POST", "/admin/users", {"email": "c@example.com", "username": "c\u0000"}, "username"),
        ("POST", "/admin/users", {"email": "d@example.com", "full_name": "D\u0007"}, "full_name"),
        ("PATCH", "/admin/users/admin@accelshare.local", {"full_name": "x\u0000"}, "full_name"),
        ("POST", "/admin/keypairs", {"user_email": "admin@accelshare.local\u0000"}, "user_email"),
        ("POST", "/auth/login", {"email": "admin@accelshare.local\u0000"}, "email"),
    ],
)
async def test_nul_and_control_characters_in_emails_and_names_are_refused(
    sqlite_cluster: Cluster, method: str, path: str, body: dict[str, Any], field: str
) -> None:
    cluster = sqlite_cluster
    before = (await cluster.admin.get("/admin/users")).json()["items"]
    payload = {"password": "long enough password", **body} if "keypairs" not in path else body
    response = await cluster.admin.request(method, path, json=payload)
    assert response.status_code == 400, response.text
    problem = response.json()
    assert problem["field"] == field, problem
    assert "control character U+00" in problem["detail"], problem
    assert (await cluster.admin.get("/admin/users")).json()["items"] == before
    listed = await cluster.admin.get("/admin/keypairs", params={"user_email": "x\u0000@y"})
    assert listed.status_code == 400
    assert listed.json()["field"] == "user_email"


async def test_an_app_page_cannot_use_the_login_on_the_apps_origin(tmp_path: Path) -> None:
    """``[apps] origin``: an app page's script runs on the apps origin, where the login
    cookie opens nothing (the API is not served there, app routes want the apps cookie);
    the console's origin hands a token only to the owner's top-level navigation."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'manager.db'}"
    apps_config = {"origin": "http://apps.test"}
    async with running_cluster(url, tmp_path / "state", apps=apps_config) as cluster:
        await cluster.add_agent("i-node01")
        alice, _ = await make_user(cluster, "alice@example.com")
        await make_user(cluster, "bob@example.com")
        created = await cluster.create(
            {"cpu": "1"},
            client=alice,
            name="web",
            maxWaitSeconds=10,
            config={"resources": {"cpu": "1"}, "service_ports": [{"name": "web", "port": 8080}]},
        )
        assert created.json()["status"] == "RUNNING", created.text
        sid = created.json()["sessionId"]
        app_path = f"/session/{sid}/apps/web/"
        transport = httpx.ASGITransport(app=cluster.app)
        console = httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8081")
        apps = httpx.AsyncClient(transport=transport, base_url="http://apps.test")

        async def login(email: str) -> tuple[str, str]:
            answer = await console.post(
                "/auth/login", json={"email": email, "password": "long enough password"}
            )
            assert answer.status_code == 200, answer.text
            console.cookies.clear()
            cookie = "; ".join(f"{k}={v}" for k, v in answer.cookies.items())
            return cookie, answer.json()["csrf_token"]

        cookie, csrf = await login("alice@example.com")
        with_login = {"Cookie": cookie, "X-CSRF-Token": csrf}
        # What an app page's fetch() reaches on its own origin, with the login: nothing.
        for method, path in (
            ("GET", "/sessions"),
            ("GET", "/whoami"),
            ("GET", f"/session/{sid}"),
            ("GET", f"/session/{sid}/apps"),
            ("DELETE", f"/session/{sid}"),
            ("POST", "/admin/gql"),
            ("POST", "/auth/logout"),
        ):
            answer = await apps.request(method, path, headers=with_login)
            assert answer.status_code == 404, (method, path, answer.text)
            assert sid not in answer.text
        assert (await apps.get(app_path, headers=with_login)).status_code == 401
        # The console's origin: a script request or a frame with the login is refused...
        for headers in (
            {"Sec-Fetch-Mode": "cors", "Sec-Fetch-Site": "same-site"},
            {"Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "iframe"},
            {"Sec-Fetch-Mode": "navigate", "Sec-Fetch-Site": "cross-site"},
        ):
            answer = await console.get(app_path, headers={"Cookie": cookie, **headers})
            assert answer.status_code == 403, (headers, answer.text)
            assert "token=" not in answer.text
        # ... the owner's navigation gets a token, bob's does not.
        bob_cookie, _ = await login("bob@example.com")
        bob_nav = await console.get(
            app_path, headers={"Cookie": bob_cookie, "Sec-Fetch-Mode": "navigate"}
        )
        assert bob_nav.status_code == 404, bob_nav.text
        nav = await console.get(app_path, headers={"Cookie": cookie, "Sec-Fetch-Mode": "navigate"})
        assert nav.status_code == 303, nav.text
        handoff = httpx.URL(nav.headers["location"])
        assert handoff.host == "apps.test"
        assert handoff.path == "/_apps/auth"
        # Not redeemable on the console's origin; once on the apps origin.
        assert (await console.get(handoff.raw_path.decode())).status_code == 404
        landed = await apps.get(handoff.raw_path.decode())
        assert landed.status_code == 303, landed.text
        app_cookie = f"accelshare_app={landed.cookies['accelshare_app']}"
        apps.cookies.clear()
        assert (await apps.get(handoff.raw_path.decode())).status_code == 401
        # The apps cookie passes the proxy's checks (the hollow agent serves no app: 503)
        # and opens no API on the console's origin.
        proxied = await apps.get(app_path, headers={"Cookie": app_cookie})
        assert proxied.status_code == 503, proxied.text
        for path in ("/sessions", "/whoami"):
            answer = await console.get(path, headers={"Cookie": app_cookie})
            assert answer.status_code == 401, (path, answer.text)
        await console.aclose()
        await apps.aclose()
        await alice.aclose()


async def test_a_domain_admin_cannot_take_over_a_superadmin(sqlite_cluster: Cluster) -> None:
    """An admin of the superadmin's domain must not mint a keypair for the superadmin
    (that key would sign as the superadmin), nor disable or delete the superadmin's
    account or keys (regression: these routes checked only the domain)."""
    cluster = sqlite_cluster
    admin, _ = await make_user(cluster, "domain-admin@example.com", role="admin")
    whoami = (await cluster.admin.get("/whoami")).json()
    root_email, root_key = whoami["email"], whoami["access_key"]
    async with admin:
        minted = await admin.post("/admin/keypairs", json={"user_email": root_email})
        assert minted.status_code == 403, minted.text
        assert "secret_key" not in minted.text
        for method, path, body in (
            ("PATCH", f"/admin/keypairs/{root_key}", {"is_active": False}),
            ("DELETE", f"/admin/keypairs/{root_key}", None),
            ("DELETE", f"/admin/users/{root_email}", None),
            ("PATCH", f"/admin/users/{root_email}", {"status": "inactive"}),
        ):
            response = await admin.request(method, path, json=body)
            assert response.status_code == 403, (method, path, response.text)
        # the superadmin still works
        assert (await cluster.admin.get("/agents")).status_code == 200
        # and the admin can still manage plain users of its domain
        plain = await admin.post(
            "/admin/users", json={"email": "p@example.com", "password": "long enough password"}
        )
        assert plain.status_code == 201, plain.text
        made = await admin.post("/admin/keypairs", json={"user_email": "p@example.com"})
        assert made.status_code == 201, made.text


async def test_secrets_are_never_logged_nor_returned_again(
    sqlite_cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    cluster = sqlite_cluster
    caplog.set_level(logging.DEBUG)
    await cluster.add_agent("i-node01")
    user, keypair = await make_user(cluster, "secretive@example.com")
    extra = await cluster.admin.post(
        "/admin/keypairs", json={"user_email": "secretive@example.com"}
    )
    assert extra.status_code == 201
    secrets = {
        keypair["secret_key"],
        extra.json()["secret_key"],
        cluster.creds.secret_key,
        SECRET,
        "long enough password",
    }
    async with user:
        created = await cluster.create({"cuda.shares": "0.1"}, client=user, maxWaitSeconds=10)
        assert created.status_code == 201
        # failed logins and signatures log something; never the secret
        await cluster.admin.post(
            "/auth/login",
            json={"email": "secretive@example.com", "password": "long enough password"},
        )
        await cluster.admin.post(
            "/auth/login", json={"email": "secretive@example.com", "password": "wrong password!!"}
        )
        await cluster.client(keypair["access_key"], "x" * 40).get("/sessions")
        bodies = []
        for path in (
            "/admin/users",
            "/admin/keypairs",
            "/admin/users?email=secretive@example.com",
            "/whoami",
            f"/session/{created.json()['sessionId']}",
            "/sessions?status=all",
            "/admin/etcd?prefix=",
        ):
            response = await cluster.admin.get(path)
            bodies.append((path, response.text))
        # GraphQL: every query and every field (test_graphql_returns_no_secret_of_another)
    for path, text in bodies:
        for secret in secrets:
            assert secret not in text, (path, "leaks a secret")
    logged = "\n".join(r.getMessage() for r in caplog.records)
    logged += "\n".join(str(r.args) for r in caplog.records)
    for secret in secrets:
        assert secret not in logged, "a secret reached the log"


# -- GraphQL: every query, every field ------------------------------------------------------

_TYPE_REF = "kind name ofType { kind name ofType { kind name ofType { kind name } } }"
INTROSPECTION = (
    "{ __schema { queryType { name } types { name kind fields { name "
    f"args {{ name type {{ {_TYPE_REF} }} }} type {{ {_TYPE_REF} }} }} }} }} }}"
)


def _named(ref: dict[str, Any]) -> tuple[str, str, bool]:
    """(kind, name, is_required) of a type reference, through lists and non-nulls."""
    required = ref["kind"] == "NON_NULL"
    while ref.get("ofType"):
        ref = ref["ofType"]
    return ref["kind"], ref["name"], required


def selection(types: dict[str, Any], type_name: str, depth: int = 3) -> str:
    """Every field of an object type without required arguments, nested ``depth`` deep."""
    parts = []
    for field in types[type_name]["fields"]:
        if any(_named(arg["type"])[2] for arg in field["args"]):
            continue
        kind, name, _ = _named(field["type"])
        if kind in ("SCALAR", "ENUM"):
            parts.append(field["name"])
        elif kind == "OBJECT" and depth > 0 and not name.startswith("__"):
            parts.append(f"{field['name']} {{ {selection(types, name, depth - 1)} }}")
    return " ".join(parts) or "__typename"


async def graphql_everything(
    client: httpx.AsyncClient, arguments: dict[str, Any]
) -> dict[str, httpx.Response]:
    """Ask every root query for every field it has; required arguments from
    ``arguments`` by name (a query with one not there fails the test: give it one)."""
    answer = await client.post("/admin/gql", json={"query": INTROSPECTION})
    assert answer.status_code == 200, answer.text
    schema = answer.json()["data"]["__schema"]
    types = {t["name"]: t for t in schema["types"] if t["fields"]}
    responses = {}
    for field in types[schema["queryType"]["name"]]["fields"]:
        declared, passed = [], []
        for arg in field["args"]:
            kind, name, required = _named(arg["type"])
            if arg["name"] in arguments:
                bang = "!" if required else ""
                declared.append(f"${arg['name']}: {name}{bang}")
                passed.append(f"{arg['name']}: ${arg['name']}")
            else:
                assert not required, f"GraphQL {field['name']}: give {arg['name']} a value"
        kind, name, _ = _named(field["type"])
        body = f" {{ {selection(types, name)} }}" if kind == "OBJECT" else ""
        head = f"query({', '.join(declared)})" if declared else "query"
        call = f"{field['name']}({', '.join(passed)})" if passed else field["name"]
        query = f"{head} {{ {call}{body} }}"
        variables = {a.split(":")[0][1:]: arguments[a.split(":")[0][1:]] for a in declared}
        responses[field["name"]] = await client.post(
            "/admin/gql", json={"query": query, "variables": variables}
        )
    return responses


async def _password_hash(cluster: Cluster, email: str) -> str:
    async with cluster.manager.db.begin() as db:
        row = await db.execute(
            sa.text("SELECT password_hash FROM users WHERE email = :e"), {"e": email}
        )
        return str(row.scalar_one())


async def test_graphql_returns_no_secret_of_another(sqlite_cluster: Cluster) -> None:
    """Another user, a domain admin and the superadmin ask every GraphQL query for every
    field (found by introspection, so a query added later is asked too), pointed at the
    victim's keypair and session: no secret key, password or password hash of the victim,
    nor the superadmin's key, nor the cluster secret in any answer.  The old check asked
    a ``user_list`` query the schema does not have: an error, so it could never fail.
    Non-vacuous: the queries answer data (no errors for the superadmin), the victim's
    session is among it, and ``keypair.secret_key`` is really asked (and null)."""
    cluster = sqlite_cluster
    await cluster.add_agent("i-node01")
    victim, keypair = await make_user(cluster, "victim@example.com")
    other, _ = await make_user(cluster, "other@example.com")
    admin, _ = await make_user(cluster, "admin@example.com", role="admin")
    async with victim, other, admin:
        created = await cluster.create({"cpu": 1}, client=victim, enqueueOnly=True)
        assert created.status_code == 201, created.text
        session_id = created.json()["sessionId"]
        secrets = {
            "victim's secret key": keypair["secret_key"],
            "victim's password": "long enough password",
            "victim's password hash": await _password_hash(cluster, "victim@example.com"),
            "superadmin's secret key": cluster.creds.secret_key,
            "cluster secret": SECRET,
        }
        arguments = {
            "access_key": keypair["access_key"],
            "id": session_id,
            "agent_id": "i-node01",
            "limit": 100,
            "offset": 0,
            "name": "default",  # groups_by_name, domain, scaling_group, policies
            "storage_host_name": "local:volume1",  # quota_scope (refused: no quota scopes)
            "quota_scope_id": "user:victim",
        }
        callers = (("other", other), ("admin", admin), ("superadmin", cluster.admin))
        for caller, client in (*callers, ("victim", victim)):
            answers = await graphql_everything(client, arguments)
            assert len(answers) >= 5, answers.keys()
            for query, response in answers.items():
                assert response.status_code == 200, (caller, query, response.text)
                for what, secret in secrets.items():
                    assert secret not in response.text, (caller, query, f"leaks the {what}")
            if caller == "superadmin":
                failed = {
                    q: r.json()["errors"] for q, r in answers.items() if r.json().get("errors")
                }
                # refused by design (docs/compatibility.md), and storage_volume, whose ``id``
                # is a volume's ("local:volume1"), not the session id the others take
                refused = {
                    q for q, errors in failed.items()
                    if all(e["message"].startswith("Not supported by accelshare") for e in errors)
                }  # fmt: skip
                assert refused == {"quota_scope", "vfolder_host_permissions"}, failed
                assert set(failed) - refused == {"storage_volume"}, failed
                assert session_id in answers["compute_session_list"].text
                asked = answers["keypair"].json()["data"]["keypair"]
                assert asked["access_key"] == keypair["access_key"]
                assert "secret_key" in asked, asked  # asked for, and answered null
                assert asked["secret_key"] is None, "shown again after its creation"


def _modes(directory: Path) -> dict[str, int]:
    return {p.name: stat.S_IMODE(p.stat().st_mode) for p in directory.iterdir() if p.is_file()}


SECRET_HOLDERS = {
    "manager.db",  # every keypair's secret key, in plain text
    "manager.db-wal",
    "manager.db-shm",
    "admin-credentials.env",
    "cookie-secret",
    "cluster-secret",
}


@pytest.fixture
def usual_umask() -> Iterator[None]:
    """umask 022, under which the files used to be created readable by everyone."""
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


@pytest.mark.usefixtures("usual_umask")
async def test_key_files_are_private(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The default layout: ``<data-dir>/manager.db`` (and its WAL files), the secrets
    and the config store in one data dir, which nobody else may enter."""
    monkeypatch.delenv(ENV_CLUSTER_SECRET, raising=False)
    state = tmp_path / "state"
    async with running_cluster(None, state, **{"cluster-secret": None}) as cluster:
        assert cluster.config.db_url.database == str(state / "manager.db")
        assert (await cluster.admin.get("/whoami")).status_code == 200
        assert (await cluster.admin.get("/config/resource-slots")).status_code == 200
        live = _modes(state)  # while the database is open: its -wal and -shm exist
    assert SECRET_HOLDERS | {"config-store.db"} <= set(live), sorted(live)
    assert {name: oct(live[name]) for name in SECRET_HOLDERS} == {
        name: oct(0o600) for name in SECRET_HOLDERS
    }
    assert stat.S_IMODE(state.stat().st_mode) == 0o700, oct(state.stat().st_mode)
    assert not [p for p in state.iterdir() if p.name.endswith(".tmp")]

    # State left open by an older version is made private at the next start, loudly.
    loosened = ("manager.db", "cookie-secret", "config-store.db")
    state.chmod(0o755)
    for name in loosened:
        (state / name).chmod(0o644)
    caplog.set_level(logging.WARNING, logger="accelshare.manager.private_files")
    async with running_cluster(None, state, **{"cluster-secret": None}) as cluster:
        assert (await cluster.admin.get("/config/resource-slots")).status_code == 200
        live = _modes(state)
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    holders = SECRET_HOLDERS | {"config-store.db", "config-store.db-wal", "config-store.db-shm"}
    assert {name: oct(live.get(name, 0)) for name in holders} == {
        name: oct(0o600) for name in holders
    }
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    for path in (state, *(state / name for name in loosened)):
        assert any(m.startswith(f"{path} was open to other users") for m in warned), warned


@pytest.mark.usefixtures("usual_umask")
async def test_the_config_store_file_is_private_from_the_first_start(tmp_path: Path) -> None:
    state = tmp_path / "state"
    async with running_cluster(None, state) as cluster:
        assert (await cluster.admin.get("/config/resource-slots")).status_code == 200
        live = _modes(state)
    assert live["config-store.db"] == 0o600, oct(live["config-store.db"])


# -- GraphQL cost limits (docs/reliability.md) ----------------------------------------------


def _gql_records(caplog: pytest.LogCaptureFixture) -> tuple[int, list[logging.LogRecord]]:
    """(bytes written, records) of what the log got since the last clear."""
    records = list(caplog.records)
    text = "\n".join(logging.Formatter().format(r) for r in records)
    return len(text.encode()), records


@pytest.mark.parametrize(
    ("name", "query", "limit", "value", "received"),
    [
        pytest.param(
            "aliases",
            "{" + " ".join(f'a{i}: agent(agent_id: "x") {{ id }}' for i in range(400)) + "}",
            "max-aliases",
            30,
            400,
            id="400-aliases-of-a-refused-field",
        ),
        pytest.param(
            "many",  # 11 tokens each: the parse stops at the token limit
            "{" + " ".join(f'a{i}: agent(agent_id: "x") {{ id }}' for i in range(1000)) + "}",
            "max-tokens",
            5000,
            "more than 5000",
            id="1000-aliases-of-a-refused-field",
        ),
        pytest.param(
            "depth",
            "{ images " + "{ a " * 30 + "{ b }" + " }" * 30 + " }",
            "max-depth",
            20,
            32,
            id="depth-32",
        ),
        pytest.param(
            "fields",
            "{ images { " + " ".join(["ref"] * 1500) + " } }",
            "max-fields",
            1000,
            1501,
            id="1501-fields",
        ),
        pytest.param(
            "fragments",
            "{ images { ...A } } fragment A on ImageNode { ...B ...B ...B ...B } "
            "fragment B on ImageNode { ...C ...C ...C ...C } "
            "fragment C on ImageNode { ref name tag description runtime architecture }",
            "max-fields",
            1000,
            1 + 4 * 4 * 6 * 1,
            id="fragments-expanded",
        ),
        pytest.param(
            "tokens",
            "{ images { " + " ".join(["ref"] * 6000) + " } }",
            "max-tokens",
            5000,
            "more than 5000",
            id="6000-tokens",
        ),
    ],
)
async def test_graphql_over_a_cost_limit_gets_a_fast_400_and_one_log_line(
    sqlite_cluster: Cluster,
    caplog: pytest.LogCaptureFixture,
    name: str,
    query: str,
    limit: str,
    value: int,
    received: int | str,
) -> None:
    """The flood is refused before it runs: 400 naming the limit, its value and what the
    request had, fast, and the log grows by one short line (a thousand aliases of a
    refused field used to write 23 MB of tracebacks)."""
    cluster = sqlite_cluster
    if name == "fragments":  # 97 fields: under the default; the test lowers the limit
        cluster.app.state.graphql_limits = GraphQLLimits(max_fields=50)
        value = 50
        received = 97
    user, _ = await make_user(cluster, f"{name}@example.com")
    async with user:
        caplog.clear()
        caplog.set_level(logging.DEBUG)
        started = time.monotonic()
        response = await user.post("/admin/gql", json={"query": query})
        elapsed = time.monotonic() - started
        written, records = _gql_records(caplog)
    assert response.status_code == 400, response.text
    problem = response.json()
    assert problem["type"] == "/problems/graphql-too-complex", problem
    assert (problem["limit"], problem["limit_value"], problem["received"]) == (
        limit,
        value,
        received,
    )
    assert limit in problem["detail"], problem
    assert str(value) in problem["detail"], problem
    assert elapsed < 2.0, elapsed
    refused = [r for r in records if "refused" in r.getMessage()]
    assert len(refused) == 1, [r.getMessage() for r in records]
    assert not any(r.exc_info for r in records)
    assert written < 2000, written


async def test_graphql_errors_within_the_limits_log_one_line(
    sqlite_cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    """30 aliases of a field the caller may not use: 30 errors in the answer, one log
    line without a traceback (strawberry logged a traceback per error)."""
    cluster = sqlite_cluster
    user, _ = await make_user(cluster, "refused@example.com")
    query = "{" + " ".join(f'a{i}: agent(agent_id: "x") {{ id }}' for i in range(30)) + "}"
    async with user:
        caplog.clear()
        caplog.set_level(logging.DEBUG)
        response = await user.post("/admin/gql", json={"query": query})
        written, records = _gql_records(caplog)
    assert response.status_code == 200, response.text
    errors = response.json()["errors"]
    assert len(errors) == 30, errors[:2]
    assert "superadmin" in errors[0]["message"], errors[:2]
    gql_lines = [r for r in records if "graphql" in r.getMessage() or r.name.startswith("straw")]
    assert len(gql_lines) == 1, [r.getMessage() for r in gql_lines]
    assert "30 error(s)" in gql_lines[0].getMessage()
    assert not any(r.exc_info for r in records)
    assert written < 2000, written


@pytest.mark.parametrize(
    "query",
    [
        "compute_session_list",
        "agent_list",
        "vfolder_list",
        "vfolder_own_list",
        "vfolder_invited_list",
        "vfolder_project_list",
        "user_list",
        "keypair_list",
    ],
)
@pytest.mark.parametrize(
    ("page", "argument", "bad"),
    [("limit: -1", "limit", -1), ("limit: 1001", "limit", 1001), ("offset: -5", "offset", -5)],
)
async def test_graphql_page_sizes_are_capped_like_rest(
    sqlite_cluster: Cluster, query: str, page: str, argument: str, bad: int
) -> None:
    response = await sqlite_cluster.admin.post(
        "/admin/gql", json={"query": f"{{ {query}({page}) {{ total_count }} }}"}
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["data"] is None, body
    message = body["errors"][0]["message"]
    assert f"{query}({argument})" in message, message
    assert str(bad) in message, message
    fine = await sqlite_cluster.admin.post(
        "/admin/gql", json={"query": f"{{ {query}(limit: 1000) {{ total_count }} }}"}
    )
    assert fine.status_code == 200, fine.text
    assert "errors" not in fine.json(), fine.text


async def test_graphql_limits_come_from_manager_toml(tmp_path: Path) -> None:
    """``[api.graphql]`` is what the running manager enforces."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'manager.db'}"
    api = {"graphql": {"max-aliases": 2, "max-depth": 3}}
    async with running_cluster(url, tmp_path / "state", api=api) as cluster:
        two = await cluster.admin.post(
            "/admin/gql", json={"query": "{ a: images { ref } b: images { ref } }"}
        )
        assert two.status_code == 200, two.text
        assert "errors" not in two.json(), two.text
        three = await cluster.admin.post(
            "/admin/gql",
            json={"query": "{ a: images { ref } b: images { ref } c: images { ref } }"},
        )
        assert three.status_code == 400, three.text
        assert (three.json()["limit"], three.json()["limit_value"]) == ("max-aliases", 2)
        deep = await cluster.admin.post(
            "/admin/gql", json={"query": "{ compute_session_list { items { containers { id } } } }"}
        )
        assert deep.status_code == 400, deep.text
        assert (deep.json()["limit"], deep.json()["received"]) == ("max-depth", 4), deep.text


# -- login throttling (docs/reliability.md) -------------------------------------------------


def _from(cluster: Cluster, address: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=cluster.app, client=(address, 40000)),
        base_url="http://127.0.0.1:8081",
    )


async def _login_as(client: httpx.AsyncClient, email: str, password: str) -> httpx.Response:
    return await client.post("/auth/login", json={"email": email, "password": password})


async def test_a_password_guesser_is_throttled_then_let_back_after_the_window(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """50 wrong passwords from one address: the first 5 get 401, the rest 429 with
    ``Retry-After`` without a password check (fast), even the right password; the owner
    logs in from another address meanwhile; after the window the guesser's address may
    try again and the right password works."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'manager.db'}"
    api = {"login": {"window": 2.0, "max-failures-per-account-address": 5}}
    async with running_cluster(url, tmp_path / "state", api=api) as cluster:
        _user, _keypair = await make_user(cluster, "victim@example.com")
        async with _from(cluster, "6.6.6.6") as attacker, _from(cluster, "10.0.0.1") as owner:
            statuses = []
            started = time.monotonic()
            for i in range(50):
                response = await _login_as(attacker, "victim@example.com", f"guess {i}")
                statuses.append(response.status_code)
                if response.status_code == 429:
                    refused = response
            elapsed = time.monotonic() - started
            assert statuses == [401] * 5 + [429] * 45, statuses
            assert 1 <= int(refused.headers["Retry-After"]) <= 2, refused.headers
            problem = refused.json()
            assert problem["reason"] == "too-many-failures", problem
            assert problem["limit"] == "max-failures-per-account-address", problem
            assert "try again in" in problem["detail"], problem
            assert elapsed < 20, elapsed
            right = await _login_as(attacker, "victim@example.com", "long enough password")
            assert right.status_code == 429, right.text
            assert "set-cookie" not in right.headers
            elsewhere = await _login_as(owner, "victim@example.com", "long enough password")
            assert elsewhere.status_code == 200, elsewhere.text
            await asyncio.sleep(2.05)
            after = await _login_as(attacker, "victim@example.com", "long enough password")
            assert after.status_code == 200, after.text
    throttled = [r for r in caplog.records if "throttled" in r.getMessage()]
    assert len(throttled) == 46, len(throttled)  # one line per refused attempt


async def test_a_distributed_guess_cannot_lock_the_superadmin_out(tmp_path: Path) -> None:
    """Guesses from 20 addresses reach the account-wide limit: a new address is refused
    (429, bounded by the window), but the superadmin's known address still logs in."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'manager.db'}"
    api = {"login": {"max-failures-per-account": 20, "max-failures-per-account-address": 5}}
    async with running_cluster(url, tmp_path / "state", api=api) as cluster:
        email, password = cluster.creds.email, cluster.creds.password
        async with _from(cluster, "10.0.0.1") as admin:
            assert (await _login_as(admin, email, password)).status_code == 200
            for i in range(20):
                async with _from(cluster, f"6.6.{i}.1") as attacker:
                    guess = await _login_as(attacker, email, "not it")
                    assert guess.status_code == 401, guess.text
            async with _from(cluster, "7.7.7.7") as newcomer:
                refused = await _login_as(newcomer, email, password)
            assert refused.status_code == 429, refused.text
            assert refused.json()["limit"] == "max-failures-per-account", refused.text
            assert 1 <= int(refused.headers["Retry-After"]) <= 300
            known = await _login_as(admin, email, password)
            assert known.status_code == 200, known.text
            signed = await cluster.admin.get("/whoami")  # keypairs are never throttled
            assert signed.status_code == 200, signed.text
