"""Known slot types across a cluster (spec 01): the union of every slot any agent reported,
kept in the config store, never shrinking, read once per request and passed down explicitly."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from accelshare.api.schemas.sessions import CreateSessionBody
from accelshare.common import SlotTypes
from accelshare.manager.models import UserRole
from accelshare.manager.slots import RESOURCE_SLOTS_PREFIX, KnownSlots
from accelshare.protocol import CLUSTER_SECRET_HEADER
from accelshare_testkit.hollow_agent import TWO_FGPU, HollowAgent, HollowSpec

from .cluster import SECRET, Cluster, running_cluster

ROCM: dict[str, Any] = {**TWO_FGPU, "slot_name": "rocm", "device_plugin_name": "MockDevice"}


async def stored_slots(cluster: Cluster) -> dict[str, Any]:
    return dict(await cluster.manager.store.get_prefix(RESOURCE_SLOTS_PREFIX))


async def test_heartbeats_accumulate_slot_types_and_never_remove_one(cluster: Cluster) -> None:
    assert await stored_slots(cluster) == {}
    await cluster.add_agent("i-cuda")
    assert await stored_slots(cluster) == {"cuda.shares": "count"}
    rocm = await cluster.add_agent("i-rocm", mock_config=ROCM, allocation_mode="discrete")
    assert await stored_slots(cluster) == {"cuda.shares": "count", "rocm.device": "count"}
    assert (await cluster.admin.get("/config/resource-slots")).json() == {
        "cpu": "count",
        "mem": "bytes",
        "cuda.shares": "count",
        "rocm.device": "count",
    }

    # a later agent without rocm, and the rocm agent coming back without its plugin
    await cluster.add_agent("i-cuda2")
    cluster.hollow.remove(rocm)
    await cluster.add_agent("i-rocm")  # same id, now the default (cuda) accelerator
    assert await stored_slots(cluster) == {"cuda.shares": "count", "rocm.device": "count"}
    agent = (await cluster.admin.get("/agents/i-rocm")).json()
    assert "rocm.device" not in agent["availableSlots"]
    # so a session may still ask for it: no alive agent could hold it, so it is refused
    # naming the largest (0) unless it waits for agents; then it waits, it is not
    # refused as an unknown slot
    refused = await cluster.create({"rocm.device": 1}, enqueueOnly=True)
    assert refused.status_code == 400, refused.text
    assert refused.json()["largest"]["rocm.device"] == "0"
    waiting = await cluster.create({"rocm.device": 1}, enqueueOnly=True, waitForAgents=True)
    assert waiting.status_code == 201, waiting.text
    assert waiting.json()["status"] == "PENDING"


async def test_a_never_reported_slot_is_refused_at_enqueue(cluster: Cluster) -> None:
    await cluster.add_agent("i-cuda")
    refused = await cluster.create({"cpu": 1, "rocm.device": 1})
    assert refused.status_code == 400, refused.text
    problem = refused.json()
    assert problem["field"] == "config.resources.rocm.device"
    assert problem["detail"].startswith("Unknown requested resource slot: rocm.device")
    assert "cpu, mem, cuda.shares" in problem["detail"]  # what is known instead
    listed = (await cluster.admin.get("/sessions", params={"status": "all"})).json()
    assert listed["total"] == 0  # nothing was enqueued
    # zero of a slot nobody has is no request for it
    zero = await cluster.create({"cpu": 1, "rocm.device": 0}, enqueueOnly=True)
    assert zero.status_code == 201, zero.text
    assert "rocm.device" not in zero.json()["session"]["requestedSlots"]


async def test_an_unknown_scaling_group_is_refused_before_its_slots_are_recorded(
    cluster: Cluster,
) -> None:
    agent = HollowAgent(
        HollowSpec("i-rocm", scaling_group="nowhere", mock_config=ROCM),
        cluster_secret=SECRET,
        manager=cluster.internal,
    )
    response = await cluster.internal.post(
        "/internal/agents/heartbeat",
        content=agent.heartbeat_message().model_dump_json(),
        headers={CLUSTER_SECRET_HEADER: SECRET, "Content-Type": "application/json"},
    )
    assert response.status_code == 400, response.text
    assert response.json()["field"] == "scaling_group"
    assert "unknown scaling group 'nowhere'" in response.json()["detail"]
    assert await stored_slots(cluster) == {}
    assert "rocm.shares" not in (await cluster.admin.get("/config/resource-slots")).json()
    assert (await cluster.admin.get("/agents/i-rocm")).status_code == 404


@pytest.fixture
async def quiet(db_url: str, tmp_path: Path) -> AsyncIterator[Cluster]:
    """No background loops: only the request under test reads the known set."""
    async with running_cluster(db_url, tmp_path / "state", background=False) as cluster:
        yield cluster


async def test_a_request_keeps_the_set_it_read_when_a_heartbeat_adds_a_slot(
    quiet: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The set is read once at the start of ``POST /session``; a slot that a heartbeat
    adds while the request runs is unknown to that request, known to the next one."""
    cluster = quiet
    await cluster.add_agent("i-cuda")
    known_slots = cluster.manager.known_slots
    load = known_slots.load
    arrivals: list[Mapping[str, SlotTypes]] = []

    async def load_then_a_heartbeat() -> Mapping[str, SlotTypes]:
        types = await load()
        if not arrivals:
            arrivals.append(types)  # before the heartbeat, which loads again itself
            await cluster.add_agent("i-rocm", mock_config=ROCM)
        return types

    monkeypatch.setattr(known_slots, "load", load_then_a_heartbeat)
    during = await cluster.create({"rocm.shares": "0.5"}, enqueueOnly=True)
    assert arrivals, "the request did not read the known set"
    assert "rocm.shares" in await stored_slots(cluster)  # the heartbeat did add it...
    assert during.status_code == 400, during.text  # ...but not for the request under way
    assert "Unknown requested resource slot: rocm.shares" in during.json()["detail"]
    after = await cluster.create({"rocm.shares": "0.5"}, enqueueOnly=True)
    assert after.status_code == 201, after.text


async def test_creates_keep_the_set_and_read_again_for_a_slot_outside_it(
    quiet: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Creates naming known slots do not read the store; a slot another manager wrote
    into it is accepted by the next create naming it (one read), without a restart; a
    slot still unknown after that read is refused as before."""
    cluster = quiet
    await cluster.add_agent("i-cuda")
    store = cluster.manager.known_slots.store
    get_prefix = store.get_prefix
    reads: list[str] = []

    async def counted(prefix: str, **kwargs: Any) -> Any:
        if prefix == RESOURCE_SLOTS_PREFIX:
            reads.append(prefix)
        return await get_prefix(prefix, **kwargs)

    monkeypatch.setattr(store, "get_prefix", counted)
    for resources in ({"cpu": 1}, {"cuda.shares": "0.5"}, {}):
        ok = await cluster.create(resources, enqueueOnly=True)
        assert ok.status_code == 201, ok.text
    assert reads == []

    # another manager records a slot its agent reported: straight into the store
    await store.put_prefix(RESOURCE_SLOTS_PREFIX, {"rocm.device": "count"})
    waiting = await cluster.create({"rocm.device": 1}, enqueueOnly=True, waitForAgents=True)
    assert waiting.status_code == 201, waiting.text
    assert waiting.json()["session"]["requestedSlots"]["rocm.device"] == "1"
    assert len(reads) == 1
    again = await cluster.create({"rocm.device": 1}, enqueueOnly=True, waitForAgents=True)
    assert again.status_code == 201, again.text
    assert len(reads) == 1  # now in the kept set

    for _ in range(2):  # never reported: refused each time, after one read each
        refused = await cluster.create({"cpu": 1, "npu.device": 1})
        assert refused.status_code == 400, refused.text
        problem = refused.json()
        assert problem["field"] == "config.resources.npu.device"
        assert problem["detail"].startswith(
            "Unknown requested resource slot: npu.device (slots known in this cluster:"
            " cpu, mem, cuda.shares, rocm.device)"
        )
    assert len(reads) == 3


async def test_a_loaded_set_is_a_snapshot(cluster: Cluster) -> None:
    """What :meth:`KnownSlots.load` returns does not change when a heartbeat adds a slot
    (the request or round that read it keeps its view); the next load sees the slot."""
    await cluster.add_agent("i-cuda")
    known_slots: KnownSlots = cluster.manager.known_slots
    held = await known_slots.load()
    assert "cuda.shares" in held
    await cluster.add_agent("i-rocm", mock_config=ROCM)
    assert "rocm.shares" not in held
    with pytest.raises(TypeError):
        held["rocm.shares"] = SlotTypes.COUNT  # type: ignore[index]
    assert "rocm.shares" in await known_slots.load()


@dataclass(frozen=True)
class Caller:
    user_id: uuid.UUID
    email: str
    role: UserRole
    domain_name: str
    access_key: str


async def test_an_enqueue_given_no_set_reads_the_clusters(cluster: Cluster) -> None:
    """``SessionService.create`` called without ``known`` parses against the cluster's
    set (read for the enqueue), not the intrinsic slots alone."""
    await cluster.add_agent("i-cuda")
    me = (await cluster.admin.get("/whoami")).json()
    caller = Caller(
        uuid.UUID(me["user_id"]), me["email"], UserRole(me["role"]), me["domain"], me["access_key"]
    )
    body = CreateSessionBody.model_validate(
        {
            "image": "python:3.11",
            "config": {"resources": {"cuda.shares": "0.5"}},
            "enqueueOnly": True,
        }
    )
    result = await cluster.manager.sessions.create(caller, body.to_request())
    assert result.created
    assert result.body["session"]["requestedSlots"]["cuda.shares"] == "0.5"
