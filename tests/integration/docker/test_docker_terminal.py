"""A terminal in a docker kernel: ``exec`` with a tty through aiodocker, real dockerd."""

from __future__ import annotations

import time
import uuid
from decimal import Decimal

import pytest

from accelshare.agent.runtime import KernelNotFound, KernelSpec, ResourceLimits
from accelshare.agent.runtime.docker import DockerRuntime
from accelshare.agent.runtime.terminal import Terminal
from accelshare_testkit.kernel_exec import run_in_kernel

pytestmark = pytest.mark.integration


async def read_until(terminal: Terminal, needle: str, timeout_s: float = 15.0) -> str:
    screen = ""
    deadline = time.monotonic() + timeout_s
    while needle not in screen:
        assert time.monotonic() < deadline, f"no {needle!r} in {screen!r}"
        chunk = await terminal.read()
        assert chunk, f"the terminal ended before {needle!r}: {screen!r}"
        screen += chunk.decode(errors="replace")
    return screen


async def test_docker_terminal_env_size_resize_and_exit(
    docker_runtime: DockerRuntime, busybox_image: str
) -> None:
    kernel_id = f"dt-{uuid.uuid4().hex[:10]}"
    await docker_runtime.create_kernel(
        KernelSpec(
            kernel_id=kernel_id,
            image=busybox_image,
            resource_txt="SLOTS={}\n",
            env={"BACKENDAI_MOCK_CUDA_DEVICES": "gpu-a"},
            limits=ResourceLimits(cpu_count=Decimal("0.5"), mem_bytes=64 << 20, pids_max=64),
        )
    )
    terminal = await docker_runtime.open_terminal(kernel_id, cols=100, rows=30)
    try:
        await terminal.write(
            b"echo mock=$BACKENDAI_MOCK_CUDA_DEVICES; pwd; echo who=$(id -u):$(id -g); stty size\r"
        )
        screen = await read_until(terminal, "30 100")
        assert "mock=gpu-a" in screen
        assert "/home/work" in screen
        # The kernel's non-root user, not the exec's default root.
        config = docker_runtime.config
        assert f"who={config.kernel_uid}:{config.kernel_gid}" in screen
        assert config.kernel_uid != 0
        await terminal.resize(120, 40)
        await terminal.write(b"stty size\r")
        await read_until(terminal, "40 120")
        await terminal.write(b"exit 4\r")
        while await terminal.read():
            pass
        assert terminal.exit_code() == 4  # type: ignore[attr-defined]
    finally:
        await terminal.close()
    await docker_runtime.destroy_kernel(kernel_id, grace_s=0)
    with pytest.raises(KernelNotFound):
        await docker_runtime.open_terminal(kernel_id, cols=80, rows=24)


async def test_a_command_runs_in_a_docker_kernel_on_pipes(
    docker_runtime: DockerRuntime, busybox_image: str
) -> None:
    """The execute API's docker side: ``exec`` without a tty, stdout and stderr apart,
    stdin, the exit code, as the kernel's user in ``/home/work``."""
    kernel_id = f"dx-{uuid.uuid4().hex[:10]}"
    await docker_runtime.create_kernel(
        KernelSpec(
            kernel_id=kernel_id,
            image=busybox_image,
            resource_txt="SLOTS={}\n",
            limits=ResourceLimits(cpu_count=Decimal("0.5"), mem_bytes=64 << 20, pids_max=64),
        )
    )
    result = await run_in_kernel(
        docker_runtime,
        kernel_id,
        ["/bin/sh", "-c", "read line; echo got=$line; pwd; id -u; echo oops >&2; exit 5"],
        stdin=b"hello\n",
    )
    assert result.code == 5
    config = docker_runtime.config
    assert result.stdout == f"got=hello\n/home/work\n{config.kernel_uid}\n"
    assert result.stderr == "oops\n"
    await docker_runtime.destroy_kernel(kernel_id, grace_s=0)
    with pytest.raises(KernelNotFound):
        await docker_runtime.exec_in_kernel(kernel_id, ["true"])
