"""The REST surface with real requests: validation, auth and ownership, logs, events, admin."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import httpx
import pytest

from accelshare.manager.clock import FrozenClock, utcnow
from accelshare.protocol import (
    CreateKernelRequest,
    KernelEventBatch,
    KernelEventType,
    KernelStatus,
    ServicePortMapping,
)

from .cluster import SECRET, Cluster, Signer


async def make_user(
    cluster: Cluster, email: str, role: str = "user"
) -> tuple[httpx.AsyncClient, dict[str, Any]]:
    response = await cluster.admin.post(
        "/admin/users", json={"email": email, "password": "long enough password", "role": role}
    )
    assert response.status_code == 201, response.text
    keypair = response.json()["keypair"]
    return cluster.client(keypair["access_key"], keypair["secret_key"]), keypair


VALIDATION_CASES: list[tuple[str, dict[str, Any], dict[str, Any], str, str]] = [
    # (case, resources, other body fields, problem field, words in the detail)
    (
        "unknown-slot",
        {"foo.bar": 1},
        {},
        "config.resources.foo.bar",
        "Unknown requested resource slot: foo.bar",
    ),
    (
        "quantum",
        {"cuda.shares": "0.15"},
        {},
        "config.resources.cuda.shares",
        "not a multiple of the quantum 0.1 (nearest valid amounts: 0.1 and 0.2)",
    ),
    (
        "discrete",
        {"cpu": "1.5"},
        {},
        "config.resources.cpu",
        "must be a whole number (nearest whole amounts: 1 and 2)",
    ),
    ("zero-cpu", {"cpu": 0}, {}, "config.resources.cpu", "cpu must be positive"),
    ("bad-mem", {"mem": "lots"}, {}, "config.resources.mem", "Invalid amount for mem"),
    ("negative", {"cpu": -1}, {}, "config.resources.cpu", "cannot be negative"),
    ("priority", {}, {"priority": 500}, "priority", "less than or equal to 100"),
    (
        "scaling-group",
        {},
        {"config": {"scalingGroup": "nope"}},
        "config.scalingGroup",
        "Unknown scaling group 'nope'",
    ),
    (
        "batch-command",
        {},
        {"type": "batch"},
        "startupCommand",
        "batch session needs a startupCommand",
    ),
    ("image", {}, {"image": ""}, "image", "at least 1 character"),
]


async def test_validation_names_field_and_value(cluster: Cluster) -> None:
    """One cluster, every case (each case is named in the failure message)."""
    await cluster.add_agent("i-node01")
    for case, resources, extra, field, words in VALIDATION_CASES:
        payload: dict[str, Any] = {"image": "python:3.11", "config": {"resources": resources}}
        for key, value in extra.items():
            if key == "config":
                payload["config"].update(value)
            else:
                payload[key] = value
        response = await cluster.admin.post("/session", json=payload)
        assert response.status_code == 400, (case, response.text)
        assert response.headers["content-type"] == "application/problem+json", case
        problem = response.json()
        assert (case, problem["field"]) == (case, field)
        assert words in problem["detail"], (case, problem["detail"])
        assert "received" in problem, case


async def test_names_conflict_reuse_and_pending_limits(cluster: Cluster) -> None:
    await cluster.add_agent("i-node01")
    first = await cluster.create({"cuda.shares": "0.1"}, name="dup")
    assert first.status_code == 201
    again = await cluster.create({"cuda.shares": "0.1"}, name="dup")
    assert again.status_code == 409
    assert again.json()["field"] == "name"
    reused = await cluster.create({"cuda.shares": "0.1"}, name="dup", reuseIfExists=True)
    assert reused.status_code == 200
    assert reused.json()["created"] is False
    assert reused.json()["sessionId"] == first.json()["sessionId"]

    policy = await cluster.admin.patch(
        "/admin/resource-policies/default", json={"max_pending_session_count": 1}
    )
    assert policy.status_code == 200, policy.text
    big = {"cuda.shares": "1.9"}  # "dup" holds 0.1: one of these fits
    assert (await cluster.create(big, name="fills", maxWaitSeconds=10)).json()[
        "status"
    ] == "RUNNING"
    blocked = await cluster.create(big, name="waits", enqueueOnly=True)
    assert blocked.status_code == 201, blocked.text
    refused = await cluster.create(big, name="refused", enqueueOnly=True)
    assert refused.status_code == 412, refused.text
    assert refused.json()["field"] == "keypair_resource_policy.max_pending_session_count"
    assert "You cannot have more than 1 pending session(s)" in refused.json()["detail"]


async def test_authentication_failures(cluster: Cluster) -> None:
    creds = cluster.creds
    stale = cluster.client(creds.access_key, creds.secret_key)
    stale.auth = Signer(
        creds.access_key, creds.secret_key, lambda: utcnow() - timedelta(minutes=20)
    )
    wrong = cluster.client(creds.access_key, "x" * 40)
    unknown = cluster.client("AKIAUNKNOWNUNKNOWN00", "x" * 40)
    user, keypair = await make_user(cluster, "inactive@example.com")
    async with stale, wrong, unknown, user:
        for client, reason in (
            (stale, "date-expired"),
            (wrong, "signature-mismatch"),
            (unknown, "unknown-access-key"),
        ):
            response = await client.get("/sessions")
            assert response.status_code == 401, response.text
            assert response.json()["reason"] == reason
        assert (await user.get("/sessions")).status_code == 200
        deactivated = await cluster.admin.patch(
            f"/admin/keypairs/{keypair['access_key']}", json={"is_active": False}
        )
        assert deactivated.status_code == 200
        response = await user.get("/sessions")
        assert response.status_code == 401
        assert response.json()["reason"] == "inactive-access-key"
    anonymous = await cluster.admin.get("/sessions", auth=None)
    assert anonymous.status_code == 401
    assert anonymous.json()["reason"] == "missing-credentials"


async def test_users_only_see_their_own_sessions(cluster: Cluster) -> None:
    await cluster.add_agent("i-node01")
    alice, _ = await make_user(cluster, "alice@example.com")
    bob, _ = await make_user(cluster, "bob@example.com")
    domain_admin, _ = await make_user(cluster, "admin@example.com", role="admin")
    async with alice, bob, domain_admin:
        created = await cluster.create({"cuda.shares": "0.1"}, client=alice, name="mine")
        assert created.status_code == 201, created.text
        sid = created.json()["sessionId"]
        for path in (
            f"/session/{sid}",
            f"/session/{sid}/why",
            f"/session/{sid}/logs",
            "/session/mine",
        ):
            response = await bob.get(path)
            assert response.status_code == 404, (path, response.text)
        assert (await bob.delete(f"/session/{sid}")).status_code == 404
        assert (await bob.get("/sessions")).json()["total"] == 0
        assert (await alice.get("/session/mine")).json()["sessionId"] == sid
        # The listing names each owner by e-mail too (the console's Owner column).
        ours = await cluster.create({"cpu": "1"}, name="admins")
        assert ours.status_code == 201, ours.text
        listed_by_admin = (await cluster.admin.get("/sessions")).json()["items"]
        owners = {s["sessionName"]: (s["ownerEmail"], s["accessKey"]) for s in listed_by_admin}
        alice_key = (await alice.get("/whoami")).json()["access_key"]
        assert owners["mine"] == ("alice@example.com", alice_key)
        assert owners["admins"][0] == (await cluster.admin.get("/whoami")).json()["email"]
        assert [s["ownerEmail"] for s in (await alice.get("/sessions")).json()["items"]] == [
            "alice@example.com"
        ]
        assert (await cluster.admin.delete(f"/session/{ours.json()['sessionId']}")).is_success
        assert (await domain_admin.get(f"/session/{sid}")).status_code == 200
        assert (await cluster.admin.get(f"/session/{sid}")).status_code == 200
        forbidden = await alice.get("/agents")
        assert forbidden.status_code == 403
        assert forbidden.json()["reason"] == "insufficient-role"
        assert (await alice.get("/admin/users")).status_code == 403
        gql = await alice.post(
            "/admin/gql", json={"query": '{ agent(agent_id: "i-node01") { id } }'}
        )
        assert gql.json()["errors"][0]["message"].startswith("This needs the superadmin role")
        listed = await alice.post(
            "/admin/gql",
            json={"query": "{ compute_session_list { total_count items { name status } } }"},
        )
        assert listed.json()["data"]["compute_session_list"]["total_count"] == 1
        deleted = await alice.delete("/session/mine")
        assert deleted.json()["status"] in ("CANCELLED", "TERMINATED")


async def test_logs_events_metrics_and_slot_types(cluster: Cluster) -> None:
    await cluster.add_agent("i-node01")
    created = await cluster.create({"cuda.shares": "0.5"}, name="watched", maxWaitSeconds=10)
    assert created.json()["status"] == "RUNNING", created.text
    logs = (await cluster.admin.get("/session/watched/logs")).json()
    assert logs["result"]["logs"].startswith("hollow kernel")
    assert (await cluster.admin.delete("/session/watched")).json()["status"] == "TERMINATED"

    events = await cluster.admin.get("/session/watched/events")
    assert events.headers["content-type"].startswith("text/event-stream")
    statuses = [line for line in events.text.splitlines() if line.startswith("data: ")]
    assert '"status": "RUNNING"' in statuses[-3]
    assert '"status": "TERMINATED"' in statuses[-1]
    assert len(statuses) == 8  # PENDING .. RUNNING, TERMINATING, TERMINATED

    slots = (await cluster.admin.get("/config/resource-slots")).json()
    assert slots == {"cpu": "count", "mem": "bytes", "cuda.shares": "count"}
    details = (await cluster.admin.get("/config/resource-slots/details")).json()
    assert details["cuda.shares"]["display_unit"] == "fGPU"
    metrics = await cluster.admin.get("/metrics", auth=None)
    assert 'accelshare_sessions{status="TERMINATED"} 1.0' in metrics.text
    assert "accelshare_scheduler_pass_seconds_count" in metrics.text


async def test_agent_endpoints_need_the_cluster_secret(cluster: Cluster) -> None:
    agent = await cluster.add_agent("i-node01")
    body = agent.heartbeat_message().model_dump_json()
    for headers in ({}, {"X-Accelshare-Cluster-Secret": "wrong"}):
        response = await cluster.internal.post(
            "/internal/agents/heartbeat",
            content=body,
            headers={"Content-Type": "application/json", **headers},
        )
        assert response.status_code == 401
    ok = await cluster.internal.post(
        "/internal/agents/heartbeat",
        content=body,
        headers={"Content-Type": "application/json", "X-Accelshare-Cluster-Secret": SECRET},
    )
    assert ok.status_code == 200


async def test_admin_config_tree_and_scaling_groups(cluster: Cluster) -> None:
    put = await cluster.admin.put(
        "/admin/etcd",
        json={"prefix": "config/plugins/scheduler/fifo", "tree": {"num_retries_to_skip": "2"}},
    )
    assert put.status_code == 200, put.text
    got = await cluster.admin.get(
        "/admin/etcd", params={"key": "config/plugins/scheduler/fifo/num_retries_to_skip"}
    )
    assert got.json()["value"] == "2"
    tree = await cluster.admin.get("/admin/etcd", params={"prefix": "config/plugins"})
    assert tree.json()["tree"] == {"scheduler": {"fifo": {"num_retries_to_skip": "2"}}}
    bad = await cluster.admin.patch(
        "/admin/scaling-groups/default",
        json={"scheduler_opts": {"agent_selection_strategy": "magic"}},
    )
    assert bad.status_code == 400
    assert "agent_selection_strategy 'magic'" in bad.json()["detail"]
    made = await cluster.admin.post(
        "/admin/scaling-groups",
        json={"name": "gpu", "scheduler": "lifo", "scheduler_opts": {"pending_timeout": 60}},
    )
    assert made.status_code == 201, made.text
    assert made.json()["scheduler_opts"]["pending_timeout"] == 60
    policies = (await cluster.admin.get("/admin/resource-policies")).json()["items"]
    assert [p["name"] for p in policies] == ["default"]
    keypairs = (await cluster.admin.get("/admin/keypairs")).json()["items"]
    assert "secret_key" not in keypairs[0]


async def test_bind_refusal_cancels_and_releases(cluster: Cluster) -> None:
    agent = await cluster.add_agent("i-node01")
    agent.refuse_creates = "the image cannot be found"
    created = await cluster.create({"cuda.shares": "1"}, name="doomed", enqueueOnly=True)
    assert created.status_code == 201
    body = await cluster.wait_status("doomed", "CANCELLED")
    assert "the image cannot be found" in body["statusInfo"]
    detail = (await cluster.admin.get("/agents/i-node01")).json()
    assert detail["occupiedSlots"].get("cuda.shares", "0") == "0"
    agent.refuse_creates = None
    await cluster.create({"cuda.shares": "2"}, name="fits")
    await cluster.wait_status("fits", "RUNNING")


async def test_events_started_exited_and_deduplicated(cluster: Cluster) -> None:
    agent = await cluster.add_agent("i-node01", start_running=False)
    await cluster.create({"cuda.shares": "2"}, name="slow", enqueueOnly=True)
    await cluster.create({"cuda.shares": "2"}, name="next", enqueueOnly=True)
    await cluster.wait_status("slow", "CREATING")
    (kernel_id,) = agent.kernels
    await agent.start_kernel(kernel_id)
    await cluster.wait_status("slow", "RUNNING")
    assert (await cluster.session("next"))["status"] == "PENDING"
    kernel = agent.kernels[kernel_id]
    exited = agent._event(kernel, KernelEventType.EXITED, exit_code=3)
    await agent.exit_kernel(kernel_id, exit_code=3)
    await agent.send(exited)  # a different id: still applied once (the session is final)
    body = await cluster.wait_status("slow", "TERMINATED")
    assert (body["exitCode"], body["result"]) == (3, "FAILURE")
    await cluster.wait_status("next", "CREATING")
    applied = await cluster.manager.registry.apply_events(
        KernelEventBatch(agent_id="i-node01", events=[exited])
    )
    assert applied == 0


async def test_a_destroyed_kernels_exit_event_first_still_ends_the_session_as_destroyed(
    cluster: Cluster,
) -> None:
    """A real agent's destroyed kernel exits 143 (SIGTERM), and its exit event often reaches
    the manager before the destroy's answer: the session ends as destroyed either way,
    never as a FAILURE of the kernel."""
    agent = await cluster.add_agent("i-node01")
    agent.destroy_exit_code = 143
    for name, first in (("event-later", False), ("event-first", True)):
        agent.destroy_event_first = first
        await cluster.create({"cuda.shares": "0.5"}, name=name)
        await cluster.wait_status(name, "RUNNING")
        destroyed = await cluster.admin.delete(f"/session/{name}")
        assert destroyed.status_code == 200, destroyed.text
        body = await cluster.wait_status(name, "TERMINATED")
        assert body["result"] == "UNDEFINED", (name, body["result"])
        assert body["statusInfo"].startswith("destroyed by "), (name, body["statusInfo"])
        await agent.settle()


async def test_a_started_event_brings_the_apps_host_ports(cluster: Cluster) -> None:
    """An agent starting kernels in the background can have its "started" event applied
    before the create's answer is recorded: the session is RUNNING then, and the host
    port of its app must already be known (else the app proxy uses the declared port)."""
    agent = await cluster.add_agent("i-node01", start_running=False)
    payload = {
        "image": "python:3.11",
        "name": "web",
        "enqueueOnly": True,
        "config": {
            "resources": {"cuda.shares": "1"},
            "service_ports": [{"name": "web", "protocol": "http", "port": 8888}],
        },
    }
    assert (await cluster.admin.post("/session", json=payload)).status_code == 201
    await cluster.wait_status("web", "CREATING")
    (kernel_id,) = agent.kernels
    kernel = agent.kernels[kernel_id]
    kernel.status = KernelStatus.RUNNING
    mapping = ServicePortMapping(name="web", container_port=8888, host_port=30123)
    await agent.send(agent._event(kernel, KernelEventType.STARTED, service_ports=[mapping]))
    body = await cluster.wait_status("web", "RUNNING")
    apps = (await cluster.admin.get(f"/session/{body['sessionId']}/apps")).json()["apps"]
    assert [(a["name"], a["port"], a.get("hostPort")) for a in apps] == [("web", 8888, 30123)]


@pytest.fixture
async def frozen(db_url: str, tmp_path: Any) -> Any:
    from datetime import UTC, datetime

    from .cluster import running_cluster

    clock = FrozenClock(datetime.now(UTC))
    async with running_cluster(
        db_url, tmp_path / "state", clock=clock, background=False, **{"agent-timeout": 30}
    ) as c:
        yield c, clock


async def test_lost_agent_and_reconciliation(frozen: tuple[Cluster, FrozenClock]) -> None:
    cluster, clock = frozen
    agent = await cluster.add_agent("i-node01")
    await cluster.create({"cuda.shares": "1"}, name="keeps", enqueueOnly=True)
    clock.advance(timedelta(seconds=1))
    await cluster.create({"cuda.shares": "1"}, name="ends", enqueueOnly=True)
    await cluster.manager.scheduler.run_once()
    await cluster.wait_status("keeps", "RUNNING")
    await cluster.wait_status("ends", "RUNNING")
    clock.advance(timedelta(seconds=31))
    await agent.settle()
    assert await cluster.manager.registry.sweep() == ["i-node01"]
    assert (await cluster.admin.get("/agents/i-node01")).json()["status"] == "LOST"
    keeps = await cluster.session("keeps")
    assert keeps["status"] == "RUNNING"
    assert "agent i-node01 is LOST" in keeps["statusInfo"]
    # while it is away (unreachable): one session is destroyed; nobody can confirm it
    cluster.hollow.remove(agent)
    ended = await cluster.admin.delete("/session/ends")
    assert ended.json()["status"] == "TERMINATED"
    ends_kernel = (await cluster.session("ends"))["kernels"][0]["kernelId"]
    # the agent comes back still holding both kernels, plus one nobody knows about
    cluster.hollow.add(agent)
    assert ends_kernel in agent.kernels
    stray = "00000000-0000-0000-0000-000000000001"
    await agent._create(
        CreateKernelRequest(
            kernel_id=stray, session_id="x", image="i", requested_slots={"cpu": "1"}
        )
    )
    ack = await agent.heartbeat()
    assert ack.destroy_kernels == [ends_kernel]
    detail = (await cluster.admin.get("/agents/i-node01")).json()
    assert detail["status"] == "ALIVE"
    assert detail["statusData"]["unknown_kernels"] == [stray]
    assert (await cluster.session("keeps"))["statusInfo"] == "agent i-node01 is back"


async def test_pending_timeout_cancels(frozen: tuple[Cluster, FrozenClock]) -> None:
    cluster, clock = frozen
    await cluster.add_agent("i-node01")
    patched = await cluster.admin.patch(
        "/admin/scaling-groups/default", json={"scheduler_opts": {"pending_timeout": 60}}
    )
    assert patched.status_code == 200
    await cluster.create({"cuda.shares": "2"}, name="first", enqueueOnly=True)
    clock.advance(timedelta(seconds=1))
    await cluster.create({"cuda.shares": "2"}, name="waits", enqueueOnly=True)
    await cluster.manager.scheduler.run_once()
    first, waits = await cluster.statuses("first", "waits")
    assert (first != "PENDING", waits) == (True, "PENDING")
    clock.advance(timedelta(seconds=61))
    await cluster.manager.scheduler.run_once()
    body = await cluster.session("waits")
    assert body["status"] == "CANCELLED"
    assert "pending_timeout (60 s)" in body["statusInfo"]


async def test_openapi_lists_the_control_plane(cluster: Cluster) -> None:
    spec = (await cluster.admin.get("/openapi.json", auth=None)).json()
    for path in (
        "/session",
        "/session/{ref}/why",
        "/sessions",
        "/agents/{agent_id}/alloc-map",
        "/config/resource-slots",
        "/admin/etcd",
        "/internal/agents/heartbeat",
        "/admin/gql",
    ):
        assert path in spec["paths"], path


async def test_dependencies_and_keypair_quota_from_the_database(cluster: Cluster) -> None:
    agent = await cluster.add_agent("i-node01")
    first = await cluster.create(
        {"cuda.shares": "0.2"}, name="first", type="batch", startupCommand="true", maxWaitSeconds=10
    )
    assert first.json()["status"] == "RUNNING", first.text
    after = await cluster.create({"cuda.shares": "0.2"}, name="after", dependencies=["first"])
    assert after.json()["status"] == "PENDING"
    assert after.json()["statusInfo"].startswith("Waiting for dependency sessions")
    (kernel_id,) = agent.kernels
    await agent.exit_kernel(kernel_id, exit_code=0)
    await cluster.wait_status("after", "RUNNING")

    quota = await cluster.admin.patch(
        "/admin/resource-policies/default", json={"total_resource_slots": {"cuda.shares": "1"}}
    )
    assert quota.status_code == 200, quota.text
    over = await cluster.create({"cuda.shares": "1"}, name="over")
    assert over.json()["status"] == "PENDING"
    assert (
        "Keypair resource quota exceeded (cuda.shares: 0.2 in use + 1 requested > 1 allowed)"
        in (over.json()["statusInfo"])
    )
    why = (await cluster.admin.get("/session/over/why")).json()
    assert [p["name"] for p in why["scheduler"]["failed_predicates"]] == ["keypair_resource_limit"]
    await cluster.admin.delete("/session/after")
    await cluster.wait_status("over", "RUNNING")


async def test_backendai_routes_accelshare_lacks_answer_501_naming_the_feature(
    cluster: Cluster,
) -> None:
    """No bare 404/405 for a Backend.AI feature accelshare does not have: a 501
    not-supported problem naming it and what to use instead."""
    cases = [
        ("POST", "/session/s1/commit", "session-commit"),
        ("POST", "/session/s1/complete", "code-completion"),
        ("POST", "/session/s1/interrupt", "interrupt"),
        ("POST", "/session/_/create-from-template", "session-template"),
        ("GET", "/template/session", "session-template"),
        ("GET", "/user-config/dotfiles", "dotfiles"),
        ("GET", "/services", "model-serving"),
        ("GET", "/logs/error", "server-logs"),
        ("POST", "/image/import", "image-import"),
    ]
    for method, path, feature in cases:
        response = await cluster.admin.request(method, path, json={})
        assert response.status_code == 501, (path, response.text)
        problem = response.json()
        assert problem["type"] == "/problems/not-supported", problem
        assert problem["feature"] == feature, problem
        assert "docs/compatibility.md" in problem["detail"]
    # the routes accelshare has are not shadowed
    assert (await cluster.admin.get("/session/nosuch/logs")).status_code == 404
    assert (await cluster.admin.post("/session/nosuch/logs")).status_code == 405


async def test_the_scaling_group_is_sgroup_on_the_wire(cluster: Cluster) -> None:
    """``?sgroup=`` and the ``sgroup`` body key select a scaling group (Backend.AI's
    spelling); ``scaling_group`` is not one of /admin/etcd's keys."""
    await cluster.add_agent("i-node01")  # in scaling group default
    for group, unit in (("default", "fGPU"), ("nope", "")):  # from the group's agents
        details = await cluster.admin.get(
            "/config/resource-slots/details", params={"sgroup": group}
        )
        assert details.json()["cuda.shares"]["display_unit"] == unit, details.text
        limits = await cluster.admin.get("/config/resource-slots/limits", params={"sgroup": group})
        assert ("cuda.shares" in limits.json()) is bool(unit), limits.text
    key = "config/plugins/scheduler/fifo/num_retries_to_skip"
    assert (await cluster.admin.put("/admin/etcd", json={"key": key, "value": "2"})).is_success
    scoped = {"key": key, "value": "3", "scope": "sgroup", "sgroup": "default"}
    assert (await cluster.admin.put("/admin/etcd", json=scoped)).is_success
    refused = await cluster.admin.put("/admin/etcd", json={**scoped, "scaling_group": "default"})
    assert refused.status_code == 400, refused.text
    for params, value in (({}, "2"), ({"sgroup": "default"}, "3"), ({"sgroup": "nope"}, "2")):
        got = await cluster.admin.get("/admin/etcd", params={"key": key, **params})
        assert got.json()["value"] == value, (params, got.text)
    wrong = await cluster.admin.get("/admin/etcd", params={"key": key, "sgroup": "a/b"})
    assert wrong.status_code == 400
    assert wrong.json()["field"] == "sgroup"
    gone = await cluster.admin.delete(
        "/admin/etcd", params={"key": key, "scope": "sgroup", "sgroup": "default"}
    )
    assert gone.is_success
    got = await cluster.admin.get("/admin/etcd", params={"key": key, "sgroup": "default"})
    assert got.json()["value"] == "2"
