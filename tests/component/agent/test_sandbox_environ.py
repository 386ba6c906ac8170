"""A session's environment reaches its kernel's command, never a privileged program.

A kernel's environment is the session's (``environ`` of the create request): a
``LD_PRELOAD`` (or ``LD_LIBRARY_PATH``, ``LD_AUDIT``, ``GCONV_PATH`` ...) in it makes
every dynamically linked program started with it load the session's code.  Each test
starts sandboxed kernels whose environment preloads a small library that records, for
each process that loads it, its effective uid, its PID namespace and its name; bwrap,
nsenter, setpriv and the exec helper run outside the sandbox or as root inside it, so
none of them may show up there: only the kernel's own processes, as the kernel's user,
inside the sandbox.  Both ways of starting kernels (the exec helper, the Python way and
setpriv), a dynamically linked exec helper, the execute API and a web terminal.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import subprocess
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from accelshare.agent.runtime import ExitReason, KernelSpec, ProcessRuntime
from accelshare.agent.runtime.exec_helper import HELPER_PREFIX, HELPER_SOURCE, VARIANTS
from accelshare.agent.runtime.sandbox import SandboxConfig
from accelshare.cbuild import BuildFailed, build, find_compiler
from accelshare_testkit.kernel_exec import run_in_kernel

RuntimeFactory = Callable[..., ProcessRuntime]

#: Every test that starts kernels runs both ways: the exec helper and Python + setpriv.
BOTH_KERNEL_EXECS = True

pytestmark = pytest.mark.skipif(find_compiler() is None, reason="no C compiler (cc / $CC)")

KERNEL_UID, KERNEL_GID = SandboxConfig().effective_ids()
HOST_PID_NS = os.readlink("/proc/self/ns/pid")

#: The preloaded library: one line per process that loads it, "<euid> <pid namespace>
#: <program>", appended to $PRELOAD_MARKS (the kernel's work folder: the same path on
#: the host and in the sandbox), else to the file compiled in (a host folder).
PRELOAD_SOURCE = r"""
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

__attribute__((constructor)) static void mark(void) {
    int saved = errno;
    char ns[128] = "?";
    ssize_t n = readlink("/proc/self/ns/pid", ns, sizeof ns - 1);
    ns[n > 0 ? n : 1] = '\0';
    char line[512];
    int len = snprintf(line, sizeof line, "%d %s %s\n", (int)geteuid(), ns,
                       program_invocation_name);
    const char *files[] = {getenv("PRELOAD_MARKS"), MARKS};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        if (files[i] == NULL)
            continue;
        int fd = open(files[i], O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0666);
        if (fd < 0)
            continue;
        fchmod(fd, 0666);
        if (write(fd, line, (size_t)len) < 0) {
        }
        close(fd);
        break;
    }
    errno = saved;
}
"""


@dataclasses.dataclass(frozen=True)
class Preload:
    library: Path  # in a folder every kernel sees read-only (a ro_path)
    host_marks: Path  # where a process without $PRELOAD_MARKS writes

    def env(self, marks: Path) -> dict[str, str]:
        return {"LD_PRELOAD": str(self.library), "PRELOAD_MARKS": str(marks)}


@pytest.fixture(scope="module")
def preload(tmp_path_factory: pytest.TempPathFactory) -> Preload:
    folder = tmp_path_factory.mktemp("preload")
    folder.chmod(0o755)
    host_marks = folder / "marks" / "host.txt"
    host_marks.parent.mkdir()
    host_marks.parent.chmod(0o1777)
    source = folder / "mark.c"
    source.write_text(PRELOAD_SOURCE)
    library = folder / "libmark.so"
    compiler = find_compiler()
    assert compiler is not None
    subprocess.run(
        [
            *compiler,
            "-shared",
            "-fPIC",
            f'-DMARKS="{host_marks}"',
            "-o",
            str(library),
            str(source),
        ],
        check=True,
        capture_output=True,
    )
    library.chmod(0o755)
    return Preload(library, host_marks)


@pytest.fixture(scope="module")
def dynamic_helper(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The exec helper as it is built where no static C library is there."""
    try:
        return build(
            HELPER_SOURCE,
            tmp_path_factory.mktemp("dynamic-helper"),
            prefix=HELPER_PREFIX,
            variants=[v for v in VARIANTS if "-static" not in v[0]],
        )
    except BuildFailed as e:
        pytest.skip(f"no dynamic build of the exec helper: {e}")


@pytest.fixture
async def sandboxed(
    make_runtime: RuntimeFactory,
    sandbox_support: str | None,
    kernel_exec: Path | None,
    preload: Preload,
) -> AsyncIterator[Callable[..., ProcessRuntime]]:
    if sandbox_support is not None:
        pytest.skip(sandbox_support)
    made: list[ProcessRuntime] = []

    def factory(helper: Path | None = kernel_exec) -> ProcessRuntime:
        config = SandboxConfig(ro_paths=(preload.library.parent,), exec_helper=helper)
        runtime = make_runtime(sandbox=config, exec_helper=helper)
        made.append(runtime)
        return runtime

    yield factory
    for runtime in made:
        await runtime.close()


def marks(*files: Path) -> list[tuple[int, str, str]]:
    """Every ``(euid, pid namespace, program)`` the library recorded in ``files``."""
    found = []
    for file in files:
        if file.exists():
            for line in file.read_text().splitlines():
                euid, ns, program = line.split(" ", 2)
                found.append((int(euid), ns, program))
    return found


def assert_only_the_kernel_loaded_it(found: list[tuple[int, str, str]], program: str) -> None:
    privileged = [m for m in found if m[0] == 0 or m[1] == HOST_PID_NS or m[0] != KERNEL_UID]
    assert not privileged, f"the session's library ran in a privileged process: {found}"
    # ... and the kernel's own command still got the environment
    assert any(m[2].endswith(program) for m in found), found


def kernel(preload: Preload, runtime: ProcessRuntime, command: str) -> tuple[KernelSpec, Path]:
    kernel_id = f"env-{uuid.uuid4().hex[:10]}"
    work_marks = runtime.scratch_root / kernel_id / "work" / "marks.txt"
    spec = KernelSpec(
        kernel_id=kernel_id,
        image="shell",
        resource_txt="SLOTS={}\nCPU_SHARES=0:1\n",
        command=(command,),
        env=preload.env(work_marks),
    )
    return spec, work_marks


async def _run_kernel(runtime: ProcessRuntime, preload: Preload) -> None:
    spec, work_marks = kernel(preload, runtime, 'echo "preload=$LD_PRELOAD"')
    await runtime.create_kernel(spec)
    info = await runtime.wait_exit(spec.kernel_id, timeout_s=15)
    log = await runtime.get_logs(spec.kernel_id)
    assert info.exit is not None, log
    assert (info.exit.reason, info.exit.exit_code) == (ExitReason.EXITED, 0), log
    assert f"preload={preload.library}" in log, log
    assert_only_the_kernel_loaded_it(marks(work_marks, preload.host_marks), "sh")


async def test_a_preload_in_the_environment_runs_only_in_the_kernel(
    sandboxed: Callable[..., ProcessRuntime], preload: Preload
) -> None:
    await _run_kernel(sandboxed(), preload)


async def test_a_dynamically_linked_exec_helper_loads_nothing_of_the_session(
    sandboxed: Callable[..., ProcessRuntime],
    preload: Preload,
    dynamic_helper: Path,
    kernel_exec: Path | None,
) -> None:
    if kernel_exec is None:
        pytest.skip("the exec helper's own test")
    await _run_kernel(sandboxed(dynamic_helper), preload)


async def _started(runtime: ProcessRuntime, preload: Preload) -> tuple[KernelSpec, Path]:
    spec, work_marks = kernel(preload, runtime, "echo ready; exec sleep 600")
    await runtime.create_kernel(spec)
    log_file = runtime.scratch_root / spec.kernel_id / "logs" / "kernel.log"
    async with asyncio.timeout(15):
        while "ready" not in (log_file.read_text() if log_file.exists() else ""):
            await asyncio.sleep(0.02)
    return spec, work_marks


async def test_the_execute_api_runs_the_session_environment_only_as_the_kernel(
    sandboxed: Callable[..., ProcessRuntime], preload: Preload
) -> None:
    runtime = sandboxed()
    spec, work_marks = await _started(runtime, preload)
    work_marks.unlink(missing_ok=True)  # (the kernel's own line: only the exec's now)
    result = await run_in_kernel(runtime, spec.kernel_id, ["sh", "-c", 'echo "got=$LD_PRELOAD"'])
    assert result.code == 0, result
    assert f"got={preload.library}" in result.stdout, result
    assert_only_the_kernel_loaded_it(marks(work_marks, preload.host_marks), "sh")


async def test_a_terminal_runs_the_session_environment_only_as_the_kernel(
    sandboxed: Callable[..., ProcessRuntime], preload: Preload
) -> None:
    runtime = sandboxed()
    spec, work_marks = await _started(runtime, preload)
    work_marks.unlink(missing_ok=True)
    terminal = await runtime.open_terminal(spec.kernel_id, cols=120, rows=40)
    screen = b""
    try:
        await terminal.write(b'echo "<$((6*7))>$LD_PRELOAD"\r')
        async with asyncio.timeout(15):
            while f"<42>{preload.library}".encode() not in screen:
                chunk = await terminal.read()
                assert chunk, screen
                screen += chunk
    finally:
        await terminal.close()
    assert_only_the_kernel_loaded_it(marks(work_marks, preload.host_marks), "sh")
