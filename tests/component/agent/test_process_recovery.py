"""Restart recovery with real kernels: re-adoption, exits while the agent was away,
identical allocations, no double counting, recycled pids, orphans."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sys
import textwrap
import uuid
from collections.abc import Awaitable, Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from accelshare.agent.recovery import discover_kernels
from accelshare.agent.resource_txt import ResourceTxt, render_resource_txt
from accelshare.agent.runtime import (
    ExitReason,
    KernelSpec,
    KernelState,
    ProcessRuntime,
    ResourceLimits,
)
from accelshare.agent.runtime.cgroups import KernelCgroup
from accelshare.agent.runtime.procfs import is_same_process, read_stat
from accelshare.agent.scratch import ScratchDir
from accelshare.agent.state_files import read_kernel_meta
from accelshare.common import ResourceSlot, SlotTypes

RuntimeFactory = Callable[..., ProcessRuntime]
Eventually = Callable[..., Awaitable[Any]]

GPU1 = "c59395cd-ac91-4cd3-a1b0-3d2568aa2d01"
GPU2 = "c59395cd-ac91-4cd3-a1b0-3d2568aa2d02"
SLOT_TYPES = {"cpu": SlotTypes.COUNT, "mem": SlotTypes.BYTES, "cuda.shares": SlotTypes.COUNT}


def new_kernel_id() -> str:
    return f"r-{uuid.uuid4().hex[:12]}"


def allocation(cpu: str, mem_gib: int, shares: dict[str, str]) -> dict[str, dict[str, Decimal]]:
    result = {
        "cpu": {cpu: Decimal(1)},
        "mem": {"root": Decimal(mem_gib << 30)},
    }
    if shares:
        result["cuda.shares"] = {dev: Decimal(v) for dev, v in shares.items()}
    return result


def resource_txt(alloc: dict[str, dict[str, Decimal]]) -> str:
    slots = ResourceSlot({slot: sum(per.values(), Decimal(0)) for slot, per in alloc.items()})
    content = ResourceTxt(
        slots=slots, allocations=alloc, extra_lines=(("CUDA_RESOURCE_VIRTUALIZED", "1"),)
    )
    return render_resource_txt(content, SLOT_TYPES)


AGENT_SCRIPT = textwrap.dedent(
    """
    import asyncio, json, sys
    from pathlib import Path
    from accelshare.agent.runtime import KernelSpec, ProcessRuntime, ProcessRuntimeConfig

    async def main():
        runtime = ProcessRuntime(ProcessRuntimeConfig(
            scratch_root=Path(sys.argv[1]), cgroup_parent="accelshare-test"))
        started = {}
        for kernel_id, text in json.loads(sys.argv[2]).items():
            info = await runtime.create_kernel(KernelSpec(kernel_id, "shell", text))
            started[kernel_id] = info.cid
        print(json.dumps(started), flush=True)
        await asyncio.sleep(3600)

    asyncio.run(main())
    """
)


async def test_kernels_survive_a_killed_agent_and_are_readopted(
    make_runtime: RuntimeFactory, scratch_root: Path
) -> None:
    allocations = {
        new_kernel_id(): allocation("0", 1, {GPU1: "0.2"}),
        new_kernel_id(): allocation("1", 2, {GPU1: "0.4", GPU2: "0.8"}),
    }
    texts = {kernel_id: resource_txt(alloc) for kernel_id, alloc in allocations.items()}
    agent = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        AGENT_SCRIPT,
        str(scratch_root),
        json.dumps(texts),
        stdout=asyncio.subprocess.PIPE,
    )
    assert agent.stdout is not None
    line = await asyncio.wait_for(agent.stdout.readline(), timeout=30)
    started = json.loads(line)
    agent.send_signal(signal.SIGKILL)  # the agent dies; its kernels must not
    await agent.wait()

    for kernel_id, cid in started.items():
        assert is_same_process(int(cid), None, kernel_id=kernel_id)

    report = await discover_kernels(make_runtime(), SLOT_TYPES)  # the restarted agent
    assert {k.kernel_id: k.info.cid for k in report.live} == started
    assert {k.kernel_id: k.allocations for k in report.live} == allocations
    assert report.exited == ()
    assert report.unrecoverable == ()
    assert report.total_allocations()["cuda.shares"] == {GPU1: Decimal("0.6"), GPU2: Decimal("0.8")}


async def test_restart_recovery_reports_exits_and_restores_only_live_kernels(
    make_runtime: RuntimeFactory, scratch_root: Path, eventually: Eventually
) -> None:
    before = make_runtime()
    live, killed, finished = new_kernel_id(), new_kernel_id(), new_kernel_id()
    alloc = {
        live: allocation("0", 1, {GPU1: "0.6", GPU2: "0.6"}),
        killed: allocation("1", 1, {GPU2: "0.2"}),
        finished: allocation("2", 1, {}),
    }
    wait_for_go = "while [ ! -e go ]; do sleep 0.02; done; echo done; exit 5"
    commands: dict[str, tuple[str, ...] | None] = {
        live: None,
        killed: None,
        finished: (wait_for_go,),
    }
    infos = {}
    for kernel_id in (live, killed, finished):
        infos[kernel_id] = await before.create_kernel(
            KernelSpec(
                kernel_id,
                "shell",
                resource_txt(alloc[kernel_id]),
                command=commands[kernel_id],
                limits=ResourceLimits(mem_bytes=128 << 20),
            )
        )

    # While no agent runs: one kernel is killed, one ends by itself.
    killed_pid = int(infos[killed].cid or 0)
    os.killpg(killed_pid, signal.SIGKILL)
    (scratch_root / finished / "work" / "go").touch()
    for kernel_id in (killed, finished):
        exit_file = scratch_root / kernel_id / "state" / "exit.json"
        await eventually(exit_file.exists, what=f"{kernel_id}'s supervisor to record its exit")

    after = make_runtime()
    report = await discover_kernels(after, SLOT_TYPES)
    assert [k.kernel_id for k in report.live] == [live]
    assert report.live[0].allocations == alloc[live]
    assert report.live[0].info.cid == infos[live].cid
    assert report.live[0].resources.extra("CUDA_RESOURCE_VIRTUALIZED") == "1"
    exits = {info.kernel_id: info.exit for info in report.exited}
    assert set(exits) == {killed, finished}
    killed_exit, finished_exit = exits[killed], exits[finished]
    assert killed_exit is not None
    assert (killed_exit.reason, killed_exit.exit_code) == (ExitReason.KILLED, 137)
    assert finished_exit is not None
    assert (finished_exit.reason, finished_exit.exit_code) == (ExitReason.EXITED, 5)
    assert report.total_allocations() == {
        slot: dict(per) for slot, per in alloc[live].items()
    }  # exited kernels hold nothing

    again = await discover_kernels(make_runtime(), SLOT_TYPES)  # a second restart
    assert [k.kernel_id for k in again.live] == [live]
    assert {i.kernel_id: i.exit for i in again.exited} == exits
    text = (scratch_root / live / "config" / "resource.txt").read_text()
    assert text.count("CID=") == 1


async def test_cid_written_after_a_crash_between_start_and_cid(
    make_runtime: RuntimeFactory, scratch_root: Path
) -> None:
    runtime = make_runtime()
    kernel_id = new_kernel_id()
    info = await runtime.create_kernel(KernelSpec(kernel_id, "shell", "CPU_SHARES=0:1\n"))
    path = scratch_root / kernel_id / "config" / "resource.txt"
    path.write_text("CPU_SHARES=0:1\n")  # as if the agent died before appending CID
    report = await discover_kernels(make_runtime(), SLOT_TYPES)
    assert [k.info.cid for k in report.live] == [info.cid]
    assert path.read_text() == f"CPU_SHARES=0:1\nCID={info.cid}\n"


@pytest.mark.parametrize("left", ["resource.txt only", "launch.json created, not written"])
async def test_a_start_cut_short_between_its_files_is_a_failed_kernel(
    make_runtime: RuntimeFactory, scratch_root: Path, left: str
) -> None:
    """The agent writes a new kernel's files in place, one after the other (no temporary
    file + rename): one that dies in between leaves a scratch dir without a whole launch
    record, which a restarted agent reports as a failed start, never as a live kernel."""
    kernel_id = new_kernel_id()
    scratch = ScratchDir(scratch_root, kernel_id)
    assert scratch.prepare()
    scratch.write_resource_txt(resource_txt(allocation("0", 1, {GPU1: "0.5"})), new=True)
    if left != "resource.txt only":
        scratch.launch_file.touch()  # O_EXCL create done, the write never came
    runtime = make_runtime()
    report = await discover_kernels(runtime, SLOT_TYPES)
    assert report.live == ()
    assert [i.kernel_id for i in report.exited] == [kernel_id]
    assert report.exited[0].exit is not None
    assert report.exited[0].exit.reason is ExitReason.FAILED
    assert report.total_allocations() == {}
    await runtime.cleanup_kernel(kernel_id)
    assert not scratch.exists()


async def test_the_agents_record_of_a_kernel_is_kept_in_its_launch_record(
    make_runtime: RuntimeFactory, scratch_root: Path
) -> None:
    """The process runtime keeps ``agent_meta`` in launch.json (no agent.json of its own);
    an agent.json (written by the docker runtime, or an older agent) is read first."""
    runtime = make_runtime()
    kernel_id = new_kernel_id()
    meta = {"session_id": "s-1", "owner_access_key": "AK", "labels": {"a": "b"}}
    info = await runtime.create_kernel(
        KernelSpec(kernel_id, "shell", "CPU_SHARES=0:1\n", agent_meta=meta)
    )
    assert info.scratch_dir is not None
    assert not (info.scratch_dir / "state" / "agent.json").exists()
    assert read_kernel_meta(info.scratch_dir) == meta
    report = await discover_kernels(make_runtime(), SLOT_TYPES)  # the restarted agent
    [live] = report.live
    assert read_kernel_meta(live.info.scratch_dir) == meta
    (info.scratch_dir / "state" / "agent.json").write_text('{"session_id": "older"}')
    assert read_kernel_meta(info.scratch_dir) == {"session_id": "older"}
    assert read_kernel_meta(None) == {}


async def test_a_recycled_pid_is_not_mistaken_for_the_kernel(
    make_runtime: RuntimeFactory, scratch_root: Path
) -> None:
    kernel_id = new_kernel_id()
    state = scratch_root / kernel_id / "state"
    state.mkdir(parents=True)
    (scratch_root / kernel_id / "config").mkdir()
    (scratch_root / kernel_id / "config" / "resource.txt").write_text("CPU_SHARES=0:1\n")
    me = read_stat(os.getpid())
    assert me is not None
    # The recorded pids now belong to this test process: alive, but not the kernel (no
    # kernel-id mark in its environment; the supervisor's start time does not match).
    (state / "proc.json").write_text(
        json.dumps(
            {
                "kernel_pid": os.getpid(),
                "kernel_start": me.start_ticks,
                "supervisor_pid": os.getpid(),
                "supervisor_start": me.start_ticks + 1,
            }
        )
    )
    runtime = make_runtime()
    info = await runtime.get_kernel(kernel_id)
    assert info.state is KernelState.EXITED
    assert info.exit is not None
    assert info.exit.reason is ExitReason.LOST
    assert (await runtime.destroy_kernel(kernel_id)).state is KernelState.EXITED  # no signal sent
    report = await discover_kernels(runtime, SLOT_TYPES)
    assert report.live == ()
    assert [i.kernel_id for i in report.exited] == [kernel_id]


async def test_a_kernel_whose_scratch_dir_vanished_is_an_orphan(
    make_runtime: RuntimeFactory, scratch_root: Path
) -> None:
    runtime = make_runtime()
    kernel_id = new_kernel_id()
    info = await runtime.create_kernel(KernelSpec(kernel_id, "shell", "CPU_SHARES=0:1\n"))
    assert info.cid is not None
    launch = json.loads((scratch_root / kernel_id / "state" / "launch.json").read_text())
    shutil.rmtree(scratch_root / kernel_id)
    report = await discover_kernels(make_runtime(), SLOT_TYPES)
    assert report.live == ()
    assert [(u.info.kernel_id, u.reason) for u in report.unrecoverable] == [
        (kernel_id, "no scratch dir (orphan)")
    ]
    assert int(info.cid) in report.unrecoverable[0].info.pids
    destroyed = await runtime.destroy_kernel(kernel_id, grace_s=0.2)
    assert destroyed.state is KernelState.EXITED
    assert not is_same_process(int(info.cid), None)
    if launch.get("cgroup") and runtime.cgroups is not None:
        cgroup = KernelCgroup.from_json(launch["cgroup"])
        assert cgroup is not None
        runtime.cgroups.remove(cgroup)


async def test_a_kernel_outliving_its_supervisor_is_still_tracked(
    make_runtime: RuntimeFactory, scratch_root: Path
) -> None:
    runtime = make_runtime()
    kernel_id = new_kernel_id()
    info = await runtime.create_kernel(KernelSpec(kernel_id, "shell", "CPU_SHARES=0:1\n"))
    assert info.cid is not None
    proc = json.loads((scratch_root / kernel_id / "state" / "proc.json").read_text())
    os.kill(proc["supervisor_pid"], signal.SIGKILL)  # e.g. systemd killed the agent's group
    after = make_runtime()
    assert (await after.get_kernel(kernel_id)).is_running
    waiter = asyncio.create_task(after.wait_exit(kernel_id, timeout_s=20))
    os.killpg(int(info.cid), signal.SIGKILL)
    ended = await waiter
    assert ended.exit is not None
    assert ended.exit.reason is ExitReason.LOST  # nobody was left to record the exit code
    assert ended.exit.exit_code is None
