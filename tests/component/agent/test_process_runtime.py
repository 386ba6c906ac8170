"""Real kernels through the process runtime: lifecycle, logs, limits, OOM, isolation."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
import uuid
from collections.abc import Awaitable, Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from accelshare.agent.runtime import (
    ExitReason,
    KernelConflict,
    KernelSpec,
    KernelStartFailed,
    KernelState,
    ProcessEnvironment,
    ProcessRuntime,
    ResourceLimits,
    UnknownEnvironment,
    default_environments,
)
from accelshare.agent.runtime.cgroups import CgroupVersion
from accelshare.agent.runtime.procfs import read_environ, read_stat
from accelshare.agent.runtime.sandbox import SandboxConfig

#: Kernels start both ways: the exec helper and a forked Python process (conftest.py).
BOTH_KERNEL_EXECS = True

RuntimeFactory = Callable[..., ProcessRuntime]
Eventually = Callable[..., Awaitable[Any]]

RESOURCE_TXT = "SLOTS={}\nCPU_SHARES=0:1\n"


def new_kernel_id() -> str:
    return f"t-{uuid.uuid4().hex[:12]}"


HOG = "b = []\nwhile True:\n    b.append(bytearray(8 << 20))\n"


def spec(command: tuple[str, ...] | None, image: str = "shell", **kwargs: object) -> KernelSpec:
    return KernelSpec(
        kernel_id=new_kernel_id(),
        image=image,
        resource_txt=RESOURCE_TXT,
        command=command,
        **kwargs,  # type: ignore[arg-type]
    )


def cgroup_paths(pid: int) -> dict[str, str]:
    """controller -> cgroup path of a process, from /proc/<pid>/cgroup."""
    paths: dict[str, str] = {}
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else ["unified"]:
            paths[controller] = path
    return paths


async def test_create_running_destroy(runtime: ProcessRuntime, eventually: Eventually) -> None:
    kernel = spec(
        (
            "echo started; echo kid=$BACKENDAI_KERNEL_ID mock=$MOCK_VAR cwd=$(pwd); "
            'cat "$ACCELSHARE_RESOURCE_TXT"; echo oops >&2; exec sleep 60',
        ),
        env={"MOCK_VAR": "gpu0"},
    )
    info = await runtime.create_kernel(kernel)
    assert info.state is KernelState.RUNNING
    assert info.cid is not None
    pid = int(info.cid)
    scratch = runtime.scratch_root / kernel.kernel_id

    # "oops" is the last line the command writes: wait for it, not for an earlier one
    log = await eventually(lambda: "oops" in (t := (scratch / "logs/kernel.log").read_text()) and t)
    assert "CPU_SHARES=0:1" in log
    assert f"kid={kernel.kernel_id} mock=gpu0 cwd={scratch / 'work'}" in log
    assert "oops" in log  # stderr goes to the same log
    assert await runtime.get_logs(kernel.kernel_id, tail_bytes=5) == "oops\n"

    # its own session and process group, and the marks a restarted agent checks
    stat = read_stat(pid)
    assert stat is not None
    assert stat.pgid == pid
    assert os.getsid(pid) == pid
    env = read_environ(pid)
    assert env is not None
    assert env["ACCELSHARE_KERNEL_ID"] == kernel.kernel_id
    assert env["ACCELSHARE_RESOURCE_TXT"] == str(scratch / "config/resource.txt")
    assert env["HOME"] == str(scratch / "work")
    assert "SECRET_OF_THE_AGENT" not in env

    text = (scratch / "config/resource.txt").read_text()
    assert text == RESOURCE_TXT + f"CID={pid}\n"

    got = await runtime.get_kernel(kernel.kernel_id)
    assert got.is_running
    assert got.cid == info.cid

    destroyed = await runtime.destroy_kernel(kernel.kernel_id)
    assert destroyed.state is KernelState.EXITED
    assert destroyed.exit is not None
    assert destroyed.exit.reason is ExitReason.DESTROYED
    assert destroyed.exit.exit_code == 128 + signal.SIGTERM
    assert destroyed.exit.signal == signal.SIGTERM
    stat = read_stat(pid)
    assert stat is None or not stat.is_alive
    assert "started" in await runtime.get_logs(kernel.kernel_id)  # logs outlive the kernel
    assert (await runtime.destroy_kernel(kernel.kernel_id)).exit == destroyed.exit  # idempotent

    await runtime.cleanup_kernel(kernel.kernel_id)
    assert not scratch.exists()


@pytest.fixture(autouse=True)
def _agent_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SECRET_OF_THE_AGENT", "x")  # must not leak into kernels


async def test_exit_code_is_captured(runtime: ProcessRuntime) -> None:
    kernel = spec(("echo bye; exit 7",))
    await runtime.create_kernel(kernel)
    info = await runtime.wait_exit(kernel.kernel_id, timeout_s=10)
    assert info.state is KernelState.EXITED
    assert info.exit is not None
    assert (info.exit.reason, info.exit.exit_code, info.exit.signal) == (ExitReason.EXITED, 7, None)
    assert not info.exit.oom_killed
    with pytest.raises(KernelConflict, match="has exited"):
        await runtime.create_kernel(kernel)  # same id again: clean up first


async def test_python_environment(runtime: ProcessRuntime) -> None:
    kernel = spec(
        ("-c", "import sys; print('py', sys.version_info[0]); sys.exit(3)"), image="python"
    )
    await runtime.create_kernel(kernel)
    info = await runtime.wait_exit(kernel.kernel_id, timeout_s=10)
    assert info.exit is not None
    assert info.exit.exit_code == 3
    assert "py 3" in await runtime.get_logs(kernel.kernel_id)


@pytest.mark.parametrize(
    ("image", "startup", "exit_code", "output"),
    [
        # a command line through /bin/sh, whatever the environment (as Backend.AI runs it)
        ("python", "python -c 'print(42)'", 0, "42\n"),
        ("python", "echo hi; echo $FOO", 0, "hi\nbar\n"),
        ("python", "exit 3", 3, ""),
        ("shell", "echo hello; exit 3", 3, "hello\n"),
        ("shell", "echo 'a  b' | tr -s ' '", 0, "a b\n"),
    ],
)
@pytest.mark.parametrize("sandboxed", [False, True])
async def test_startup_command_runs_through_the_shell_in_every_environment(
    make_runtime: RuntimeFactory,
    sandbox_support: str | None,
    sandboxed: bool,
    image: str,
    startup: str,
    exit_code: int,
    output: str,
) -> None:
    if sandboxed and sandbox_support is not None:
        pytest.skip(sandbox_support)
    runtime = make_runtime(sandbox=SandboxConfig() if sandboxed else None)
    kernel = spec(None, image=image, startup_command=startup, env={"FOO": "bar"})
    await runtime.create_kernel(kernel)
    info = await runtime.wait_exit(kernel.kernel_id, timeout_s=20)
    assert info.exit is not None
    assert (info.exit.reason, info.exit.exit_code) == (ExitReason.EXITED, exit_code)
    assert await runtime.get_logs(kernel.kernel_id) == output


@pytest.mark.parametrize("sandboxed", [False, True])
async def test_startup_command_python_is_the_environments_interpreter(
    make_runtime: RuntimeFactory, sandbox_support: str | None, sandboxed: bool, tmp_path: Path
) -> None:
    """``python ...`` in a startup command is the environment's interpreter (its bin dir
    is first on PATH), in the built-in ``python`` environment and in a configured one
    (a virtualenv-like image dir), and the command runs in the environment's work dir
    with its ``env``."""
    if sandboxed and sandbox_support is not None:
        pytest.skip(sandbox_support)
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    project = ProcessEnvironment.from_config(
        "proj",
        {
            "command-prefix": [str(venv / "bin" / "python")],
            "image-dir": str(venv),
            "env": {"PROJ": "yes"},
            "work-dir": "{work}/project",
        },
    )
    # PATH = the default (/bin:/usr/bin): only the environment can put `python` on it.
    runtime = make_runtime(
        sandbox=SandboxConfig() if sandboxed else None,
        passthrough_env=(),
        environments={"proj": project, **default_environments()},
    )
    where = "import sys; print(sys.executable)"
    kernel = spec(None, image="python", startup_command=f"python -c '{where}'; pwd")
    await runtime.create_kernel(kernel)
    info = await runtime.wait_exit(kernel.kernel_id, timeout_s=20)
    assert info.exit is not None
    assert info.exit.exit_code == 0
    scratch = runtime.scratch_root / kernel.kernel_id
    work = (scratch / "work").resolve()
    assert await runtime.get_logs(kernel.kernel_id) == f"{sys.executable}\n{work}\n"

    kernel = spec(None, image="proj", startup_command=f"python -c '{where}'; pwd; echo $PROJ")
    await runtime.create_kernel(kernel)
    info = await runtime.wait_exit(kernel.kernel_id, timeout_s=20)
    assert info.exit is not None
    assert info.exit.exit_code == 0
    scratch = runtime.scratch_root / kernel.kernel_id
    work = (scratch / "work" / "project").resolve()
    expected = f"{venv / 'bin' / 'python'}\n{work}\nyes\n"
    assert await runtime.get_logs(kernel.kernel_id) == expected


async def test_an_unreadable_startup_command_fails_as_a_shell_syntax_error(
    runtime: ProcessRuntime,
) -> None:
    """The shell reads the command line: an unclosed quote is its syntax error (exit
    code 2, the reason in the logs), as in a Backend.AI batch session."""
    kernel = spec(None, image="python", startup_command="python -c 'print(1)")
    await runtime.create_kernel(kernel)
    info = await runtime.wait_exit(kernel.kernel_id, timeout_s=10)
    assert info.exit is not None
    assert info.exit.exit_code == 2
    log = await runtime.get_logs(kernel.kernel_id)
    assert re.search("Unterminated quoted string|unexpected EOF", log), log  # dash | bash


async def test_no_command_stays_running_until_destroyed(runtime: ProcessRuntime) -> None:
    kernel = spec(None)
    info = await runtime.create_kernel(kernel)
    assert info.cid is not None
    cmdline = Path(f"/proc/{info.cid}/cmdline").read_bytes().split(b"\0")
    assert cmdline[:2] == [b"sleep", b"infinity"]
    with pytest.raises(TimeoutError):
        await runtime.wait_exit(kernel.kernel_id, timeout_s=0.3)
    assert (await runtime.create_kernel(kernel)).cid == info.cid  # idempotent by kernel id
    destroyed = await runtime.destroy_kernel(kernel.kernel_id, grace_s=5)
    assert destroyed.exit is not None
    assert destroyed.exit.reason is ExitReason.DESTROYED


async def test_sigterm_ignored_escalates_to_sigkill(
    runtime: ProcessRuntime, eventually: Eventually
) -> None:
    kernel = spec(("trap '' TERM; echo ready; while :; do sleep 0.05; done",))
    await runtime.create_kernel(kernel)
    await eventually(
        lambda: "ready" in (runtime.scratch_root / kernel.kernel_id / "logs/kernel.log").read_text()
    )
    info = await runtime.destroy_kernel(kernel.kernel_id, grace_s=0.2)
    assert info.exit is not None
    assert info.exit.reason is ExitReason.DESTROYED
    assert info.exit.exit_code == 137


async def test_start_failure_is_reported(make_runtime: RuntimeFactory) -> None:
    broken = ProcessEnvironment("broken", ("/nonexistent/interpreter",))
    runtime = make_runtime(environments={"broken": broken, **default_environments()})
    kernel = KernelSpec(new_kernel_id(), "broken", RESOURCE_TXT, command=("x",))
    with pytest.raises(KernelStartFailed, match="nonexistent"):
        await runtime.create_kernel(kernel)
    info = await runtime.get_kernel(kernel.kernel_id)
    assert info.state is KernelState.EXITED
    assert info.exit is not None
    assert info.exit.reason is ExitReason.FAILED
    assert "FileNotFoundError" in (info.exit.error or "")
    with pytest.raises(UnknownEnvironment, match="expected one of broken, python, shell"):
        await runtime.create_kernel(KernelSpec(new_kernel_id(), "cobol", RESOURCE_TXT))
    with pytest.raises(KernelStartFailed, match="Invalid kernel id"):
        await runtime.create_kernel(KernelSpec("../x", "shell", RESOURCE_TXT))


async def test_cgroup_limits_are_applied(
    runtime: ProcessRuntime, cgroup_support: dict[str, str | None]
) -> None:
    if cgroup_support["memory"] is not None:
        pytest.skip(f"cgroup limits not testable here: {cgroup_support['memory']}")
    kernel = spec(("exec sleep 60",))
    limits = ResourceLimits(cpu_count=Decimal("0.5"), mem_bytes=96 << 20, pids_max=16)
    info = await runtime.create_kernel(KernelSpec(**{**_fields(kernel), "limits": limits}))
    assert info.cid is not None
    paths = cgroup_paths(int(info.cid))
    assert runtime.cgroups is not None
    layout = runtime.cgroups.layout
    if layout.version is CgroupVersion.V1:
        memory = layout.v1_mounts["memory"] / paths["memory"].lstrip("/")
        assert memory.name == kernel.kernel_id
        assert (memory / "memory.limit_in_bytes").read_text().strip() == str(96 << 20)
        checked = [memory]
        if cgroup_support["cpu"] is None:
            cpu = layout.v1_mounts["cpu"] / paths["cpu"].lstrip("/")
            assert (cpu / "cpu.cfs_quota_us").read_text().strip() == "50000"
            checked.append(cpu)
        if cgroup_support["pids"] is None:
            pids = layout.v1_mounts["pids"] / paths["pids"].lstrip("/")
            assert (pids / "pids.max").read_text().strip() == "16"
            checked.append(pids)
    else:
        assert layout.v2_mount is not None
        directory = layout.v2_mount / paths["unified"].lstrip("/")
        assert (directory / "memory.max").read_text().strip() == str(96 << 20)
        assert (directory / "pids.max").read_text().strip() == "16"
        checked = [directory]
    assert info.limits["memory"].startswith("cgroup-")
    destroyed = await runtime.destroy_kernel(kernel.kernel_id)
    assert destroyed.exit is not None
    assert not destroyed.exit.oom_killed
    assert not any(d.exists() for d in checked)  # removed with the kernel


async def test_a_stray_still_exiting_at_the_collection_leaves_no_cgroup(
    runtime: ProcessRuntime, cgroup_support: dict[str, str | None]
) -> None:
    """A process that left the kernel's process group (``setsid``) is only SIGKILLed by
    the collection's sweep of the cgroup, and may still be exiting when the cgroup is
    removed: the removal is tried again until it is gone, so a kernel whose scratch dir
    is kept (``keep-scratch``, no ``cleanup_kernel``) leaves no cgroup behind."""
    if cgroup_support["pids"] is not None:
        pytest.skip(f"needs a writable pids cgroup: {cgroup_support['pids']}")
    strays = []
    for _ in range(5):
        kernel = spec(("setsid sleep 300 & exec sleep 300",))
        info = await runtime.create_kernel(kernel)
        assert info.cid is not None
        paths = cgroup_paths(int(info.cid))
        assert runtime.cgroups is not None
        layout = runtime.cgroups.layout
        if layout.version is CgroupVersion.V1:
            directory = layout.v1_mounts["pids"] / paths["pids"].lstrip("/")
        else:
            assert layout.v2_mount is not None
            directory = layout.v2_mount / paths["unified"].lstrip("/")
        assert directory.name == kernel.kernel_id
        await asyncio.sleep(0.2)  # (the stray has left the group)
        strays += [int(p) for p in (directory / "cgroup.procs").read_text().split()]
        destroyed = await runtime.destroy_kernel(kernel.kernel_id, grace_s=1)
        assert destroyed.exit is not None
        assert not directory.exists(), "the kernel's cgroup outlived it"
        record = json.loads((destroyed.scratch_dir / "state" / "exit.json").read_text())
        assert record["cgroup_left"] is False
    assert len(strays) >= 10  # the command and its stray, each time


async def test_memory_hog_is_oom_killed(
    runtime: ProcessRuntime, cgroup_support: dict[str, str | None]
) -> None:
    if cgroup_support["memory"] is not None:
        pytest.skip(f"OOM kill needs a writable memory cgroup: {cgroup_support['memory']}")
    kernel = spec(("-c", HOG), image="python")
    limits = ResourceLimits(mem_bytes=64 << 20)
    await runtime.create_kernel(KernelSpec(**{**_fields(kernel), "limits": limits}))
    info = await runtime.wait_exit(kernel.kernel_id, timeout_s=30)
    assert info.exit is not None
    assert info.exit.reason is ExitReason.OOM_KILLED
    assert info.exit.oom_killed
    assert info.exit.exit_code == 137
    assert info.exit.signal == signal.SIGKILL
    # the record is stable once the cgroup is gone (a restarted agent reads the same)
    again = await runtime.get_kernel(kernel.kernel_id)
    assert again.exit == info.exit


async def test_rlimit_fallback_without_cgroups(make_runtime: RuntimeFactory) -> None:
    runtime = make_runtime(use_cgroups=False)
    kernel = spec(("exec sleep 60",))
    limits = ResourceLimits(cpu_count=Decimal(1), cpuset_cpus=(0,), mem_bytes=256 << 20, pids_max=5)
    info = await runtime.create_kernel(KernelSpec(**{**_fields(kernel), "limits": limits}))
    assert info.cid is not None
    pid = int(info.cid)
    limits_text = Path(f"/proc/{pid}/limits").read_text()
    assert re.search(rf"Max data size\s+{256 << 20}\s+{256 << 20}\s+bytes", limits_text)
    assert os.sched_getaffinity(pid) == {0}
    assert info.limits["memory"] == f"rlimit RLIMIT_DATA={256 << 20}"
    assert info.limits["cpu"].startswith("not enforced")
    assert info.limits["pids"].startswith("not enforced")
    assert "accelshare" not in Path(f"/proc/{pid}/cgroup").read_text()
    await runtime.destroy_kernel(kernel.kernel_id)

    runtime_as = make_runtime(use_cgroups=False, rlimit_memory="as")
    hog = spec(("-c", HOG), image="python")
    await runtime_as.create_kernel(
        KernelSpec(**{**_fields(hog), "limits": ResourceLimits(mem_bytes=128 << 20)})
    )
    info = await runtime_as.wait_exit(hog.kernel_id, timeout_s=30)
    assert info.exit is not None
    assert info.exit.exit_code == 1
    assert not info.exit.oom_killed
    assert "MemoryError" in await runtime_as.get_logs(hog.kernel_id)


async def test_a_sandboxed_kernel_has_its_own_pid_namespace(
    make_runtime: RuntimeFactory, sandbox_support: str | None, eventually: Eventually
) -> None:
    if sandbox_support is not None:
        pytest.skip(sandbox_support)
    runtime = make_runtime(sandbox=SandboxConfig())
    kernel = spec(("echo pid=$$ procs=$(ls /proc | grep -c '^[0-9]'); exec sleep 60",))
    await runtime.create_kernel(kernel)
    log_file = runtime.scratch_root / kernel.kernel_id / "logs/kernel.log"
    log = await eventually(lambda: "pid=" in (t := log_file.read_text()) and t)
    assert "pid=2 " in log  # pid 1 is the sandbox's init (bwrap), the command is next
    procs = int(log.split("procs=")[1].split()[0])
    assert procs <= 6  # its own /proc: init, sh, the $(...) subshell, ls, grep; not the host's
    info = await runtime.destroy_kernel(kernel.kernel_id, grace_s=0.5)
    assert info.exit is not None
    assert info.exit.reason is ExitReason.DESTROYED


async def test_a_sandboxed_kernels_terminal_runs_in_its_namespaces(
    make_runtime: RuntimeFactory, sandbox_support: str | None, eventually: Eventually
) -> None:
    """The shell sees the kernel's PID namespace and /proc, not the host's: it cannot
    find (or signal) the agent or other sessions' processes."""
    if sandbox_support is not None:
        pytest.skip(sandbox_support)
    runtime = make_runtime(sandbox=SandboxConfig())
    kernel = spec(("exec sleep 60",))
    await runtime.create_kernel(kernel)
    terminal = await runtime.open_terminal(kernel.kernel_id, cols=80, rows=24)
    try:
        await terminal.write(
            f"echo pid=$$ procs=$(ls /proc | grep -c '^[0-9]') "
            f"agent=$(test -e /proc/{os.getpid()}/status && echo seen || echo unseen)\r".encode()
        )
        output = b""

        async def answered() -> re.Match[bytes] | None:
            nonlocal output
            output += await terminal.read()
            return re.search(rb"pid=(\d+) procs=(\d+) agent=(\w+)", output)

        found = await eventually(answered)
        assert int(found.group(1)) < 20, output  # a low pid: the kernel's namespace
        assert int(found.group(2)) <= 8, output  # sleep, the shell, its helpers; not the host
        assert found.group(3) == b"unseen", output
    finally:
        await terminal.close()
    await runtime.destroy_kernel(kernel.kernel_id, grace_s=0.5)


def _fields(kernel: KernelSpec) -> dict[str, object]:
    return {name: getattr(kernel, name) for name in KernelSpec.__slots__}


async def test_environment_work_dir_template(
    make_runtime: RuntimeFactory, eventually: Eventually, tmp_path: Path
) -> None:
    """``work-dir``: inside the scratch dir it is created; outside it must exist."""
    inside = ProcessEnvironment.from_config(
        "proj", {"command-prefix": ["/bin/sh", "-c"], "work-dir": "{work}/project/{kernel_id}"}
    )
    outside = ProcessEnvironment.from_config(
        "shared", {"command-prefix": ["/bin/sh", "-c"], "work-dir": str(tmp_path / "absent")}
    )
    runtime = make_runtime(environments={"proj": inside, "shared": outside})
    kernel = spec(("echo cwd=$(pwd); exec sleep 60",), image="proj")
    await runtime.create_kernel(kernel)
    scratch = runtime.scratch_root / kernel.kernel_id
    log = await eventually(lambda: "cwd=" in (t := (scratch / "logs/kernel.log").read_text()) and t)
    expected = (scratch / "work" / "project" / kernel.kernel_id).resolve()
    assert f"cwd={expected}" in log
    with pytest.raises(KernelStartFailed, match="is not a folder"):
        await runtime.create_kernel(spec(("true",), image="shared"))


@pytest.mark.parametrize("sandboxed", [False, True])
async def test_the_environments_interpreter_comes_first_on_path(
    make_runtime: RuntimeFactory,
    eventually: Eventually,
    sandbox_support: str | None,
    sandboxed: bool,
) -> None:
    """``python`` in a session of an interpreter's environment (its scripts, its
    terminal) is that interpreter, not whichever Python the host's PATH finds first."""
    if sandboxed and sandbox_support is not None:
        pytest.skip(sandbox_support)
    # PATH = the default (/bin:/usr/bin): only the environment can put `python` on it.
    runtime = make_runtime(sandbox=SandboxConfig() if sandboxed else None, passthrough_env=())
    code = "import shutil; print('python=' + str(shutil.which('python')))"
    kernel = spec(("-c", code), image="python")
    await runtime.create_kernel(kernel)
    log_file = runtime.scratch_root / kernel.kernel_id / "logs/kernel.log"
    log = await eventually(lambda: "python=" in (t := log_file.read_text()) and t)
    assert f"python={Path(sys.executable).parent / 'python'}\n" in log
