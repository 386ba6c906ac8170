"""``admin manager status / freeze / unfreeze`` (``GET/PUT /manager/status``) and
``admin scaling-group get-available`` (``GET /scaling-groups?group=``)."""

from __future__ import annotations

import pytest

from accelshare.manager.maintenance import (
    FROZEN_REASON,
    MANAGER_STATUS_KEY,
    ManagerStatus,
    read_manager_status,
)

from .cluster import Cluster
from .test_mgr_api import make_user


async def test_only_a_superadmin_reads_or_changes_the_manager_status(cluster: Cluster) -> None:
    user, _ = await make_user(cluster, "u@example.com")
    admin, _ = await make_user(cluster, "a@example.com", role="admin")
    async with user, admin:
        for client in (user, admin):
            assert (await client.get("/manager/status")).status_code == 403
            refused = await client.put("/manager/status", json={"status": "frozen"})
            assert refused.status_code == 403
            assert refused.json()["reason"] == "insufficient-role"
    assert await read_manager_status(cluster.manager.scheduler.store) is ManagerStatus.RUNNING


async def test_bad_status_bodies_are_400s(cluster: Cluster) -> None:
    for body in ({"status": "paused"}, {"status": "frozen", "force_kill": "maybe"}, {}):
        response = await cluster.admin.put("/manager/status", json=body)
        assert response.status_code in (400, 422), response.text
    response = await cluster.admin.put(
        "/manager/status", json={"status": "running", "force_kill": True}
    )
    assert response.status_code == 400
    assert "force_kill" in response.text


async def test_frozen_schedules_nothing_refuses_creates_and_survives_in_the_store(
    cluster: Cluster,
) -> None:
    await cluster.add_agent("i-node01")
    first = await cluster.create({"cpu": 4}, name="holder", maxWaitSeconds=10)
    assert first.json()["status"] == "RUNNING", first.text
    waiting = await cluster.create({"cpu": 6}, name="waiter", maxWaitSeconds=2)
    assert waiting.json()["status"] == "PENDING", waiting.text

    status = (await cluster.admin.get("/manager/status")).json()
    assert status["status"] == "running"
    assert status["active_sessions"] == 1
    assert status["nodes"][0]["status"] == "running"

    frozen = await cluster.admin.put("/manager/status", json={"status": "frozen"})
    assert frozen.status_code == 204, frozen.text
    assert (await cluster.admin.get("/manager/status")).json()["status"] == "frozen"
    assert await read_manager_status(cluster.manager.scheduler.store) is ManagerStatus.FROZEN
    assert (await cluster.session("waiter"))["statusInfo"] == FROZEN_REASON

    refused = await cluster.create({"cpu": 1}, name="late")
    assert refused.status_code == 503, refused.text
    assert refused.json()["type"].endswith("/server-frozen")

    # resources free up, passes run: still nothing is placed
    assert (await cluster.admin.delete("/session/holder")).status_code < 300
    await cluster.wait_status("holder", "TERMINATED")
    mark = cluster.manager.scheduler.next_pass_mark()
    cluster.manager.trigger()
    assert await cluster.manager.scheduler.wait_for_pass(mark, 10)
    waiter = await cluster.session("waiter")
    assert (waiter["status"], waiter["statusInfo"]) == ("PENDING", FROZEN_REASON)

    thawed = await cluster.admin.put("/manager/status", json={"status": "running"})
    assert thawed.status_code == 204, thawed.text
    await cluster.wait_status("waiter", "RUNNING")
    assert (await cluster.create({"cpu": 1}, name="later", maxWaitSeconds=10)).status_code == 201


async def test_freeze_with_force_kill_destroys_every_live_session(cluster: Cluster) -> None:
    await cluster.add_agent("i-node01")
    for name in ("k1", "k2"):
        created = await cluster.create({"cpu": 1}, name=name, maxWaitSeconds=10)
        assert created.json()["status"] == "RUNNING", created.text
    response = await cluster.admin.put(
        "/manager/status", json={"status": "frozen", "force_kill": True}
    )
    assert response.status_code == 204, response.text
    for name in ("k1", "k2"):
        await cluster.wait_status(name, "TERMINATED", "CANCELLED")
    assert (await cluster.admin.get("/manager/status")).json()["active_sessions"] == 0
    await cluster.admin.put("/manager/status", json={"status": "running"})


@pytest.mark.parametrize("who", ["superadmin", "member"])
async def test_available_scaling_groups_of_a_project(cluster: Cluster, who: str) -> None:
    created = await cluster.admin.post("/admin/scaling-groups", json={"name": "spare"})
    assert created.status_code == 201, created.text
    off = await cluster.admin.post(
        "/admin/scaling-groups", json={"name": "retired", "is_active": False}
    )
    assert off.status_code == 201, off.text
    client = cluster.admin
    if who == "member":
        client, _ = await make_user(cluster, "m@example.com")
    response = await client.get("/scaling-groups", params={"group": "default"})
    assert response.status_code == 200, response.text
    assert response.json() == {"scaling_groups": [{"name": "default"}]}  # spare: not associated
    for name in ("spare", "retired"):
        opened = await cluster.admin.post(
            f"/admin/scaling-groups/{name}/associations", json={"domain": "default"}
        )
        assert opened.status_code == 200, opened.text
    response = await client.get("/scaling-groups", params={"group": "default"})
    assert response.json() == {"scaling_groups": [{"name": "default"}, {"name": "spare"}]}
    missing = await client.get("/scaling-groups", params={"group": "no-such-project"})
    assert missing.status_code == 404
    assert "no-such-project" in missing.text


async def test_an_unknown_stored_status_reads_as_running(cluster: Cluster) -> None:
    store = cluster.manager.scheduler.store
    await store.put(MANAGER_STATUS_KEY, "on-vacation")
    assert await read_manager_status(store) is ManagerStatus.RUNNING
    assert (await cluster.admin.get("/manager/status")).json()["status"] == "running"
