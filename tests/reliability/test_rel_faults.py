"""Fault injection with real processes: a local cluster (``accelshare dev``'s
:class:`LocalCluster`: one manager and two agents with the process runtime, on
loopback), SIGKILLed while sessions start, then restarted.

After every recovery the accounting must hold:

* every acknowledged session is listed exactly once, none lost;
* each agent's alloc map (read live from the agent) equals the sum of the
  ``resource.txt`` files of the kernels the manager considers occupying there;
* the manager's ``occupiedSlots`` of each agent equal that agent's own alloc map;
* no device is over its capacity; pending sessions still start once room frees up.

Redis is not used by accelshare, so there is no Redis restart to survive.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from accelshare.agent.resource_txt import parse_resource_txt
from accelshare.client.auth import KeypairAuth
from accelshare.common import SlotTypes
from accelshare.devcluster import free_port
from accelshare.devcluster.cluster import LocalCluster
from accelshare.devcluster.layout import DevClusterOptions
from accelshare.devcluster.processes import Daemon

T = TypeVar("T")
IN_TRANSIT = {"SCHEDULED", "PREPARING", "PULLING", "PREPARED", "CREATING", "TERMINATING"}
OCCUPYING = IN_TRANSIT | {"RUNNING", "ERROR"}
SLOT_TYPES = {"cpu": SlotTypes.COUNT, "mem": SlotTypes.BYTES, "cuda.shares": SlotTypes.COUNT}
FIGURES: dict[str, Any] = {}  # printed with -s (docs/reliability.md)
SHARE = {"cpu": 1, "mem": "256m", "cuda.shares": "0.5"}  # 2 agents x 2 GPUs: room for 8


def until(condition: Callable[[], T | None], *, timeout_s: float, what: str) -> T:
    """Poll (no sleeps as synchronisation): generous deadlines, short naps between."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}: last {value!r}")
        time.sleep(0.1)


@pytest.fixture
def local(tmp_path: Path) -> Iterator[LocalCluster]:
    cluster = LocalCluster(
        DevClusterOptions(
            data_dir=tmp_path / "dev", port=free_port(), agents=2, cpus=8, mem_bytes=8 * 2**30
        )
    )
    cluster.start(timeout_s=120)
    try:
        yield cluster
    finally:
        cluster.stop(destroy_sessions=True, grace_s=5)


def api(cluster: LocalCluster) -> httpx.Client:
    config = cluster.client_config()
    return httpx.Client(
        base_url=config.endpoint, auth=KeypairAuth(config.access_key, config.secret_key), timeout=30
    )


def sessions(http: httpx.Client) -> list[dict[str, Any]]:
    response = http.get("/sessions", params={"status": "all", "limit": 1000})
    response.raise_for_status()
    items: list[dict[str, Any]] = response.json()["items"]
    return items


def create_burst(cluster: LocalCluster, count: int) -> list[str | None]:
    """``count`` creations in parallel; the ids acknowledged (None: refused or cut off)."""

    def one(_: int) -> str | None:
        try:
            with api(cluster) as http:
                response = http.post(
                    "/session",
                    json={"image": "python", "config": {"resources": SHARE}},
                )
        except httpx.HTTPError:
            return None
        return str(response.json()["sessionId"]) if response.status_code == 201 else None

    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(one, range(count)))


def settled(http: httpx.Client, agents_alive: int) -> list[dict[str, Any]] | None:
    try:
        listed = sessions(http)
        agents = http.get("/agents", params={"status": "ALIVE"}).json()["items"]
    except (httpx.HTTPError, KeyError):
        return None
    if len(agents) < agents_alive or any(s["status"] in IN_TRANSIT for s in listed):
        return None
    return listed


def occupying_kernels(http: httpx.Client, listed: list[dict[str, Any]]) -> dict[str, set[str]]:
    """agent id -> kernel ids the manager considers occupying there."""
    held: dict[str, set[str]] = {}
    for s in listed:
        if s["status"] not in OCCUPYING:
            continue
        for kernel in http.get(f"/session/{s['sessionId']}").json()["kernels"]:
            if kernel["status"] in OCCUPYING:
                held.setdefault(kernel["agentId"], set()).add(kernel["kernelId"])
    return held


def resource_txt_totals(scratch: Path, kernels: set[str]) -> dict[tuple[str, str], Decimal]:
    """(slot, device) -> the sum over those kernels' resource.txt files."""
    totals: dict[tuple[str, str], Decimal] = {}
    for kernel_id in kernels:
        matches = [p for p in scratch.glob("*/config/resource.txt") if kernel_id in str(p)]
        assert len(matches) == 1, (kernel_id, matches)
        parsed = parse_resource_txt(matches[0].read_text(), SLOT_TYPES, source=str(matches[0]))
        for slot, per_device in parsed.allocations.items():
            for device, amount in per_device.items():
                if amount:
                    key = (slot, device)
                    totals[key] = totals.get(key, Decimal(0)) + amount
    return totals


def check_accounting(
    cluster: LocalCluster, http: httpx.Client, acknowledged: set[str]
) -> Counter[str]:
    alive = len(cluster.agent_ids)
    listed = until(lambda: settled(http, alive), timeout_s=120, what="the cluster to settle")
    ids = Counter(s["sessionId"] for s in listed)
    assert not [sid for sid, n in ids.items() if n > 1], "a session is listed twice"
    assert acknowledged <= set(ids), f"lost: {acknowledged - set(ids)}"

    def agree() -> bool:
        held = occupying_kernels(http, sessions(http))
        for agent_id in cluster.agent_ids:
            amap = http.get(f"/agents/{agent_id}/alloc-map").json()
            from_map: dict[tuple[str, str], Decimal] = {}
            per_slot: dict[str, Decimal] = {}
            for plugin in amap["maps"].values():
                for device in plugin["devices"]:
                    allocated = Decimal(device["allocated"])
                    assert allocated <= Decimal(device["capacity"]), device
                    if allocated:
                        from_map[(device["slot_name"], device["device_id"])] = allocated
                        slot = device["slot_name"]
                        per_slot[slot] = per_slot.get(slot, Decimal(0)) + allocated
            scratch = cluster.layout.agent_dir(agent_id) / "scratch"
            if from_map != resource_txt_totals(scratch, held.get(agent_id, set())):
                return False
            detail = http.get(f"/agents/{agent_id}").json()
            occupied = {k: Decimal(v) for k, v in detail["occupiedSlots"].items() if Decimal(v)}
            if occupied != per_slot:
                return False
        return True

    # the agents' reconciliation runs with their heartbeats: allow a few rounds
    until(agree, timeout_s=60, what="alloc maps == resource.txt sums == occupied slots")
    return Counter(s["status"] for s in sessions(http))


def restart(daemon: Daemon, http: httpx.Client, what: str) -> None:
    daemon.signal(signal.SIGKILL)
    assert daemon.wait(30), f"{what} did not die"
    assert daemon.exit_code() == -signal.SIGKILL
    daemon.start()

    def healthy() -> bool:
        try:
            return http.get("/health").status_code == 200
        except httpx.HTTPError:
            return False

    until(healthy, timeout_s=60, what=f"{what} back")


def test_sigkill_agent_and_manager_mid_activity_loses_nothing(local: LocalCluster) -> None:
    acknowledged: set[str] = set()
    with api(local) as http, ThreadPoolExecutor(1) as background:
        # 1. SIGKILL an agent while kernels are being created on it
        burst = background.submit(create_burst, local, 12)

        def creating_started() -> bool:
            return any(s["status"] != "PENDING" for s in sessions(http))

        until(creating_started, timeout_s=60, what="the first session to be scheduled")
        restart(local.agents[0], http, "agent i-dev-01")
        acknowledged |= {sid for sid in burst.result() if sid}
        counts = check_accounting(local, http, acknowledged)
        assert counts["RUNNING"] <= 8, counts
        FIGURES["after agent SIGKILL"] = dict(counts)

        # 2. SIGKILL the manager in the middle of a burst (requests and binds in flight)
        burst = background.submit(create_burst, local, 12)
        until(lambda: len(sessions(http)) > len(acknowledged), timeout_s=60, what="a new one")
        assert local.manager is not None
        restart(local.manager, http, "the manager")
        acknowledged |= {sid for sid in burst.result() if sid}
        counts = check_accounting(local, http, acknowledged)
        assert counts["RUNNING"] <= 8, counts
        FIGURES["after manager SIGKILL"] = dict(counts)
        # more than fits, with everything up: exactly the room is used
        acknowledged |= {sid for sid in create_burst(local, 12) if sid}
        counts = check_accounting(local, http, acknowledged)
        assert counts["RUNNING"] == 8, counts
        assert counts["PENDING"] > 0, counts

        # 3. pending sessions still start once the running ones end
        running = [s["sessionId"] for s in sessions(http) if s["status"] == "RUNNING"]
        pending_before = {s["sessionId"] for s in sessions(http) if s["status"] == "PENDING"}
        for sid in running:
            assert http.delete(f"/session/{sid}").status_code == 200

        def resumed() -> bool:
            now = {s["sessionId"]: s["status"] for s in sessions(http)}
            return sum(now[sid] == "RUNNING" for sid in pending_before) == min(
                8, len(pending_before)
            )

        until(resumed, timeout_s=120, what="pending sessions to start")
        FIGURES["at the end"] = dict(check_accounting(local, http, acknowledged))
        FIGURES["acknowledged"] = len(acknowledged)
        print(f"faults: {FIGURES}")


# -- a full disk under the scratch root ----------------------------------------------------


def _mount_tmpfs(where: Path, size: str) -> bool:
    where.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
        capture_output=True,
        check=False,
    )
    return result.returncode == 0


def test_a_full_scratch_disk_refuses_cleanly_and_recovers(tmp_path: Path) -> None:
    options = DevClusterOptions(
        data_dir=tmp_path / "dev", port=free_port(), agents=1, cpus=8, mem_bytes=8 * 2**30
    )
    cluster = LocalCluster(options)
    scratch = cluster.layout.agent_dir(cluster.agent_ids[0]) / "scratch"
    if shutil.which("mount") is None or not _mount_tmpfs(scratch, "4m"):
        pytest.skip("cannot mount a tmpfs (needs root with CAP_SYS_ADMIN)")
    try:
        cluster.start(timeout_s=120)
        with api(cluster) as http:
            filler = scratch / "filler"
            with filler.open("wb") as out, contextlib.suppress(OSError):
                while True:  # until ENOSPC
                    out.write(b"\0" * 65536)
                    out.flush()
            body = {"image": "python", "config": {"resources": SHARE}}
            refused = [http.post("/session", json=body).json()["sessionId"] for _ in range(3)]

            def ended() -> list[dict[str, Any]] | None:
                now = [s for s in sessions(http) if s["sessionId"] in refused]
                done = [s for s in now if s["status"] in ("CANCELLED", "ERROR", "TERMINATED")]
                return now if len(done) == len(refused) else None

            # a kernel that cannot get its scratch dir must end, not hang or leak
            outcome = until(ended, timeout_s=120, what="the sessions on a full disk to end")
            assert all(s["status"] in ("CANCELLED", "ERROR") for s in outcome), outcome
            FIGURES["disk full"] = [s["statusInfo"] for s in outcome]
            print(f"disk full: {FIGURES['disk full']}")
            assert cluster.exited() is None, "a daemon died of a full disk"
            check_accounting(cluster, http, set(refused))
            amap = http.get(f"/agents/{cluster.agent_ids[0]}/alloc-map").json()
            held = [
                d for m in amap["maps"].values() for d in m["devices"] if Decimal(d["allocated"])
            ]
            assert not held, held  # nothing leaked
            # room again: sessions start
            filler.unlink()
            started = http.post("/session", json={**body, "maxWaitSeconds": 60})
            assert started.json()["status"] == "RUNNING", started.text
            check_accounting(cluster, http, set(refused) | {started.json()["sessionId"]})
    finally:
        cluster.stop(destroy_sessions=True, grace_s=5)
        subprocess.run(["umount", "-l", str(scratch)], capture_output=True, check=False)
