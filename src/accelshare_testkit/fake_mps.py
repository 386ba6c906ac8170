"""A fake ``nvidia-cuda-mps-control`` for tests on machines without NVIDIA's driver.

:func:`install_fake_mps_control` writes it as an executable script (standard library
only, run by this interpreter).  It behaves as the real program does where the agent
relies on it, and records every call:

    -d                  forks a daemon that writes <pipe>/nvidia-cuda-mps-control.pid and
                        <log>/control.log, then waits for ``quit``; exits 0 once the pid
                        file is there.  With <log>/fake-refuse-start present it prints
                        that file's text and exits 1 instead.
    (no argument)       reads commands from stdin.  No running daemon: prints "Cannot
                        find MPS control daemon process" and exits 1 (as the real one).
                        get_server_list    prints <log>/fake-servers (if present)
                        get_client_list N  prints <log>/fake-clients-N (if present)
                        quit               ends the daemon and waits until it has gone

Each call appends one JSON line to ``<log>/fake-calls.jsonl``: ``{"argv": [...],
"commands": [...], "env": {the CUDA_* variables it saw}}``; :func:`read_calls` reads
them.  ``<pipe>`` and ``<log>`` are ``$CUDA_MPS_PIPE_DIRECTORY`` and
``$CUDA_MPS_LOG_DIRECTORY``, as for the real daemon.
"""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path
from typing import Any

__all__ = ["CALLS_FILE", "FAKE_SOURCE", "install_fake_mps_control", "read_calls"]

CALLS_FILE = "fake-calls.jsonl"

FAKE_SOURCE = r"""
import json, os, sys, time

PIPE = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
LOG = os.environ.get("CUDA_MPS_LOG_DIRECTORY", "/var/log/nvidia-mps")
PID_FILE = os.path.join(PIPE, "nvidia-cuda-mps-control.pid")
QUIT_FILE = os.path.join(PIPE, "fake-quit")


def record(commands):
    seen = {k: v for k, v in os.environ.items() if k.startswith("CUDA_")}
    with open(os.path.join(LOG, "fake-calls.jsonl"), "a") as f:
        f.write(json.dumps({"argv": sys.argv[1:], "commands": commands, "env": seen}) + "\n")


def log(text):
    with open(os.path.join(LOG, "control.log"), "a") as f:
        f.write(f"[fake] {text}\n")


def daemon_pid():
    try:
        pid = int(open(PID_FILE).read().strip())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return None
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[-1].split()[0]
    except OSError:
        return pid
    return None if state == "Z" else pid


def read(name):
    try:
        return open(os.path.join(LOG, name)).read().strip()
    except OSError:
        return ""


def start():
    refusal = os.path.join(LOG, "fake-refuse-start")
    if os.path.exists(refusal):
        print(open(refusal).read().strip())
        sys.exit(1)
    if daemon_pid() is not None:
        print("An instance of this daemon is already running")
        sys.exit(1)
    if os.path.exists(QUIT_FILE):
        os.unlink(QUIT_FILE)
    if os.fork() == 0:
        os.setsid()
        if os.fork() != 0:
            os._exit(0)
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        with open(PID_FILE, "w") as f:
            f.write(f"{os.getpid()}\n")
        log("Starting control daemon")
        while not os.path.exists(QUIT_FILE):
            time.sleep(0.02)
        os.unlink(QUIT_FILE)
        os.unlink(PID_FILE)
        log("Exit with status 0")
        os._exit(0)
    deadline = time.monotonic() + 5
    while daemon_pid() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    sys.exit(0 if daemon_pid() is not None else 1)


def commands(lines):
    if daemon_pid() is None:
        print("Cannot find MPS control daemon process")
        sys.exit(1)
    for line in lines:
        words = line.split()
        if not words:
            continue
        if words[0] == "get_server_list":
            print(read("fake-servers"))
        elif words[0] == "get_client_list" and len(words) > 1:
            print(read(f"fake-clients-{words[1]}"))
        elif words[0] == "quit":
            pid = daemon_pid()
            open(QUIT_FILE, "w").close()
            deadline = time.monotonic() + 5
            while pid is not None and daemon_pid() == pid and time.monotonic() < deadline:
                time.sleep(0.01)


if sys.argv[1:] == ["-d"]:
    record([])
    start()
elif not sys.argv[1:]:
    lines = sys.stdin.read().splitlines()
    record(lines)
    commands(lines)
else:
    record([])
    print("usage: nvidia-cuda-mps-control [-d]")
    sys.exit(2)
"""


def install_fake_mps_control(folder: Path, name: str = "nvidia-cuda-mps-control") -> Path:
    """Write the fake as ``folder/name`` (executable, run by this interpreter)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(f"#!{sys.executable}\n{FAKE_SOURCE}")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def read_calls(log_dir: Path) -> list[dict[str, Any]]:
    """The calls the fake recorded in ``log_dir``, oldest first."""
    try:
        text = (log_dir / CALLS_FILE).read_text()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines() if line.strip()]
