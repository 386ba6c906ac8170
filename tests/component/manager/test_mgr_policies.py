"""Scheduling policies end to end: a manager (SQLite, and PostgreSQL when reachable) with
hollow agents, passes run by hand under a frozen clock so the order is deterministic.

Every hollow agent has two GPUs of 1.0 ``cuda.shares`` (2.0 in all), 8 cores, 16 GiB.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import httpx
import pytest

from accelshare.config import ConfigScopes
from accelshare.manager.scheduler.loop import ROUNDROBIN_KEY

from .cluster import Cluster, Frozen


async def make_user(
    cluster: Cluster, email: str, **extra: Any
) -> tuple[httpx.AsyncClient, dict[str, Any]]:
    response = await cluster.admin.post(
        "/admin/users", json={"email": email, "password": "long enough password", **extra}
    )
    assert response.status_code == 201, response.text
    keypair = response.json()["keypair"]
    return cluster.client(keypair["access_key"], keypair["secret_key"]), keypair


async def enqueue(
    frozen: Frozen,
    name: str,
    shares: str,
    *,
    client: httpx.AsyncClient | None = None,
    **body: Any,
) -> str:
    """Enqueue; returns the session id (the admin finds other users' sessions by id only)."""
    cluster, clock = frozen
    clock.advance(timedelta(seconds=1))  # distinct created_at: FIFO order is the name order
    response = await cluster.create(
        {"cuda.shares": shares}, client=client, name=name, enqueueOnly=True, **body
    )
    assert response.status_code == 201, response.text
    sid: str = response.json()["sessionId"]
    return sid


async def schedule(cluster: Cluster, *running: str) -> None:
    """One pass, then wait for the sessions it should have started."""
    await cluster.manager.scheduler.run_once()
    for name in running:
        await cluster.wait_status(name, "RUNNING")


async def end(cluster: Cluster, name: str, client: httpx.AsyncClient | None = None) -> None:
    response = await (client or cluster.admin).delete(f"/session/{name}")
    assert response.status_code == 200, response.text
    await cluster.wait_status(name, "TERMINATED", "CANCELLED")


async def status_of(cluster: Cluster, *names: str) -> dict[str, str]:
    return {n: (await cluster.session(n))["status"] for n in names}


async def agent_of(cluster: Cluster, name: str) -> str:
    agent: str = (await cluster.session(name))["agentId"]
    return agent


# -- scheduler options from the config store ----------------------------------------------


async def test_fifo_options_from_the_store_scaling_group_scope_over_global(frozen: Frozen) -> None:
    cluster, _ = frozen
    store = cluster.manager.store
    await store.put("config/plugins/scheduler/fifo/num_retries_to_skip", "5")
    await store.scoped(scaling_group="default").put(
        "config/plugins/scheduler/fifo/num_retries_to_skip", "1", scope=ConfigScopes.SCALING_GROUP
    )
    await cluster.add_agent("i-node01")
    await enqueue(frozen, "hog", "1")
    await schedule(cluster, "hog")
    await enqueue(frozen, "old", "1.5")
    await schedule(cluster)  # old fails once: retries = 1
    await enqueue(frozen, "new", "1.5")
    await end(cluster, "hog")
    # the scaling group's 1 applies (not the global 5): old has failed once, so new goes first
    await schedule(cluster, "new")
    assert (await cluster.session("old"))["status"] == "PENDING"


async def test_scaling_group_options_win_over_the_store(frozen: Frozen) -> None:
    cluster, _ = frozen
    await cluster.manager.store.put("config/plugins/scheduler/fifo/num_retries_to_skip", "1")
    patched = await cluster.admin.patch(
        "/admin/scaling-groups/default",
        json={"scheduler_opts": {"config": {"num_retries_to_skip": 0}}},
    )
    assert patched.status_code == 200, patched.text
    await cluster.add_agent("i-node01")
    await enqueue(frozen, "hog", "1")
    await schedule(cluster, "hog")
    await enqueue(frozen, "old", "1.5")
    await schedule(cluster)
    await enqueue(frozen, "new", "1.5")
    await end(cluster, "hog")
    await schedule(cluster, "old")  # plain FIFO: the DB's 0 disables the skipping
    assert (await cluster.session("new"))["status"] == "PENDING"


async def test_roundrobin_state_in_the_store(frozen: Frozen) -> None:
    cluster, _ = frozen
    for i in (1, 2, 3):
        await cluster.add_agent(f"i-node0{i}")
    patched = await cluster.admin.patch(
        "/admin/scaling-groups/default",
        json={"scheduler_opts": {"agent_selection_strategy": "roundrobin"}},
    )
    assert patched.status_code == 200, patched.text
    key = ROUNDROBIN_KEY.format(scaling_group="default")
    await cluster.manager.store.put(key, "i-node01")
    placed = []
    for n in range(4):
        await enqueue(frozen, f"s{n}", "0.1")
        await schedule(cluster, f"s{n}")
        placed.append(await agent_of(cluster, f"s{n}"))
        assert await cluster.manager.store.get(key) == placed[-1]
    assert placed == ["i-node02", "i-node03", "i-node01", "i-node02"]


# -- manual agent assignment ----------------------------------------------------------------


async def test_manual_assignment_checks_the_agent_and_waits_for_it(frozen: Frozen) -> None:
    cluster, _ = frozen
    await cluster.add_agent("i-node01")
    await cluster.add_agent("i-node02")

    def pinned(shares: str) -> dict[str, Any]:
        return {"resources": {"cuda.shares": shares}, "agentList": ["i-node02"]}

    await enqueue(frozen, "filler", "1.6", config=pinned("1.6"))
    await schedule(cluster, "filler")
    assert await agent_of(cluster, "filler") == "i-node02"
    # 0.4 free on i-node02 (i-node01 is empty but not allowed)
    await enqueue(frozen, "pinned", "0.8", config=pinned("0.8"))
    await schedule(cluster)
    body = await cluster.session("pinned")
    assert body["status"] == "PENDING"
    assert "i-node02: cuda.shares needs 0.8" in body["statusInfo"]
    why = (await cluster.admin.get("/session/pinned/why")).json()
    assert [r.split(":")[0] for r in why["agents"]] == ["i-node02"]
    await end(cluster, "filler")
    await schedule(cluster, "pinned")
    assert await agent_of(cluster, "pinned") == "i-node02"


# -- priorities -----------------------------------------------------------------------------


async def test_priority_order_is_honoured(frozen: Frozen) -> None:
    cluster, _ = frozen
    await cluster.add_agent("i-node01")
    await enqueue(frozen, "hog", "1")
    await schedule(cluster, "hog")
    await enqueue(frozen, "low1", "1", priority=10)
    await enqueue(frozen, "low2", "1", priority=10)
    await enqueue(frozen, "high", "2", priority=50)
    await schedule(cluster)
    # low1 would fit in the free 1.0, but the waiting priority-50 session goes first
    assert await status_of(cluster, "low1", "low2", "high") == dict.fromkeys(
        ("low1", "low2", "high"), "PENDING"
    )
    why = (await cluster.admin.get("/session/low1/why")).json()
    assert why["scheduler"]["kind"] == "deferred"
    assert "Waiting for priority-50 sessions" in why["scheduler"]["msg"]
    await end(cluster, "hog")
    await schedule(cluster, "high")
    assert await status_of(cluster, "low1", "low2") == {"low1": "PENDING", "low2": "PENDING"}
    await end(cluster, "high")
    await schedule(cluster, "low1", "low2")


# -- DRF ------------------------------------------------------------------------------------


async def test_drf_alternates_between_a_heavy_and_a_light_user(frozen: Frozen) -> None:
    cluster, _ = frozen
    patched = await cluster.admin.patch("/admin/scaling-groups/default", json={"scheduler": "drf"})
    assert patched.status_code == 200, patched.text
    await cluster.add_agent("i-node01")
    heavy, _ = await make_user(cluster, "heavy@example.com")
    light, _ = await make_user(cluster, "light@example.com")
    async with heavy, light:
        ids: dict[str, str] = {}
        for n in range(1, 5):  # the heavy user asks first and for more
            ids[f"h{n}"] = await enqueue(frozen, f"h{n}", "0.5", client=heavy)
        for n in range(1, 3):
            ids[f"l{n}"] = await enqueue(frozen, f"l{n}", "0.5", client=light)
        # room for four: FIFO would give h1..h4; DRF alternates h1, l1, h2, l2
        await schedule(cluster, *(ids[n] for n in ("h1", "l1", "h2", "l2")))
        assert await status_of(cluster, ids["h3"], ids["h4"]) == {
            ids["h3"]: "PENDING",
            ids["h4"]: "PENDING",
        }
        ids["l3"] = await enqueue(frozen, "l3", "0.5", client=light)
        # heavy frees one: heavy 0.5 < light 1.0 -> heavy's h3 next, although l3 waits too
        await end(cluster, ids["h1"])
        await schedule(cluster, ids["h3"])
        assert (await cluster.session(ids["l3"]))["status"] == "PENDING"
        # light frees one: light 0.5 < heavy 1.0 -> l3 before the older h4
        await end(cluster, ids["l1"])
        await schedule(cluster, ids["l3"])
        assert (await cluster.session(ids["h4"]))["status"] == "PENDING"


# -- keypair quota --------------------------------------------------------------------------


async def test_keypair_quota_stops_a_user_and_resumes(frozen: Frozen) -> None:
    cluster, _ = frozen
    await cluster.add_agent("i-node01")  # registers the cuda.shares slot
    made = await cluster.admin.post(
        "/admin/resource-policies",
        json={
            "name": "one-gpu",
            "default_for_unspecified": "UNLIMITED",  # cpu and mem: no limit
            "total_resource_slots": {"cuda.shares": "1"},
        },
    )
    assert made.status_code == 201, made.text
    user, _ = await make_user(cluster, "capped@example.com", resource_policy="one-gpu")
    async with user:
        ids = {n: await enqueue(frozen, n, "0.5", client=user) for n in ("a1", "a2", "a3")}
        await enqueue(frozen, "other", "0.5")  # the admin's keypair has no such quota
        await schedule(cluster, ids["a1"], ids["a2"], "other")
        body = await cluster.session(ids["a3"])
        assert body["status"] == "PENDING"
        assert (
            "Keypair resource quota exceeded (cuda.shares: 1 in use + 0.5 requested > 1 allowed)"
            in body["statusInfo"]
        )
        why = (await user.get("/session/a3/why")).json()
        assert [p["name"] for p in why["scheduler"]["failed_predicates"]] == [
            "keypair_resource_limit"
        ]
        assert "Keypair resource quota exceeded" in why["explanation"]
        await end(cluster, ids["a1"])
        await schedule(cluster, ids["a3"])


async def test_running_counters_are_read_only_when_a_limit_or_drf_reads_them(
    frozen: Frozen, monkeypatch: pytest.MonkeyPatch
) -> None:
    from accelshare.manager.scheduler import loop

    cluster, _ = frozen
    await cluster.add_agent("i-node01")
    contexts: list[Any] = []
    load_snapshot = loop.load_snapshot

    async def capturing(*args: Any, **kwargs: Any) -> Any:
        loaded = await load_snapshot(*args, **kwargs)
        contexts.append(loaded.snapshot)
        return loaded

    monkeypatch.setattr(loop, "load_snapshot", capturing)
    await enqueue(frozen, "one", "1")
    await schedule(cluster, "one")
    await enqueue(frozen, "waits", "1.5")
    await schedule(cluster)
    # the default policy limits nothing on running sessions: no counters read
    assert contexts[-1].predicate_context.concurrent_sessions == {}
    assert contexts[-1].predicate_context.occupancy == {}

    policy = await cluster.admin.patch(
        "/admin/resource-policies/default", json={"max_concurrent_sessions": 5}
    )
    assert policy.status_code == 200, policy.text
    await schedule(cluster)
    ctx = contexts[-1].predicate_context
    assert sum(ctx.concurrent_sessions.values()) == 1  # "one" runs
    assert (
        sum(o.get_amount("cuda.shares") for (kind, _), o in ctx.occupancy.items() if kind == "user")
        == 1
    )

    policy = await cluster.admin.patch(
        "/admin/resource-policies/default", json={"max_concurrent_sessions": 0}
    )
    assert policy.status_code == 200, policy.text
    scaling_group = await cluster.admin.patch(
        "/admin/scaling-groups/default", json={"scheduler": "drf"}
    )
    assert scaling_group.status_code == 200, scaling_group.text
    await schedule(cluster)
    assert [s.get_amount("cuda.shares") for s in contexts[-1].occupancy_by_access_key.values()] == [
        1
    ]
