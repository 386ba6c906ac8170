"""Storage folders in a docker kernel (bind mounts, ``ReadOnly``), real dockerd."""

from __future__ import annotations

import uuid
from decimal import Decimal
from pathlib import Path

import pytest

from accelshare.agent.runtime import KernelSpec, KernelStartFailed, ResourceLimits
from accelshare.agent.runtime.docker import DockerRuntime
from accelshare.agent.runtime.folder_mounts import FolderMount
from accelshare_testkit.kernel_exec import run_in_kernel

pytestmark = pytest.mark.integration


async def test_rw_and_ro_folders_in_a_docker_kernel(
    docker_runtime: DockerRuntime, busybox_image: str, tmp_path: Path
) -> None:
    rw, ro = tmp_path / "rw", tmp_path / "ro"
    rw.mkdir()
    ro.mkdir()
    (rw / "host.txt").write_text("h\n")
    (ro / "in.txt").write_text("from-host\n")
    kernel_id = f"dm-{uuid.uuid4().hex[:10]}"
    await docker_runtime.create_kernel(
        KernelSpec(
            kernel_id=kernel_id,
            image=busybox_image,
            resource_txt="SLOTS={}\n",
            limits=ResourceLimits(cpu_count=Decimal("0.5"), mem_bytes=64 << 20, pids_max=64),
            folder_mounts=(
                FolderMount("data", str(rw), "/home/work/data"),
                FolderMount("ro", str(ro), "/data/ro", read_only=True),
            ),
        )
    )
    script = (
        "echo made > /home/work/data/out.txt && echo rw=ok;"
        " echo owner=$(stat -c %u /home/work/data/host.txt);"
        " cat /data/ro/in.txt;"
        " (echo x > /data/ro/x) 2>&1 | grep -o -i 'read-only file system';"
        " test -e /data/ro/x && echo ro=written || echo ro=refused"
    )
    out = (await run_in_kernel(docker_runtime, kernel_id, ["/bin/sh", "-c", script])).output
    uid = docker_runtime.config.kernel_uid
    assert "rw=ok" in out
    assert f"owner={uid}" in out  # the host's files are the kernel's user's
    assert "from-host" in out
    assert "read-only file system" in out.lower()
    assert "ro=refused" in out
    assert (rw / "out.txt").read_text() == "made\n"
    assert (rw / "out.txt").stat().st_uid == uid
    await docker_runtime.destroy_kernel(kernel_id, grace_s=0)


async def test_a_missing_host_folder_fails_the_docker_start(
    docker_runtime: DockerRuntime, busybox_image: str, tmp_path: Path
) -> None:
    spec = KernelSpec(
        kernel_id=f"dm-{uuid.uuid4().hex[:10]}",
        image=busybox_image,
        resource_txt="SLOTS={}\n",
        folder_mounts=(FolderMount("gone", str(tmp_path / "nope"), "/home/work/gone"),),
    )
    with pytest.raises(KernelStartFailed, match=r"mount 'gone': host_path .* does not exist"):
        await docker_runtime.create_kernel(spec)
