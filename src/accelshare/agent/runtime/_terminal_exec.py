"""Start a terminal shell, or a command, inside a process kernel's limits.  Standard
library only.

Run by :mod:`accelshare.agent.runtime.terminal` as
``python -I -S _terminal_exec.py <scratch>/<id>/state/launch.json SHELL`` with stdin,
stdout and stderr on the slave side of a fresh pty and in a new session
(``start_new_session``).  It makes the pty its controlling terminal, joins the kernel's
cgroups (the ``procs_files`` of ``launch.json``) *before* it execs the shell, applies
the kernel's rlimits and CPU affinity (all three through ``_launcher.py``'s
``enter_kernel_limits``, loaded by path: one implementation for kernels and
terminals).  For a sandboxed kernel (a third argument: the sandbox's pid, see
sandbox.py) it sets no-new-privileges, loads the sandbox's syscall filter and execs
``nsenter`` into all the sandbox's
namespaces, its root and working folder, as the kernel's user, which execs the shell;
otherwise it execs the shell in the kernel's cwd.  Either way the shell gets the
kernel's environment (so the plugins' tools, such as the mock ``nvidia-smi`` in
``config/bin``, are on PATH) and ``TERM=xterm-256color``; nsenter itself (root, or the
agent's user, outside the sandbox) gets a fixed one, and the kernel's comes through a
descriptor to the sandbox record's ``env_program``, which applies it inside as the
kernel's user.  Any failure is written to stderr (the terminal) and the exit code is
127.

``_terminal_exec.py LAUNCH --run NSPID|- ARGV...`` (:mod:`.execs`, the execute API)
starts ``ARGV`` the same way (``-``: the kernel has no sandbox) on the pipes it was
given instead of a pty: no controlling terminal, no ``TERM``.
"""

from __future__ import annotations

import ctypes
import fcntl
import importlib.util
import json
import os
import sys
import termios
from types import ModuleType

#: The process runtime's supervisor script, next to this one: its
#: ``enter_kernel_limits`` is the one implementation of "join the kernel's cgroups,
#: apply its rlimits and CPU affinity" (this script runs under ``python -I -S``, so
#: it is loaded by path, not imported).
LAUNCHER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_launcher.py")


def load_launcher() -> ModuleType:
    """``_launcher.py`` as a module (its ``main`` only runs as ``__main__``)."""
    spec = importlib.util.spec_from_file_location("_accelshare_launcher", LAUNCHER)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {LAUNCHER}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_RAISE = 2
CLONE_NEWUSER = 0x10000000
NS_GET_USERNS = 0xB701  # ioctl on a namespace file: its owning user namespace (a new fd)
CAP_SYS_CHROOT = 18
CAP_SYS_ADMIN = 21
#: What nsenter needs in the user namespace owning the sandbox's namespaces: entering
#: them (setns) and its root (``--root``: chroot).
NSENTER_CAPS = (CAP_SYS_ADMIN, CAP_SYS_CHROOT)
_LINUX_CAPABILITY_VERSION_3 = 0x20080522


class _SockFprog(ctypes.Structure):
    _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.c_char_p))


def load_syscall_filter(libc: ctypes.CDLL, path: str) -> None:
    """Put this process (and what it execs: nsenter, then the shell) under the sandbox's
    compiled seccomp filter (raw BPF, 8 bytes per instruction, written by the agent), as
    bwrap does for the kernel's own processes.  Needs no-new-privileges set first."""
    with open(path, "rb") as f:
        program = f.read()
    if not program or len(program) % 8:
        raise ValueError(f"{path}: not a BPF program ({len(program)} bytes)")
    fprog = _SockFprog(len(program) // 8, program)
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP)")


class _CapHeader(ctypes.Structure):
    _fields_ = (("version", ctypes.c_uint32), ("pid", ctypes.c_int))


class _CapData(ctypes.Structure):
    _fields_ = (
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    )


def enter_owner_userns(libc: ctypes.CDLL, pid: int) -> bool:
    """Before nsenter, for a sandbox of an agent that is not root: bwrap's
    ``--disable-userns`` runs the kernel in a user namespace nested in the one that owns
    the sandbox's other namespaces (mount, PID, network ...), and capabilities in the
    nested one give no right to enter those: nsenter ``--user`` alone fails
    ("reassociate to namespace 'ns/cgroup' failed").  So this process enters the owning
    user namespace first (its creator, the agent's user, holds every capability there),
    and keeps only :data:`NSENTER_CAPS` across the exec of nsenter (ambient), which then
    enters the other namespaces (its first pass, without ``--user``) and the kernel's
    own user namespace last: entering it clears the ambient set, and what nsenter
    execs there runs as the agent's uid (not 0 inside) with no capability left.

    False (nothing done) when the kernel's user namespace is the owner itself."""
    user_fd = os.open(f"/proc/{pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    mnt_fd = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    try:
        owner_fd = fcntl.ioctl(mnt_fd, NS_GET_USERNS)
        try:
            if os.fstat(owner_fd).st_ino == os.fstat(user_fd).st_ino:
                return False
            if libc.setns(owner_fd, CLONE_NEWUSER) != 0:
                raise OSError(ctypes.get_errno(), "setns(the sandbox's owning user namespace)")
        finally:
            os.close(owner_fd)
    finally:
        os.close(user_fd)
        os.close(mnt_fd)
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    if libc.capget(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capget")
    for cap in NSENTER_CAPS:  # (all below 32: the first word)
        data[0].inheritable |= 1 << cap
    if libc.capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capset")
    for cap in NSENTER_CAPS:
        if libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, cap, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), f"prctl(PR_CAP_AMBIENT_RAISE, {cap})")
    return True


def nsenter_argv(
    sandbox: dict[str, object], pid: int, cwd: str, env_program: list[str], command: list[str]
) -> list[str]:
    """``nsenter`` into a sandboxed kernel (sandbox.py): all its namespaces, its root and
    the working folder, as the kernel's user (root agent: ``--setuid``; otherwise the
    sandbox's user namespace maps the agent's own uid, kept as it is), running
    ``env_program`` (which applies the kernel's environment: nsenter itself runs with
    the launcher's ``privileged_env``), which runs ``command`` in ``cwd``."""
    argv = [
        "/usr/bin/nsenter" if os.path.exists("/usr/bin/nsenter") else "nsenter",
        f"--target={pid}",
        "--mount",
        "--uts",
        "--ipc",
        "--net",
        "--pid",
        "--cgroup",
        # the target's root and working folder (an explicit --wd=PATH would be opened in
        # the host's namespace, leaving the shell's cwd outside the sandbox's root)
        "--root",
        "--wd",
    ]
    if sandbox.get("userns"):
        argv += ["--user", "--preserve-credentials"]
    else:
        argv += [f"--setuid={sandbox['uid']}", f"--setgid={sandbox['gid']}"]
    return [*argv, "--", *env_program, "/usr/bin/env", f"--chdir={cwd}", *command]


def main(argv: list[str]) -> int:
    launch_file = argv[1]
    run = argv[2] == "--run"
    if run:  # LAUNCH --run NSPID|- ARGV...
        namespace_pid = None if argv[3] == "-" else int(argv[3])
        command = argv[4:]
    else:  # LAUNCH SHELL [NSPID]
        namespace_pid = int(argv[3]) if len(argv) > 3 else None
        command = [argv[2]]
    try:
        if not command:
            raise ValueError("no command to run")
        with open(launch_file, encoding="utf-8") as f:
            cfg = json.load(f)
        if not run:
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)
        launcher = load_launcher()
        launcher.enter_kernel_limits(cfg)
        launcher.default_signals()  # as a kernel's command starts: nothing ignored or blocked
        env = dict(cfg["env"])
        if not run:
            env["TERM"] = "xterm-256color"
            env["SHELL"] = command[0]
        sandbox = cfg.get("sandbox")
        if sandbox and namespace_pid is not None:
            # The shell in the kernel's sandbox, as its user, never gaining privileges
            # (no set-uid program inside can raise them).
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
                raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
            if sandbox.get("seccomp"):
                load_syscall_filter(libc, sandbox["seccomp"])
            # nsenter runs as root (or the agent's user) outside the sandbox: the
            # kernel's environment (the session's) reaches only the program that
            # applies it as the kernel's user, inside (sandbox.py, _env_program)
            env_program = sandbox.get("env_program") or [
                *(sys.executable, "-I", "-S", "-c", launcher.ENV_APPLIER),
                *(launcher.ENV_FD_ARG, "--"),
            ]
            if sandbox.get("userns"):
                enter_owner_userns(libc, namespace_pid)
            env_fd = launcher.env_file(env)
            env_program = launcher.fill_env_fd(env_program, env_fd)
            argv = nsenter_argv(sandbox, namespace_pid, cfg["cwd"], env_program, command)
            os.execvpe(argv[0], argv, launcher.privileged_env(env))
        if namespace_pid is not None:
            raise ValueError("a sandbox pid was given for a kernel without a sandbox")
        os.chdir(cfg["cwd"])
        if run:  # a command name is looked up on the kernel's PATH
            os.execvpe(command[0], command, env)
        os.execve(command[0], command, env)
    except BaseException as e:
        what, end = ("the command", "\n") if run else ("the terminal", "\r\n")
        os.write(2, f"accelshare: cannot start {what}: {type(e).__name__}: {e}{end}".encode())
        return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv))
