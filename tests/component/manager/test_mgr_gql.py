"""GraphQL filters: ``agents(status, scaling_group)`` and ``compute_session_list(status)``,
with each caller's visibility (a user sees only its own sessions)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from accelshare.manager.clock import FrozenClock

from .cluster import Cluster, running_cluster

AGENTS = """query ($status: String, $scaling_group: String) {
  agents(status: $status, scaling_group: $scaling_group) {
    id status scaling_group available_slots lost_at
  }
}"""
SESSIONS = """query ($status: String, $access_key: String) {
  compute_session_list(status: $status, access_key: $access_key, limit: 50) {
    total_count items { name status access_key }
  }
}"""


async def gql(client: httpx.AsyncClient, query: str, **variables: Any) -> dict[str, Any]:
    response = await client.post("/admin/gql", json={"query": query, "variables": variables})
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def make_user(cluster: Cluster, email: str) -> tuple[httpx.AsyncClient, str]:
    response = await cluster.admin.post(
        "/admin/users", json={"email": email, "password": "long enough password"}
    )
    assert response.status_code == 201, response.text
    keypair = response.json()["keypair"]
    return cluster.client(keypair["access_key"], keypair["secret_key"]), keypair["access_key"]


@pytest.fixture
async def frozen(db_url: str, tmp_path: Path) -> AsyncIterator[tuple[Cluster, FrozenClock]]:
    clock = FrozenClock(datetime.now(UTC))
    async with running_cluster(
        db_url, tmp_path / "state", clock=clock, background=False, **{"agent-timeout": 30}
    ) as cluster:
        yield cluster, clock


async def test_agents_by_status_and_scaling_group(frozen: tuple[Cluster, FrozenClock]) -> None:
    cluster, clock = frozen
    made = await cluster.admin.post("/admin/scaling-groups", json={"name": "gpu"})
    assert made.status_code == 201, made.text
    await cluster.add_agent("i-node01")
    clock.advance(timedelta(seconds=31))
    await cluster.add_agent("i-node02", scaling_group="gpu", cpus=4)
    await cluster.add_agent("i-node03")
    assert await cluster.manager.registry.sweep() == ["i-node01"]

    async def ids(**variables: Any) -> list[tuple[str, str, str]]:
        body = await gql(cluster.admin, AGENTS, **variables)
        assert not body.get("errors"), body
        return [(a["id"], a["status"], a["scaling_group"]) for a in body["data"]["agents"]]

    assert await ids() == [
        ("i-node01", "LOST", "default"),
        ("i-node02", "ALIVE", "gpu"),
        ("i-node03", "ALIVE", "default"),
    ]
    assert await ids(status="ALIVE") == [("i-node02", "ALIVE", "gpu"), ("i-node03", "ALIVE", "default")]  # fmt: skip
    assert await ids(status="lost") == [("i-node01", "LOST", "default")]
    assert await ids(scaling_group="gpu") == [("i-node02", "ALIVE", "gpu")]
    assert await ids(status="LOST", scaling_group="gpu") == []
    assert await ids(scaling_group="nowhere") == []
    lost = (await gql(cluster.admin, AGENTS, status="LOST"))["data"]["agents"][0]
    assert lost["lost_at"] == clock().isoformat()
    node02 = (await gql(cluster.admin, AGENTS, scaling_group="gpu"))["data"]["agents"][0]
    assert json.loads(node02["available_slots"])["cpu"] == "4"

    bad = await gql(cluster.admin, AGENTS, status="sleeping")
    assert bad["data"] is None
    assert bad["errors"][0]["message"].startswith("Unknown agent status 'sleeping'")
    user, _ = await make_user(cluster, "u@example.com")
    async with user:
        refused = await gql(user, AGENTS, status="ALIVE")
    assert refused["errors"][0]["message"].startswith("This needs the superadmin role")


async def test_compute_session_list_by_status_and_owner(cluster: Cluster) -> None:
    await cluster.add_agent("i-node01")  # two GPUs: 2.0 shares in all
    alice, alice_key = await make_user(cluster, "alice@example.com")
    bob, bob_key = await make_user(cluster, "bob@example.com")
    async with alice, bob:
        for client, name, shares in (
            (alice, "a-runs", "0.5"),
            (alice, "a-ends", "0.5"),
            (bob, "b-runs", "0.5"),
            (alice, "a-waits", "1.5"),  # 0.5 left after the others: waits
        ):
            created = await cluster.create({"cuda.shares": shares}, client=client, name=name)
            assert created.status_code == 201, created.text
        for ref in ("a-runs", "a-ends"):
            await cluster.wait_status(f"{ref}?owner_access_key={alice_key}", "RUNNING")
        await cluster.wait_status(f"b-runs?owner_access_key={bob_key}", "RUNNING")
        assert (await alice.delete("/session/a-ends")).json()["status"] == "TERMINATED"
        assert (await alice.get("/session/a-waits")).json()["status"] == "PENDING"

        async def listed(client: httpx.AsyncClient, **variables: Any) -> tuple[int, list[str]]:
            body = await gql(client, SESSIONS, **variables)
            assert not body.get("errors"), body
            page = body["data"]["compute_session_list"]
            return page["total_count"], sorted(f"{s['name']}:{s['status']}" for s in page["items"])

        everyone = ["a-ends:TERMINATED", "a-runs:RUNNING", "a-waits:PENDING", "b-runs:RUNNING"]
        assert await listed(cluster.admin) == (4, everyone)
        assert await listed(cluster.admin, status="RUNNING") == (2, ["a-runs:RUNNING", "b-runs:RUNNING"])  # fmt: skip
        assert await listed(cluster.admin, status="PENDING,TERMINATED") == (
            2,
            ["a-ends:TERMINATED", "a-waits:PENDING"],
        )
        assert await listed(cluster.admin, status="RUNNING", access_key=bob_key) == (1, ["b-runs:RUNNING"])  # fmt: skip

        # a user sees its own sessions only, whatever it asks for
        assert await listed(alice) == (3, ["a-ends:TERMINATED", "a-runs:RUNNING", "a-waits:PENDING"])  # fmt: skip
        assert await listed(alice, status="RUNNING") == (1, ["a-runs:RUNNING"])
        assert await listed(alice, status="running,pending") == (2, ["a-runs:RUNNING", "a-waits:PENDING"])  # fmt: skip
        assert await listed(alice, access_key=bob_key) == (0, [])
        assert await listed(alice, status="RUNNING", access_key=alice_key) == (1, ["a-runs:RUNNING"])  # fmt: skip
        assert await listed(bob, status="PENDING,TERMINATED") == (0, [])
        assert await listed(bob) == (1, ["b-runs:RUNNING"])

        bad = await gql(alice, SESSIONS, status="RUNNING,NAPPING")
        assert bad["data"] is None
        assert bad["errors"][0]["message"].startswith("Unknown session status in 'RUNNING,NAPPING'")
