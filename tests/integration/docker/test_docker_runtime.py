"""The docker runtime against a real dockerd (started by conftest) and a local busybox image."""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import replace
from decimal import Decimal
from pathlib import Path

import pytest

from accelshare.accel.mock import MockPlugin, load_mock_config, smi
from accelshare.accel.options import AcceleratorOptions
from accelshare.agent.recovery import discover_kernels
from accelshare.agent.runtime import (
    AGENT_ID_LABEL,
    KERNEL_ID_LABEL,
    ExitReason,
    ImageUnavailable,
    KernelSpec,
    KernelStartFailed,
    KernelState,
    ResourceLimits,
)
from accelshare.agent.runtime.docker import DockerRuntime, DockerRuntimeConfig
from accelshare.common import AllocationMode, SlotTypes

pytestmark = pytest.mark.integration

RESOURCE_TXT = 'SLOTS={"cpu":"1"}\nCPU_SHARES=0:1\nMEM_SHARES=root:64m\n'
SLOT_TYPES = {"cpu": SlotTypes.COUNT, "mem": SlotTypes.BYTES}
REPORT = (
    "echo kid=$BACKENDAI_KERNEL_ID mock=$BACKENDAI_MOCK_CUDA_DEVICES > /home/work/report; "
    "cat /home/config/resource.txt >> /home/work/report; "
    "echo limit=$(cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null "
    "|| cat /sys/fs/cgroup/memory.max) >> /home/work/report; "
    "echo END >> /home/work/report; echo to-stdout; "
    "trap 'exit 0' TERM; while :; do sleep 1 & wait $!; done"
)


def new_kernel_id() -> str:
    return f"d-{uuid.uuid4().hex[:12]}"


async def poll_file(path: Path, marker: str, timeout_s: float = 20.0) -> str:
    deadline = time.monotonic() + timeout_s
    while True:
        if path.exists() and marker in (text := path.read_text()):
            return text
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} never contained {marker!r}")
        await asyncio.sleep(0.05)


async def test_container_lifecycle(docker_runtime: DockerRuntime, busybox_image: str) -> None:
    kernel_id = new_kernel_id()
    spec = KernelSpec(
        kernel_id=kernel_id,
        image=busybox_image,
        resource_txt=RESOURCE_TXT,
        command=("sh", "-c", REPORT),
        env={"BACKENDAI_MOCK_CUDA_DEVICES": "gpu-a,gpu-b"},
        limits=ResourceLimits(cpu_count=Decimal("0.5"), mem_bytes=64 << 20, pids_max=64),
        labels={"ai.accelshare.session-id": "s-1"},
    )
    info = await docker_runtime.create_kernel(spec)
    assert info.state is KernelState.RUNNING
    assert info.cid is not None
    scratch = docker_runtime.scratch_root / kernel_id

    report = await poll_file(scratch / "work" / "report", "END")
    assert f"kid={kernel_id} mock=gpu-a,gpu-b" in report
    assert "CPU_SHARES=0:1" in report  # /home/config/resource.txt is visible inside
    assert f"limit={64 << 20}" in report
    assert (scratch / "config" / "resource.txt").read_text() == RESOURCE_TXT + f"CID={info.cid}\n"

    data = await (await docker_runtime.docker.containers.get(info.cid)).show()
    labels = data["Config"]["Labels"]
    assert labels[KERNEL_ID_LABEL] == kernel_id
    assert labels[AGENT_ID_LABEL] == docker_runtime.config.agent_id
    assert labels["ai.accelshare.session-id"] == "s-1"
    assert data["HostConfig"]["Memory"] == 64 << 20
    assert data["HostConfig"]["NanoCpus"] == 500_000_000
    assert data["HostConfig"]["PidsLimit"] == 64
    assert info.limits["memory"] == f"docker Memory={64 << 20}"

    assert (await docker_runtime.create_kernel(spec)).cid == info.cid  # idempotent
    assert "to-stdout" in await docker_runtime.get_logs(kernel_id)

    destroyed = await docker_runtime.destroy_kernel(kernel_id)
    assert destroyed.state is KernelState.EXITED
    assert destroyed.exit is not None
    assert destroyed.exit.reason is ExitReason.DESTROYED
    assert destroyed.exit.exit_code == 0  # the trap ended it on SIGTERM
    assert "to-stdout" in await docker_runtime.get_logs(kernel_id)  # saved before removal
    after = await docker_runtime.get_kernel(kernel_id)
    assert after.state is KernelState.EXITED
    assert after.exit is not None
    assert after.exit.reason is ExitReason.DESTROYED
    await docker_runtime.cleanup_kernel(kernel_id)
    assert not scratch.exists()


async def test_exit_code_idle_kernel_and_bad_image(
    docker_runtime: DockerRuntime, busybox_image: str
) -> None:
    ends = new_kernel_id()
    await docker_runtime.create_kernel(
        KernelSpec(ends, busybox_image, RESOURCE_TXT, command=("sh", "-c", "exit 3"))
    )
    info = await docker_runtime.wait_exit(ends, timeout_s=20)
    assert info.exit is not None
    assert (info.exit.reason, info.exit.exit_code) == (ExitReason.EXITED, 3)

    idle = new_kernel_id()
    await docker_runtime.create_kernel(KernelSpec(idle, busybox_image, RESOURCE_TXT))
    with pytest.raises(TimeoutError):
        await docker_runtime.wait_exit(idle, timeout_s=0.3)
    assert (await docker_runtime.get_kernel(idle)).is_running

    absent = new_kernel_id()
    with pytest.raises(
        KernelStartFailed, match="image accelshare-test/none:0: absent from the engine and the pull"
    ):
        await docker_runtime.create_kernel(
            KernelSpec(absent, "accelshare-test/none:0", RESOURCE_TXT)
        )
    failed = await docker_runtime.get_kernel(absent)  # recorded with the reason, not a hang
    assert failed.exit is not None
    assert failed.exit.reason is ExitReason.FAILED
    assert "accelshare-test/none:0" in (failed.exit.error or "")


async def test_an_absent_image_is_pulled_or_refused_with_the_reason(
    docker_runtime: DockerRuntime, busybox_image: str
) -> None:
    """PULLING: a present image is not pulled; an absent one is pulled, and where no
    registry can serve it (these machines reach none) the engine's reason is given;
    with pulling off the error says so at once."""
    assert await docker_runtime.ensure_image(busybox_image) is False
    with pytest.raises(ImageUnavailable, match="the pull failed") as caught:
        await docker_runtime.ensure_image("accelshare-test/none:0")
    assert caught.value.image == "accelshare-test/none:0"
    no_pull = DockerRuntime(
        replace(docker_runtime.config, pull_timeout_s=0), docker_runtime._docker
    )
    with pytest.raises(ImageUnavailable, match="pulling is off; run `docker pull"):
        await no_pull.ensure_image("accelshare-test/none:0")


async def test_memory_hog_container_is_oom_killed(
    docker_runtime: DockerRuntime, busybox_image: str
) -> None:
    kernel_id = new_kernel_id()
    hog = "x=$(head -c 200000000 /dev/zero | tr '\\0' a); echo survived"
    await docker_runtime.create_kernel(
        KernelSpec(
            kernel_id,
            busybox_image,
            RESOURCE_TXT,
            command=("sh", "-c", hog),
            limits=ResourceLimits(mem_bytes=32 << 20),
        )
    )
    info = await docker_runtime.wait_exit(kernel_id, timeout_s=30)
    assert info.exit is not None
    assert info.exit.oom_killed
    assert info.exit.reason is ExitReason.OOM_KILLED


async def test_recovery_lists_containers_by_label(
    docker_runtime: DockerRuntime, busybox_image: str
) -> None:
    live, killed = new_kernel_id(), new_kernel_id()
    for kernel_id in (live, killed):
        await docker_runtime.create_kernel(KernelSpec(kernel_id, busybox_image, RESOURCE_TXT))
    killed_info = await docker_runtime.get_kernel(killed)
    assert killed_info.cid is not None
    container = await docker_runtime.docker.containers.get(killed_info.cid)
    await container.kill(signal="SIGKILL")  # dies while "the agent is away"

    # A restarted agent: a new runtime object on the same scratch root and agent id,
    # and a stranger agent on the same engine that must not see these kernels.
    config = docker_runtime.config
    restarted = await DockerRuntime.connect(config)
    stranger = await DockerRuntime.connect(
        DockerRuntimeConfig(
            scratch_root=config.scratch_root.parent / "other",
            docker_url=config.docker_url,
            agent_id="someone-else",
        )
    )
    try:
        report = await discover_kernels(restarted, SLOT_TYPES)
        assert [k.kernel_id for k in report.live] == [live]
        assert report.live[0].allocations == {
            "cpu": {"0": Decimal(1)},
            "mem": {"root": Decimal(64 << 20)},
        }
        assert [i.kernel_id for i in report.exited] == [killed]
        exit_ = report.exited[0].exit
        assert exit_ is not None
        assert exit_.exit_code == 137
        assert await stranger.scan_kernels() == []
    finally:
        await restarted.close()
        await stranger.close()


async def test_an_unknown_network_fails_the_create_with_the_engines_word(
    docker_runtime: DockerRuntime, busybox_image: str
) -> None:
    """[container] docker-network naming a network the engine lacks: each create fails
    (KernelStartFailed, the engine's message), nothing is left running."""
    config = replace(docker_runtime.config, network_mode="no-such-net")
    runtime = await DockerRuntime.connect(config)
    try:
        kernel_id = new_kernel_id()
        with pytest.raises(KernelStartFailed, match="docker: network no-such-net not found"):
            await runtime.create_kernel(KernelSpec(kernel_id, busybox_image, RESOURCE_TXT))
        assert (await runtime.get_kernel(kernel_id)).state is KernelState.EXITED
        assert (
            await docker_runtime.docker.containers.list(
                all=True, filters=f'{{"name": ["accelshare-{kernel_id}"]}}'
            )
            == []
        )
    finally:
        await runtime.close()


async def test_plugin_files_appear_under_home_config(
    docker_runtime: DockerRuntime, busybox_image: str
) -> None:
    """The mock plugin's nvidia-smi files in a container: present and executable; in an
    image without python3 (busybox) the wrapper's fallback fails with 127, as documented
    in docs/plugins.md."""
    repo = Path(__file__).resolve().parents[3]
    plugin = MockPlugin(
        load_mock_config(repo / "configs" / "accelerator" / "two-fgpu.toml"),
        AcceleratorOptions(allocation_mode=AllocationMode.FRACTIONAL),
    )
    gpu = plugin.inventory.devices[0].device_id
    resources = plugin.kernel_resources({"cuda.shares": {gpu: Decimal("0.5")}})
    kernel_id = new_kernel_id()
    script = (
        "ls -l /home/config/bin/nvidia-smi > /home/work/report; "
        "grep -c device_id /home/config/mock-cuda-smi.json >> /home/work/report; "
        "/home/config/bin/nvidia-smi -L >> /home/work/report 2>&1; echo rc=$? >> /home/work/report; "
        "echo END >> /home/work/report; trap 'exit 0' TERM; while :; do sleep 1 & wait $!; done"
    )
    spec = KernelSpec(
        kernel_id=kernel_id,
        image=busybox_image,
        resource_txt=RESOURCE_TXT,
        command=("sh", "-c", script),
        env=resources.env,
        config_files=resources.config_files,
    )
    await docker_runtime.create_kernel(spec)
    report = await poll_file(docker_runtime.scratch_root / kernel_id / "work" / "report", "END")
    lines = report.splitlines()
    assert lines[0].startswith("-rwxr-xr-x"), report
    assert lines[1] == "1"  # one device in the devices file
    assert "python3: not found" in report
    assert "rc=127" in report
    assert (docker_runtime.scratch_root / kernel_id / "config" / "bin" / smi.SCRIPT_FILE).exists()
    await docker_runtime.destroy_kernel(kernel_id)
    await docker_runtime.cleanup_kernel(kernel_id)


# Reports who the kernel runs as and what it may do, into its work folder.
WHOAMI = (
    "r=/home/work/report; echo uid=$(id -u) gid=$(id -g) > $r; "
    "(echo x > /etc/owned) 2>/dev/null && echo etc=written >> $r || echo etc=refused >> $r; "
    "(echo x > /home/config/x) 2>/dev/null && echo config=written >> $r "
    "|| echo config=refused >> $r; "
    "mkdir /home/work/sub && echo ok > /home/work/sub/f && echo work=written >> $r; "
    "cat /proc/self/status >> $r; echo END >> $r"
)


def _status_field(report: str, name: str) -> str:
    (line,) = [x for x in report.splitlines() if x.startswith(f"{name}:")]
    return line.split(":", 1)[1].strip()


async def test_the_kernel_runs_as_the_non_root_user_without_privileges(
    docker_runtime: DockerRuntime, busybox_image: str
) -> None:
    """The configured uid/gid (not 0), writes in its work folder only, no capabilities,
    no new privileges; the engine holds the same settings."""
    kernel_id = new_kernel_id()
    info = await docker_runtime.create_kernel(
        KernelSpec(
            kernel_id=kernel_id,
            image=busybox_image,
            resource_txt=RESOURCE_TXT,
            startup_command=WHOAMI,
        )
    )
    scratch = docker_runtime.scratch_root / kernel_id
    report = await poll_file(scratch / "work" / "report", "END")
    uid, gid = docker_runtime.config.kernel_uid, docker_runtime.config.kernel_gid
    assert uid != 0
    assert f"uid={uid} gid={gid}" in report
    assert "etc=refused" in report
    assert "config=refused" in report  # /home/config is read-only
    assert "work=written" in report
    assert (scratch / "work" / "sub" / "f").stat().st_uid == uid  # as seen from the host
    assert _status_field(report, "NoNewPrivs") == "1"
    assert int(_status_field(report, "CapEff"), 16) == 0
    assert int(_status_field(report, "CapBnd"), 16) == 0
    assert _status_field(report, "Uid").split() == [str(uid)] * 4

    assert info.cid is not None
    data = await (await docker_runtime.docker.containers.get(info.cid)).show()
    assert data["Config"]["User"] == f"{uid}:{gid}"
    assert data["HostConfig"]["Privileged"] is False
    assert data["HostConfig"]["CapDrop"] == ["ALL"]
    assert data["HostConfig"]["SecurityOpt"] == ["no-new-privileges:true"]
    assert sorted(m["Destination"] for m in data["Mounts"]) == ["/home/config", "/home/work"]
    assert {m["Source"] for m in data["Mounts"]} == {
        str(scratch / "config"),
        str(scratch / "work"),
    }
    await docker_runtime.destroy_kernel(kernel_id, grace_s=0)


async def test_the_kernel_user_is_configurable(
    docker_runtime: DockerRuntime, busybox_image: str
) -> None:
    runtime = DockerRuntime(
        replace(docker_runtime.config, kernel_uid=4321, kernel_gid=4322), docker_runtime.docker
    )
    kernel_id = new_kernel_id()
    await runtime.create_kernel(
        KernelSpec(
            kernel_id=kernel_id,
            image=busybox_image,
            resource_txt=RESOURCE_TXT,
            startup_command=WHOAMI,
        )
    )
    report = await poll_file(runtime.scratch_root / kernel_id / "work" / "report", "END")
    assert "uid=4321 gid=4322" in report
    assert "work=written" in report
    await runtime.destroy_kernel(kernel_id, grace_s=0)
