"""The kernels' exec helper (runtime/exec_helper.py, exec_helper/accelshare_exec.c): its
build (static first, a dynamic fallback, cached by source), its ``enter`` mode driven
directly, and through the process runtime (the ``drop`` mode is compared with setpriv
in test_sandbox.py)."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import socket
import stat
import struct
import subprocess
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from accelshare.agent.runtime import KernelSpec, KernelStartFailed, ProcessRuntime
from accelshare.agent.runtime.exec_helper import (
    HELPER_DIR,
    build_exec_helper,
    prepare_exec_helper,
)
from accelshare.cbuild import BuildFailed, find_compiler

RuntimeFactory = Callable[..., ProcessRuntime]

pytestmark = pytest.mark.skipif(find_compiler() is None, reason="no C compiler (cc / $CC)")


@pytest.fixture
def helper(exec_helper_build: Path | str) -> Path:
    if isinstance(exec_helper_build, str):
        pytest.skip(exec_helper_build)
    return exec_helper_build


def enter(
    helper: Path,
    tmp_path: Path,
    command: list[str],
    *options: str,
    env: bytes = b"PATH=/usr/bin:/bin\0",
    keep: tuple[int, ...] = (),
) -> tuple[str, int, str]:
    """Run ``helper enter`` as the supervisor does: (its error report, its exit code,
    the log)."""
    err_r, err_w = os.pipe()
    env_r, env_w = os.pipe()
    log = tmp_path / "kernel.log"
    argv = [str(helper), "enter", str(err_w), str(env_r), *options]
    argv += ["--log", str(log), "--cwd", str(tmp_path), "--", *command]
    for fd in (err_w, env_r, *keep):
        os.set_inheritable(fd, True)
    pid = os.posix_spawn(str(helper), argv, {}, setsid=True)
    os.close(err_w)
    os.close(env_r)
    with contextlib.suppress(BrokenPipeError):
        os.write(env_w, env)
    os.close(env_w)
    with os.fdopen(err_r, "rb") as errors:
        error = errors.read().decode()
    _, status = os.waitpid(pid, 0)
    return error, os.waitstatus_to_exitcode(status), log.read_text() if log.exists() else ""


def has_interpreter(program: Path) -> bool:
    """Whether an ELF program is dynamically linked (has a ``PT_INTERP`` header)."""
    data = program.read_bytes()
    assert data[:4] == b"\x7fELF"
    assert data[4] == 2  # (64-bit)
    byte_order = "<" if data[5] == 1 else ">"
    (phoff,) = struct.unpack_from(f"{byte_order}Q", data, 0x20)
    phentsize, phnum = struct.unpack_from(f"{byte_order}HH", data, 0x36)
    kinds = [
        struct.unpack_from(f"{byte_order}I", data, phoff + i * phentsize)[0] for i in range(phnum)
    ]
    return 3 in kinds  # PT_INTERP


def static_linking_works(tmp_path: Path) -> bool:
    compiler = find_compiler()
    assert compiler is not None
    source = tmp_path / "s.c"
    source.write_text("int main(void) { return 0; }\n")
    done = subprocess.run(
        [*compiler, "-static", "-o", str(tmp_path / "s"), str(source)],
        capture_output=True,
        check=False,
    )
    return done.returncode == 0


def test_the_helper_is_static_where_the_c_library_allows_and_cached(tmp_path: Path) -> None:
    folder = tmp_path / "helpers"
    built = build_exec_helper(folder)
    mode = built.stat().st_mode
    assert stat.S_IMODE(mode) == 0o755
    assert stat.S_IMODE(folder.stat().st_mode) == 0o755
    assert has_interpreter(built) == (not static_linking_works(tmp_path))
    # the same source again: no compiler needed
    assert build_exec_helper(folder, env={**os.environ, "CC": "/bin/false"}) == built


def test_a_c_library_without_static_linking_gets_a_dynamic_helper(tmp_path: Path) -> None:
    compiler = find_compiler()
    assert compiler is not None
    wrapper = tmp_path / "cc-no-static"
    wrapper.write_text(
        "#!/bin/sh\n"
        'for a in "$@"; do [ "$a" = -static ] && { echo "cannot find -lc" >&2; exit 1; }; done\n'
        f'exec {compiler[0]} "$@"\n'
    )
    wrapper.chmod(0o755)
    built = build_exec_helper(tmp_path / "helpers", env={**os.environ, "CC": str(wrapper)})
    assert has_interpreter(built)
    error, code, _ = enter(built, tmp_path, ["true"])
    assert (error, code) == ("", 0)
    # neither builds: the static build's reason, and the Python way at agent start
    failing = {**os.environ, "CC": "/bin/false"}
    with pytest.raises(BuildFailed, match=r"/bin/false -static .* exited with 1"):
        build_exec_helper(tmp_path / "none", env=failing)
    state = prepare_exec_helper(tmp_path / "root", env={**os.environ, "CC": "no-such-cc"})
    assert state.path is None
    assert "no C compiler: 'no-such-cc'" in state.reason
    assert state.status.startswith("python fork and setpriv (no exec helper: no C compiler")
    ready = prepare_exec_helper(tmp_path / "root")
    assert ready.path is not None
    assert ready.path.parent == tmp_path / "root" / HELPER_DIR
    assert ready.status == f"exec helper {ready.path}"


def test_enter_applies_the_kernels_limits_output_and_cwd(helper: Path, tmp_path: Path) -> None:
    procs = [tmp_path / "procs-a", tmp_path / "procs-b"]  # (cgroup.procs stand-ins)
    for file in procs:
        file.write_text("")
    kept_r, kept_w = os.pipe()
    leaked = os.open("/dev/null", os.O_RDONLY)  # inheritable, not kept: closed
    os.set_inheritable(leaked, True)
    cpu = sorted(os.sched_getaffinity(0))[0]
    script = (
        "echo pid=$$ cwd=$(pwd) foo=$FOO; ulimit -d; ulimit -n; "
        "grep Cpus_allowed_list /proc/self/status; ls /proc/$$/fd | tr '\\n' ,"
    )
    try:
        error, code, log = enter(
            helper,
            tmp_path,
            ["sh", "-c", script],
            *("--procs", str(procs[0]), "--procs", str(procs[1])),
            *("--rlimit", "RLIMIT_DATA", str(512 << 20), str(512 << 20)),
            *("--rlimit", "RLIMIT_NOFILE", "64", "64"),
            *("--cpus", str(cpu), "--keep-fd", str(kept_w)),
            env=b"PATH=/usr/bin:/bin\0FOO=bar baz\0",
            keep=(kept_w,),
        )
    finally:
        for fd in (kept_r, kept_w, leaked):
            os.close(fd)
    assert (error, code) == ("", 0), log
    pid = log.split("pid=")[1].split()[0]
    assert [file.read_text() for file in procs] == [pid, pid]
    assert f"cwd={tmp_path} foo=bar baz" in log
    assert "524288\n64\n" in log  # KiB, files
    assert f"Cpus_allowed_list:\t{cpu}\n" in log
    fds = {int(fd) for fd in log.strip().rsplit("\n", 1)[-1].split(",") if fd}
    assert fds - {3} == {0, 1, 2, kept_w}, log  # (3: ls's own listing)


@pytest.mark.parametrize(
    ("command", "options", "expected"),
    [
        (
            ["nosuchcmd"],
            (),
            "FileNotFoundError: [Errno 2] No such file or directory: '/bin/nosuchcmd'",
        ),
        (
            ["/no/such/program"],
            (),
            "FileNotFoundError: [Errno 2] No such file or directory: '/no/such/program'",
        ),
        (["{tmp}/data.txt"], (), "PermissionError: [Errno 13] Permission denied: '{tmp}/data.txt'"),
        (
            ["true"],
            ("--rlimit", "RLIMIT_DATA", "12x", "1"),
            "ValueError: accelshare-exec: bad rlimit value",
        ),
        (
            ["true"],
            ("--rlimit", "RLIMIT_NOPE", "1", "1"),
            "AttributeError: module 'resource' has no attribute 'RLIMIT_NOPE'",
        ),
        (["true"], ("--cpus", "0,,-1"), "ValueError: accelshare-exec: bad CPU number"),
        (
            ["true"],
            ("--procs", "/no/such/cgroup.procs"),
            "FileNotFoundError: [Errno 2] No such file or directory: '/no/such/cgroup.procs'",
        ),
        (
            ["true"],
            ("--bogus",),
            "ValueError: accelshare-exec: unknown option, or one without its value",
        ),
    ],
)
def test_enter_reports_each_failure_as_python_would(
    helper: Path, tmp_path: Path, command: list[str], options: tuple[str, ...], expected: str
) -> None:
    (tmp_path / "data.txt").write_text("not a program\n")  # (mode 0644)
    command = [part.replace("{tmp}", str(tmp_path)) for part in command]
    error, code, _ = enter(helper, tmp_path, command, *options)
    assert (error, code) == (expected.replace("{tmp}", str(tmp_path)), 127)


def test_enter_refuses_a_malformed_environment(helper: Path, tmp_path: Path) -> None:
    error, code, _ = enter(helper, tmp_path, ["true"], env=b"PATH=/bin\0no-nul")
    assert (error, code) == (
        "ValueError: the kernel's environment does not end with a NUL byte",
        127,
    )
    error, code, _ = enter(helper, tmp_path, ["true"], env=b"=x\0")
    assert (error, code) == ("ValueError: illegal environment variable name", 127)


def apply_env(helper: Path, command: list[str], env: bytes) -> tuple[int, str, str]:
    """``helper env FD -- COMMAND`` with ``env`` in a memfd, its own environment holding
    only a PATH that leads nowhere: (exit code, stdout, stderr)."""
    fd = os.memfd_create("env")
    try:
        os.write(fd, env)
        os.lseek(fd, 0, os.SEEK_SET)
        done = subprocess.run(
            [str(helper), "env", str(fd), "--", *command],
            env={"PATH": "/nowhere"},
            pass_fds=(fd,),
            capture_output=True,
            text=True,
            check=False,
        )
    finally:
        os.close(fd)
    return done.returncode, done.stdout, done.stderr


def test_env_mode_runs_the_command_with_the_given_environment(helper: Path) -> None:
    """The ``env`` mode (inside a sandbox, once the kernel's user is in place): the
    command gets exactly the environment read from the descriptor, is looked up on its
    PATH, and does not inherit the descriptor."""
    code, out, err = apply_env(
        helper,
        ["sh", "-c", 'echo "foo=$FOO path=$PATH"; ls /proc/self/fd | tr "\\n" ,'],
        b"PATH=/usr/bin:/bin\0FOO=bar baz\0",
    )
    assert (code, err) == (0, ""), out
    assert "foo=bar baz path=/usr/bin:/bin" in out
    assert set(out.splitlines()[-1].strip(",").split(",")) == {"0", "1", "2", "3"}, out


def test_env_mode_exits_as_setpriv_and_env_do(helper: Path, tmp_path: Path) -> None:
    """127 with the error when the program is not there, 126 when it cannot run."""
    code, _, err = apply_env(helper, ["nosuchcmd"], b"PATH=/bin\0")
    assert code == 127
    assert err == (
        "accelshare-exec: FileNotFoundError: [Errno 2] No such file or directory:"
        " '/bin/nosuchcmd'\n"
    )
    data = tmp_path / "data.txt"
    data.write_text("not a program\n")
    code, _, err = apply_env(helper, [str(data)], b"PATH=/bin\0")
    assert code == 126
    assert "PermissionError: [Errno 13] Permission denied" in err
    code, _, err = apply_env(helper, ["true"], b"PATH=/bin\0no-nul")
    assert code == 127
    assert "does not end with a NUL byte" in err


def socket_mode(helper: Path, net: str, user: str) -> tuple[int, bytes, list[int], str]:
    """``socket NETNS_FD USERNS_FD SOCK_FD`` on the files ``net`` and ``user``: its exit
    code, what it sent, the descriptors it sent, its stderr."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    net_fd, user_fd = os.open(net, os.O_RDONLY), os.open(user, os.O_RDONLY)
    try:
        fds = (net_fd, user_fd, theirs.fileno())
        done = subprocess.run(
            [str(helper), "socket", *map(str, fds)],
            pass_fds=fds,
            capture_output=True,
            timeout=10,
            check=False,
        )
        theirs.close()
        data, got, _, _ = socket.recv_fds(ours, 4096, 4)
        return done.returncode, data, got, done.stderr.decode()
    finally:
        ours.close()
        theirs.close()
        os.close(net_fd)
        os.close(user_fd)


def test_socket_mode_sends_a_socket_of_the_namespace_or_its_error(
    helper: Path, tmp_path: Path
) -> None:
    """The ``socket`` mode (an agent that is not root relaying app ports): an unconnected
    TCP socket of the network namespace comes back over the unix socket; a failure comes
    back as Python's "TypeName: message" instead."""
    if os.geteuid() != 0:
        pytest.skip("entering a network namespace needs CAP_SYS_ADMIN")
    code, data, fds, err = socket_mode(helper, "/proc/self/ns/net", "/proc/self/ns/user")
    assert (code, data, err, len(fds)) == (0, b"\0", "", 1)
    with socket.socket(fileno=fds[0]) as made:
        assert (made.family, made.type) == (socket.AF_INET, socket.SOCK_STREAM)
        assert made.getsockname() == ("0.0.0.0", 0)  # (not bound, not connected)
    not_a_namespace = tmp_path / "file"
    not_a_namespace.write_text("")
    code, data, fds, _ = socket_mode(helper, "/proc/self/ns/net", str(not_a_namespace))
    assert (code, fds) == (1, [])
    assert data == (
        b"OSError: [Errno 22] Invalid argument (entering the user namespace that owns it)"
    )
    code, data, fds, _ = socket_mode(helper, str(not_a_namespace), "/proc/self/ns/user")
    assert (code, fds, data) == (1, [], b"OSError: [Errno 22] Invalid argument (entering it)")
    done = subprocess.run([str(helper), "socket", "3"], capture_output=True, check=False)
    assert done.returncode == 127
    assert b"ValueError: accelshare-exec: socket NETNS_FD USERNS_FD SOCK_FD" in done.stderr


def kernel(command: tuple[str, ...], **kwargs: Any) -> KernelSpec:
    return KernelSpec(
        f"xh-{uuid.uuid4().hex[:10]}", "shell", "SLOTS={}\n", command=command, **kwargs
    )


async def test_a_kernels_ld_preload_never_runs_in_the_helper(
    make_runtime: RuntimeFactory, helper: Path, tmp_path: Path
) -> None:
    """The helper runs as the agent's user before its exec: the kernel's environment is
    only passed on, never its own (a ``LD_PRELOAD`` there would run as root)."""
    compiler = find_compiler()
    assert compiler is not None
    marker = tmp_path / "loaded-into"
    source = tmp_path / "mark.c"
    source.write_text(
        "#include <stdio.h>\n#include <unistd.h>\n"
        "__attribute__((constructor)) static void mark(void) {\n"
        '  char exe[4096]; ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);\n'
        f'  FILE *f = fopen("{marker}", "a"); if (!f || n < 0) return; exe[n] = 0;\n'
        '  fprintf(f, "%s\\n", exe); fclose(f);\n}\n'
    )
    library = tmp_path / "libmark.so"
    subprocess.run([*compiler, "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    runtime = make_runtime(exec_helper=helper)
    spec = kernel(("true",), env={"LD_PRELOAD": str(library)})
    await runtime.create_kernel(spec)
    info = await runtime.wait_exit(spec.kernel_id, timeout_s=15)
    assert info.exit is not None
    assert info.exit.exit_code == 0
    loaded = marker.read_text().split()
    assert loaded, "the kernel's own command loads its LD_PRELOAD"
    assert str(helper) not in loaded
    assert not any(Path(exe).name.startswith("accelshare-exec") for exe in loaded)


async def test_a_helper_that_is_gone_fails_the_start_with_its_reason(
    make_runtime: RuntimeFactory, tmp_path: Path
) -> None:
    runtime = make_runtime(exec_helper=tmp_path / "gone" / "accelshare-exec-0")
    with pytest.raises(KernelStartFailed, match=r"FileNotFoundError: .*accelshare-exec-0"):
        await runtime.create_kernel(kernel(("true",)))


async def test_the_kernel_gets_its_limits_and_default_signals_from_the_helper(
    make_runtime: RuntimeFactory, helper: Path
) -> None:
    """What _exec_kernel gives the Python way, the helper gives: a session of its own,
    rlimits, every signal's default (even one the agent ignores), nothing blocked."""
    ignored = signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    try:
        runtime = make_runtime(exec_helper=helper, use_cgroups=False)
        from accelshare.agent.runtime import ResourceLimits

        spec = kernel(
            (
                "echo sid=$(ps -o sid= -p $$ | tr -d ' ') pid=$$; grep -E 'Sig(Ign|Blk)' /proc/self/status; ulimit -d",
            ),
            limits=ResourceLimits(mem_bytes=1 << 30),
        )
        await runtime.create_kernel(spec)
        info = await runtime.wait_exit(spec.kernel_id, timeout_s=15)
        log = await runtime.get_logs(spec.kernel_id)
    finally:
        signal.signal(signal.SIGUSR1, ignored)
    assert info.exit is not None
    assert info.exit.exit_code == 0, log
    sid, pid = (part.split("=")[1] for part in log.split()[:2])
    assert sid == pid, log
    assert "SigBlk:\t0000000000000000" in log, log
    ignored_mask = int(log.split("SigIgn:\t")[1].split()[0], 16)
    assert ignored_mask & ~0x180000000 == 0, log  # (32, 33: glibc's own, left as they are)
    assert str((1 << 30) // 1024) in log, log
    assert resource.getrlimit(resource.RLIMIT_DATA)  # (the agent's own are untouched)


async def test_the_agent_builds_the_helper_at_start_and_starts_kernels_with_it(
    agent_toml: Callable[..., Path],
    scratch_root: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The real build at start (conftest's agents take the session's helper): into the
    scratch root, root's and 0755, and given to the runtime (and, as root, its sandbox)."""
    from accelshare.agent import service_runtime
    from accelshare.agent.runtime import exec_helper
    from accelshare.config.agent_file import load_agent_config

    monkeypatch.setattr(service_runtime, "prepare_exec_helper", exec_helper.prepare_exec_helper)
    config = load_agent_config(agent_toml())
    with caplog.at_level("INFO"):
        runtime, _ = await service_runtime.make_runtime(config, scratch_root)
    try:
        assert isinstance(runtime, ProcessRuntime)
        built = runtime.config.exec_helper
        assert built is not None
        assert built.parent == scratch_root / HELPER_DIR
        assert stat.S_IMODE(built.parent.stat().st_mode) == 0o755
        assert built.parent.stat().st_uid == os.geteuid()
        if runtime.sandbox is not None and os.geteuid() == 0:
            assert runtime.sandbox.exec_helper == built
        assert f"kernel exec: exec helper {built}" in caplog.text
    finally:
        await runtime.close()


# -- supervise mode (the fork server's supervisors) ----------------------------------------


def supervise(
    helper: Path, tmp_path: Path, command: list[str], *options: str
) -> tuple[int, dict[str, Any], Path]:
    """Start ``helper supervise`` as the fork server does (without a launch file): (its
    pid, its status report, the state folder with proc.json / exit.json)."""
    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    status_r, status_w = os.pipe()
    env_fd = os.memfd_create("env")
    os.write(env_fd, b"PATH=/usr/bin:/bin\0")
    os.lseek(env_fd, 0, os.SEEK_SET)
    argv = [str(helper), "supervise", str(status_w), str(env_fd)]
    argv += ["--proc-file", str(state / "proc.json"), "--exit-file", str(state / "exit.json")]
    argv += [*options, "--log", str(tmp_path / "kernel.log"), "--cwd", str(tmp_path)]
    argv += ["--", *command]
    for fd in (status_w, env_fd):
        os.set_inheritable(fd, True)
    pid = os.posix_spawn(str(helper), argv, {}, setsid=True)
    os.close(status_w)
    os.close(env_fd)
    with os.fdopen(status_r, "rb") as status:
        report = json.loads(status.read().decode())
    return pid, report, state


def finished(pid: int, state: Path) -> dict[str, Any]:
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    record: dict[str, Any] = json.loads((state / "exit.json").read_text(encoding="utf-8"))
    return record


def test_supervise_records_the_kernel_as_the_python_supervisor_does(
    helper: Path, tmp_path: Path
) -> None:
    pid, report, state = supervise(helper, tmp_path, ["sh", "-c", "echo hi; exit 3"])
    kernel_pid = report["kernel_pid"]
    assert report == {"ok": True, "supervisor_pid": pid, "kernel_pid": kernel_pid}
    proc = json.loads((state / "proc.json").read_text())
    assert sorted(proc) == [
        "kernel_pid",
        "kernel_start",
        "started_at",
        "supervisor_pid",
        "supervisor_start",
    ]
    assert (proc["supervisor_pid"], proc["kernel_pid"]) == (pid, kernel_pid)
    assert isinstance(proc["supervisor_start"], int)
    assert isinstance(proc["kernel_start"], int | None)  # (it may be gone already)
    assert isinstance(proc["started_at"], float)
    record = finished(pid, state)
    assert {k: v for k, v in record.items() if k != "finished_at"} == {
        "reason": "exited",
        "exit_code": 3,
        "signal": None,
    }
    assert record["finished_at"] >= proc["started_at"]
    assert (tmp_path / "kernel.log").read_text() == "hi\n"
    assert not list(state.glob("*.tmp"))


def test_supervise_stays_through_term_and_records_a_killed_kernel(
    helper: Path, tmp_path: Path
) -> None:
    pid, report, state = supervise(helper, tmp_path, ["sleep", "30"])
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        os.kill(pid, signum)  # ignored: it stays to record the exit code
    os.kill(report["kernel_pid"], signal.SIGTERM)
    record = finished(pid, state)
    assert (record["reason"], record["exit_code"], record["signal"]) == ("killed", 143, 15)


def test_supervise_reports_a_failed_exec_in_json_that_reads_back(
    helper: Path, tmp_path: Path
) -> None:
    """The error text (quotes, a line break, bytes that are not UTF-8) is JSON-escaped in
    the status report and exit.json alike."""
    program = os.fsdecode(b'/no/such "dir"\n\xff\xc3/prog')
    pid, report, state = supervise(helper, tmp_path, [program])
    assert report["ok"] is False
    assert report["error"].startswith("FileNotFoundError: [Errno 2] No such file or directory:")
    assert '/no/such "dir"\n\ufffd\ufffd/prog' in report["error"]
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 1
    record = json.loads((state / "exit.json").read_text(encoding="utf-8"))
    assert record["reason"] == "failed"
    assert record["exit_code"] is None
    assert record["error"] == report["error"]


def test_supervise_reports_a_bad_option_of_the_kernels_as_a_failed_start(
    helper: Path, tmp_path: Path
) -> None:
    pid, report, state = supervise(helper, tmp_path, ["true"], "--rlimit", "RLIMIT_NO", "1", "1")
    assert report == {
        "ok": False,
        "error": "AttributeError: module 'resource' has no attribute 'RLIMIT_NO'",
    }
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 1
    assert json.loads((state / "exit.json").read_text())["error"] == report["error"]


async def test_the_fork_servers_supervisor_is_the_helper(
    make_runtime: RuntimeFactory, helper: Path
) -> None:
    """With the fork server and the helper, the kernel's supervisor is the helper's
    ``supervise`` (no Python process per kernel), named by its launch file (procfs.py)."""
    from accelshare.agent.runtime.procfs import find_marked_processes

    runtime = make_runtime(exec_helper=helper, fork_server=True)
    try:
        spec = kernel(("sleep 30",))
        info = await runtime.create_kernel(spec)
        proc = json.loads((info.scratch_dir / "state" / "proc.json").read_text())
        supervisor = proc["supervisor_pid"]
        assert os.readlink(f"/proc/{supervisor}/exe") == str(helper)
        cmdline = Path(f"/proc/{supervisor}/cmdline").read_bytes().split(b"\0")
        assert cmdline[1] == b"supervise"
        assert os.getsid(supervisor) == supervisor
        environ = Path(f"/proc/{supervisor}/environ").read_bytes()
        assert environ == b"PATH=/usr/sbin:/usr/bin:/sbin:/bin\0"
        assert supervisor in find_marked_processes(runtime.scratch_root)[spec.kernel_id]
        await runtime.destroy_kernel(spec.kernel_id, grace_s=0)
        done = await runtime.wait_exit(spec.kernel_id, timeout_s=10)
        assert done.exit is not None
        assert done.exit.reason.value in ("killed", "destroyed")
    finally:
        await runtime.close()
