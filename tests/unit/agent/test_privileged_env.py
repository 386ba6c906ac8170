"""What of a kernel's environment its privileged programs (bwrap, setpriv, nsenter, the
exec helper's ``drop``) get: a fixed PATH and the agent's marks, nothing of the session's
(test_sandbox_environ.py runs real sandboxes)."""

from __future__ import annotations

import os
import subprocess
import sys

from accelshare.agent.ports import PUBLISHED_PORTS_ENV
from accelshare.agent.runtime._launcher import (
    ENV_APPLIER,
    MARK_VARS,
    PRIVILEGED_ENV,
    env_file,
    privileged_env,
)
from accelshare.agent.runtime.base import KERNEL_ID_ENV, RESOURCE_TXT_ENV


def test_only_the_agents_marks_and_a_fixed_path_are_kept() -> None:
    assert {KERNEL_ID_ENV, RESOURCE_TXT_ENV, PUBLISHED_PORTS_ENV} <= set(MARK_VARS)
    kernel_env = {
        "PATH": "/home/evil/bin:/usr/bin",
        "LD_PRELOAD": "/data/evil.so",
        "LD_LIBRARY_PATH": "/data",
        "GCONV_PATH": "/data",
        KERNEL_ID_ENV: "k-1",
        RESOURCE_TXT_ENV: "/scratch/k-1/config/resource.txt",
    }
    assert privileged_env(kernel_env) == {
        **PRIVILEGED_ENV,
        KERNEL_ID_ENV: "k-1",
        RESOURCE_TXT_ENV: "/scratch/k-1/config/resource.txt",
    }


def test_the_python_applier_gives_the_command_exactly_the_environment_read() -> None:
    """``ENV_APPLIER`` (where no exec helper is built): the command gets the environment
    of the descriptor (not the applier's own), is looked up on its PATH, starts with
    SIGPIPE at its default, and a missing one exits 127 naming it."""
    fd = env_file({"PATH": "/usr/bin:/bin", "FOO": "bar baz", "EMPTY": ""})
    try:
        script = 'echo "$FOO|$EMPTY|$PATH|${OWN-unset}"; grep SigIgn /proc/self/status'
        done = subprocess.run(
            [sys.executable, "-I", "-S", "-c", ENV_APPLIER, str(fd), "--", "sh", "-c", script],
            env={"OWN": "applier's own", "PATH": "/nowhere"},
            pass_fds=(fd,),
            capture_output=True,
            text=True,
            check=False,
        )
    finally:
        os.close(fd)
    assert (done.returncode, done.stderr) == (0, "")
    first, ignored = done.stdout.splitlines()
    assert first == "bar baz||/usr/bin:/bin|unset"
    assert int(ignored.split()[1], 16) & ((1 << 12) | (1 << 24)) == 0  # SIGPIPE, SIGXFSZ
    fd = env_file({"PATH": "/bin"})
    try:
        done = subprocess.run(
            [sys.executable, "-I", "-S", "-c", ENV_APPLIER, str(fd), "--", "nosuchcmd"],
            pass_fds=(fd,),
            capture_output=True,
            text=True,
            check=False,
        )
    finally:
        os.close(fd)
    assert done.returncode == 127
    assert done.stderr == (
        "accelshare-exec: FileNotFoundError: [Errno 2] No such file or directory:"
        " '/bin/nosuchcmd'\n"
    )
