"""The process runtime with the launcher's fork server (``fork_server``)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from accelshare.agent.runtime import (
    ExitReason,
    KernelSpec,
    KernelStartFailed,
    ProcessEnvironment,
    ProcessRuntime,
)
from accelshare.agent.runtime.environments import default_environments
from accelshare.agent.runtime.procfs import is_same_process

#: Kernels start both ways: the exec helper and a forked Python process (conftest.py).
BOTH_KERNEL_EXECS = True

RuntimeFactory = Callable[..., ProcessRuntime]
Eventually = Callable[..., Awaitable[Any]]


def kernel(command: tuple[str, ...] | None = None) -> KernelSpec:
    return KernelSpec(f"f-{uuid.uuid4().hex[:10]}", "shell", "SLOTS={}\n", command=command)


def server_pid(runtime: ProcessRuntime) -> int:
    assert runtime._launcher.fork_server is not None
    pid = runtime._launcher.fork_server.pid
    assert pid is not None
    return pid


async def test_kernels_are_forked_by_one_server(
    make_runtime: RuntimeFactory, eventually: Eventually
) -> None:
    runtime = make_runtime(fork_server=True, prespawn_launchers=2)
    server = server_pid(runtime)
    assert runtime._launcher.spares == []  # no spare launchers while the server serves
    first = await runtime.create_kernel(kernel(("echo out-$0; echo err-$0 >&2; exit 4",)))
    done = await runtime.wait_exit(first.kernel_id, timeout_s=10)
    assert done.exit is not None
    assert (done.exit.reason, done.exit.exit_code) == (ExitReason.EXITED, 4)
    logs = await runtime.get_logs(first.kernel_id)
    assert "out-" in logs
    assert "err-" in logs
    infos = await asyncio.gather(*(runtime.create_kernel(kernel()) for _ in range(6)))
    for info in infos:
        assert info.is_running
        assert info.cid is not None
        assert is_same_process(int(info.cid), None, kernel_id=info.kernel_id)
        # the server's child is the kernel's supervisor, in a session of its own: not
        # the agent's child, and out of the agent's process group and signals
        supervisor = psutil.Process(int(info.cid)).parent()
        assert supervisor.ppid() == server != os.getpid()
        assert os.getsid(supervisor.pid) == supervisor.pid != os.getsid(0)
        # the kernel: the supervisor's child, leading a process group of its own
        assert os.getpgid(int(info.cid)) == int(info.cid)
    assert server_pid(runtime) == server  # the same server launched all seven
    await asyncio.gather(*(runtime.destroy_kernel(i.kernel_id, grace_s=1) for i in infos))
    for info in infos:
        done = await runtime.wait_exit(info.kernel_id, timeout_s=10)
        assert done.exit is not None
        assert done.exit.reason is ExitReason.DESTROYED
    # the supervisors, once their kernels ended, are reaped (the server wakes every
    # REAP_INTERVAL_S to do so even without another job)
    await eventually(lambda: psutil.Process(server).children() == [], timeout_s=5)
    await runtime.close()
    assert not psutil.pid_exists(server) or psutil.Process(server).status() == "zombie"


async def test_a_dead_server_is_replaced(make_runtime: RuntimeFactory) -> None:
    runtime = make_runtime(fork_server=True)
    old = server_pid(runtime)
    os.kill(old, signal.SIGKILL)
    await asyncio.to_thread(psutil.Process(old).wait, 5)
    info = await runtime.create_kernel(kernel())
    assert info.is_running
    assert server_pid(runtime) != old
    await runtime.destroy_kernel(info.kernel_id, grace_s=1)
    await runtime.close()


async def test_without_a_server_a_fresh_launcher_starts_the_kernel(
    make_runtime: RuntimeFactory, tmp_path: Path
) -> None:
    # a "python" that cannot run the server: every hand-over fails, the fallback starts it
    runtime = make_runtime(fork_server=True)
    assert runtime._launcher.fork_server is not None
    runtime._launcher.fork_server._argv = [str(tmp_path / "missing-python")]
    runtime._launcher.fork_server._stop_locked()
    info = await runtime.create_kernel(kernel())
    assert info.is_running
    await runtime.destroy_kernel(info.kernel_id, grace_s=1)
    await runtime.close()


async def test_a_failing_start_through_the_server_is_reported(
    make_runtime: RuntimeFactory,
) -> None:
    broken = ProcessEnvironment("broken", ("/nonexistent/x",), idle_command=("/nonexistent/y",))
    environments = {**default_environments(), "broken": broken}
    runtime = make_runtime(fork_server=True, environments=environments)
    kernel_id = f"f-{uuid.uuid4().hex[:10]}"
    with pytest.raises(KernelStartFailed, match="FileNotFoundError"):
        await runtime.create_kernel(KernelSpec(kernel_id, "broken", "SLOTS={}\n"))
    info = await runtime.get_kernel(kernel_id)
    assert info.exit is not None
    assert info.exit.reason is ExitReason.FAILED
    ok = await runtime.create_kernel(kernel())  # the server is still there
    assert ok.is_running
    await runtime.destroy_kernel(ok.kernel_id, grace_s=1)
    await runtime.close()


async def test_the_server_ignores_malformed_messages_and_ends_on_eof(
    make_runtime: RuntimeFactory,
) -> None:
    runtime = make_runtime(fork_server=True)
    server = runtime._launcher.fork_server
    assert server is not None
    with server._lock:
        control = server._control
        assert control is not None
        control.send(b"no fd attached")  # ignored
        r, w = os.pipe()
        socket.send_fds(control, [b""], [w])  # an fd without a path: closed, ignored
        os.close(w)
    assert os.read(r, 1) == b""  # the server closed its copy: EOF, nothing launched
    os.close(r)
    info = await runtime.create_kernel(kernel())
    assert info.is_running
    await runtime.destroy_kernel(info.kernel_id, grace_s=1)
    pid = server_pid(runtime)
    await runtime.close()
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"
