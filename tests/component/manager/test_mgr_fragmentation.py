"""``resource_opts.allow_fractional_resource_fragmentation`` through the API.

Two GPUs of 1.0 share, each 0.6 taken: 0.8 fits only split over both devices
(0.4 + 0.4).  Allowed (the default), the session runs with that split; refused, the
same request stays PENDING and says it is fragmented.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from .cluster import Cluster

SPLIT: dict[str, Any] = {"cpu": 1, "mem": "256m", "cuda.shares": "0.8"}


async def fill_each_gpu_to_0_6(cluster: Cluster) -> None:
    await cluster.add_agent("i-node01")
    for name in ("left", "right"):
        created = await cluster.create({"cuda.shares": "0.6"}, name=name, maxWaitSeconds=10)
        assert created.json()["status"] == "RUNNING", created.text
    devices = {
        device
        for name in ("left", "right")
        for kernel in (await cluster.session(name))["kernels"]
        for device in kernel["deviceAllocs"]["cuda.shares"]
    }
    assert len(devices) == 2, devices  # one 0.6 on each GPU: 0.4 left on each


def shares_by_device(session: dict[str, Any]) -> list[Decimal]:
    allocs = session["kernels"][0]["deviceAllocs"]["cuda.shares"]
    return sorted(Decimal(v) for v in allocs.values())


async def test_the_same_request_is_split_when_allowed_and_waits_when_not(
    cluster: Cluster,
) -> None:
    await fill_each_gpu_to_0_6(cluster)
    strict = await cluster.create(
        SPLIT,
        name="strict",
        config={
            "resources": SPLIT,
            "resource_opts": {"allow_fractional_resource_fragmentation": False},
        },
    )
    assert strict.status_code == 201, strict.text
    body = await cluster.session("strict")
    assert body["resourceOpts"] == {"allow_fractional_resource_fragmentation": False}
    assert body["status"] == "PENDING"
    assert "cuda.shares needs 0.8" in body["statusInfo"], body["statusInfo"]
    assert "without fragmentation (fragmented:" in body["statusInfo"], body["statusInfo"]
    why = (await cluster.admin.get("/session/strict/why")).json()
    assert "fragmented" in str(why["agents"]), why
    assert (await cluster.admin.delete("/session/strict")).json()["status"] == "CANCELLED"

    allowed = await cluster.create(SPLIT, name="allowed", maxWaitSeconds=10)
    assert allowed.json()["status"] == "RUNNING", allowed.text
    running = await cluster.session("allowed")
    assert running["resourceOpts"] == {"allow_fractional_resource_fragmentation": True}
    assert shares_by_device(running) == [Decimal("0.4"), Decimal("0.4")]


async def test_the_scaling_groups_default_and_a_requests_own_choice(cluster: Cluster) -> None:
    """``scheduler_opts.allow_fractional_resource_fragmentation`` is the default of a
    scaling group's sessions; a request's ``resource_opts`` wins over it."""
    patched = await cluster.admin.patch(
        "/admin/scaling-groups/default",
        json={"scheduler_opts": {"allow_fractional_resource_fragmentation": False}},
    )
    assert patched.status_code == 200, patched.text
    await fill_each_gpu_to_0_6(cluster)
    waits = await cluster.create(SPLIT, name="by-default")
    assert waits.status_code == 201, waits.text
    body = await cluster.session("by-default")
    assert (body["status"], body["resourceOpts"]) == (
        "PENDING",
        {"allow_fractional_resource_fragmentation": False},
    )
    assert "fragmented" in body["statusInfo"], body["statusInfo"]
    assert (await cluster.admin.delete("/session/by-default")).json()["status"] == "CANCELLED"

    asked = await cluster.create(
        SPLIT,
        name="asked",
        maxWaitSeconds=10,
        config={
            "resources": SPLIT,
            "resource_opts": {"allow_fractional_resource_fragmentation": True},
        },
    )
    assert asked.json()["status"] == "RUNNING", asked.text
    assert shares_by_device(await cluster.session("asked")) == [Decimal("0.4"), Decimal("0.4")]
