"""Start a terminal shell inside a process kernel's limits.  Standard library only.

Run by :mod:`accelshare.agent.runtime.terminal` as
``python -I -S _terminal_exec.py <scratch>/<id>/state/launch.json SHELL`` with stdin,
stdout and stderr on the slave side of a fresh pty and in a new session
(``start_new_session``).  It makes the pty its controlling terminal, joins the kernel's
cgroups (the ``procs_files`` of ``launch.json``) *before* it execs the shell, applies
the kernel's rlimits and CPU affinity, changes to the kernel's cwd and execs the shell
with the kernel's environment (so the plugins' tools, such as the mock ``nvidia-smi``
in ``config/bin``, are on PATH) and ``TERM=xterm-256color``.  Any failure is written
to stderr (the terminal) and the exit code is 127.
"""

from __future__ import annotations

import fcntl
import json
import os
import resource
import signal
import sys
import termios


def main(argv: list[str]) -> int:
    launch_file, shell = argv[1], argv[2]
    try:
        with open(launch_file, encoding="utf-8") as f:
            cfg = json.load(f)
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)
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
