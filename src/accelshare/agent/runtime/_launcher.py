"""Kernel supervisor of the process runtime.  Standard library only, never imports accelshare.

Run by the runtime as ``python -I -S _launcher.py <scratch>/<id>/state/launch.json STATUS_FD``,
or started ahead as a *spare* with ``-`` instead of the path: it then waits for the path
on stdin (one line; EOF without one: exit quietly), moves its own output to the kernel's
``logs/launcher.log`` and its cwd to the scratch dir, and goes on as below:

1. forks and lets the first process exit at once, so the supervisor is not the
   agent's child: it survives the agent and is reaped by init, and the agent never
   blocks on it (a fork server's job is the supervisor itself: see below);
2. ``setsid()``: its own session, away from the agent's terminal and signals;
3. starts the kernel process, which ``setsid()``s (own session and process group, so
   the runtime can signal the whole group), writes its pid into every cgroup
   ``cgroup.procs`` listed (it joins its cgroups *before* it execs the command, so
   no byte of the command runs unlimited), applies rlimits and CPU affinity
   (:func:`enter_kernel_limits`, shared with ``_terminal_exec.py``), sends
   stdout/stderr to the kernel log, and execs the command.  With an exec helper
   (``launch.json``'s ``exec_helper``, a small static C program the agent builds:
   exec_helper.py) the supervisor starts it with ``posix_spawn`` and it does all that
   before its exec, with no Python in the kernel's process (:func:`_spawn_kernel`); without one the
   supervisor forks a Python child that does it (:func:`_exec_kernel`);
   A sandboxed kernel (``launch.json`` has a ``sandbox`` record, see sandbox.py) execs
   bubblewrap instead, with a fixed environment (:data:`PRIVILEGED_ENV`): the kernel's
   goes in a memfd to the sandbox's command prefix, which applies it once the kernel's
   user is in place (:func:`env_file`); bwrap reports the sandbox's pid (its init) through an info pipe,
   and for outbound networking waits on a block pipe until slirp4netns has set the
   network up.  The init and the command under it get a session and process group of
   their own (``--new-session``): a destroy signals that group (process_stop.py), not
   bwrap outside;
4. reports through STATUS_FD: an exec failure comes back through a close-on-exec
   pipe as ``{"ok": false, "error": ...}``; success writes ``state/proc.json``
   (both pids and their start times, the identity a restarted agent checks, and the
   sandbox's pid) and then ``{"ok": true, ...}``; a sandbox bwrap could not set up is a
   failed start carrying the end of the kernel log (bwrap's complaint);
5. waits for the kernel, kills what is left of its process group (and the sandbox's
   init, which ends its whole PID namespace, and stops the sandbox's slirp4netns), and
   writes ``state/exit.json`` (exit code, signal; bwrap's
   ``128 + N`` is read as signal N): the exit code is recorded even if no
   agent was running when the kernel ended.

Fork-server mode (``--fork-server CONTROL_FD``, :func:`serve`): one long-lived launcher
per agent whose interpreter is up once; for each kernel the agent sends the launch
file's path with the status pipe's write end attached (``SCM_RIGHTS``) over a
``SOCK_SEQPACKET`` socket, and the server forks a child that goes on like a spare given
its launch file (output to ``logs/launcher.log``) from step 2: that child is the
kernel's supervisor, already detached from the agent (the server is not the agent), so
it skips step 1's fork.  The server reaps its supervisors as they end; it exits when the
agent closes its end (or dies), and the supervisors still running are then re-parented
to init like those of step 1.  A launch record that names the exec helper gets no forked
child: the server ``posix_spawn``s the helper's ``supervise`` mode, a supervisor in C
that does steps 2-5 as :func:`supervise` does (:func:`spawn_supervisor`).  A fork is far cheaper than starting an interpreter per
create, and each fork less saves the copy of the interpreter's pages a forked Python
process makes as it runs.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import resource
import select
import signal
import socket
import sys
import time
import traceback
from typing import Any, NoReturn

REAP_INTERVAL_S = 0.5
"""Fork-server mode: the longest a finished job waits to be reaped."""


def _write_json_atomic(path: str, data: dict[str, Any]) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


def _start_ticks(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
            fields = f.read().rpartition(")")[2].split()
        return int(fields[19])
    except (OSError, ValueError, IndexError):
        return None


def _report(status_fd: int, data: dict[str, Any]) -> None:
    try:
        os.write(status_fd, json.dumps(data).encode() + b"\n")
        os.close(status_fd)
    except OSError:
        pass  # the agent is gone; proc.json / exit.json tell the next one


def enter_kernel_limits(cfg: dict[str, Any]) -> None:
    """Put the calling process under the kernel's limits of ``launch.json``.

    Writes its pid into every cgroup ``cgroup.procs`` in ``procs_files`` (so it joins
    the kernel's cgroups *before* it execs anything), applies ``rlimits`` and
    ``cpu_affinity``.  Shared with ``_terminal_exec.py``, which loads this file by path
    (both run under ``python -I -S``, where neither accelshare nor this directory is
    importable); keep this module free of side effects on import.
    """
    pid = str(os.getpid()).encode()
    for procs_file in cfg.get("procs_files", []):
        fd = os.open(procs_file, os.O_WRONLY)
        try:
            os.write(fd, pid)
        finally:
            os.close(fd)
    for name, soft, hard in cfg.get("rlimits", []):
        resource.setrlimit(getattr(resource, name), (soft, hard))
    if cfg.get("cpu_affinity"):
        os.sched_setaffinity(0, cfg["cpu_affinity"])


#: bwrap's option that gives the sandbox's init (and the command under it) a session and
#: process group of their own (see sandbox.py, ``SESSION_ARGS``).
_SESSION_OPTION = "--new-session"

#: The environment of every program that runs outside a sandbox or before the kernel's
#: user is in place inside it (bwrap, setpriv, nsenter, the exec helper's ``drop``),
#: with the agent's marks (:func:`privileged_env`): the kernel's environment is the
#: session's (a ``LD_PRELOAD`` in it would run the session's code in them, as root), so
#: it reaches only the program that applies it once the kernel's user is in place
#: (:data:`ENV_APPLIER`, the helper's ``drop`` and ``env`` modes), through a
#: descriptor (:func:`env_file`).
PRIVILEGED_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
#: The agent's marks on a kernel's processes (base.py: ``KERNEL_ID_ENV``,
#: ``RESOURCE_TXT_ENV``; ports.py: ``PUBLISHED_PORTS_ENV``), which the agent sets last
#: in the kernel's environment (no session chooses them) and finds its kernels' processes
#: by (procfs.py): bwrap and the sandbox's init carry them too (:func:`privileged_env`).
MARK_VARS = (
    "ACCELSHARE_KERNEL_ID",
    "BACKENDAI_KERNEL_ID",
    "ACCELSHARE_RESOURCE_TXT",
    "ACCELSHARE_PUBLISHED_PORTS",
)
#: In a sandbox record's ``command_prefix`` and ``env_program`` (sandbox.py): stands for
#: the descriptor of the kernel's environment (:func:`env_file`), filled in at exec.
ENV_FD_ARG = "{env_fd}"
#: ``python -I -S -c ENV_APPLIER FD -- PROGRAM ARG...``: the kernel's environment from
#: FD (``KEY=VALUE`` entries, each ended by a NUL byte), then PROGRAM with it, looked up
#: on its PATH; SIGPIPE and SIGXFSZ back to their default (Python ignores them, and an
#: ignored signal survives exec).  A failure is reported as the exec helper reports it
#: (exit code 127 when PROGRAM is not there, else 126).  Where no exec helper could be
#: built: after setpriv (sandbox.py), or nsenter (a terminal).
ENV_APPLIER = """\
import os, signal, sys
signal.signal(signal.SIGPIPE, signal.SIG_DFL)
signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
with open(int(sys.argv[1]), "rb") as f:
    env = dict(e.split(b"=", 1) for e in f.read().split(b"\\0")[:-1])
argv = sys.argv[3:]
try:
    os.execvpe(argv[0], argv, env)
except OSError as e:
    if isinstance(e.filename, bytes):  # (os.execvpe's PATH search names it so)
        e.filename = os.fsdecode(e.filename)
    sys.stderr.write(f"accelshare-exec: {type(e).__name__}: {e}\\n")
    sys.exit(127 if isinstance(e, FileNotFoundError) else 126)
"""


def privileged_env(env: dict[str, str]) -> dict[str, str]:
    """The environment of a kernel's privileged programs: :data:`PRIVILEGED_ENV` and the
    agent's :data:`MARK_VARS` of the kernel's environment ``env``, nothing else of it."""
    return {**PRIVILEGED_ENV, **{key: env[key] for key in MARK_VARS if key in env}}


def env_file(env: dict[str, str]) -> int:
    """A new descriptor (inheritable, not on disk: a memfd) holding ``env`` as
    ``KEY=VALUE`` entries each ended by a NUL byte, read from its start; ``ValueError``
    for a name or value ``os.execve`` would refuse."""
    return _memfd(b"".join(_env_entry(key, value) for key, value in env.items()))


def _memfd(data: bytes) -> int:
    """A new inheritable memfd holding ``data``, read from its start."""
    fd = os.memfd_create("accelshare-env")
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.lseek(fd, 0, os.SEEK_SET)
        os.set_inheritable(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def fill_env_fd(argv: list[str], env_fd: int) -> list[str]:
    """``argv`` with :data:`ENV_FD_ARG` replaced by ``env_fd``."""
    return [str(env_fd) if arg == ENV_FD_ARG else arg for arg in argv]


def sandbox_argv(
    cfg: dict[str, Any],
    info_fd: int,
    block_fd: int | None,
    env_fd: int,
    filter_fd: int | None = None,
) -> list[str]:
    """bwrap's command line for a sandboxed kernel (``cfg["sandbox"]``, see sandbox.py):
    its command prefix reads the kernel's environment from ``env_fd``
    (:func:`env_file`).  The syscall filter's file is opened here (inheritable) unless
    ``filter_fd`` is given (:func:`open_filter`)."""
    sandbox = cfg["sandbox"]
    argv = [sandbox["bwrap"], *sandbox["args"], "--info-fd", str(info_fd)]
    if block_fd is not None:
        argv += ["--block-fd", str(block_fd)]
    if filter_fd is None:
        filter_fd = open_filter(cfg)
    if filter_fd is not None:
        argv += ["--seccomp", str(filter_fd)]
    return [*argv, "--", *fill_env_fd(sandbox["command_prefix"], env_fd), *cfg["argv"]]


def open_filter(cfg: dict[str, Any]) -> int | None:
    """The sandbox's syscall filter file opened for bwrap (inheritable), if it has one."""
    path = (cfg.get("sandbox") or {}).get("seccomp")
    if not path:
        return None
    filter_fd = os.open(path, os.O_RDONLY)  # (inherited by bwrap only)
    os.set_inheritable(filter_fd, True)
    return filter_fd


def _exec_kernel(
    cfg: dict[str, Any], err_w: int, info_fd: int | None = None, block_fd: int | None = None
) -> NoReturn:
    try:
        os.setsid()
        enter_kernel_limits(cfg)
        stdin = os.open(os.devnull, os.O_RDONLY)
        log = os.open(cfg["log_file"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(stdin, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.chdir(cfg["cwd"])
        # An ignored disposition and a blocked signal survive exec: Python ignores
        # SIGPIPE/SIGXFSZ, the supervisor TERM/INT/HUP, and an agent started in the
        # background (nohup, a shell's `&`) inherits more.  The command starts with
        # every default, as bwrap passes them on to it.
        default_signals()
        argv, env = cfg["argv"], cfg["env"]
        if cfg.get("sandbox") and info_fd is not None:
            # bwrap (and setpriv after it) get a fixed environment; the kernel's is
            # read inside the sandbox once the kernel's user is in place
            argv = sandbox_argv(cfg, info_fd, block_fd, env_file(env))
            env = privileged_env(env)
        os.execvpe(argv[0], argv, env)
    except BaseException as e:  # report anything, then die without running atexit handlers
        try:
            os.write(err_w, f"{type(e).__name__}: {e}".encode(errors="replace"))
        finally:
            os._exit(127)


def _spawn_kernel(
    cfg: dict[str, Any], err_w: int, info_fd: int | None = None, block_fd: int | None = None
) -> int:
    """The kernel's process through the exec helper (``cfg["exec_helper"]``, see
    exec_helper.py): what :func:`_exec_kernel` does in a forked child, done by a small
    static program started with ``posix_spawn`` (no copy of this interpreter's pages),
    in a session of its own with every signal's default and none blocked.  The helper
    runs as the agent's user (root) before its exec: it gets an empty environment, and
    the environment it execs with comes through a pipe (a ``LD_PRELOAD`` of the
    kernel's never reaches it): the kernel's, or for a sandbox :func:`privileged_env`
    (bwrap's), the kernel's then read inside the sandbox from a descriptor kept for it
    (:func:`env_file`).  Returns the kernel's pid; a failure of the helper's comes back
    through ``err_w`` as from :func:`_exec_kernel`, one before the spawn is raised
    here."""
    helper = cfg["exec_helper"]
    keep = [fd for fd in (info_fd, block_fd) if fd is not None]
    argv, env = cfg["argv"], cfg["env"]
    filter_fd = kernel_env_fd = None
    env_r, env_w = os.pipe()
    try:
        if cfg.get("sandbox") and info_fd is not None:
            kernel_env_fd = env_file(env)
            keep.append(kernel_env_fd)
            env = privileged_env(env)
            filter_fd = open_filter(cfg)
            if filter_fd is not None:
                keep.append(filter_fd)
            argv = sandbox_argv(cfg, info_fd, block_fd, kernel_env_fd, filter_fd)
        environ = b"".join(_env_entry(key, value) for key, value in env.items())
        command = [helper, "enter", str(err_w), str(env_r), *_helper_options(cfg, keep)]
        command += ["--", *argv]
        for fd in (err_w, env_r, *keep):
            os.set_inheritable(fd, True)
        pid = os.posix_spawn(
            helper,
            command,
            {},
            setsid=True,
            setsigdef=signal.valid_signals() - {signal.SIGKILL, signal.SIGSTOP},
            setsigmask=(),
        )
        os.set_inheritable(err_w, False)
        os.close(env_r)
        env_r = -1
        with contextlib.suppress(OSError):  # a helper that died early says why on err_w
            view = memoryview(environ)
            while view:
                view = view[os.write(env_w, view) :]
    finally:
        for opened in (env_r, env_w, filter_fd, kernel_env_fd):
            if opened is not None and opened >= 0:
                os.close(opened)
    return pid


def _helper_options(cfg: dict[str, Any], keep: list[int]) -> list[str]:
    """The exec helper's options for the kernel's process (its ``enter`` mode's, also
    taken by ``supervise``): cgroups, rlimits, CPU affinity, the descriptors ``keep``
    passed on to the command, the log and the cwd."""
    options = []
    for procs_file in cfg.get("procs_files", []):
        options += ["--procs", procs_file]
    for name, soft, hard in cfg.get("rlimits", []):
        options += ["--rlimit", str(name), str(int(soft)), str(int(hard))]
    if cfg.get("cpu_affinity"):
        options += ["--cpus", ",".join(str(int(cpu)) for cpu in cfg["cpu_affinity"])]
    for fd in keep:
        options += ["--keep-fd", str(fd)]
    return [*options, "--log", cfg["log_file"], "--cwd", cfg["cwd"]]


def spawn_supervisor(cfg: dict[str, Any], launch_file: str, status_fd: int) -> int:
    """The kernel's supervisor in C (fork-server mode with an exec helper): the helper's
    ``supervise`` mode, started with ``posix_spawn`` in a session of its own, with every
    signal's default and none blocked, :data:`PRIVILEGED_ENV` as its environment, stdin
    from /dev/null and its output to the kernel's ``logs/launcher.log``.  It does what
    :func:`supervise` does (steps 3-5; the helper's source says exactly how), the
    kernel's process being a fork of its own that goes on as ``enter`` does.  The
    environment the kernel's process execs with (the kernel's, or bwrap's
    :func:`privileged_env`) comes in a memfd, so does the kernel's own for a sandbox
    (:func:`env_file`, read inside it).  Returns the supervisor's pid; raises (nothing
    started) when it cannot be started: the caller then fails the start."""
    helper = cfg["exec_helper"]
    argv, env = cfg["argv"], cfg["env"]
    sandbox = cfg.get("sandbox")
    opened: list[int] = []
    try:
        keep: list[int] = []
        command = [helper, "supervise", str(status_fd)]
        options = [
            "--launch",
            launch_file,
            "--proc-file",
            cfg["proc_file"],
            "--exit-file",
            cfg["exit_file"],
        ]
        if sandbox:
            kernel_env_fd = env_file(env)
            opened.append(kernel_env_fd)
            keep.append(kernel_env_fd)
            env = privileged_env(env)
            bwrap = [sandbox["bwrap"], *sandbox["args"]]
            filter_fd = open_filter(cfg)
            if filter_fd is not None:
                opened.append(filter_fd)
                keep.append(filter_fd)
                bwrap += ["--seccomp", str(filter_fd)]
            argv = [*bwrap, "--", *fill_env_fd(sandbox["command_prefix"], kernel_env_fd), *argv]
            options += ["--bwrap", str(len(bwrap))]
            if _SESSION_OPTION in sandbox["args"]:
                options.append("--session-group")
            if sandbox.get("network") == "outbound":
                options += ["--outbound", sandbox["slirp4netns"]]
        exec_env_fd = _memfd(b"".join(_env_entry(key, value) for key, value in env.items()))
        opened.append(exec_env_fd)
        command += [str(exec_env_fd), *options, *_helper_options(cfg, keep), "--", *argv]
        launcher_log = os.path.join(
            os.path.dirname(os.path.dirname(launch_file)), "logs", "launcher.log"
        )
        os.set_inheritable(status_fd, True)
        return os.posix_spawn(
            helper,
            command,
            PRIVILEGED_ENV,
            file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (
                    os.POSIX_SPAWN_OPEN,
                    1,
                    launcher_log,
                    os.O_WRONLY | os.O_CREAT | os.O_APPEND,
                    0o644,
                ),
                (os.POSIX_SPAWN_DUP2, 1, 2),
            ],
            setsid=True,
            setsigdef=signal.valid_signals() - {signal.SIGKILL, signal.SIGSTOP},
            setsigmask=(),
        )
    finally:
        for fd in opened:
            os.close(fd)


def _env_entry(key: str, value: str) -> bytes:
    """``KEY=VALUE`` and a NUL byte, refused as ``os.execve`` refuses it."""
    name, text = os.fsencode(key), os.fsencode(value)
    if not name or b"=" in name:
        raise ValueError("illegal environment variable name")
    if b"\0" in name or b"\0" in text:
        raise ValueError("embedded null byte")
    return name + b"=" + text + b"\0"


def default_signals() -> None:
    """Every signal's default disposition, and none blocked (in a child before exec)."""
    for signum in signal.valid_signals():
        if signum in (signal.SIGKILL, signal.SIGSTOP):
            continue
        with contextlib.suppress(OSError, ValueError):  # the kernel may reserve some
            signal.signal(signum, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, ())


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks)


def _read_sandbox_info(fd: int) -> int | None:
    """The sandbox's pid (its init, as the host sees it) from bwrap's ``--info-fd``;
    None when bwrap ended without creating it (its reason is in the kernel log)."""
    try:
        info = json.loads(_read_all(fd).decode(errors="replace") or "null")
    except ValueError:
        return None
    pid = info.get("child-pid") if isinstance(info, dict) else None
    return pid if isinstance(pid, int) and pid > 0 else None


def _log_tail(path: str, limit: int = 600) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - limit))
            return f.read().decode(errors="replace").strip()
    except OSError:
        return ""


#: ioctl on a namespace file: a descriptor of the user namespace that owns it.
NS_GET_USERNS = 0xB701


def _netns_owner(sandbox_pid: int) -> int:
    """A descriptor of the user namespace owning the sandbox's network namespace."""
    net_fd = os.open(f"/proc/{sandbox_pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        return fcntl.ioctl(net_fd, NS_GET_USERNS)
    except OSError as e:
        raise OSError(e.errno, f"the sandbox's user namespace: {e.strerror}") from e
    finally:
        os.close(net_fd)


def _start_network(cfg: dict[str, Any], sandbox_pid: int) -> tuple[int, int]:
    """Outbound networking for a sandbox: slirp4netns in the kernel's cgroups, attached
    to the sandbox's network namespace (it reaches other hosts, never the host's
    loopback).  An agent that is root owns the namespace: slirp4netns then runs in a
    sandbox of its own with its capabilities dropped (``--enable-sandbox``) and a
    syscall filter; otherwise it runs as the agent's user and enters the user namespace
    that owns the sandbox's network namespace first.  Returns ``(pid, exit_fd)``: closing ``exit_fd`` ends it.  Raises
    ``OSError`` when it does not report ready within 10 s."""
    sandbox = cfg["sandbox"]
    ready_r, ready_w = os.pipe()
    exit_r, exit_w = os.pipe()
    argv = [
        sandbox["slirp4netns"],
        "--configure",
        "--mtu=65520",
        "--disable-host-loopback",
        f"--ready-fd={ready_w}",
        f"--exit-fd={exit_r}",
    ]
    userns_fd = None
    if os.geteuid() == 0:
        argv += ["--enable-sandbox", "--enable-seccomp"]
    else:
        # the user namespace that owns the sandbox's network namespace, through a
        # descriptor (/proc/self/fd/N in slirp4netns), not /proc/PID/ns/user: with
        # --disable-userns bwrap's init moves on into a nested one while it sets the
        # sandbox up, in which the network namespace cannot be entered
        try:
            userns_fd = _netns_owner(sandbox_pid)
        except OSError:
            os.close(ready_r)
            os.close(ready_w)
            os.close(exit_r)
            os.close(exit_w)
            raise
        argv += [f"--userns-path=/proc/self/fd/{userns_fd}"]
    argv += [str(sandbox_pid), "tap0"]
    pid = os.fork()
    if pid == 0:
        try:
            os.close(ready_r)
            os.close(exit_w)
            os.set_inheritable(ready_w, True)
            os.set_inheritable(exit_r, True)
            if userns_fd is not None:
                os.set_inheritable(userns_fd, True)
            enter_kernel_limits(cfg)
            os.execv(argv[0], argv)
        finally:
            os._exit(127)
    os.close(ready_w)
    os.close(exit_r)
    if userns_fd is not None:
        os.close(userns_fd)
    try:
        ready = select.select([ready_r], [], [], 10.0)[0] and os.read(ready_r, 16)
    finally:
        os.close(ready_r)
    if not ready:
        os.close(exit_w)
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise OSError("slirp4netns did not set up the sandbox's network within 10 s")
    return pid, exit_w


def _fail_start(cfg: dict[str, Any], status_fd: int, error: str) -> int:
    _write_json_atomic(
        cfg["exit_file"],
        {"reason": "failed", "error": error, "exit_code": None, "finished_at": time.time()},
    )
    _report(status_fd, {"ok": False, "error": error})
    return 1


def supervise(cfg: dict[str, Any], status_fd: int) -> int:
    os.setsid()
    sandboxed = bool(cfg.get("sandbox"))
    outbound = sandboxed and cfg["sandbox"].get("network") == "outbound"
    err_r, err_w = os.pipe()  # both ends close-on-exec: EOF means the exec succeeded
    info_r, info_w = os.pipe() if sandboxed else (-1, -1)
    block_r, block_w = os.pipe() if outbound else (-1, -1)
    if cfg.get("exec_helper"):
        try:
            kernel_pid = _spawn_kernel(
                cfg, err_w, info_w if sandboxed else None, block_r if outbound else None
            )
        except Exception as e:  # nothing started
            for fd in (err_r, err_w, info_r, info_w, block_r, block_w):
                if fd >= 0:
                    os.close(fd)
            return _fail_start(cfg, status_fd, f"{type(e).__name__}: {e}")
    else:
        kernel_pid = os.fork()
        if kernel_pid == 0:
            os.close(err_r)
            if sandboxed:
                os.close(info_r)
                os.set_inheritable(info_w, True)
            if outbound:
                os.close(block_w)
                os.set_inheritable(block_r, True)
            _exec_kernel(cfg, err_w, info_w if sandboxed else None, block_r if outbound else None)
    os.close(err_w)
    for fd in (info_w, block_r):
        if fd >= 0:
            os.close(fd)
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)  # stay to record the exit code
    error = _read_all(err_r).decode(errors="replace")
    if error:
        os.waitpid(kernel_pid, 0)
        return _fail_start(cfg, status_fd, error)
    sandbox_pid = None
    network: tuple[int, int] | None = None
    if sandboxed:
        sandbox_pid = _read_sandbox_info(info_r)
        if sandbox_pid is None:
            _, status = os.waitpid(kernel_pid, 0)
            why = _log_tail(cfg["log_file"]) or f"exit code {os.waitstatus_to_exitcode(status)}"
            return _fail_start(cfg, status_fd, f"the sandbox could not be set up: {why}")
        if outbound:
            try:
                network = _start_network(cfg, sandbox_pid)
            except OSError as e:
                with contextlib.suppress(OSError):
                    os.killpg(kernel_pid, signal.SIGKILL)
                os.waitpid(kernel_pid, 0)
                return _fail_start(cfg, status_fd, f"the sandbox's network: {e}")
            os.write(block_w, b"1")  # the command may start now
            os.close(block_w)
    supervisor_pid = os.getpid()
    proc = {
        "supervisor_pid": supervisor_pid,
        "supervisor_start": _start_ticks(supervisor_pid),
        "kernel_pid": kernel_pid,
        "kernel_start": _start_ticks(kernel_pid),
        "started_at": time.time(),
    }
    sandbox_start = None
    if sandbox_pid is not None:
        sandbox_start = _start_ticks(sandbox_pid)
        proc["sandbox_pid"] = sandbox_pid
        proc["sandbox_start"] = sandbox_start
        if _SESSION_OPTION in cfg["sandbox"]["args"]:
            proc["sandbox_group"] = True  # the command's process group is the init's pid
    _write_json_atomic(cfg["proc_file"], proc)
    _report(status_fd, {"ok": True, "supervisor_pid": supervisor_pid, "kernel_pid": kernel_pid})
    _, status = os.waitpid(kernel_pid, 0)
    code = os.waitstatus_to_exitcode(status)
    killed_by = -code if code < 0 else None
    if sandboxed and killed_by is None and 128 < code <= 128 + 64:
        killed_by = code - 128  # bwrap exits 128 + N when a signal N killed the command
    with contextlib.suppress(OSError):  # the kernel has ended: so has what it left in its group
        os.killpg(kernel_pid, signal.SIGKILL)
    if sandbox_pid is not None and _start_ticks(sandbox_pid) == sandbox_start:
        # bwrap ends with the command, the sandbox's init (in a session of its own) may
        # still wait for what the command left: its end ends the whole PID namespace
        with contextlib.suppress(OSError):
            os.kill(sandbox_pid, signal.SIGKILL)
    if network is not None:
        os.close(network[1])  # slirp4netns ends with its exit fd
        with contextlib.suppress(ChildProcessError):
            os.waitpid(network[0], 0)
    _write_json_atomic(
        cfg["exit_file"],
        {
            "reason": "killed" if killed_by else "exited",
            "exit_code": 128 + killed_by if killed_by else code,
            "signal": killed_by,
            "finished_at": time.time(),
        },
    )
    return 0


def _wait_for_job() -> str | None:
    """Spare mode: the launch file from stdin; output and cwd moved to the kernel's dir."""
    line = sys.stdin.buffer.readline().decode().strip()
    if not line:
        return None
    _adopt_job(line)
    return line


def _adopt_job(line: str) -> None:
    """Output to the kernel's ``logs/launcher.log``, stdin from /dev/null, cwd its dir."""
    scratch_root = os.path.dirname(os.path.dirname(line))  # <root>/state/launch.json
    log = os.open(
        os.path.join(scratch_root, "logs", "launcher.log"),
        os.O_WRONLY | os.O_CREAT | os.O_APPEND,
        0o644,
    )
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.chdir(scratch_root)


def _read_launch(launch_file: str) -> dict[str, Any]:
    with open(launch_file, encoding="utf-8") as f:
        cfg: dict[str, Any] = json.load(f)
    return cfg


def _launch(launch_file: str, status_fd: int) -> int:
    """Steps 1-5 for one launch file: returns in the supervisor only."""
    cfg = _read_launch(launch_file)
    if os.fork() != 0:
        os._exit(0)  # detach: the supervisor is re-parented to init
    return supervise(cfg, status_fd)


def _reap_children() -> None:
    """Collect the supervisors (the forked jobs) that have exited: each exits once its
    kernel has ended and ``exit.json`` is written."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def serve(control_fd: int) -> int:
    """Fork-server mode: one job per message (the launch file's path, one fd attached:
    the status pipe's write end).  A message without exactly one fd is ignored (its
    fds closed); EOF ends the server.  Each job runs in a forked child, the kernel's
    supervisor (steps 2-5, no detaching fork: the server is not the agent), and never
    returns here; the server only forks, closes its copy of the fd and reaps the
    supervisors that have ended."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the agent decides when it ends (EOF)
    control = socket.socket(fileno=control_fd)
    control.settimeout(REAP_INTERVAL_S)  # wakes to reap: no job outlives it as a zombie
    while True:
        _reap_children()
        try:
            message, fds, _flags, _addr = socket.recv_fds(control, 4096, 4)
        except TimeoutError:
            continue
        if not message and not fds:
            return 0
        if len(fds) != 1 or not message:
            for fd in fds:
                os.close(fd)
            continue
        status_fd = fds[0]
        if _spawned(message, status_fd):
            os.close(status_fd)
            continue
        if os.fork() == 0:
            code = 1
            try:
                control.close()
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                os.set_inheritable(status_fd, False)
                _adopt_job(message.decode())
                code = supervise(_read_launch(message.decode()), status_fd)
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 1
            except BaseException:
                traceback.print_exc()  # into the kernel's launcher.log once adopted
            finally:
                os._exit(code)
        os.close(status_fd)


def _spawned(message: bytes, status_fd: int) -> bool:
    """Fork-server mode: a launch whose record names an exec helper gets the C
    supervisor (:func:`spawn_supervisor`); True when it is done with (started, or its
    failure recorded and reported), False for the forked Python supervisor (no helper,
    or a launch file the server cannot read: the fork reports that as it always has)."""
    try:
        launch_file = message.decode()
        cfg = _read_launch(launch_file)
    except Exception:
        return False
    if not isinstance(cfg, dict) or not cfg.get("exec_helper"):
        return False
    try:
        spawn_supervisor(cfg, launch_file, status_fd)
    except Exception as e:  # nothing started
        report_fd = os.dup(status_fd)  # (the caller closes status_fd)
        try:
            _fail_start(cfg, report_fd, f"{type(e).__name__}: {e}")
        except Exception:  # (the agent reads EOF: a failed start)
            traceback.print_exc()
            os.close(report_fd)
    return True


def main(argv: list[str]) -> int:
    if argv[1] == "--fork-server":
        return serve(int(argv[2]))
    launch_file, status_fd = argv[1], int(argv[2])
    os.set_inheritable(status_fd, False)  # the kernel must not hold the agent's pipe open
    if launch_file == "-":
        job = _wait_for_job()
        if job is None:
            return 0
        launch_file = job
    return _launch(launch_file, status_fd)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
