"""A process runtime run by an agent that is not root: started by
test_sandbox_unprivileged.py as a dedicated unprivileged user, it sandboxes kernels
(bubblewrap in a user namespace mapping only that user) and prints what they saw, one
JSON object on stdout; the last kernel serves an app port that the agent relays, and
what it answers through the relay is reported too.

``python unprivileged_agent.py SETTINGS`` where SETTINGS (JSON) holds ``scratch_root``,
``exec_helper`` (a path or null: the Python way), ``preload`` (a library for
``LD_PRELOAD``, in ``ro_path``), ``ro_path`` and ``secret`` (a file of the agent's that no
kernel may see).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from accelshare.agent.runtime import (
    KernelInfo,
    KernelSpec,
    KernelStartFailed,
    ProcessRuntime,
    ProcessRuntimeConfig,
)
from accelshare.agent.runtime.sandbox import SandboxConfig
from accelshare.agent.runtime.sandbox import probe as probe_sandbox
from accelshare_testkit.kernel_exec import run_in_kernel

RESOURCE_TXT = "SLOTS={}\nCPU_SHARES=0:1\n"

#: What the first kernel reports about itself, one ``key=value`` a line.
INSPECT = r"""
echo "uid=$(id -u) gid=$(id -g)"
for ns in pid net mnt user ipc uts; do echo "ns_$ns=$(readlink /proc/self/ns/$ns)"; done
if ! command -v unshare >/dev/null; then echo userns=no-unshare
elif unshare -U true 2>/dev/null; then echo userns=allowed
else echo userns=refused
fi
if echo written > "$HOME/probe.txt" && [ "$(cat "$HOME/probe.txt")" = written ]; then
    echo work=writable
else
    echo work=not-writable
fi
if [ -e "$SECRET" ]; then echo secret=visible; else echo secret=hidden; fi
echo "agent_dir=$(ls -A "$AGENT_DIR" 2>/dev/null | tr '\n' ' ')"
echo "scratch=$(ls -A "$SCRATCH_ROOT" 2>/dev/null | tr '\n' ' ')"
echo "ifaces=$(tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | sort | tr '\n' ',')"
echo "marker=$MARKER"
echo "preload=$LD_PRELOAD"
grep -E '^Cap(Inh|Prm|Eff|Amb):' /proc/self/status
exit 7
"""

#: The kernel that runs until destroyed: its PID namespace, then it waits.
RUN = 'echo "ns_pid=$(readlink /proc/self/ns/pid)"; echo ready; exec sleep 600'

#: What a command of the execute API reports: its user, PID namespace, the session's
#: variable and its capabilities.
EXEC = (
    'echo "uid=$(id -u) ns_pid=$(readlink /proc/self/ns/pid) marker=$MARKER"; '
    "grep -E '^Cap(Inh|Prm|Eff|Amb):' /proc/self/status"
)


#: The port an app listens on inside its sandbox (the relay's target).
APP_PORT = 8080

#: A kernel's app: answers each connection with its uid and network namespace.
APP = r"""
import os, socket
server = socket.create_server(("127.0.0.1", int(os.environ["APP_PORT"])))
print("listening", flush=True)
while True:
    conn, _ = server.accept()
    with conn:
        conn.sendall(f"pong {os.getuid()} {os.readlink('/proc/self/ns/net')}".encode())
"""


def spec(
    kernel_id: str,
    command: str,
    env: dict[str, str],
    published_ports: tuple[tuple[int, int], ...] = (),
) -> KernelSpec:
    return KernelSpec(
        kernel_id=kernel_id,
        image="shell",
        resource_txt=RESOURCE_TXT,
        command=(command,),
        env=env,
        published_ports=published_ports,
    )


async def read_all(runtime: ProcessRuntime, kernel_id: str, argv: list[str]) -> dict[str, Any]:
    result = await run_in_kernel(runtime, kernel_id, argv)
    return {"code": result.code, "output": result.output}


async def terminal_output(runtime: ProcessRuntime, kernel_id: str) -> str:
    terminal = await runtime.open_terminal(kernel_id, cols=120, rows=40)
    screen = b""
    try:
        await terminal.write(b'echo "<$((6*7))>$(id -u):$(readlink /proc/self/ns/pid)"\r')
        async with asyncio.timeout(15):
            while b"<42>" not in screen or not screen.rstrip().endswith(b"$"):
                chunk = await terminal.read()
                if not chunk:
                    break
                screen += chunk
    finally:
        await terminal.close()
    return screen.decode(errors="replace")


async def main(settings: dict[str, Any]) -> dict[str, Any]:
    helper = Path(settings["exec_helper"]) if settings["exec_helper"] else None
    sandbox = SandboxConfig(
        ro_paths=(Path(settings["ro_path"]),),
        exec_helper=helper,
        network=settings.get("network", "none"),
    )
    report: dict[str, Any] = {
        "uid": os.geteuid(),
        "gid": os.getegid(),
        "ns": {ns: os.readlink(f"/proc/self/ns/{ns}") for ns in ("pid", "net", "mnt", "user")},
        "effective_ids": list(sandbox.effective_ids()),
    }
    why = probe_sandbox(sandbox)
    report["probe"] = why
    if why is not None:
        return report
    scratch_root = Path(settings["scratch_root"])
    runtime = ProcessRuntime(
        ProcessRuntimeConfig(
            scratch_root=scratch_root,
            sandbox=sandbox,
            exec_helper=helper,
            fork_server=helper is not None,
            stop_grace_s=2.0,
            cgroup_parent="accelshare-test",
        )
    )
    report["kernel_exec"] = runtime.kernel_exec
    try:
        # 1. a kernel that runs until destroyed (an exec and a terminal in it) ...
        running = f"unpriv-{uuid.uuid4().hex[:8]}"
        env = {"MARKER": "from-the-session", "LD_PRELOAD": settings["preload"]}
        await runtime.create_kernel(
            spec(running, RUN, {**env, "PRELOAD_MARKS": str(marks_file(scratch_root, running))})
        )
        log_file = scratch_root / running / "logs" / "kernel.log"
        async with asyncio.timeout(15):
            while "ready" not in (log_file.read_text() if log_file.exists() else ""):
                await asyncio.sleep(0.02)
        # 2. ... while one reports what it sees and exits by itself
        first = f"unpriv-{uuid.uuid4().hex[:8]}"
        inspect_env = {
            **env,
            "PRELOAD_MARKS": str(marks_file(scratch_root, first)),
            "SECRET": settings["secret"],
            "AGENT_DIR": str(Path(settings["secret"]).parent),
            "SCRATCH_ROOT": str(scratch_root),
        }
        await runtime.create_kernel(spec(first, INSPECT, inspect_env))
        info = await runtime.wait_exit(first, timeout_s=15)
        report["inspect"] = {
            "kernel_id": first,
            "log": await runtime.get_logs(first),
            **ended(info, scratch_root),
        }
        report["running"] = {
            "kernel_id": running,
            "log": await runtime.get_logs(running),
            "proc": json.loads((scratch_root / running / "state" / "proc.json").read_text()),
        }
        report["exec"] = await read_all(runtime, running, ["sh", "-c", EXEC])
        report["terminal"] = await terminal_output(runtime, running)
        info = await runtime.destroy_kernel(running)
        report["destroyed"] = ended(info, scratch_root)
        proc = report["running"]["proc"]
        # (the sandbox's init may still be exiting: given up to 5 s)
        left = [proc["kernel_pid"], proc["sandbox_pid"]]
        deadline = time.monotonic() + 5
        while (left := [pid for pid in left if alive(pid)]) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        report["destroyed"]["alive"] = left
        # 3. a kernel that declares an app port: the agent relays it into the sandbox
        report["app"] = await app_reply(runtime, scratch_root)
    finally:
        # every kernel ended and removed, also after a failure (nothing outlives the test)
        for kernel in await runtime.scan_kernels():
            with contextlib.suppress(Exception):
                await runtime.destroy_kernel(kernel.kernel_id, grace_s=0)
            with contextlib.suppress(Exception):
                await runtime.cleanup_kernel(kernel.kernel_id)
        await runtime.close()
    return report


async def app_reply(runtime: ProcessRuntime, scratch_root: Path) -> dict[str, Any]:
    """What an app inside a kernel answers through the agent's relay of its port (or
    why the kernel could not start)."""
    with socket.socket() as probe:  # a host port that is free now
        probe.bind(("127.0.0.1", 0))
        host_port = int(probe.getsockname()[1])
    kernel_id = f"unpriv-{uuid.uuid4().hex[:8]}"
    env = {"APP_PORT": str(APP_PORT), "APP": APP, "PY": sys.executable}
    try:
        await runtime.create_kernel(
            spec(kernel_id, 'exec "$PY" -I -c "$APP"', env, ((APP_PORT, host_port),))
        )
    except KernelStartFailed as e:
        return {"error": str(e)}
    log_file = scratch_root / kernel_id / "logs" / "kernel.log"
    async with asyncio.timeout(15):
        while "listening" not in (log_file.read_text() if log_file.exists() else ""):
            await asyncio.sleep(0.02)
        reader, writer = await asyncio.open_connection("127.0.0.1", host_port)
        reply = await reader.read()
        writer.close()
    await runtime.destroy_kernel(kernel_id, grace_s=0)
    return {"reply": reply.decode(errors="replace"), "log": log_file.read_text()}


def marks_file(scratch_root: Path, kernel_id: str) -> Path:
    """Where the preloaded library records the processes that load it (the kernel's
    work folder: the same path on the host and in the sandbox)."""
    return scratch_root / kernel_id / "work" / "marks.txt"


def ended(info: KernelInfo, scratch_root: Path) -> dict[str, Any]:
    """How a kernel ended: its exit as the runtime reports it and as exit.json records
    it, and the preloaded library's marks."""
    exit_json = scratch_root / info.kernel_id / "state" / "exit.json"
    marks = marks_file(scratch_root, info.kernel_id)
    return {
        "exit": None
        if info.exit is None
        else {"reason": str(info.exit.reason), "code": info.exit.exit_code},
        "exit_json": json.loads(exit_json.read_text()) if exit_json.exists() else None,
        "marks": marks.read_text() if marks.exists() else "",
    }


def alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (not a zombie)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(json.loads(sys.argv[1])))))
