"""The process runtime with launchers started ahead (``prespawn_launchers``)."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from accelshare.agent.runtime import (
    ExitReason,
    KernelSpec,
    KernelStartFailed,
    ProcessEnvironment,
    ProcessRuntime,
)
from accelshare.agent.runtime.procfs import is_same_process

#: Kernels start both ways: the exec helper and a forked Python process (conftest.py).
BOTH_KERNEL_EXECS = True

RuntimeFactory = Callable[..., ProcessRuntime]
Eventually = Callable[..., Awaitable[Any]]


def kernel(command: tuple[str, ...] | None = None) -> KernelSpec:
    return KernelSpec(f"w-{uuid.uuid4().hex[:10]}", "shell", "SLOTS={}\n", command=command)


async def test_spares_start_kernels_and_are_replaced(
    make_runtime: RuntimeFactory, eventually: Eventually
) -> None:
    runtime = make_runtime(fork_server=False, prespawn_launchers=2)
    spares = [p.pid for p, _ in runtime._launcher.spares]
    assert len(spares) == 2
    first = await runtime.create_kernel(kernel(("echo out-$0; echo err-$0 >&2; exit 4",)))
    assert runtime._launcher.spares[0][0].pid == spares[1]  # the oldest was used, a new one queued
    assert len(runtime._launcher.spares) == 2
    done = await runtime.wait_exit(first.kernel_id, timeout_s=10)
    assert done.exit is not None
    assert (done.exit.reason, done.exit.exit_code) == (ExitReason.EXITED, 4)
    logs = await runtime.get_logs(first.kernel_id)
    assert "out-" in logs
    assert "err-" in logs
    second = await runtime.create_kernel(kernel())
    assert second.is_running
    await runtime.destroy_kernel(second.kernel_id, grace_s=1)

    left = [p for p, _ in runtime._launcher.spares]
    await runtime.close()
    assert all(p.poll() is not None for p in left)  # spares exit without launching
    assert runtime._launcher.spares == []


async def test_a_dead_spare_is_skipped(make_runtime: RuntimeFactory) -> None:
    runtime = make_runtime(fork_server=False, prespawn_launchers=1)
    process, _ = runtime._launcher.spares[0]
    process.kill()
    process.wait()
    info = await runtime.create_kernel(kernel())  # falls back to a fresh launcher
    assert info.cid is not None
    assert is_same_process(int(info.cid), None, kernel_id=info.kernel_id)
    await runtime.destroy_kernel(info.kernel_id, grace_s=1)
    await runtime.close()


async def test_a_failing_start_through_a_spare_is_reported(make_runtime: RuntimeFactory) -> None:
    broken = ProcessEnvironment("broken", ("/nonexistent/x",), idle_command=("/nonexistent/y",))
    runtime = make_runtime(fork_server=False, prespawn_launchers=1, environments={"broken": broken})
    kernel_id = f"w-{uuid.uuid4().hex[:10]}"
    with pytest.raises(KernelStartFailed, match="FileNotFoundError"):
        await runtime.create_kernel(KernelSpec(kernel_id, "broken", "SLOTS={}\n"))
    info = await runtime.get_kernel(kernel_id)
    assert info.exit is not None
    assert info.exit.reason is ExitReason.FAILED
    await runtime.close()
