"""Start a terminal shell inside a process kernel's limits.  Standard library only.

Run by :mod:`accelshare.agent.runtime.terminal` as
``python -I -S _terminal_exec.py <scratch>/<id>/state/launch.json SHELL`` with stdin,
stdout and stderr on the slave side of a fresh pty and in a new session
(``start_new_session``).  It makes the pty its controlling terminal, joins the kernel's
cgroups (the ``procs_files`` of ``launch.json``) *before* it execs the shell, applies
the kernel's rlimits and CPU affinity (all three through ``_launcher.py``'s
``enter_kernel_limits``, loaded by path: one implementation for kernels and
terminals), changes to the kernel's cwd and execs the shell
with the kernel's environment (so the plugins' tools, such as the mock ``nvidia-smi``
in ``config/bin``, are on PATH) and ``TERM=xterm-256color``.  Any failure is written
to stderr (the terminal) and the exit code is 127.
"""

from __future__ import annotations

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


def main(argv: list[str]) -> int:
    launch_file, shell = argv[1], argv[2]
    try:
        with open(launch_file, encoding="utf-8") as f:
            cfg = json.load(f)
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)
        load_launcher().enter_kernel_limits(cfg)
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
