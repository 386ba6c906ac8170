"""The history of ended sessions through the REST API: ``GET /sessions`` with the ended
statuses and ``order=recent`` (the console's history page), paginated, most recent
first, under the role rules (a user: their own; an admin: the domain's)."""

from __future__ import annotations

import httpx

from .cluster import Cluster
from .test_mgr_api import make_user

ENDED = "/sessions?status=TERMINATED,CANCELLED,ERROR&order=recent"


async def _names(client: httpx.AsyncClient, query: str) -> tuple[list[str], int]:
    response = await client.get(query)
    assert response.status_code == 200, response.text
    body = response.json()
    return [s["sessionName"] for s in body["items"]], body["total"]


async def test_history_pages_most_recent_first_under_the_role_rules(cluster: Cluster) -> None:
    await cluster.add_agent("i-node01")
    alice, alice_keys = await make_user(cluster, "alice@example.com")
    bob, _ = await make_user(cluster, "bob@example.com")
    domain_admin, _ = await make_user(cluster, "admin@example.com", role="admin")
    async with alice, bob, domain_admin:
        # a session that ran and was destroyed (TERMINATED) ...
        ran = await cluster.create({"cpu": "1"}, client=alice, name="ran", maxWaitSeconds=10)
        assert ran.json()["status"] == "RUNNING", ran.text
        assert (await alice.delete("/session/ran")).json()["status"] == "TERMINATED"
        # ... two that never ran (cancelled while PENDING: no agent has 50 GPUs) ...
        for name in ("waited-1", "waited-2"):
            pending = await cluster.create(
                {"cuda.shares": "50"}, client=alice, name=name, enqueueOnly=True, waitForAgents=True
            )
            assert pending.status_code == 201, pending.text
            assert (await alice.delete(f"/session/{name}")).json()["status"] == "CANCELLED"
        # ... one still running (not history), and bob's ended one.
        live = await cluster.create({"cpu": "1"}, client=alice, name="live", maxWaitSeconds=10)
        assert live.json()["status"] == "RUNNING", live.text
        theirs = await cluster.create({"cpu": "1"}, client=bob, name="bobs", maxWaitSeconds=10)
        bobs_id = theirs.json()["sessionId"]
        assert (await bob.delete("/session/bobs")).json()["status"] == "TERMINATED"

        assert await _names(alice, ENDED) == (["waited-2", "waited-1", "ran"], 3)
        assert await _names(alice, ENDED + "&limit=2") == (["waited-2", "waited-1"], 3)
        assert await _names(alice, ENDED + "&limit=2&offset=2") == (["ran"], 3)
        # the default order is unchanged: oldest first
        assert await _names(alice, ENDED.replace("&order=recent", "")) == (
            ["ran", "waited-1", "waited-2"],
            3,
        )
        # the reason each ended is in the listing
        body = (await alice.get(ENDED + "&limit=1")).json()["items"][0]
        assert (body["sessionName"], body["status"]) == ("waited-2", "CANCELLED"), body
        assert body["statusInfo"] == "destroyed by alice@example.com", body

        # bob sees only his own, even when he names alice's access key; nor her logs
        assert await _names(bob, ENDED) == (["bobs"], 1)
        assert await _names(bob, ENDED + f"&access_key={alice_keys['access_key']}") == ([], 0)
        ran_id = ran.json()["sessionId"]
        for path in (f"/session/{ran_id}", f"/session/{ran_id}/logs"):
            assert (await bob.get(path)).status_code == 404, path
        # the owner and the admins read an ended session's logs (what the agent kept)
        for client in (alice, domain_admin, cluster.admin):
            logs = await client.get(f"/session/{ran_id}/logs")
            assert logs.status_code == 200, logs.text
            assert isinstance(logs.json()["result"]["logs"], str)
        assert (await alice.get(f"/session/{bobs_id}/logs")).status_code == 404

        # the admins see everyone's history, most recent first
        everyone = (["bobs", "waited-2", "waited-1", "ran"], 4)
        assert await _names(domain_admin, ENDED) == everyone
        assert await _names(cluster.admin, ENDED) == everyone
        assert await _names(cluster.admin, ENDED + f"&access_key={alice_keys['access_key']}") == (
            ["waited-2", "waited-1", "ran"],
            3,
        )


async def test_history_order_is_validated(cluster: Cluster) -> None:
    response = await cluster.admin.get("/sessions?status=all&order=newest")
    assert response.status_code == 400, response.text
    problem = response.json()
    assert (problem["field"], problem["received"]) == ("order", "newest"), problem
    assert "'created' or 'recent'" in problem["expected"], problem
