"""The kernel supervisor and the terminal script share one "enter the kernel's limits".

Both ``_launcher.py`` and ``_terminal_exec.py`` run as stand-alone scripts under
``python -I -S``; the terminal script loads the launcher's ``enter_kernel_limits`` by
path.  These tests run the real scripts that way.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import accelshare.agent.runtime as runtime_pkg

RUNTIME_DIR = Path(runtime_pkg.__file__).parent
TERMINAL_EXEC = RUNTIME_DIR / "_terminal_exec.py"


def _launch_cfg(tmp_path: Path, procs: Path) -> dict[str, object]:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return {
        "procs_files": [str(procs)],
        "rlimits": [["RLIMIT_NOFILE", 77, 77 if hard == resource.RLIM_INFINITY else min(77, hard)]],
        "cpu_affinity": sorted(os.sched_getaffinity(0))[:1],
        "cwd": str(tmp_path),
        "env": {"PATH": "/usr/bin:/bin"},
    }


def test_the_terminal_script_has_no_copy_of_the_limits_code() -> None:
    source = TERMINAL_EXEC.read_text(encoding="utf-8")
    assert "setrlimit" not in source
    assert "sched_setaffinity" not in source
    assert "enter_kernel_limits" in source


def test_the_terminal_script_under_isolated_python_enters_the_limits(tmp_path: Path) -> None:
    procs = tmp_path / "cgroup.procs"  # a plain file stands in for the cgroup's
    procs.write_text("")
    cfg = _launch_cfg(tmp_path, procs)
    launch = tmp_path / "launch.json"
    launch.write_text(json.dumps(cfg))
    shell = tmp_path / "shell.sh"
    shell.write_text(
        "#!/bin/sh\n"
        'echo "PID=$$ NOFILE=$(ulimit -n) CWD=$(pwd) TERM=$TERM"\n'
        "grep Cpus_allowed_list /proc/self/status\n"
    )
    shell.chmod(0o755)
    master, slave = os.openpty()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", str(TERMINAL_EXEC), str(launch), str(shell)],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            start_new_session=True,
            cwd="/",
        )
        os.close(slave)
        assert proc.wait(timeout=30) == 0
        out = b""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: the slave side is closed and drained
                break
            if not chunk:
                break
            out += chunk
    finally:
        os.close(master)
    text = out.decode(errors="replace")
    assert "cannot start the terminal" not in text, text
    assert "NOFILE=77" in text, text
    assert f"CWD={tmp_path}" in text, text
    assert "TERM=xterm-256color" in text, text
    pid = text.split("PID=", 1)[1].split()[0]
    assert procs.read_text() == pid  # it wrote its own pid (the shell's: exec keeps it)
    cpu = cfg["cpu_affinity"][0]  # type: ignore[index]
    assert f"Cpus_allowed_list:\t{cpu}" in text, text
