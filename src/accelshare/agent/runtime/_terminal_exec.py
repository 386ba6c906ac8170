"""Start a terminal shell inside a process kernel's limits.  Standard library only.

Run by :mod:`accelshare.agent.runtime.terminal` as
``python -I -S _terminal_exec.py <scratch>/<id>/state/launch.json SHELL`` with stdin,
stdout and stderr on the slave side of a fresh pty and in a new session
(``start_new_session``).  It makes the pty its controlling terminal, joins the kernel's
cgroups (the ``procs_files`` of ``launch.json``) *before* it execs the shell, applies
the kernel's rlimits and CPU affinity (all three through ``_launcher.py``'s
``enter_kernel_limits``, loaded by path: one implementation for kernels and
terminals), with a third argument (a pid in an ``isolate-namespaces`` kernel's
namespaces) enters the kernel's PID and mount namespaces and forks (the shell runs there,
this process waits and exits as it did), changes to the kernel's cwd and execs the shell
with the kernel's environment (so the plugins' tools, such as the mock ``nvidia-smi``
in ``config/bin``, are on PATH) and ``TERM=xterm-256color``.  Any failure is written
to stderr (the terminal) and the exit code is 127.
"""

from __future__ import annotations

import ctypes
import fcntl
import importlib.util
import json
import os
import signal
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


def enter_namespaces(pid: int) -> None:
    """Join the PID and mount namespaces of ``pid`` (``setns(2)`` through libc: Python
    3.11 has no ``os.setns``).  The PID namespace applies to children only: the caller
    must fork.  Both files are opened before either is entered (the mount namespace
    brings its own ``/proc``)."""
    libc = ctypes.CDLL(None, use_errno=True)
    fds = [os.open(f"/proc/{pid}/ns/{kind}", os.O_RDONLY) for kind in ("pid", "mnt")]
    try:
        for fd, kind in zip(fds, ("pid", "mnt"), strict=True):
            if libc.setns(fd, 0) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"setns({kind} of {pid}): {os.strerror(err)}")
    finally:
        for fd in fds:
            os.close(fd)


def relay_exit(child: int) -> int:
    """Wait for the shell forked into the namespaces and exit as it did.  The pty stays
    the shell's: this process closes its side, ignores the terminal's job-control keys
    (it is in the foreground group) and dies with the group on SIGHUP."""
    for fd in (0, 1, 2):
        os.close(fd)
    for signum in (signal.SIGINT, signal.SIGQUIT, signal.SIGTSTP):
        signal.signal(signum, signal.SIG_IGN)
    _, status = os.waitpid(child, 0)
    return os.waitstatus_to_exitcode(status) & 0xFF


def main(argv: list[str]) -> int:
    launch_file, shell = argv[1], argv[2]
    namespace_pid = int(argv[3]) if len(argv) > 3 else None
    try:
        with open(launch_file, encoding="utf-8") as f:
            cfg = json.load(f)
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)
        load_launcher().enter_kernel_limits(cfg)
        if namespace_pid is not None:
            enter_namespaces(namespace_pid)
            child = os.fork()  # the child is in the kernel's PID namespace
            if child:
                return relay_exit(child)
        os.chdir(cfg["cwd"])
        for signum in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT, signal.SIGQUIT):
            signal.signal(signum, signal.SIG_DFL)
        env = dict(cfg["env"])
        env["TERM"] = "xterm-256color"
        env["SHELL"] = shell
        os.execve(shell, [shell], env)
    except BaseException as e:
        os.write(2, f"accelshare: cannot start the terminal: {type(e).__name__}: {e}\r\n".encode())
        return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv))
