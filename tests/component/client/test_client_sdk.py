"""The SDK against a real manager and agent (the local cluster of conftest.py)."""

from __future__ import annotations

import asyncio
import json
import uuid
from decimal import Decimal

import pytest

from accelshare.client import (
    AccelshareClient,
    APIError,
    ClientConfig,
    ConnectionFailed,
    GraphQLError,
    SyncAccelshareClient,
)
from accelshare.client.models import (
    CreatedUser,
    KeypairInfo,
    ResourcePolicyInfo,
    ScalingGroupAssociations,
    ScalingGroupInfo,
    UserInfo,
)
from accelshare.devcluster import LocalCluster, free_port

AGENT = "i-dev-01"


def _cuda(amap_maps: dict[str, object]) -> dict[str, Decimal]:
    view = amap_maps["cuda"]
    return {d.device_id: Decimal(d.allocated) for d in view.devices}  # type: ignore[attr-defined]


async def test_health_and_whoami(sdk: AccelshareClient) -> None:
    assert (await sdk.health())["status"] == "ok"
    me = await sdk.whoami()
    assert me["role"] == "superadmin"
    assert me["access_key"] == sdk.client_config.access_key


async def test_an_idle_keep_alive_connection_outlives_uvicorns_five_seconds(
    clean: LocalCluster,
) -> None:
    """The official SDK pools idle connections for 15 s: the manager holds them longer
    (30 s, as Backend.AI's does), so a request after 6 idle seconds goes over the same
    connection instead of failing with "Broken pipe"."""
    host, port = clean.endpoint.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    request = f"GET /health HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()
    try:
        for _ in range(2):
            writer.write(request)
            await writer.drain()
            status = await asyncio.wait_for(reader.readline(), 10)
            assert status.startswith(b"HTTP/1.1 200"), status
            length = 0
            while (line := await reader.readline()) not in (b"\r\n", b""):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            await reader.readexactly(length)
            await asyncio.sleep(6)  # longer than uvicorn's default keep-alive (5 s)
        assert not reader.at_eof()
    finally:
        writer.close()


async def test_session_lifecycle(sdk: AccelshareClient) -> None:
    created = await sdk.sessions.create(
        "python",
        resources={"cpu": "1", "mem": "1g", "cuda.shares": "0.5"},
        name="sdk-life",
        max_wait_s=30,
    )
    assert created.created
    assert created.status == "RUNNING", created
    sid = created.session_id
    info = await sdk.sessions.get("sdk-life")
    assert info.session_id == sid
    assert info.requested_slots == {
        "cpu": Decimal(1),
        "mem": Decimal(2**30),
        "cuda.shares": Decimal("0.5"),
    }
    assert info.kernels
    assert sum(info.kernels[0].device_allocs["cuda.shares"].values()) == Decimal("0.5")
    assert next(c.to for c in info.status_history) == "PENDING"
    assert [c.to for c in info.status_history][-1] == "RUNNING"
    page = await sdk.sessions.list("RUNNING")
    assert sid in {s.session_id for s in page.items}
    why = await sdk.sessions.why(sid)
    assert why.status == "RUNNING"
    assert "not pending" in why.explanation
    assert isinstance(await sdk.sessions.logs(sid), str)

    seen: list[str] = []

    async def follow() -> None:
        async for event in sdk.sessions.events(sid):
            seen.append(event.status)

    follower = asyncio.create_task(follow())
    destroyed = await sdk.sessions.destroy(sid)
    assert destroyed.status in ("TERMINATING", "TERMINATED")
    await asyncio.wait_for(follower, timeout=30)  # the stream ends at a final status
    assert seen[0] == "PENDING"
    assert "RUNNING" in seen
    assert seen[-1] == "TERMINATED"
    assert (await sdk.sessions.get(sid)).is_final


async def test_pending_then_started_when_freed(sdk: AccelshareClient) -> None:
    """Three 1-fGPU sessions on 2 fGPU: one waits with a reason, then starts by itself."""
    first = await sdk.sessions.create("python", resources={"cuda.shares": "1"}, max_wait_s=30)
    second = await sdk.sessions.create("python", resources={"cuda.shares": "1"}, max_wait_s=30)
    assert (first.status, second.status) == ("RUNNING", "RUNNING")
    third = await sdk.sessions.create("python", resources={"cuda.shares": "1"})
    assert third.status == "PENDING"
    assert "cuda.shares" in third.session.pending_reason
    why = await sdk.sessions.why(third.session_id)
    assert why.status == "PENDING"
    assert any(AGENT in line for line in why.agents)
    assert "PENDING" in why.explanation
    await sdk.sessions.destroy(first.session_id)
    started = await sdk.sessions.wait(third.session_id, ("RUNNING",), timeout_s=30)
    assert started.status == "RUNNING"


async def test_enqueue_only_answers_at_once(sdk: AccelshareClient) -> None:
    created = await sdk.sessions.create("python", resources={"cpu": "1"}, enqueue_only=True)
    assert created.status == "PENDING"
    assert created.session.status_info == "enqueued"


async def test_agents_and_alloc_maps(sdk: AccelshareClient) -> None:
    created = await sdk.sessions.create("python", resources={"cuda.shares": "0.2"}, max_wait_s=30)
    bigger = await sdk.sessions.create("python", resources={"cuda.shares": "1.2"}, max_wait_s=30)
    assert (created.status, bigger.status) == ("RUNNING", "RUNNING")
    agents = await sdk.agents.list()
    assert [a.id for a in agents] == [AGENT]
    assert agents[0].status == "ALIVE"
    assert agents[0].available_slots["cpu"] == 8
    assert agents[0].available_slots["mem"] == 16 * 2**30
    assert agents[0].available_slots["cuda.shares"] == 2
    agent = await sdk.agents.get(AGENT)
    assert agent.alloc_map is not None
    assert "cuda" in agent.slot_metadata or "cuda.shares" in agent.slot_metadata
    amap = await sdk.agents.alloc_map(AGENT)
    assert amap.source == "agent"
    assert sorted(_cuda(amap.maps).values()) == [Decimal("0.6"), Decimal("0.8")]
    compat = await sdk.agents.alloc_map_compat(AGENT)
    assert sorted(compat.alloc_map.values()) == ["0.60", "0.80"]
    assert next(iter(compat.alloc_map.values())) == "0.80"  # most allocated first


async def test_graphql_gpu_alloc_map(sdk: AccelshareClient) -> None:
    await sdk.sessions.create("python", resources={"cuda.shares": "0.3"}, max_wait_s=30)
    data = await sdk.query(
        "query ($agent_id: String!) { agent(agent_id: $agent_id)"
        " { id status available_slots gpu_alloc_map } }",
        {"agent_id": AGENT},
    )
    agent = data["agent"]
    assert agent["status"] == "ALIVE"
    assert json.loads(agent["available_slots"])["cuda.shares"] == "2"
    assert sorted(json.loads(agent["gpu_alloc_map"]).values()) == ["0.00", "0.30"]
    with pytest.raises(GraphQLError) as caught:
        await sdk.query("{ no_such_field }")
    assert "no_such_field" in str(caught.value)
    assert caught.value.errors


async def test_config_slots(sdk: AccelshareClient) -> None:
    slots = await sdk.config.resource_slots()
    assert slots == {"cpu": "count", "mem": "bytes", "cuda.shares": "count"} | {
        k: v for k, v in slots.items() if k not in ("cpu", "mem", "cuda.shares")
    }
    details = await sdk.config.resource_slot_details()
    assert details["cuda.shares"]["display_unit"] == "fGPU"
    elsewhere = await sdk.config.resource_slot_details(scaling_group="no-such-group")
    assert elsewhere["cuda.shares"]["display_unit"] == ""  # no agent of that group says


@pytest.mark.parametrize(
    ("resources", "field", "words"),
    [
        ({"nope.device": "1"}, "config.resources.nope.device", "Unknown requested resource slot"),
        ({"cuda.shares": "0.25"}, "config.resources.cuda.shares", "quantum"),
        ({"cpu": "-1"}, "config.resources.cpu", "cpu"),
    ],
    ids=["unknown-slot", "off-quantum", "negative"],
)
async def test_refusals_carry_the_problem(
    sdk: AccelshareClient, resources: dict[str, str], field: str, words: str
) -> None:
    with pytest.raises(APIError) as caught:
        await sdk.sessions.create("python", resources=resources)
    error = caught.value
    assert error.status == 400
    assert error.problem["field"] == field
    assert words in error.detail


async def test_not_found_and_bad_keys(sdk: AccelshareClient, clean: LocalCluster) -> None:
    with pytest.raises(APIError) as caught:
        await sdk.sessions.get(str(uuid.uuid4()))
    assert caught.value.status == 404
    config = clean.client_config()
    wrong = ClientConfig(config.endpoint, config.access_key, "x" * 40)
    async with AccelshareClient(wrong) as client:
        with pytest.raises(APIError) as refused:
            await client.sessions.list()
    assert refused.value.status == 401
    assert refused.value.problem["reason"] == "signature-mismatch"
    nowhere = ClientConfig(f"http://127.0.0.1:{free_port()}", config.access_key, "x" * 40)
    async with AccelshareClient(nowhere) as client:
        with pytest.raises(ConnectionFailed, match="cannot reach the manager"):
            await client.sessions.list()


async def test_admin_users_keypairs_policies(sdk: AccelshareClient, clean: LocalCluster) -> None:
    tag = uuid.uuid4().hex[:8]
    policy = await sdk.admin.create_policy(
        f"p-{tag}",
        default_for_unspecified="UNLIMITED",
        total_resource_slots={"cpu": "4", "mem": "inf"},
        max_concurrent_sessions=1,
    )
    assert isinstance(policy, ResourcePolicyInfo)
    assert policy.max_concurrent_sessions == 1
    assert policy.total_resource_slots == {"cpu": Decimal(4), "mem": Decimal("Infinity")}
    assert policy.to_json()["total_resource_slots"] == {"cpu": "4", "mem": "Infinity"}
    made = await sdk.admin.create_user(
        f"u-{tag}@example.com", "password-123", resource_policy=f"p-{tag}"
    )
    assert isinstance(made, CreatedUser)
    assert (made.user.email, made.user.role, made.user.status) == (
        f"u-{tag}@example.com",
        "user",
        "active",
    )
    keypair = made.keypair
    assert keypair is not None
    assert keypair.secret_key
    assert keypair.resource_policy == f"p-{tag}"
    user_config = ClientConfig(clean.endpoint, keypair.access_key, keypair.secret_key)
    async with AccelshareClient(user_config) as user:
        assert (await user.whoami())["role"] == "user"
        with pytest.raises(APIError) as forbidden:
            await user.agents.list()
        assert forbidden.value.status == 403
        assert (await user.sessions.list()).items == []
    listed = await sdk.admin.list_keypairs(user_email=f"u-{tag}@example.com")
    assert [k.access_key for k in listed] == [keypair.access_key]
    assert listed[0].user_email == f"u-{tag}@example.com"
    assert listed[0].secret_key is None
    assert "secret_key" not in listed[0].to_json()  # exactly what the server sent
    extra = await sdk.admin.create_keypair(f"u-{tag}@example.com", is_admin=False)
    assert isinstance(extra, KeypairInfo)
    assert extra.secret_key
    updated = await sdk.admin.update_keypair(keypair.access_key, is_active=False)
    assert isinstance(updated, KeypairInfo)
    assert updated.is_active is False
    assert await sdk.admin.delete_keypair(keypair.access_key) is None
    assert await sdk.admin.delete_keypair(extra.access_key) is None
    changed = await sdk.admin.update_user(f"u-{tag}@example.com", total_resource_slots={"cpu": "2"})
    assert isinstance(changed, UserInfo)
    assert changed.total_resource_slots == {"cpu": Decimal(2)}
    users = {u.email: u for u in await sdk.admin.list_users()}
    assert users[f"u-{tag}@example.com"].total_resource_slots["cpu"] == Decimal(2)
    deleted = await sdk.admin.delete_user(f"u-{tag}@example.com")
    assert deleted.status == "deleted"
    again = await sdk.admin.update_policy(f"p-{tag}", max_concurrent_sessions=2)
    assert again.max_concurrent_sessions == 2
    assert await sdk.admin.delete_policy(f"p-{tag}") is None
    assert f"p-{tag}" not in {p.name for p in await sdk.admin.list_policies()}


async def test_admin_scaling_groups_and_config_tree(sdk: AccelshareClient) -> None:
    name = f"sg-{uuid.uuid4().hex[:8]}"
    made = await sdk.admin.create_scaling_group(
        name, scheduler="lifo", scheduler_opts={"pending_timeout": 60}
    )
    assert isinstance(made, ScalingGroupInfo)
    assert made.scheduler == "lifo"
    changed = await sdk.admin.update_scaling_group(name, scheduler="drf")
    assert changed.scheduler == "drf"
    assert changed.scheduler_opts["pending_timeout"] == 60
    groups = {g.name: g for g in await sdk.admin.list_scaling_groups()}
    assert groups[name].is_active is True
    assert (await sdk.admin.scaling_group_associations(name)).domains == []  # open to nobody
    opened = await sdk.admin.associate_scaling_group(name, domain="default")
    assert isinstance(opened, ScalingGroupAssociations)
    assert (opened.domains, opened.groups, opened.keypairs) == (["default"], [], [])
    closed = await sdk.admin.dissociate_scaling_group(name, domain="default")
    assert closed.domains == []
    with pytest.raises(APIError) as unknown:
        await sdk.admin.associate_scaling_group(name, domain="no-such-domain")
    assert unknown.value.status == 404
    assert await sdk.admin.delete_scaling_group(name) is None
    assert name not in {g.name for g in await sdk.admin.list_scaling_groups()}

    key = f"test/{name}"
    await sdk.admin.etcd_put(f"{key}/a", "1")
    await sdk.admin.etcd_put_tree(key, {"b": {"c": "2"}})
    assert await sdk.admin.etcd_get(f"{key}/a") == "1"
    assert await sdk.admin.etcd_get_prefix(key) == {"a": "1", "b": {"c": "2"}}
    await sdk.admin.etcd_delete(key, prefix=True)
    assert await sdk.admin.etcd_get(f"{key}/a") is None
    await sdk.admin.etcd_put(key, "g", scope="sgroup", scaling_group=name)
    assert await sdk.admin.etcd_get(key, scaling_group=name) == "g"  # merged
    assert await sdk.admin.etcd_get(key) is None
    await sdk.admin.etcd_delete(key, scope="sgroup", scaling_group=name)
    assert await sdk.admin.etcd_get(key, scaling_group=name) is None
    mode = await sdk.admin.etcd_get("config/plugins/accelerator/cuda/allocation_mode")
    assert mode == "fractional"  # written by dev up before the agent started


def test_sync_client(clean: LocalCluster) -> None:
    with SyncAccelshareClient(clean.client_config()) as client:
        created = client.sessions.create("python", resources={"cpu": "1"}, max_wait_s=30)
        assert created.status == "RUNNING"
        assert created.session_id in {s.session_id for s in client.sessions.list().items}
        client.sessions.destroy(created.session_id)
        statuses = [e.status for e in client.sessions.events(created.session_id)]
        assert statuses[0] == "PENDING"
        assert statuses[-1] == "TERMINATED"
        assert client.client_config.endpoint == clean.endpoint
