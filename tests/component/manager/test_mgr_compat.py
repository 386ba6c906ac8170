"""What the official Backend.AI client sends, replayed without the client (issue #12).

The GraphQL documents below are verbatim what ``backend.ai-client`` 25.5.2 sends for
``ps``, ``admin agent list``, ``admin agent info``, ``session info`` and ``vfolder list``
(recorded against a dev cluster).  tests/integration/compat drives the real client;
these run everywhere, also where no Python 3.12 is installed.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from accelshare.api.signing import compute_signature, parse_authorization

from .cluster import Cluster

UA = {"User-Agent": "Backend.AI Client for Python 25.5.2"}

KEYPAIR = "query { keypair { user_id access_key secret_key is_active is_admin } }"
PS = (
    "query($limit:Int!, $offset:Int!, $status: String, $access_key: String, $filter: String,"
    " $order: String) {\n  compute_session_list(\n      limit:$limit, offset:$offset,"
    " status:$status, access_key:$access_key, filter:$filter, order:$order) {\n    items {"
    " name access_key priority id group_name type image status status_info status_changed"
    " result }\n    total_count\n  }\n}"
)
PS_STATUSES = (
    "PENDING,SCHEDULED,PULLING,PREPARED,PREPARING,CREATING,RUNNING,RUNNING_DEGRADED,"
    "TERMINATING,ERROR"
)
AGENT_LIST = (
    "query($limit:Int!, $offset:Int!, $status: String, $scaling_group: String, $filter:"
    " String, $order: String) {\n  agent_list(\n      limit:$limit, offset:$offset,"
    " status:$status, scaling_group:$scaling_group, filter:$filter, order:$order) {\n"
    "    items { id status architecture scaling_group region first_contact cpu_cur_pct"
    " mem_cur_bytes available_slots occupied_slots }\n    total_count\n  }\n}"
)
AGENT_INFO = (
    "query($agent_id: String!) {\n    agent(agent_id: $agent_id) {id status region"
    " architecture first_contact cpu_cur_pct available_slots occupied_slots hardware_metadata"
    " live_stat local_config}\n}"
)
SESSION_INFO = (
    "query($id: UUID!) {  compute_session(id: $id) {    name priority id main_kernel_id image"
    " tag created_at terminated_at status status_info status_data occupying_slots idle_checks"
    " containers { id cluster_role cluster_idx cluster_hostname session_id image registry"
    " status status_info status_data status_changed agent container_id resource_opts"
    " occupied_slots preopen_ports live_stat last_stat id } dependencies { name id }  }}"
)
VFOLDER_LIST = (
    "query($limit:Int!, $offset:Int!, $group_id: UUID, $filter: String, $order: String) {\n"
    "  vfolder_list(\n      limit:$limit, offset:$offset, group_id:$group_id, filter:$filter,"
    " order:$order) {\n    items { host name status created_at creator group permission"
    " ownership_type status }\n    total_count\n  }\n}"
)
PAGE = {"filter": None, "order": None, "limit": 20, "offset": 0}


# Requests the real client signed (recorded on a throwaway dev cluster whose keypair was
# AKIA35JMPD9UED4IEGPL / the secret below): Backend.AI's own signatures are reproduced.
RECORDED_SECRET = "5EyIYlC2eblJtKG62Q7e7PA8qlOpmDfFhFv3rTE0"
RECORDED = [
    pytest.param(
        "POST",
        "/admin/gql",
        "2026-11-22T03:12:03.597755+00:00",
        "application/json",
        "BackendAI signMethod=HMAC-SHA256, credential=AKIA35JMPD9UED4IEGPL:"
        "d445c9b24b058272ad49ef994635f76ce23b97fd3b4a9659e870511da36d9e91",
        id="graphql-post",
    ),
    pytest.param(
        "GET",
        "/manager/announcement",
        "2026-11-22T03:12:03.592825+00:00",
        "text/plain",  # the client's content type for a request without a body
        "BackendAI signMethod=HMAC-SHA256, credential=AKIA35JMPD9UED4IEGPL:"
        "baef7332d34cd1c410d3f48f0afc8bb4b8c7b1f409a2f1ebdca3822c2d3773e4",
        id="bodyless-get",
    ),
]


@pytest.mark.parametrize(("method", "path", "date", "content_type", "authorization"), RECORDED)
def test_signatures_made_by_the_official_client_verify(
    method: str, path: str, date: str, content_type: str, authorization: str
) -> None:
    params = parse_authorization(authorization)
    assert params.access_key == "AKIA35JMPD9UED4IEGPL"
    assert params.hash_type == "sha256"
    expected = compute_signature(
        secret_key=RECORDED_SECRET,
        method=method,
        path_query=path,
        date_header=date,
        host="127.0.0.1:18932",
        content_type=content_type,
        api_version="v8.20240915",
    )
    assert expected == params.signature


async def raw_gql(cluster: Cluster, query: str, variables: dict[str, Any]) -> dict[str, Any]:
    response = await cluster.admin.post(
        "/admin/gql", json={"query": query, "variables": variables}, headers=UA
    )
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def test_the_clients_queries_are_answered(cluster: Cluster) -> None:
    await cluster.add_agent("i-node01")
    created = await cluster.create({"cuda.shares": "0.5"}, name="compat1", maxWaitSeconds=10)
    assert created.json()["status"] == "RUNNING", created.text
    session = await cluster.session("compat1")

    keypair = (await cluster.gql(KEYPAIR))["data"]["keypair"]
    assert keypair["access_key"] == cluster.creds.access_key
    assert keypair["secret_key"] is None  # a secret is shown once, at creation
    assert keypair["is_admin"] is True
    assert keypair["is_active"] is True

    listed = await cluster.gql(PS, {"status": PS_STATUSES, "access_key": None, **PAGE})
    page = listed["data"]["compute_session_list"]
    assert page["total_count"] == 1
    item = page["items"][0]
    assert item["name"] == "compat1"
    assert item["id"] == session["sessionId"]
    assert item["group_name"] == "default"
    assert item["status"] == "RUNNING"

    agents = await cluster.gql(AGENT_LIST, {"status": "ALIVE", "scaling_group": None, **PAGE})
    agent = agents["data"]["agent_list"]["items"][0]
    assert agent["id"] == "i-node01"
    assert agent["cpu_cur_pct"] is None  # not measured: null, never invented
    assert agent["mem_cur_bytes"] is None
    assert json.loads(agent["occupied_slots"])["cuda.shares"] == "0.5"

    info = (await cluster.gql(AGENT_INFO, {"agent_id": "i-node01"}))["data"]["agent"]
    assert info["live_stat"] is None
    assert json.loads(info["hardware_metadata"])["cuda"]["status"] == "healthy"
    assert json.loads(info["local_config"])["agent"]["id"] == "i-node01"

    detail = (await cluster.gql(SESSION_INFO, {"id": session["sessionId"]}))["data"]
    node = detail["compute_session"]
    kernel = session["kernels"][0]
    assert node["main_kernel_id"] == kernel["kernelId"]
    assert json.loads(node["occupying_slots"])["cuda.shares"] == "0.5"
    assert node["dependencies"] == []
    container = node["containers"][0]
    assert container["id"] == kernel["kernelId"]
    assert container["agent"] == "i-node01"
    assert container["cluster_role"] == "main"
    assert json.loads(container["occupied_slots"])["cuda.shares"] == "0.5"

    vfolders = await cluster.gql(VFOLDER_LIST, {"group_id": None, **PAGE})
    assert vfolders["data"]["vfolder_list"] == {"items": [], "total_count": 0}

    missing = await cluster.gql(SESSION_INFO, {"id": "00000000-0000-0000-0000-000000000000"})
    assert missing["data"]["compute_session"] is None


async def test_filter_and_order_expressions_select_and_sort(cluster: Cluster) -> None:
    """``ps --filter ... --order ...`` and ``admin agent list --filter``: Backend.AI's
    mini-language, run in the database (SQLite and PostgreSQL)."""
    await cluster.add_agent("i-node01")
    await cluster.add_agent("i-node02")
    for name in ("train-a", "Train-b", "eval-c"):
        created = await cluster.create({"cuda.shares": "0.1"}, name=name, maxWaitSeconds=10)
        assert created.json()["status"] == "RUNNING", created.text

    async def ps(filter: str | None, order: str | None = None) -> list[str]:
        variables = {"status": None, "access_key": None, **PAGE, "filter": filter, "order": order}
        page = (await cluster.gql(PS, variables))["data"]["compute_session_list"]
        names = [item["name"] for item in page["items"]]
        assert page["total_count"] == len(names)
        return names

    assert await ps('name like "train%"') == ["train-a"]
    assert await ps('name ilike "train%"', "-name") == ["train-a", "Train-b"]
    assert await ps('status == "RUNNING" & !(name contains "-a")', "+name") == [
        "Train-b",
        "eval-c",
    ]
    assert await ps('status in ["PENDING", "RUNNING_DEGRADED"]') == []
    email = cluster.creds.email
    assert await ps(f'user_email == "{email}" & group_name == "default"', "-created_at") == [
        "eval-c",
        "Train-b",
        "train-a",
    ]
    assert await ps('created_at > "2000-01-01" & terminated_at is null', "name") == [
        "Train-b",
        "eval-c",
        "train-a",
    ]

    agents = await cluster.gql(
        AGENT_LIST,
        {
            "status": None,
            "scaling_group": None,
            **PAGE,
            "filter": 'id != "i-node01"',
            "order": "-id",
        },
    )
    assert [a["id"] for a in agents["data"]["agent_list"]["items"]] == ["i-node02"]
    agents = await cluster.gql(
        AGENT_LIST, {"status": "ALIVE", "scaling_group": None, **PAGE, "order": "-id"}
    )
    assert [a["id"] for a in agents["data"]["agent_list"]["items"]] == ["i-node02", "i-node01"]


@pytest.mark.parametrize(
    ("filter", "order", "wanted"),
    [
        ('nmae == "x"', None, "filter at column 1: unknown field of compute_session_list"),
        ('status == "RUNNIN"', None, "filter at column 11: wrong value for status"),
        ('name == "x" &', None, "filter at column 14: bad syntax; expected"),
        ("priority like 1", None, "filter at column 1: operator not allowed for priority"),
        (None, "-nosuch", "order at column 1: unknown field of compute_session_list"),
    ],
)
async def test_bad_expressions_are_graphql_errors_naming_the_column(
    cluster: Cluster, filter: str | None, order: str | None, wanted: str
) -> None:
    variables = {"status": None, "access_key": None, **PAGE, "filter": filter, "order": order}
    body = await raw_gql(cluster, PS, variables)
    assert body["data"] is None
    assert wanted in body["errors"][0]["message"]


async def test_nasty_expressions_are_errors_of_the_caller_never_of_the_server(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    """Through the API, expressions the databases would choke on are the caller's error
    (a GraphQL error message), never an unexpected one (logged with a traceback)."""
    await cluster.add_agent("i-node01")
    created = await cluster.create({"cuda.shares": "0.1"}, name="nasty", maxWaitSeconds=10)
    assert created.json()["status"] == "RUNNING", created.text
    nasty = [
        'name == "a\x00b"',
        "priority > 3000000000",
        'created_at < "0001-01-01T00:00:00+01:00"',
        'name like "x\\\\"',
        "(" * 200 + 'name == "x"' + ")" * 200,
        "x" * 5000,
        'status == "RUNNING" & ' * 40 + 'name == "nasty"',
    ]
    caplog.set_level("INFO", logger="accelshare.api.gql")
    for text in nasty:
        variables = {"status": None, "access_key": None, **PAGE, "filter": text}
        body = await raw_gql(cluster, PS, variables)
        if body.get("errors"):
            assert body["errors"][0]["message"].startswith("filter"), body
        else:
            assert body["data"]["compute_session_list"]["total_count"] in (0, 1)
    assert not [r for r in caplog.records if r.levelname == "ERROR"]


async def test_create_body_of_the_sdk(cluster: Cluster) -> None:
    """``ComputeSession.get_or_create`` sends nulls for what was not given, and the CLI
    sends resource options as text."""
    await cluster.add_agent("i-node01")
    body = {
        "tag": None,
        "name": "compat-sdk",
        "config": {
            "mounts": [],
            "environ": None,
            "resources": {"cpu": "1", "mem": "1g", "cuda.shares": "0.4"},
            "resource_opts": {"allow_fractional_resource_fragmentation": "false"},
            "scalingGroup": None,
            "attach_network": None,
            "preopen_ports": None,
        },
        "dependencies": None,
        "callback_url": None,
        "starts_at": None,
        "bootstrap_script": None,
        "owner_access_key": None,
        "domain": "default",
        "group": "default",
        "type": "interactive",
        "enqueueOnly": False,
        "maxWaitSeconds": 0,
        "reuseIfExists": True,
        "startupCommand": None,
        "image": "python:3.11",
    }
    created = await cluster.admin.post("/session", json=body, headers=UA)
    assert created.status_code == 201, created.text
    answer = created.json()
    assert answer["status"] == "RUNNING"  # the client waits for the start, as Backend.AI
    assert answer["created"] is True
    assert answer["session"]["resourceOpts"] == {"allow_fractional_resource_fragmentation": False}
    again = await cluster.admin.post("/session", json=body, headers=UA)
    assert again.status_code == 200
    assert again.json()["created"] is False
    assert again.json()["sessionId"] == answer["sessionId"]

    bad = {**body, "name": "compat-bad"}
    bad["config"] = {**body["config"], "resource_opts": {"allow_fractional_resource_fragmentation": "maybe"}}  # fmt: skip
    refused = await cluster.admin.post("/session", json=bad, headers=UA)
    assert refused.status_code == 400
    assert refused.json()["field"] == "config.resource_opts.allow_fractional_resource_fragmentation"


async def test_a_session_that_cannot_start_is_answered_pending_at_once(cluster: Cluster) -> None:
    """Backend.AI would block the CLI until resources free up; accelshare answers
    PENDING with the reason ("is enqueued for scheduling").  (A request no agent could
    ever hold is refused instead: test_mgr_impossible.py.)"""
    await cluster.add_agent("i-node01")
    filler = await cluster.create({"cuda.shares": "2"}, name="filler")
    assert filler.status_code == 201, filler.text
    await cluster.wait_status("filler", "RUNNING")
    body = {
        "image": "python:3.11",
        "name": "too-big",
        "config": {"resources": {"cuda.shares": "1"}},
    }
    created = await cluster.admin.post("/session", json=body, headers=UA)
    assert created.status_code == 201, created.text
    assert created.json()["status"] == "PENDING"
    assert "cuda.shares" in created.json()["statusInfo"]


async def test_announcement_and_what_accelshare_does_not_have(cluster: Cluster) -> None:
    announcement = await cluster.admin.get("/manager/announcement", headers=UA)
    assert announcement.json() == {"enabled": False, "message": ""}
    for method, path in (
        ("GET", "/folders/_/fstab"),
        ("POST", "/folders/_/sharing"),
        ("GET", "/folders/_/quota"),
        ("GET", "/resource/watcher"),
        ("POST", "/resource/watcher/agent/start"),
    ):
        response = await cluster.admin.request(method, path, headers=UA)
        assert response.status_code == 501, (method, path, response.text)
        problem = response.json()
        assert problem["type"] == "/problems/not-supported"
        assert "docs/compatibility.md" in problem["detail"]
    async with cluster.client("AKIAUNKNOWN000000000", "x" * 40) as stranger:
        assert (await stranger.get("/folders")).status_code == 401


async def test_the_folder_option_share_and_owner_routes_are_served(cluster: Cluster) -> None:
    """``vfolder update-options``, ``admin vfolder list-shared-vfolders`` /
    ``update-shared-vf-permission`` / ``change-vfolder-ownership`` reach their handlers
    (tests/component/manager/test_mgr_folders.py tests what they do)."""
    shared = await cluster.admin.get("/folders/_/shared", headers=UA)
    assert shared.status_code == 200, shared.text
    assert shared.json() == {"shared": []}
    nosuch = str(uuid.uuid4())
    for path, body in (
        ("/folders/_/shared", {"vfolder": nosuch, "user": nosuch, "perm": "ro"}),
        ("/folders/_/change-ownership", {"vfolder": nosuch, "user_email": "a@x.test"}),
        ("/folders/compat-nosuch/update-options", {"cloneable": True}),
    ):
        response = await cluster.admin.post(path, json=body, headers=UA)
        assert response.status_code == 404, (path, response.text)
        assert response.json()["type"] != "/problems/not-supported"
