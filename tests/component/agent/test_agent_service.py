"""A whole agent in-process with real process-runtime kernels, driven through its RPC app,
reporting to a fake manager (httpx.MockTransport)."""

from __future__ import annotations

import asyncio
import logging
import os
import platform
import signal
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

import accelshare
from accelshare.agent.runtime import RuntimeUnavailable
from accelshare.agent.runtime.procfs import is_same_process
from accelshare.agent.service import AgentService
from accelshare.config.agent_file import load_agent_config
from accelshare.protocol import CreateKernelRequest

Factory = Callable[..., Any]
Eventually = Callable[..., Awaitable[Any]]

GPU1 = "c59395cd-ac91-4cd3-a1b0-3d2568aa2d01"
GPU2 = "c59395cd-ac91-4cd3-a1b0-3d2568aa2d02"
SLOTS = {"cpu": "1", "mem": "1g"}


def kid() -> str:
    return f"a-{uuid.uuid4().hex[:10]}"


def kernels_holding(view: dict[str, Any]) -> set[str]:
    return {
        kernel
        for plugin in view["maps"].values()
        for device in plugin["devices"]
        for kernel in device["kernels"]
    }


def allocated(view: dict[str, Any], key: str) -> list[str]:
    return [d["allocated"] for d in view["maps"][key]["devices"]]


async def test_create_running_logs_destroy_through_the_rpc(
    agent_toml: Factory, start_agent: Factory, eventually: Eventually, scratch_root: Path
) -> None:
    agent = await start_agent(agent_toml())
    empty = await agent.alloc_map()
    kernel_id = kid()
    report = await agent.create(kernel_id, SLOTS, command=["echo hello-$0; exec sleep 60"])
    assert report["status"] == "RUNNING"
    assert report["allocations"]["mem"] == {"root": str(1 << 30)}
    assert sum(1 for _ in report["allocations"]["cpu"]) == 1
    pid = int(report["container_id"])
    assert is_same_process(pid, None, kernel_id=kernel_id)

    listed = (await agent.client.get("/v1/kernels")).json()["kernels"]
    assert [(k["kernel_id"], k["status"]) for k in listed] == [(kernel_id, "RUNNING")]
    assert kernel_id in kernels_holding(await agent.alloc_map())

    async def logs() -> bool:
        response = await agent.client.get(f"/v1/kernels/{kernel_id}/logs")
        return response.status_code == 200 and "hello-" in response.text

    await eventually(logs, what="kernel output in its log")
    stats = (await agent.client.get("/v1/stats/kernels")).json()["kernels"][kernel_id]
    assert {m["name"] for m in stats} >= {"cpu_used", "mem"}

    destroyed = await agent.destroy(kernel_id)
    assert destroyed["status"] == "EXITED"
    assert destroyed["reason"] == "destroyed"
    assert not is_same_process(pid, None, kernel_id=kernel_id)
    assert await agent.alloc_map() == empty
    assert not (scratch_root / kernel_id).exists()  # keep-scratch = false
    again = await agent.destroy(kernel_id)  # idempotent
    assert again["status"] == "EXITED"
    assert (await agent.destroy("never-seen"))["reason"] == "not-found"
    missing = await agent.client.get("/v1/kernels/never-seen/logs")
    assert missing.status_code == 404
    assert missing.headers["content-type"] == "application/problem+json"

    await eventually(lambda: len(agent.manager.events_of(kernel_id)) == 2, what="events")
    started, exited = agent.manager.events_of(kernel_id)
    assert (started["event"], started["event_id"]) == ("started", f"{kernel_id}:started")
    assert (exited["event"], exited["exit_code"]) == ("exited", 143)
    assert exited["session_id"] == f"s-{kernel_id}"


async def test_compat_alloc_map_after_0_2_then_1_2_shares(
    agent_toml: Factory, set_mode: Factory, start_agent: Factory
) -> None:
    path = agent_toml()
    await set_mode(path, "fractional")
    agent = await start_agent(path)
    for shares in ("0.2", "1.2"):
        report = await agent.create(kid(), {**SLOTS, "cuda.shares": shares})
        assert report["status"] == "RUNNING", report
    assert await agent.alloc_map("compat") == {
        "c59395cd-ac91-4cd3-a1b0-3d2568aa2d02": "0.80",
        "c59395cd-ac91-4cd3-a1b0-3d2568aa2d01": "0.60",
    }
    cuda = (await agent.alloc_map())["maps"]["cuda"]
    assert cuda["kind"] == "fractional"
    assert cuda["quantum"] == "0.1"
    assert [(d["device_id"], d["capacity"], d["allocated"]) for d in cuda["devices"]] == [
        (GPU1, "1", "0.6"),
        (GPU2, "1", "0.8"),
    ]


async def test_create_is_idempotent_by_kernel_id(agent_toml: Factory, start_agent: Factory) -> None:
    agent = await start_agent(agent_toml())
    kernel_id = kid()
    first, second = await asyncio.gather(
        agent.create(kernel_id, {"cpu": "2", "mem": "2g"}),
        agent.create(kernel_id, {"cpu": "2", "mem": "2g"}),
    )
    assert first == second
    assert first["status"] == "RUNNING"
    assert await agent.create(kernel_id, {"cpu": "4", "mem": "4g"}) == first  # same kernel
    assert agent.service.allocations.totals()["cpu"][1] == 2  # counted once
    await agent.destroy(kernel_id)
    after = await agent.create(kernel_id, {"cpu": "2", "mem": "2g"})
    assert after["status"] == "EXITED"  # the existing (exited) kernel, not a new one


async def test_unknown_slot_missing_cpu_and_runtime_failure_are_failed_reports(
    agent_toml: Factory, start_agent: Factory, eventually: Eventually, scratch_root: Path
) -> None:
    agent = await start_agent(agent_toml())
    empty = await agent.alloc_map()
    unknown = await agent.create(kid(), {**SLOTS, "rocm.device": "1"})
    assert unknown["status"] == "FAILED"
    assert unknown["reason"].startswith("UnsupportedResource: ")
    assert "rocm.device" in unknown["reason"]
    dropped = await agent.create(kid(), {**SLOTS, "rocm.device": "0"})  # zero: dropped
    assert dropped["status"] == "RUNNING"
    await agent.destroy(dropped["kernel_id"])
    no_cpu = await agent.create(kid(), {"mem": "1g"})
    assert no_cpu["status"] == "FAILED"
    assert "cpu must be requested" in no_cpu["reason"]
    bad_image = kid()
    report = await agent.create(bad_image, SLOTS, image="cobol")
    assert report["status"] == "FAILED"
    assert report["reason"].startswith("UnknownEnvironment: ")
    assert await agent.alloc_map() == empty  # the runtime failure freed the allocation
    assert not (scratch_root / bad_image).exists()
    await eventually(
        lambda: [e["event"] for e in agent.manager.events_of(unknown["kernel_id"])] == ["failed"],
        what="failed event",
    )


async def test_rollback_when_the_second_map_fails(
    agent_toml: Factory, set_mode: Factory, start_agent: Factory
) -> None:
    path = agent_toml()
    await set_mode(path, "fractional")
    agent = await start_agent(path)
    before = await agent.alloc_map()
    report = await agent.create(kid(), {"cpu": "1", "mem": "32g", "cuda.shares": "0.5"})
    assert report["status"] == "FAILED"
    assert report["reason"].startswith("InsufficientResource: ")
    assert "mem" in report["reason"]
    assert await agent.alloc_map() == before  # cuda and cpu were rolled back
    assert await agent.alloc_map("compat") == {GPU1: "0.00", GPU2: "0.00"}


async def test_heartbeats_carry_slots_maps_metadata_and_kernels(
    agent_toml: Factory, set_mode: Factory, start_agent: Factory, eventually: Eventually
) -> None:
    path = agent_toml(agent={"region": "eu-west-test", "scaling-group": "gpu-pool"})
    await set_mode(path, "fractional")
    agent = await start_agent(path)
    # The manager only creates kernels on an agent that has registered.
    await eventually(lambda: agent.manager.heartbeats, what="the registration heartbeat")
    kernel_id = kid()
    await agent.create(kernel_id, {**SLOTS, "cuda.shares": "0.5"})

    def beat_with_kernel() -> dict[str, Any] | None:
        for beat in reversed(agent.manager.heartbeats):
            if [k["kernel_id"] for k in beat["kernels"]] == [kernel_id]:
                return beat
        return None

    beat = await eventually(beat_with_kernel, what="a heartbeat listing the kernel")
    assert agent.manager.heartbeats[0]["kernels"] == []  # registration came first
    assert beat["agent_id"] == "i-test"
    assert beat["rpc_url"].startswith("http://127.0.0.1:")
    assert (beat["region"], beat["scaling_group"]) == ("eu-west-test", "gpu-pool")
    # Not the wire defaults ("x86_64", ""): what this machine and package really are.
    assert beat["architecture"] == platform.machine()
    assert beat["version"] == accelshare.__version__
    assert "" not in (beat["architecture"], beat["version"])
    assert beat["slots"] == {
        "cpu": {"type": "count", "capacity": "8"},
        "mem": {"type": "bytes", "capacity": str(16 << 30)},
        "cuda.shares": {"type": "count", "capacity": "2"},
    }
    cuda = beat["alloc_maps"]["cuda"]
    assert cuda["quantum"] == "0.1"
    assert sorted(d["allocated"] for d in cuda["devices"]) == ["0", "0.5"]
    assert {d["capacity"] for d in cuda["devices"]} == {"1"}
    assert beat["slot_metadata"]["cuda.shares"]["display_unit"] == "fGPU"
    assert beat["kernels"][0]["allocations"]["cuda.shares"] in ({GPU1: "0.5"}, {GPU2: "0.5"})
    assert set(beat["images"]) >= {"python", "shell"}
    assert agent.manager.secrets == {"component-test-cluster-secret"}


async def test_heartbeat_ack_destroys_kernels(
    agent_toml: Factory, start_agent: Factory, fake_manager: Any, eventually: Eventually
) -> None:
    agent = await start_agent(agent_toml(), fake_manager)
    kernel_id = kid()
    await agent.create(kernel_id, SLOTS)
    fake_manager.destroy_kernels = [kernel_id, "unknown-kernel"]
    record = await eventually(
        lambda: not agent.service.registry.get(kernel_id).is_live, what="destroy by ack"
    )
    assert record
    assert agent.service.registry.get(kernel_id).reason == "destroyed"


async def test_rpc_needs_the_cluster_secret(agent_toml: Factory, start_agent: Factory) -> None:
    agent = await start_agent(agent_toml())
    client = agent.client
    for headers in ({}, {"X-Accelshare-Cluster-Secret": "wrong-secret"}):
        for method, url in (("GET", "/v1/alloc-map"), ("POST", "/v1/kernels")):
            response = await client.request(
                method, url, headers={"X-Accelshare-Cluster-Secret": ""} | headers
            )
            assert response.status_code == 401, (method, url, headers)
            assert response.headers["content-type"] == "application/problem+json"
            assert response.json()["status"] == 401
    metrics = await client.get("/metrics", headers={"X-Accelshare-Cluster-Secret": ""})
    assert metrics.status_code == 200
    assert "accelshare_agent_kernels_running 0.0" in metrics.text
    bad = await client.post("/v1/kernels", json={"kernel_id": "x"})
    assert bad.status_code == 400
    assert bad.headers["content-type"] == "application/problem+json"
    health = (await client.get("/v1/health")).json()
    assert (health["status"], health["agent_id"]) == ("ok", "i-test")


async def test_a_kernel_ending_by_itself_is_reported_and_freed(
    agent_toml: Factory,
    start_agent: Factory,
    fake_manager: Any,
    eventually: Eventually,
    scratch_root: Path,
) -> None:
    agent = await start_agent(agent_toml(), fake_manager)
    empty = await agent.alloc_map()
    kernel_id = kid()
    await agent.create(kernel_id, SLOTS, command=["exit 3"])
    await eventually(lambda: agent.manager.events_of(kernel_id)[-1:], what="events")
    exited = await eventually(
        lambda: [e for e in agent.manager.events_of(kernel_id) if e["event"] == "exited"],
        what="exited event",
    )
    assert exited[0]["exit_code"] == 3
    assert exited[0]["reason"] == "exited"
    assert await agent.alloc_map() == empty
    assert (scratch_root / kernel_id / "logs" / "kernel.log").exists()  # kept for its logs
    fake_manager.destroy_kernels = [kernel_id]  # the session ended: clean up
    await eventually(lambda: not (scratch_root / kernel_id).exists(), what="scratch removed")


async def test_a_kernel_over_its_memory_limit_is_killed_and_reported(
    agent_toml: Factory,
    start_agent: Factory,
    eventually: Eventually,
    cgroup_support: dict[str, str | None],
) -> None:
    if cgroup_support["memory"] is not None:
        pytest.skip(f"OOM kill needs a writable memory cgroup: {cgroup_support['memory']}")
    agent = await start_agent(agent_toml())
    kernel_id = kid()
    hog = "chunks = []\nwhile True:\n    chunks.append(bytearray(16 << 20))\n"
    report = await agent.create(
        kernel_id, {"cpu": "1", "mem": "64m"}, image="python", command=["-c", hog]
    )
    assert report["status"] == "RUNNING"
    exited = await eventually(
        lambda: [e for e in agent.manager.events_of(kernel_id) if e["event"] == "exited"],
        timeout_s=30,
        what="exited event of the memory hog",
    )
    assert exited[0]["reason"].startswith("oom-killed")
    assert exited[0]["exit_code"] == 137
    assert not agent.service.allocations.holds(kernel_id)


async def test_restart_in_process_restores_identical_maps_and_reports_gone_kernels(
    agent_toml: Factory, set_mode: Factory, start_agent: Factory, eventually: Eventually
) -> None:
    path = agent_toml()
    await set_mode(path, "fractional")
    first = await start_agent(path)
    ids = [kid() for _ in range(3)]
    for kernel_id, shares in zip(ids, ("0.2", "1.2", "0.3"), strict=True):
        await first.create(kernel_id, {"cpu": "1", "mem": "1g", "cuda.shares": shares})
    view = await first.alloc_map()
    pid_of_last = int(first.service.registry.get(ids[2]).container_id)
    await first.service.stop()

    os.killpg(pid_of_last, signal.SIGKILL)  # ends while no agent runs
    await eventually(lambda: not is_same_process(pid_of_last, None), what="kernel gone")
    second = await start_agent(path)
    kernels = {
        k["kernel_id"]: k for k in (await second.client.get("/v1/kernels")).json()["kernels"]
    }
    assert [kernels[k]["status"] for k in ids] == ["RUNNING", "RUNNING", "EXITED"]
    assert kernels[ids[0]]["session_id"] == f"s-{ids[0]}"
    restored = await second.alloc_map()
    assert kernels_holding(restored) == set(ids[:2])
    for key in ("cpu", "mem", "cuda"):  # the gone kernel's share is free again
        for before, after in zip(
            view["maps"][key]["devices"], restored["maps"][key]["devices"], strict=True
        ):
            before["kernels"].pop(ids[2], None)
            assert after["kernels"] == before["kernels"]
    assert await second.alloc_map("compat") == {GPU1: "0.60", GPU2: "0.80"}
    exited = await eventually(
        lambda: [e for e in second.manager.events_of(ids[2]) if e["event"] == "exited"],
        what="exited event for the kernel that ended meanwhile",
    )
    assert exited[0]["exit_code"] == 137

    await second.service.stop()  # twice more: the same maps, nothing double-counted
    third = await start_agent(path)
    assert await third.alloc_map() == restored


async def test_renamed_slots_keep_devices_occupied_until_old_kernels_end(
    agent_toml: Factory, set_mode: Factory, start_agent: Factory
) -> None:
    path = agent_toml()
    await set_mode(path, "fractional")
    first = await start_agent(path)
    old = kid()
    await first.create(old, {**SLOTS, "cuda.shares": "0.5"})
    held_gpu = next(iter(first.service.registry.get(old).allocations["cuda.shares"]))
    await first.service.stop()

    await set_mode(path, "discrete")
    second = await start_agent(path)
    cuda = (await second.alloc_map())["maps"]["cuda"]
    assert cuda["kind"] == "discrete"
    assert cuda["legacy_allocations"] == {"cuda.shares": {held_gpu: "0.5"}}
    by_device = {d["device_id"]: d for d in cuda["devices"]}
    assert by_device[held_gpu]["allocated"] == "1"  # not handed out whole
    assert by_device[held_gpu]["kernels"] == {old: "0.5"}
    refused = await second.create(kid(), {**SLOTS, "cuda.device": "2"})
    assert refused["reason"].startswith("InsufficientResource: ")
    fits = await second.create(kid(), {**SLOTS, "cuda.device": "1"})
    assert fits["status"] == "RUNNING"
    assert held_gpu not in fits["allocations"]["cuda.device"]
    listed = {k["kernel_id"]: k for k in second.service.list_kernels().model_dump()["kernels"]}
    assert listed[old]["allocations"]["cuda.shares"] == {held_gpu: "0.5"}

    await second.destroy(old)
    cuda = (await second.alloc_map())["maps"]["cuda"]
    assert cuda["legacy_allocations"] == {}
    assert {d["device_id"]: d["allocated"] for d in cuda["devices"]}[held_gpu] == "0"


async def test_a_removed_plugin_leaves_its_kernels_allocation_recorded_until_they_end(
    agent_toml: Factory, set_mode: Factory, start_agent: Factory, caplog: pytest.LogCaptureFixture
) -> None:
    """Spec 04, restart recovery: a kernel keeps its recorded allocation of a slot the new
    plugin set does not know; the remaining maps are exact; destroying it frees cleanly."""
    path = agent_toml()
    await set_mode(path, "fractional")
    first = await start_agent(path)
    empty = await first.alloc_map()
    kernel_id = kid()
    created = await first.create(kernel_id, {"cpu": "2", "mem": "2g", "cuda.shares": "0.5"})
    assert created["status"] == "RUNNING", created
    (gpu,) = created["allocations"]["cuda.shares"]
    assert created["allocations"]["cuda.shares"] == {gpu: "0.5"}
    before = await first.alloc_map()
    await first.service.stop()  # the kernel keeps running

    agent_toml(agent={"allowed-compute-plugins": []})  # the mock is no longer allowed
    with caplog.at_level(logging.WARNING, logger="accelshare.agent.service"):
        second = await start_agent(path)
    assert list(second.service.plugins) == ["cpu", "mem"]
    assert (
        f"restart recovery: kernel {kernel_id} holds 0.5 of cuda.shares on {gpu}, which the "
        "current plugin set does not allocate as such; kept until it ends (its device is not "
        "in any current map)"
    ) in [r.getMessage() for r in caplog.records]

    listed = {k["kernel_id"]: k for k in (await second.client.get("/v1/kernels")).json()["kernels"]}
    assert listed[kernel_id]["status"] == "RUNNING"
    assert listed[kernel_id]["allocations"] == created["allocations"]  # cuda.shares included
    view = await second.alloc_map()
    assert sorted(view["maps"]) == ["cpu", "mem"]
    assert view["maps"]["cpu"] == before["maps"]["cpu"]  # the kernel's 2 cores, as before
    assert view["maps"]["mem"] == before["maps"]["mem"]
    assert sum(int(d["allocated"]) for d in view["maps"]["cpu"]["devices"]) == 2
    assert await second.alloc_map("compat") == {}  # no cuda map to show
    assert "cuda.shares" not in second.service.heartbeat().slots
    refused = await second.create(kid(), {**SLOTS, "cuda.shares": "0.1"})  # new kernels:
    assert refused["reason"].startswith("UnsupportedResource: ")  # the new slot set
    assert "cuda.shares" in refused["reason"]

    destroyed = await second.destroy(kernel_id)
    assert (destroyed["status"], destroyed["reason"]) == ("EXITED", "destroyed")
    assert not second.service.allocations.holds(kernel_id)
    assert second.service.allocations.legacy_holdings() == []
    freed = await second.alloc_map()
    assert freed["maps"] == {key: empty["maps"][key] for key in ("cpu", "mem")}
    await second.service.stop()

    agent_toml()  # the mock allowed again: nothing of the ended kernel comes back
    third = await start_agent(path)
    assert await third.alloc_map() == empty
    assert await third.alloc_map("compat") == {GPU1: "0.00", GPU2: "0.00"}


async def test_node_stats_from_the_plugins(agent_toml: Factory, start_agent: Factory) -> None:
    agent = await start_agent(agent_toml())
    stats = (await agent.client.get("/v1/stats/node")).json()
    names = {(m["name"], m["device_id"]) for m in stats["metrics"]}
    assert ("cpu_util", None) in names
    assert ("mem", "root") in names
    assert ("cuda_util", GPU1) in names


async def test_undelivered_events_survive_a_clean_restart(
    agent_toml: Factory, start_agent: Factory, fake_manager: Any, eventually: Eventually
) -> None:
    path = agent_toml()
    down = fake_manager
    down.down = True
    first = await start_agent(path, down)
    kernel_id = kid()
    await first.create(kernel_id, SLOTS)
    await eventually(lambda: first.service.link.reachable is False, what="manager seen down")
    await first.service.stop()
    assert down.events == []

    second = await start_agent(path)
    delivered = await eventually(
        lambda: second.manager.events_of(kernel_id), what="the saved started event"
    )
    assert [e["event_id"] for e in delivered] == [f"{kernel_id}:started"]


class ExplodingRuntime:
    """A runtime whose create fails with an error no runtime should raise."""

    name = "exploding"

    def __init__(self, scratch_root: Path) -> None:
        self.scratch_root = scratch_root

    async def create_kernel(self, spec: Any) -> Any:
        raise RuntimeError("boom")

    async def scan_kernels(self) -> list[Any]:
        return []

    async def cleanup_kernel(self, kernel_id: str) -> None:
        return None

    async def close(self) -> None:
        return None


async def test_an_unexpected_runtime_error_frees_the_allocation(
    agent_toml: Factory, scratch_root: Path
) -> None:
    config = load_agent_config(agent_toml())
    service = AgentService(
        config,
        store=None,
        secret=None,
        runtime=ExplodingRuntime(scratch_root),  # type: ignore[arg-type]
        report_to_manager=False,
    )
    await service.start()
    try:
        empty = service.alloc_map_view()
        report = await service.create_kernel(
            CreateKernelRequest(
                kernel_id="k1", session_id="s", image="shell", requested_slots=SLOTS
            )
        )
        assert report.status == "FAILED"
        assert report.reason == "RuntimeError: boom"
        assert service.alloc_map_view() == empty
        assert [e.event_id for e in service.outbox.peek(10)] == ["k1:failed"]
    finally:
        await service.stop()


class ImagesRuntime(ExplodingRuntime):
    """A runtime whose image list the test controls (an engine whose images change)."""

    def __init__(self, scratch_root: Path) -> None:
        super().__init__(scratch_root)
        self.images: list[str] | None = ["python:3.11"]

    async def list_images(self) -> list[str]:
        if self.images is None:
            raise RuntimeUnavailable("no Docker engine at unix:///nowhere")
        return list(self.images)


async def test_heartbeat_images_follow_the_runtime_and_survive_an_outage(
    agent_toml: Factory,
    scratch_root: Path,
    fake_manager: Any,
    eventually: Eventually,
    caplog: pytest.LogCaptureFixture,
) -> None:
    runtime = ImagesRuntime(scratch_root)
    service = AgentService(
        load_agent_config(agent_toml()),
        store=None,
        secret=None,
        runtime=runtime,  # type: ignore[arg-type]
        transport=fake_manager.transport,
    )
    await service.start()
    try:
        assert service.heartbeat().images == ["python:3.11"]  # read at start
        service.start_reporting()
        runtime.images = ["python:3.11", "torch:2"]  # pulled on the engine
        await eventually(
            lambda: any(b["images"] == ["python:3.11", "torch:2"] for b in fake_manager.heartbeats),
            what="a heartbeat with the new image",
        )
        runtime.images = None  # the engine stops answering
        with caplog.at_level(logging.WARNING, logger="accelshare.agent.service"):
            await service.refresh_images()
            await service.refresh_images()
        assert service.heartbeat().images == ["python:3.11", "torch:2"]  # the last list
        warnings = [r.getMessage() for r in caplog.records if "images:" in r.getMessage()]
        assert warnings == [  # once per outage, naming why
            "images: no Docker engine at unix:///nowhere; the heartbeat keeps the last list"
        ]
    finally:
        await service.stop()


async def test_start_in_background_answers_preparing_then_reports_the_start(
    agent_toml: Factory, start_agent: Factory, eventually: Eventually, scratch_root: Path
) -> None:
    agent = await start_agent(agent_toml(container={"start-in-background": True}))
    empty = await agent.alloc_map()
    kernel_id = kid()
    report = await agent.create(kernel_id, SLOTS)
    assert report["status"] == "PREPARING"  # answered once allocated
    assert report["allocations"]["mem"] == {"root": str(1 << 30)}
    # a repeated create and a destroy wait for the start (the kernel's lock)
    again = await agent.create(kernel_id, SLOTS)
    assert again["status"] == "RUNNING"
    await eventually(
        lambda: [e["event"] for e in agent.manager.events_of(kernel_id)] == ["started"],
        what="started event",
    )
    destroyed = await agent.destroy(kernel_id)
    assert destroyed["status"] == "EXITED"
    # a start that fails: PREPARING first, then the failed event, the allocation freed
    bad = kid()
    report = await agent.create(bad, SLOTS, image="cobol")
    assert report["status"] == "PREPARING"
    await eventually(
        lambda: [e["event"] for e in agent.manager.events_of(bad)] == ["failed"],
        what="failed event",
    )
    assert await agent.alloc_map() == empty
    # what never fits is still refused in the answer itself
    no_cpu = await agent.create(kid(), {"mem": "1g"})
    assert no_cpu["status"] == "FAILED"


async def test_stop_waits_for_kernels_starting_in_the_background(
    agent_toml: Factory, start_agent: Factory
) -> None:
    agent = await start_agent(agent_toml(container={"start-in-background": True}))
    kernel_id = kid()
    assert (await agent.create(kernel_id, SLOTS))["status"] == "PREPARING"
    await agent.service.stop()
    record = agent.service.registry.get(kernel_id)
    assert record is not None
    assert record.status.value == "RUNNING"
    pid = int(record.report().container_id or 0)
    assert is_same_process(pid, None, kernel_id=kernel_id)
    os.killpg(pid, signal.SIGKILL)
