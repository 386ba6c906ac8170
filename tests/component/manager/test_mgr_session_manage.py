"""Managing a session after its creation (Backend.AI's ``session status-history``,
``rename``, ``set-priority``, ``--tag``, ``--starts-at``), with the refusals."""

from __future__ import annotations

import base64
from datetime import datetime, timedelta
from typing import Any

from accelshare.manager.clock import utcnow

from .cluster import Cluster
from .test_mgr_api import make_user


async def test_status_history_gives_when_each_status_was_entered(cluster: Cluster) -> None:
    await cluster.add_agent("i-node01")
    created = await cluster.create({"cuda.shares": "0.1"}, name="hist", maxWaitSeconds=10)
    assert created.json()["status"] == "RUNNING", created.text
    sid = created.json()["sessionId"]

    answer = await cluster.admin.get("/session/hist/status-history")
    assert answer.status_code == 200, answer.text
    history = answer.json()["result"]
    for status in ("PENDING", "SCHEDULED", "PREPARING", "RUNNING"):
        assert status in history, history
    assert "TERMINATED" not in history
    assert history["preparing"] == history["PREPARING"]  # what Backend.AI's client reads
    times = [datetime.fromisoformat(history[s]) for s in ("PENDING", "PREPARING", "RUNNING")]
    assert times == sorted(times)
    assert all(t.tzinfo is not None for t in times)

    assert (await cluster.admin.delete(f"/session/{sid}")).is_success
    ended = (await cluster.admin.get(f"/session/{sid}/status-history")).json()["result"]
    assert ended["terminated"] == ended["TERMINATED"]
    assert datetime.fromisoformat(ended["TERMINATED"]) >= times[-1]

    other, _ = await make_user(cluster, "other-hist@example.com")
    async with other:
        hidden = await other.get(f"/session/{sid}/status-history")
        assert hidden.status_code == 404, hidden.text
        assert hidden.json()["field"] == "session"


async def _kernels(cluster: Cluster, ref: str) -> list[dict[str, Any]]:
    kernels: list[dict[str, Any]] = (await cluster.session(ref))["kernels"]
    return kernels


async def test_rename_keeps_the_session_and_refuses_names_in_use(cluster: Cluster) -> None:
    await cluster.add_agent("i-node01")
    first = await cluster.create({"cuda.shares": "0.3"}, name="first", maxWaitSeconds=10)
    second = await cluster.create({"cuda.shares": "0.1"}, name="second", maxWaitSeconds=10)
    assert [first.json()["status"], second.json()["status"]] == ["RUNNING", "RUNNING"]
    sid = first.json()["sessionId"]
    kernels = await _kernels(cluster, sid)

    renamed = await cluster.admin.post("/session/first/rename", params={"name": "renamed"})
    assert renamed.status_code == 204, renamed.text
    body = await cluster.session("renamed")
    assert (body["sessionId"], body["status"]) == (sid, "RUNNING")
    assert await _kernels(cluster, sid) == kernels  # same kernel, same devices
    assert (await cluster.admin.get("/session/first")).status_code == 404

    taken = await cluster.admin.post(f"/session/{sid}/rename", params={"name": "second"})
    assert taken.status_code == 409, taken.text
    assert taken.json()["field"] == "name"
    assert "already exists" in taken.json()["detail"]
    for bad in ("-dash", "x" * 65, "c59395cd-ac91-4cd3-a1b0-3d2568aa2d01"):
        refused = await cluster.admin.post(f"/session/{sid}/rename", params={"name": bad})
        assert refused.status_code == 400, (bad, refused.text)
        assert refused.json()["field"] == "name", bad
    missing = await cluster.admin.post(f"/session/{sid}/rename")
    assert missing.status_code == 400, missing.text
    assert missing.json()["field"] == "name"
    assert (await cluster.session(sid))["sessionName"] == "renamed"
    assert await _kernels(cluster, sid) == kernels

    # a name is free again once its session has ended
    assert (await cluster.admin.delete("/session/second")).is_success
    reused = await cluster.admin.post(f"/session/{sid}/rename", params={"name": "second"})
    assert reused.status_code == 204, reused.text
    ended = await cluster.admin.post("/session/second/rename", params={"name": "x"})
    assert ended.status_code == 204  # "second" names the live one now
    gone = await cluster.admin.post(
        f"/session/{second.json()['sessionId']}/rename", params={"name": "again"}
    )
    assert gone.status_code == 409, gone.text
    assert gone.json()["field"] == "status"
    assert gone.json()["received"] == "TERMINATED"

    other, _ = await make_user(cluster, "other-rename@example.com")
    async with other:
        hidden = await other.post(f"/session/{sid}/rename", params={"name": "mine"})
        assert hidden.status_code == 404, hidden.text
    assert (await cluster.session(sid))["sessionName"] == "x"


async def test_tag_is_stored_and_shown(cluster: Cluster) -> None:
    await cluster.add_agent("i-node01")
    created = await cluster.create({"cpu": "1"}, name="tagged", tag="my experiment")
    assert created.status_code == 201, created.text
    assert created.json()["session"]["tag"] == "my experiment"
    assert (await cluster.session("tagged"))["tag"] == "my experiment"
    sid = created.json()["sessionId"]
    gql = await cluster.gql("query ($id: UUID!) { compute_session(id: $id) { tag } }", {"id": sid})
    assert gql["data"]["compute_session"]["tag"] == "my experiment"
    listed = (await cluster.admin.get("/sessions")).json()["items"]
    assert [s["tag"] for s in listed if s["sessionId"] == sid] == ["my experiment"]

    untagged = await cluster.create({"cpu": "1"}, name="untagged")
    assert untagged.json()["session"]["tag"] is None
    for bad in ("x" * 65, "two\nlines"):
        refused = await cluster.create({"cpu": "1"}, name="badtag", tag=bad)
        assert refused.status_code == 400, (bad, refused.text)
        assert refused.json()["field"] == "tag", refused.json()


async def test_starts_at_takes_backendais_delays(cluster: Cluster) -> None:
    await cluster.add_agent("i-node01")
    for text, delay in (
        ("20s", timedelta(seconds=20)),
        ("5m", timedelta(minutes=5)),
        ("1h", timedelta(hours=1)),
        ("2d", timedelta(days=2)),
        ("1h30m", timedelta(minutes=90)),
        ("90", timedelta(seconds=90)),
    ):
        before = utcnow()
        created = await cluster.create(
            {"cpu": "1"}, name=f"later-{len(text)}-{delay.seconds}", type="batch",
            startupCommand="true", starts_at=text, enqueueOnly=True,
        )  # fmt: skip
        after = utcnow()
        assert created.status_code == 201, (text, created.text)
        starts = datetime.fromisoformat(created.json()["session"]["startsAt"])
        assert before + delay <= starts <= after + delay, (text, starts)
        assert created.json()["status"] == "PENDING"

    iso = await cluster.create(
        {"cpu": "1"}, name="at-iso", type="batch", startupCommand="true",
        startsAt="2030-01-02T03:04:05Z", enqueueOnly=True,
    )  # fmt: skip
    assert iso.json()["session"]["startsAt"] == "2030-01-02T03:04:05+00:00"

    for bad in ("soon", "20x", "5 m", "1m1h", "99999d"):
        refused = await cluster.create(
            {"cpu": "1"}, name="bad-start", type="batch", startupCommand="true", startsAt=bad
        )
        assert refused.status_code == 400, (bad, refused.text)
        problem = refused.json()
        assert problem["field"] == "startsAt", problem
        assert "20s, 5m, 1h30m, 2d" in problem["expected"]
        assert problem["received"] == bad


MODIFY = """
mutation($input: ModifyComputeSessionInput!) {
  modify_compute_session(input: $input) { item { name priority } clientMutationId }
}
"""


async def _gql(client: Any, query: str, variables: dict[str, Any]) -> dict[str, Any]:
    response = await client.post("/admin/gql", json={"query": query, "variables": variables})
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def test_modify_compute_session_sets_the_priority_of_a_pending_session(
    cluster: Cluster,
) -> None:
    await cluster.add_agent("i-node01")
    pending = await cluster.create(
        {"cpu": "1"}, name="queued", type="batch", startupCommand="true", startsAt="1h"
    )
    assert pending.json()["status"] == "PENDING", pending.text
    sid = pending.json()["sessionId"]
    answer = await cluster.gql(
        MODIFY, {"input": {"id": sid, "priority": 42, "clientMutationId": "m-1"}}
    )
    assert answer["data"]["modify_compute_session"] == {
        "item": {"name": "queued", "priority": 42},
        "clientMutationId": "m-1",
    }
    assert (await cluster.session(sid))["priority"] == 42
    relay_id = base64.b64encode(f"ComputeSessionNode:{sid}".encode()).decode()
    both = await cluster.gql(MODIFY, {"input": {"id": relay_id, "name": "q2", "priority": 7}})
    assert both["data"]["modify_compute_session"]["item"] == {"name": "q2", "priority": 7}

    out_of_range = await _gql(cluster.admin, MODIFY, {"input": {"id": sid, "priority": 101}})
    assert "priority must be from 0 to 100" in out_of_range["errors"][0]["message"]
    bad_name = await _gql(cluster.admin, MODIFY, {"input": {"id": sid, "name": "-x"}})
    assert "Invalid session name" in bad_name["errors"][0]["message"]
    bad_id = await _gql(cluster.admin, MODIFY, {"input": {"id": "nope", "priority": 1}})
    assert "expected a session UUID" in bad_id["errors"][0]["message"]
    assert (await cluster.session(sid))["priority"] == 7

    running = await cluster.create({"cpu": "1"}, name="busy", maxWaitSeconds=10)
    assert running.json()["status"] == "RUNNING", running.text
    refused = await _gql(
        cluster.admin, MODIFY, {"input": {"id": running.json()["sessionId"], "priority": 50}}
    )
    message = refused["errors"][0]["message"]
    assert "only while it is PENDING; it is RUNNING" in message, message
    assert refused["data"] is None
    assert (await cluster.session("busy"))["priority"] == 10

    other, _ = await make_user(cluster, "other-modify@example.com")
    async with other:
        hidden = await _gql(other, MODIFY, {"input": {"id": sid, "priority": 1}})
        assert "No session" in hidden["errors"][0]["message"]
    assert (await cluster.session(sid))["priority"] == 7


RESCAN = "mutation($a: String!) { rescan_gpu_alloc_maps(agent_id: $a) { task_id } }"


async def test_rescan_gpu_alloc_maps_is_accepted_and_has_nothing_to_do(cluster: Cluster) -> None:
    await cluster.add_agent("i-node01")
    answer = await cluster.gql(RESCAN, {"a": "i-node01"})
    assert answer["data"] == {"rescan_gpu_alloc_maps": {"task_id": None}}
    unknown = await _gql(cluster.admin, RESCAN, {"a": "i-nosuch"})
    assert "No agent 'i-nosuch'" in unknown["errors"][0]["message"]
    user, _ = await make_user(cluster, "rescan-user@example.com")
    async with user:
        refused = await _gql(user, RESCAN, {"a": "i-node01"})
        assert refused["errors"][0]["message"].startswith("This needs the superadmin role")


async def test_restart_recreates_the_kernel_on_the_same_devices(cluster: Cluster) -> None:
    agent = await cluster.add_agent("i-node01")
    agent.destroy_event_first = True  # the old kernel's exit arrives before the RPC returns
    agent.destroy_exit_code = 137
    created = await cluster.create({"cuda.shares": "0.3"}, name="again", maxWaitSeconds=10)
    assert created.json()["status"] == "RUNNING", created.text
    sid = created.json()["sessionId"]
    (before,) = await _kernels(cluster, sid)
    alloc_before = agent.compat_alloc_map()

    restarted = await cluster.admin.patch("/session/again")
    assert restarted.status_code == 200, restarted.text
    assert restarted.json()["sessionId"] == sid
    assert restarted.json()["status"] == "RUNNING"
    await agent.settle()
    body = await cluster.session(sid)
    assert (body["status"], body["result"]) == ("RUNNING", "UNDEFINED"), body["statusInfo"]
    assert body["statusInfo"] == f"restarted by {cluster.creds.email}"
    (after,) = body["kernels"]
    assert after["kernelId"] != before["kernelId"]
    assert after["deviceAllocs"] == before["deviceAllocs"]
    assert after["occupiedSlots"] == before["occupiedSlots"]
    assert after["status"] == "RUNNING"
    assert agent.destroy_requests == [before["kernelId"]]
    assert list(agent.kernels) == [after["kernelId"]]
    assert agent.compat_alloc_map() == alloc_before
    last = body["statusHistory"][-1]
    assert (last["from"], last["to"]) == ("RUNNING", "RUNNING")
    assert last["reason"].startswith("restarted by")
    await agent.heartbeat()  # the agent's report of the new kernel keeps the session
    assert (await cluster.session(sid))["status"] == "RUNNING"

    # refusals: not RUNNING (a session still PENDING, a batch session that has ended)
    pending = await cluster.create(
        {"cpu": "1"}, name="waiting", type="batch", startupCommand="true", startsAt="1h"
    )
    refused = await cluster.admin.patch("/session/waiting")
    assert refused.status_code == 409, refused.text
    assert (refused.json()["field"], refused.json()["received"]) == ("status", "PENDING")
    assert (await cluster.session(pending.json()["sessionId"]))["status"] == "PENDING"
    batch = await cluster.create(
        {"cpu": "1"}, name="done", type="batch", startupCommand="true", maxWaitSeconds=10
    )
    (kernel,) = await _kernels(cluster, batch.json()["sessionId"])
    await agent.exit_kernel(kernel["kernelId"], 0)
    await cluster.wait_status("done", "TERMINATED")
    ended = await cluster.admin.patch(f"/session/{batch.json()['sessionId']}")
    assert ended.status_code == 409, ended.text
    assert (ended.json()["field"], ended.json()["received"]) == ("status", "TERMINATED")
    assert "only a RUNNING session can be restarted" in ended.json()["detail"]

    other, _ = await make_user(cluster, "other-restart@example.com")
    async with other:
        assert (await other.patch(f"/session/{sid}")).status_code == 404
    assert (await cluster.session(sid))["kernels"][0]["kernelId"] == after["kernelId"]


async def test_a_restart_the_agent_refuses_ends_the_session(cluster: Cluster) -> None:
    agent = await cluster.add_agent("i-node01")
    created = await cluster.create({"cuda.shares": "0.5"}, name="fragile", maxWaitSeconds=10)
    assert created.json()["status"] == "RUNNING", created.text
    agent.refuse_creates = "the agent is draining"
    answer = await cluster.admin.patch("/session/fragile")
    assert answer.status_code == 200, answer.text
    assert answer.json()["status"] == "TERMINATED"
    assert "restart by" in answer.json()["statusInfo"]
    assert "could not be created again" in answer.json()["statusInfo"]
    body = await cluster.session(created.json()["sessionId"])
    assert body["result"] == "FAILURE"
    assert [h["to"] for h in body["statusHistory"]][-2:] == ["ERROR", "TERMINATED"]
    assert set(agent.compat_alloc_map().values()) == {"0.00"}
    assert agent.kernels == {}


async def test_a_create_answers_the_session_as_get_shows_it(cluster: Cluster) -> None:
    """The create answer's ``session`` (read as Core rows after the wait) is the same
    JSON as ``GET /session/{id}`` (the ORM read): with kernels and history once RUNNING,
    with its dependencies, and without kernels while PENDING."""
    await cluster.add_agent("i-node01")
    running = await cluster.create(
        {"cuda.shares": "0.2"},
        name="shown",
        tag="t",
        type="batch",
        startupCommand="sleep 100",
        maxWaitSeconds=10,
        config={"resources": {"cuda.shares": "0.2"}, "environ": {"A": "1"}},
    )
    assert running.status_code == 201, running.text
    answer = running.json()["session"]
    assert answer["status"] == "RUNNING"
    assert answer["kernels"]
    assert len(answer["statusHistory"]) >= 4
    shown = await cluster.session("shown")
    # the agent's STARTED event may make the session RUNNING (and answer the create)
    # before the bind records the kernel's container id: then the answer has none yet
    (kernel,) = answer["kernels"]
    assert kernel["containerId"] in (None, shown["kernels"][0]["containerId"])
    kernel["containerId"] = shown["kernels"][0]["containerId"]
    assert answer == shown

    dependent = await cluster.create(
        {"cpu": "1"}, name="after", dependencies=["shown"], enqueueOnly=True
    )
    assert dependent.status_code == 201, dependent.text
    answer = dependent.json()["session"]
    assert answer["dependencies"] == [running.json()["sessionId"]]
    assert "kernels" not in answer
    assert answer == await cluster.session("after")

    alone = await cluster.create({"cpu": "1"}, name="alone", startsAt="1h")
    assert alone.status_code == 201, alone.text
    answer = alone.json()["session"]
    assert answer["status"] == "PENDING"
    assert answer["dependencies"] == []
    assert answer == await cluster.session("alone")


async def test_a_create_charges_the_group_asked_for_and_reads_the_owner_each_time(
    cluster: Cluster,
) -> None:
    """The enqueue's owner read (keypair, user, groups, scaling group in one query):
    the oldest group of the user's domain by default, a group by name or id, a group
    of another domain is not the user's; a keypair deactivated is refused at once and
    accepted again once reactivated (nothing is kept between requests)."""
    import uuid

    import sqlalchemy as sa

    from accelshare.manager.models import Domain, Group, GroupMember, Keypair, ScalingGroup

    await cluster.add_agent("i-node01")
    me = (await cluster.admin.get("/whoami")).json()
    user_id = uuid.UUID(me["user_id"])
    first = await cluster.create({"cpu": "1"}, startsAt="1h")
    assert first.status_code == 201, first.text
    oldest = first.json()["session"]["groupId"]
    newer_id, elsewhere_id = uuid.uuid4(), uuid.uuid4()
    async with cluster.manager.db.begin(write=True) as db:
        db.add(Domain(name="d2"))
        await db.flush()
        db.add(Group(id=newer_id, name="g-new", domain_name=me["domain"]))
        db.add(Group(id=elsewhere_id, name="elsewhere", domain_name="d2"))
        await db.flush()
        db.add(GroupMember(group_id=newer_id, user_id=user_id))
        db.add(GroupMember(group_id=elsewhere_id, user_id=user_id))

    default = await cluster.create({"cpu": "1"}, startsAt="1h")
    assert default.json()["session"]["groupId"] == oldest
    for ref in ("g-new", str(newer_id)):
        named = await cluster.create({"cpu": "1"}, startsAt="1h", group=ref)
        assert named.status_code == 201, named.text
        assert named.json()["session"]["groupId"] == str(newer_id)
    other = await cluster.create({"cpu": "1"}, startsAt="1h", group="elsewhere")
    assert other.status_code == 400, other.text
    assert other.json()["detail"] == "You are not a member of the group 'elsewhere'"
    assert "elsewhere" not in other.json()["expected"]
    assert "g-new" in other.json()["expected"]

    _, keypair = await make_user(cluster, "owned@example.com")
    key = keypair["access_key"]
    owned = await cluster.create({"cpu": "1"}, startsAt="1h", owner_access_key=key)
    assert owned.status_code == 201, owned.text
    assert owned.json()["session"]["accessKey"] == key
    for active in (False, True):
        async with cluster.manager.db.begin(write=True) as db:
            await db.execute(
                sa.update(Keypair).where(Keypair.access_key == key).values(is_active=active)
            )
        again = await cluster.create({"cpu": "1"}, startsAt="1h", owner_access_key=key)
        if active:
            assert again.status_code == 201, again.text
        else:
            assert again.status_code == 400, again.text
            assert again.json()["detail"] == f"The keypair {key} is inactive"
    unknown = await cluster.create({"cpu": "1"}, startsAt="1h", owner_access_key="AKNOPE")
    assert unknown.status_code == 404, unknown.text
    assert unknown.json()["detail"] == "Unknown access key 'AKNOPE'"

    async with cluster.manager.db.begin(write=True) as db:
        await db.execute(
            sa.update(ScalingGroup).where(ScalingGroup.name == "default").values(is_active=False)
        )
    off = await cluster.create({"cpu": "1"}, startsAt="1h")  # the default, now inactive
    assert off.status_code == 400, off.text
    assert off.json()["detail"].startswith("No scaling group is open to your sessions")
    named = await cluster.admin.post(
        "/session",
        json={
            "image": "python:3.11",
            "config": {"resources": {"cpu": "1"}, "scalingGroup": "default"},
            "startsAt": "1h",
        },
    )
    assert named.status_code == 400, named.text
    assert named.json()["detail"] == "Unknown scaling group 'default' (available: none)"
