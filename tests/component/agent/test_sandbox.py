"""The process runtime's bubblewrap sandbox, attacked the way a hostile session would.

Every test runs real kernels (no mocks) and tries to get out: become root, read the
agent's or another session's files, reach the host's loopback services, signal other
kernels, walk out of a web terminal.  Each skips with the ``sandbox_support`` reason
where this host cannot sandbox (no bwrap, no namespaces).  The last few check
:func:`sandbox_record`'s command line directly (no sandbox needed).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ipaddress
import itertools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, Literal

import httpx
import pytest

from accelshare.agent.runtime import (
    ExitReason,
    KernelInfo,
    KernelSpec,
    KernelStartFailed,
    KernelState,
    ProcessRuntime,
    ProcessRuntimeConfig,
    RuntimeUnavailable,
)
from accelshare.agent.runtime.sandbox import (
    SandboxConfig,
    interpreter_paths,
    probe,
    sandbox_record,
    write_syscall_filter,
)
from accelshare.agent.runtime.terminal import ProcessTerminal

RuntimeFactory = Callable[..., ProcessRuntime]
SandboxedFactory = Callable[..., ProcessRuntime]
Eventually = Callable[..., Awaitable[Any]]

#: Every sandbox test runs both ways: kernels started and changed to their user by the
#: exec helper, and by a forked Python process and setpriv (conftest.py).
BOTH_KERNEL_EXECS = True

RESOURCE_TXT = "SLOTS={}\nCPU_SHARES=0:1\n"
#: What a kernel's user is (the configured one when the agent is root, else the agent's).
KERNEL_UID, KERNEL_GID = SandboxConfig().effective_ids()


def spec(command: tuple[str, ...] | None, image: str = "shell", **kwargs: Any) -> KernelSpec:
    return KernelSpec(
        kernel_id=f"sbx-{uuid.uuid4().hex[:10]}",
        image=image,
        resource_txt=RESOURCE_TXT,
        command=command,
        **kwargs,
    )


def fields(log: str) -> dict[str, str]:
    """``key=value`` lines of a kernel's output (the last one of each key wins)."""
    found: dict[str, str] = {}
    for line in log.splitlines():
        key, sep, value = line.partition("=")
        if sep and re.fullmatch(r"[A-Za-z0-9_]+", key):
            found[key] = value.strip()
    return found


def entries(value: str) -> set[str]:
    """A ``ls -A | tr '\\n' ,`` listing as a set."""
    return {e for e in value.split(",") if e}


def mount_options(mountinfo: str) -> dict[str, set[str]]:
    """Mount point -> its per-mount options, from ``/proc/self/mountinfo`` lines (the
    last mount on a point wins: it is the one a path resolves to)."""
    found: dict[str, set[str]] = {}
    for line in mountinfo.splitlines():
        parts = line.split()
        if len(parts) > 6 and parts[0].isdigit() and " - " in line:
            found[parts[4].replace("\\040", " ")] = set(parts[5].split(","))
    return found


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def host_address() -> str | None:
    """One of this host's own non-loopback IPv4 addresses (not in slirp's 10.0.2.0/24)."""
    if shutil.which("ip") is None:
        return None
    try:
        out = subprocess.run(
            ["ip", "-4", "-o", "addr", "show", "scope", "global"],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    slirp_net = ipaddress.ip_network("10.0.2.0/24")
    for found in re.findall(r"inet (\d+\.\d+\.\d+\.\d+)/", out):
        if ipaddress.ip_address(found) not in slirp_net:
            return str(found)
    return None


async def port_open(host: str, port: int) -> bool:
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 2)
    except (OSError, TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


@pytest.fixture
async def sandboxed(
    make_runtime: RuntimeFactory, sandbox_support: str | None, kernel_exec: Path | None
) -> AsyncIterator[SandboxedFactory]:
    """``sandboxed(SandboxConfig(...), **runtime_overrides)``: a sandboxing runtime on the
    test's scratch root; skips where this host cannot sandbox.  Its kernels start and
    change user with ``kernel_exec`` (the exec helper; None: Python and setpriv).  Every
    runtime made is closed at the end (its port relays stop) before ``make_runtime``
    destroys kernels."""
    if sandbox_support is not None:
        pytest.skip(sandbox_support)
    made: list[ProcessRuntime] = []

    def factory(config: SandboxConfig | None = None, **overrides: Any) -> ProcessRuntime:
        config = dataclasses.replace(config or SandboxConfig(), exec_helper=kernel_exec)
        runtime = make_runtime(sandbox=config, **overrides)
        made.append(runtime)
        return runtime

    yield factory
    for runtime in made:
        await runtime.close()


async def run_to_exit(
    runtime: ProcessRuntime, kernel: KernelSpec, timeout_s: float = 15
) -> tuple[KernelInfo, str]:
    await runtime.create_kernel(kernel)
    info = await runtime.wait_exit(kernel.kernel_id, timeout_s=timeout_s)
    return info, await runtime.get_logs(kernel.kernel_id)


async def start_and_wait(
    runtime: ProcessRuntime, kernel: KernelSpec, eventually: Eventually, marker: str = "ready"
) -> KernelInfo:
    """Create a long-running kernel and wait for ``marker`` in its log."""
    info = await runtime.create_kernel(kernel)
    log_file = runtime.scratch_root / kernel.kernel_id / "logs" / "kernel.log"
    await eventually(lambda: marker in log_file.read_text(), what=f"{marker!r} in {log_file}")
    return info


# -- 1. identity --------------------------------------------------------------------------

IDENTITY_SCRIPT = r"""
echo uid=$(id -u)
echo gid=$(id -g)
echo groups=$(id -G | tr ' ' ,)
grep -E '^(CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs):' /proc/self/status | tr -d '\t' | tr : =
echo agent_secret_env=${SECRET_OF_THE_AGENT:-none}
if command -v sudo >/dev/null 2>&1; then
  sudo -n sh -c 'echo ESCALATED-$(id -u)' </dev/null 2>/dev/null; echo sudo=$?
else
  echo sudo=absent
fi
su -c 'echo ESCALATED-$(id -u)' root </dev/null 2>/dev/null; echo su=$?
setpriv --reuid=0 --regid=0 --clear-groups sh -c 'echo ESCALATED-$(id -u)' 2>/dev/null
echo setpriv=$?
test -e "$SHARED/root-only.txt" && echo secret_visible=yes || echo secret_visible=no
cat "$SHARED/root-only.txt" 2>/dev/null; echo cat_secret=$?
echo public=$(cat "$SHARED/public.txt")
# As a root agent there is no user namespace around the kernel: a nested one may well be
# allowed.  Being "root" in it must not open a host root's 0600 file.
unshare -Ur sh -c 'echo userns_uid=$(id -u); cat "$SHARED/root-only.txt"' 2>/dev/null
echo unshare=$?
"""


async def test_the_kernel_is_an_unprivileged_user_that_cannot_escalate(
    sandboxed: SandboxedFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SECRET_OF_THE_AGENT", "agent-env-secret")
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o755)
    (shared / "public.txt").write_text("public-content\n")
    (shared / "public.txt").chmod(0o644)
    secret = shared / "root-only.txt"
    secret.write_text("TOPSECRET-ROOT-ONLY\n")
    secret.chmod(0o600)
    runtime = sandboxed(SandboxConfig(ro_paths=(shared,)))
    info, log = await run_to_exit(runtime, spec((IDENTITY_SCRIPT,), env={"SHARED": str(shared)}))
    assert info.exit is not None, log
    assert info.exit.reason is ExitReason.EXITED, log
    found = fields(log)
    assert KERNEL_UID != 0
    assert (found["uid"], found["gid"]) == (str(KERNEL_UID), str(KERNEL_GID)), log
    if os.geteuid() == 0:  # (a user namespace shows unmapped groups as nobody)
        assert found["groups"] == str(KERNEL_GID), log  # no supplementary ones (root's, disk)
    for caps in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(found[caps], 16) == 0, f"{caps}={found[caps]}\n{log}"
    assert found["NoNewPrivs"] == "1", log
    assert found["agent_secret_env"] == "none", log
    assert "ESCALATED" not in log, log
    for tool in ("sudo", "su", "setpriv"):
        assert found[tool] != "0", log
    assert found["public"] == "public-content", log  # the ro_path is there ...
    assert found["secret_visible"] == "yes", log  # ... with the root-only file in it
    assert "TOPSECRET" not in log, log
    if os.geteuid() == 0:  # (otherwise the file is the kernel user's own)
        assert found["cat_secret"] != "0", log


@pytest.mark.parametrize("network", ["none", "outbound"])
async def test_no_descriptor_of_the_agent_leaks_into_the_kernel(
    sandboxed: SandboxedFactory, network: Literal["none", "outbound"]
) -> None:
    """The launcher's pipes (status, bwrap's info and block fds) stay outside: an
    inherited host fd (a folder above all) would be a way out of the mount namespace."""
    config = SandboxConfig(network=network)
    if (why := probe(config)) is not None:
        pytest.skip(why)
    runtime = sandboxed(config)
    # ls is the shell's child: the listing is the shell's own fds (no $(...) pipe open)
    _, log = await run_to_exit(runtime, spec(("ls -l /proc/$$/fd",)))
    fds = {int(fd): target for fd, target in re.findall(r" (\d+) -> (.*)$", log, re.M)}
    assert set(fds) == {0, 1, 2}, log
    assert fds[0] == "/dev/null", log


# -- 2. files -----------------------------------------------------------------------------

FILES_SCRIPT = r"""
test -e "$SECRET" && echo secret=seen || echo secret=unseen
cat "$SECRET" 2>/dev/null
test -e "$DATA_DIR" && echo data_dir=seen || echo data_dir=unseen
echo run_entries=$(ls -A /run | tr '\n' ,)
test -e /var && echo var=seen || echo var=unseen
echo tmp_entries=$(ls -A "$TMP_PATH" 2>/dev/null | tr '\n' ,)
echo root_entries=$(ls -A "$SCRATCH_ROOT" | tr '\n' ,)
test -e "$OTHER/work/b-file.txt" && echo other_file=seen || echo other_file=unseen
test -e "$OTHER/config/resource.txt" && echo other_config=seen || echo other_config=unseen
test -e "$OTHER" && echo other_dir=seen || echo other_dir=unseen
echo own_entries=$(ls -A "$OWN" | tr '\n' ,)
test -e "$OWN/state/launch.json" && echo own_state=seen || echo own_state=unseen
echo hello > "$HOME/mine.txt" && echo work=writable || echo work=readonly
echo home=$HOME cwd=$(pwd)
echo resource=$(head -c 5 "$ACCELSHARE_RESOURCE_TXT")
touch "$OWN/config/new" 2>/dev/null && echo config=writable || echo config=readonly
touch /usr/new 2>/dev/null && echo usr=writable || echo usr=readonly
echo readme=$(cat "$RO/readme.txt")
echo more >> "$RO/open.txt" 2>/dev/null && echo ro_file=writable || echo ro_file=readonly
touch "$RO/new" 2>/dev/null && echo ro_dir=writable || echo ro_dir=readonly
echo hidden_dir=$(ls -A "$RO/private" 2>/dev/null | tr '\n' ,)
echo hidden_file=$(cat "$RO/token.txt" 2>/dev/null)
cat /proc/self/mountinfo
"""


async def test_the_kernel_sees_only_its_own_folders(
    sandboxed: SandboxedFactory, tmp_path: Path, scratch_root: Path, eventually: Eventually
) -> None:
    # The manager's data dir next to the scratch root: world-readable, but not bound.
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    secret = data_dir / "admin-credentials.env"
    secret.write_text("ADMIN_KEY=hunter2-admin\n")
    secret.chmod(0o644)
    # A shared read-only folder that the file modes alone would leave writable.
    ro = tmp_path / "datasets"
    (ro / "private").mkdir(parents=True)
    (ro / "private" / "key.pem").write_text("PRIVATE-KEY\n")
    (ro / "token.txt").write_text("HIDDEN-TOKEN\n")
    (ro / "readme.txt").write_text("readme-content\n")
    (ro / "open.txt").write_text("open\n")
    for path, mode in ((ro, 0o777), (ro / "open.txt", 0o666), (ro / "token.txt", 0o644)):
        path.chmod(mode)
    config = SandboxConfig(ro_paths=(ro,), hidden=(ro / "private", ro / "token.txt"))
    runtime = sandboxed(config)
    other = spec(('echo b > "$HOME/b-file.txt"; echo ready; exec sleep 3600',))
    await start_and_wait(runtime, other, eventually)
    root = runtime.scratch_root
    assert (root / other.kernel_id / "work" / "b-file.txt").is_file()
    kernel = spec((FILES_SCRIPT,))
    own = root / kernel.kernel_id
    env = {
        "SECRET": str(secret),
        "DATA_DIR": str(data_dir),
        "TMP_PATH": str(tmp_path),
        "SCRATCH_ROOT": str(root),
        "OTHER": str(root / other.kernel_id),
        "OWN": str(own),
        "RO": str(ro),
    }
    info, log = await run_to_exit(runtime, KernelSpec(**{**_fields(kernel), "env": env}))
    assert info.exit is not None, log
    assert info.exit.exit_code == 0, log
    found = fields(log)
    # the agent's / manager's files next to the scratch root
    assert (found["secret"], found["data_dir"]) == ("unseen", "unseen"), log
    assert "hunter2" not in log
    assert entries(found["tmp_entries"]) <= {"scratch", "datasets"}, log
    # the host's sockets (/run/docker.sock, /var/run/...): a private /run, no /var
    assert (found["run_entries"], found["var"]) == ("", "unseen"), log
    # the other kernel: not there at all, not even its name
    assert entries(found["root_entries"]) <= {kernel.kernel_id, ".node"}, log
    assert kernel.kernel_id in entries(found["root_entries"]), log
    assert (found["other_file"], found["other_config"], found["other_dir"]) == ("unseen",) * 3
    # its own: work/ (writable, HOME, cwd) and config/ (read-only); not state/ or logs/
    assert entries(found["own_entries"]) == {"config", "work"}, log
    assert found["own_state"] == "unseen", log
    assert found["work"] == "writable", log
    assert f"home={own / 'work'} cwd={(own / 'work').resolve()}" in log, log
    assert found["resource"] == "SLOTS", log
    written = own / "work" / "mine.txt"
    assert written.read_text() == "hello\n"
    assert (written.stat().st_uid, written.stat().st_gid) == (KERNEL_UID, KERNEL_GID)
    assert (found["config"], found["usr"]) == ("readonly", "readonly"), log
    # the ro_path: readable, not writable even where the modes say so; hidden is empty
    assert found["readme"] == "readme-content", log
    assert (found["ro_file"], found["ro_dir"]) == ("readonly", "readonly"), log
    assert (ro / "open.txt").read_text() == "open\n"
    assert (found["hidden_dir"], found["hidden_file"]) == ("", ""), log
    assert "PRIVATE-KEY" not in log
    assert "HIDDEN-TOKEN" not in log
    # and the mount table agrees: read-only binds, a writable work dir
    mounts = mount_options(log)
    for path in (own / "config", Path("/usr"), ro):
        assert "ro" in mounts.get(str(path), set()), f"{path}: {mounts.get(str(path))}"
    assert "rw" in mounts.get(str(own / "work"), set()), mounts.get(str(own / "work"))


def _fields(kernel: KernelSpec) -> dict[str, Any]:
    return {name: getattr(kernel, name) for name in KernelSpec.__slots__}


OVERLAP_SCRIPT = r"""
echo root_entries=$(ls -A "$SCRATCH_ROOT" | tr '\n' ,)
echo own_entries=$(ls -A "$OWN" | tr '\n' ,)
test -e "$OTHER" && echo other_dir=seen || echo other_dir=unseen
cat "$OTHER/state/launch.json" "$OTHER/work/b-file.txt" 2>/dev/null
echo dataset=$(cat "$DATASET")
echo hello > "$HOME/mine.txt" && echo work=writable || echo work=readonly
"""


async def test_a_ro_path_above_the_scratch_root_shows_no_other_kernel(
    sandboxed: SandboxedFactory, tmp_path: Path, eventually: Eventually
) -> None:
    """``sandbox-ro-paths = ["/data"]`` with the scratch root in ``/data/scratch``: the
    folder is there read-only, but the scratch root inside it holds only this kernel's
    own folders (not the others' work, launch.json with their environment, logs)."""
    tmp_path.chmod(0o755)  # (pytest makes it 0700: the kernel's user could not enter)
    (tmp_path / "datasets").mkdir()
    (tmp_path / "datasets" / "set.csv").write_text("a,b\n")
    runtime = sandboxed(SandboxConfig(ro_paths=(tmp_path,)))
    root = runtime.scratch_root
    assert root.is_relative_to(tmp_path)
    other = spec(('echo SECRET-B > "$HOME/b-file.txt"; echo ready; exec sleep 3600',))
    await start_and_wait(runtime, other, eventually)
    kernel = spec((OVERLAP_SCRIPT,))
    env = {
        "SCRATCH_ROOT": str(root),
        "OWN": str(root / kernel.kernel_id),
        "OTHER": str(root / other.kernel_id),
        "DATASET": str(tmp_path / "datasets" / "set.csv"),
    }
    info, log = await run_to_exit(runtime, KernelSpec(**{**_fields(kernel), "env": env}))
    assert info.exit is not None, log
    assert info.exit.exit_code == 0, log
    found = fields(log)
    assert found["dataset"] == "a,b", log  # the ro_path itself is there
    assert entries(found["root_entries"]) <= {kernel.kernel_id, ".node"}, log
    assert entries(found["own_entries"]) == {"config", "work"}, log
    assert found["other_dir"] == "unseen", log
    assert other.kernel_id not in log, log
    assert "SECRET-B" not in log, log
    assert found["work"] == "writable", log


# -- 3. network ---------------------------------------------------------------------------

CONNECT_SCRIPT = r"""
import socket, sys
for target in sys.argv[1:]:
    name, host, port = target.split(":")
    try:
        if host == "abstract":  # an abstract unix socket (X11, D-Bus, containerd ...)
            s = socket.socket(socket.AF_UNIX)
            s.settimeout(2)
            s.connect("\0" + port)
        else:
            s = socket.create_connection((host, int(port)), timeout=2)
        with s:
            print(f"{name}=reached:{s.recv(100).decode().strip()}", flush=True)
    except OSError as e:
        print(f"{name}=failed:{type(e).__name__}", flush=True)
"""


class HostServers:
    """TCP servers on the host that greet whoever connects."""

    def __init__(self) -> None:
        self.servers: list[asyncio.Server] = []

    @staticmethod
    async def _greet(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"hello-from-host\n")
        with contextlib.suppress(OSError):
            await writer.drain()
        writer.close()

    async def start(self, host: str) -> int:
        server = await asyncio.start_server(self._greet, host, 0)
        self.servers.append(server)
        return int(server.sockets[0].getsockname()[1])

    async def start_abstract(self) -> str:
        """An abstract unix socket (no file: only the network namespace scopes it)."""
        name = f"accelshare-test-{uuid.uuid4().hex[:8]}"
        server = await asyncio.start_unix_server(self._greet, "\0" + name)
        self.servers.append(server)
        return name

    async def close(self) -> None:
        for server in self.servers:
            server.close()
            await server.wait_closed()


@pytest.fixture
async def host_servers() -> AsyncIterator[HostServers]:
    servers = HostServers()
    yield servers
    await servers.close()


async def test_without_network_the_kernel_reaches_nothing_of_the_host(
    sandboxed: SandboxedFactory, host_servers: HostServers
) -> None:
    loopback = await host_servers.start("127.0.0.1")
    abstract = await host_servers.start_abstract()
    targets = [f"loopback:127.0.0.1:{loopback}", f"unix:abstract:{abstract}"]
    address = host_address()
    if address is not None:
        targets.append(f"host:{address}:{await host_servers.start(address)}")
    assert await port_open("127.0.0.1", loopback)  # it does answer on the host
    runtime = sandboxed()
    info, log = await run_to_exit(runtime, spec(("-c", CONNECT_SCRIPT, *targets), image="python"))
    assert info.exit is not None, log
    assert info.exit.exit_code == 0, log
    found = fields(log)
    assert found["loopback"] == "failed:ConnectionRefusedError", log  # its own, empty loopback
    assert found["unix"] == "failed:ConnectionRefusedError", log  # abstract names: per netns
    if address is not None:
        assert found["host"].startswith("failed:"), log  # no route at all
    assert "hello-from-host" not in log


async def test_outbound_network_reaches_other_hosts_but_not_the_hosts_loopback(
    sandboxed: SandboxedFactory, host_servers: HostServers
) -> None:
    config = SandboxConfig(network="outbound")
    why = probe(config)
    if why is not None:
        pytest.skip(why)
    address = host_address()
    if address is None:
        pytest.skip("this host has no non-loopback IPv4 address to reach")
    loopback = await host_servers.start("127.0.0.1")
    outside = await host_servers.start(address)
    abstract = await host_servers.start_abstract()
    targets = [
        f"outside:{address}:{outside}",
        f"unix:abstract:{abstract}",
        f"loopback:127.0.0.1:{loopback}",
        f"slirp_host:10.0.2.2:{loopback}",  # slirp's alias of the host's loopback
    ]
    runtime = sandboxed(config)
    info, log = await run_to_exit(runtime, spec(("-c", CONNECT_SCRIPT, *targets), image="python"))
    assert info.exit is not None, log
    assert info.exit.exit_code == 0, log
    found = fields(log)
    assert found["outside"] == "reached:hello-from-host", log
    assert found["loopback"].startswith("failed:"), log
    assert found["slirp_host"].startswith("failed:"), log
    assert found["unix"].startswith("failed:"), log
    assert log.count("hello-from-host") == 1, log


# -- 4. processes -------------------------------------------------------------------------

SIGNAL_SCRIPT = r"""
for p in $VICTIMS; do
  kill -0 $p 2>/dev/null && echo probe_$p=alive || echo probe_$p=unseen
  kill -KILL $p 2>/dev/null && echo kill_$p=sent || echo kill_$p=refused
done
test -e /proc/$AGENT_PID && echo agent=seen || echo agent=unseen
echo procs=$(ls /proc | grep '^[0-9]' | tr '\n' ,)
"""


async def test_a_kernel_cannot_see_or_signal_another(
    sandboxed: SandboxedFactory, eventually: Eventually
) -> None:
    runtime = sandboxed()
    victim = spec(("echo ready; exec sleep 3600",))
    victim_info = await start_and_wait(runtime, victim, eventually)
    proc = json_file(runtime.scratch_root / victim.kernel_id / "state" / "proc.json")
    assert victim_info.cid == str(proc["kernel_pid"])
    sandbox_pid = int(proc["sandbox_pid"])
    children = Path(f"/proc/{sandbox_pid}/task/{sandbox_pid}/children").read_text().split()
    victims = [int(proc["kernel_pid"]), sandbox_pid, *map(int, children)]
    assert len(victims) == 3, victims  # bwrap outside, its init, the command (sleep)
    env = {"VICTIMS": " ".join(map(str, victims)), "AGENT_PID": str(os.getpid())}
    info, log = await run_to_exit(runtime, spec((SIGNAL_SCRIPT,), env=env))
    assert info.exit is not None, log
    assert info.exit.exit_code == 0, log
    found = fields(log)
    for pid in victims:
        assert (found[f"probe_{pid}"], found[f"kill_{pid}"]) == ("unseen", "refused"), log
    assert found["agent"] == "unseen", log
    own = sorted(int(p) for p in entries(found["procs"]))
    assert own, log
    assert max(own) < 20, log  # low pids: its own namespace ...
    assert len(own) <= 8, log  # ... with init, sh and its helpers only
    after = await runtime.get_kernel(victim.kernel_id)
    assert after.state is KernelState.RUNNING  # the SIGKILLs never arrived


def json_file(path: Path) -> dict[str, Any]:
    data = json.loads(path.read_text())
    assert isinstance(data, dict)
    return data


# -- 5. terminal --------------------------------------------------------------------------


class Shell:
    """Commands through a terminal; each one's output between two markers (written so
    that the pty's echo of the command line never contains them)."""

    def __init__(self, terminal: ProcessTerminal) -> None:
        self.terminal = terminal
        self.buffer = b""
        self.count = 0

    async def run(self, command: str, timeout_s: float = 10) -> str:
        self.count += 1
        begin, end = f"<<b{self.count}>>", f"<<e{self.count}>>"
        await self.terminal.write(
            f"echo '<<b'{self.count}'>>'; {command}; echo '<<e'{self.count}'>>'\r".encode()
        )
        async with asyncio.timeout(timeout_s):
            while end.encode() not in self.buffer:
                chunk = await self.terminal.read()
                if not chunk:
                    raise AssertionError(f"the terminal closed: {self.buffer!r}")
                self.buffer += chunk
        text = self.buffer.decode(errors="replace").replace("\r\n", "\n")
        self.buffer = b""
        return text.split(begin + "\n", 1)[-1].split(end, 1)[0].strip()


def listing(output: str) -> set[str]:
    return {line.strip() for line in output.splitlines() if line.strip()}


async def test_a_terminal_stays_inside_the_kernels_sandbox(
    sandboxed: SandboxedFactory, eventually: Eventually
) -> None:
    runtime = sandboxed()
    other = spec(("echo ready; exec sleep 3600",))
    await start_and_wait(runtime, other, eventually)
    kernel = spec(("echo ready; exec sleep 3579",))
    await start_and_wait(runtime, kernel, eventually)
    root = runtime.scratch_root
    own = root / kernel.kernel_id
    terminal = await runtime.open_terminal(kernel.kernel_id, cols=200, rows=50)
    shell = Shell(terminal)
    try:
        assert await shell.run("id -u; id -g") == f"{KERNEL_UID}\n{KERNEL_GID}"
        assert int(await shell.run("echo $$")) < 20  # the kernel's PID namespace
        commands = await shell.run(
            "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done"
        )
        assert "sleep 3579" in commands, commands  # sees its kernel's command ...
        assert "sleep 3600" not in commands, commands  # ... not the other kernel's
        caps = await shell.run("grep -E '^(CapEff|NoNewPrivs)' /proc/self/status | tr -d '\\t'")
        assert "CapEff:0000000000000000" in caps, caps
        assert "NoNewPrivs:1" in caps, caps
        assert await shell.run("pwd") == str((own / "work").resolve())
        assert listing(await shell.run("cd ..; ls -A1")) == {"config", "work"}
        assert listing(await shell.run("cd ..; ls -A1")) <= {kernel.kernel_id, ".node"}
        # the same through /proc/self/cwd (an nsenter that set the cwd before the root
        # would leave it outside the sandbox's root, reachable this way)
        await shell.run('cd "$HOME"')
        through_cwd = listing(await shell.run("ls -A1 /proc/self/cwd/../.."))
        assert through_cwd <= {kernel.kernel_id, ".node"}, through_cwd
        assert await shell.run(f"test -e /proc/self/cwd/../../../{other.kernel_id}; echo $?") == "1"
        assert await shell.run(f"test -e {root / other.kernel_id}; echo $?") == "1"
        # the file system root: the system folders, the private ones and the tops of
        # what is bound (the interpreter, the scratch dir); not /home, /var, /opt ...
        interpreter = interpreter_paths(sys.executable)
        tops = {p.parts[1] for p in (*interpreter, root) if len(p.parts) > 1}
        system = {"usr", "etc", "bin", "sbin", "lib", "lib32", "lib64", "libx32"}
        in_slash = listing(await shell.run("cd /; ls -A1"))
        assert in_slash <= system | {"sys", "proc", "dev", "tmp", "run"} | tops, in_slash
        # the host's /root: only the folders bound for the interpreter, nothing else
        in_root = listing(await shell.run("ls -A1 /root 2>/dev/null"))
        bound = {
            p.relative_to("/root").parts[0]
            for p in interpreter
            if p.is_relative_to("/root") and p != Path("/root")
        }
        assert in_root <= bound, (in_root, bound)
        # the sandbox's init belongs to root: its root folder is not a way out either
        assert await shell.run(f"ls /proc/1/root{root} >/dev/null 2>&1; echo $?") != "0"
    finally:
        await terminal.close()


# -- 6. signals and exit codes ------------------------------------------------------------


async def test_destroy_reaches_the_command_gracefully(
    sandboxed: SandboxedFactory, eventually: Eventually
) -> None:
    runtime = sandboxed()
    kernel = spec(("trap 'exit 7' TERM; echo ready; while :; do sleep 0.05; done",))
    await start_and_wait(runtime, kernel, eventually)
    info = await runtime.destroy_kernel(kernel.kernel_id, grace_s=5)
    assert info.exit is not None
    assert (info.exit.reason, info.exit.exit_code, info.exit.signal) == (
        ExitReason.DESTROYED,
        7,
        None,
    )


async def test_the_command_starts_with_no_signal_ignored_or_blocked(
    sandboxed: SandboxedFactory,
) -> None:
    """bwrap outside keeps the default dispositions (a destroy signals the sandbox's own
    process group, not bwrap's), so the command inherits nothing ignored either."""
    runtime = sandboxed()
    script = "grep -E '^(SigIgn|SigBlk):' /proc/$$/status | tr -d '\\t' | tr : ="
    info, log = await run_to_exit(runtime, spec((script,)))
    assert info.exit is not None, log
    found = fields(log)
    # glibc reserves signals 32 and 33 for itself (no sigaction can set them): whatever
    # a parent left there is out of reach and out of the test
    settable = sum(1 << (s - 1) for s in signal.valid_signals() if 0 < s <= 64)
    ignored, blocked = int(found["SigIgn"], 16), int(found["SigBlk"], 16)
    assert (ignored & settable, blocked & settable) == (0, 0), log


async def test_a_command_killed_by_a_signal_is_recorded_as_such(
    sandboxed: SandboxedFactory,
) -> None:
    runtime = sandboxed()
    info, _ = await run_to_exit(runtime, spec(("kill -9 $$",)))
    assert info.exit is not None
    assert (info.exit.reason, info.exit.exit_code, info.exit.signal) == (
        ExitReason.KILLED,
        137,
        9,
    )


async def test_a_process_that_leaves_the_kernels_group_ends_with_it(
    sandboxed: SandboxedFactory, eventually: Eventually
) -> None:
    """Without cgroups to sweep up, a ``setsid`` child that ignores every signal (out of
    the process group a destroy signals) still ends: the PID namespace dies with the
    sandbox's init."""
    runtime = sandboxed(use_cgroups=False)
    kernel = spec(
        ("setsid sh -c 'trap \"\" TERM HUP INT; echo ready; exec sleep 3581' & trap '' TERM; wait",)
    )
    await start_and_wait(runtime, kernel, eventually)
    stray = await eventually(lambda: host_pids_running(["sleep", "3581"]), what="the stray")
    started = await runtime.get_kernel(kernel.kernel_id)
    assert started.cid is not None
    assert all(os.getpgid(pid) != int(started.cid) for pid in stray)  # out of the group
    info = await runtime.destroy_kernel(kernel.kernel_id, grace_s=0.2)
    assert info.exit is not None
    assert info.exit.reason is ExitReason.DESTROYED
    await eventually(lambda: not host_pids_running(["sleep", "3581"]), what="the stray gone")


def host_pids_running(argv: list[str]) -> list[int]:
    """Host pids whose command line is ``argv`` (zombies excluded)."""
    wanted = "\0".join(argv).encode() + b"\0"
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if (entry / "cmdline").read_bytes() == wanted:
                found.append(int(entry.name))
    return found


# -- 7. app ports -------------------------------------------------------------------------


async def _get(client: httpx.AsyncClient, url: str) -> str | None:
    try:
        response = await client.get(url)
    except httpx.HTTPError:
        return None
    return response.text if response.status_code == 200 else None


async def test_published_ports_are_relayed_into_the_sandbox(
    sandboxed: SandboxedFactory, eventually: Eventually
) -> None:
    runtime = sandboxed()
    host_port = free_port()
    kernel = spec(
        ("-m", "http.server", "8888", "--bind", "127.0.0.1"),
        image="python",
        published_ports=((8888, host_port),),
    )
    await runtime.create_kernel(kernel)
    token = uuid.uuid4().hex
    (runtime.scratch_root / kernel.kernel_id / "work" / "token.txt").write_text(token)
    relayed = f"http://127.0.0.1:{host_port}/token.txt"
    async with httpx.AsyncClient(timeout=2) as client:
        assert await eventually(lambda: _get(client, relayed), what=relayed) == token
        # the kernel's port is its own: the host's 8888 is not it
        assert await _get(client, "http://127.0.0.1:8888/token.txt") != token
        # an agent restart: the old runtime's relays end with it, the new one re-relays
        await runtime.close()
        assert not await port_open("127.0.0.1", host_port)
        restarted = sandboxed()
        scanned = {i.kernel_id: i for i in await restarted.scan_kernels()}
        assert scanned[kernel.kernel_id].state is KernelState.RUNNING
        assert await eventually(lambda: _get(client, relayed), what="re-relayed") == token
        await restarted.destroy_kernel(kernel.kernel_id, grace_s=2)
        assert not await port_open("127.0.0.1", host_port)


# -- 8. failures --------------------------------------------------------------------------


async def test_a_sandbox_bwrap_refuses_fails_the_start_with_its_reason(
    sandboxed: SandboxedFactory,
) -> None:
    runtime = sandboxed(SandboxConfig(extra_args=("--no-such-option",)))
    kernel = spec(("echo should-not-run",))
    with pytest.raises(KernelStartFailed, match=r"sandbox could not be set up.*no-such-option"):
        await runtime.create_kernel(kernel)
    info = await runtime.get_kernel(kernel.kernel_id)
    assert info.exit is not None
    assert info.exit.reason is ExitReason.FAILED
    assert "should-not-run" not in await runtime.get_logs(kernel.kernel_id)


async def test_an_outbound_network_that_cannot_start_fails_the_start(
    sandboxed: SandboxedFactory,
) -> None:
    runtime = sandboxed(SandboxConfig(network="outbound", slirp4netns="/bin/false"))
    kernel = spec(("echo should-not-run",))
    with pytest.raises(KernelStartFailed, match="network"):
        await runtime.create_kernel(kernel)
    assert "should-not-run" not in await runtime.get_logs(kernel.kernel_id)


def test_probe_and_runtime_name_a_missing_bubblewrap(tmp_path: Path) -> None:
    missing = SandboxConfig(bwrap="/nonexistent/bwrap")
    why = probe(missing)
    assert why is not None
    assert "bubblewrap" in why
    with pytest.raises(RuntimeUnavailable, match="bubblewrap"):
        ProcessRuntime(
            ProcessRuntimeConfig(scratch_root=tmp_path, sandbox=missing, use_cgroups=False)
        )


# -- 9. the record itself (no sandbox started) --------------------------------------------


def _record(tmp_path: Path, config: SandboxConfig, program: str, **kwargs: Any) -> list[str]:
    work, conf = tmp_path / "k" / "work", tmp_path / "k" / "config"
    for folder in (work, conf):
        folder.mkdir(parents=True, exist_ok=True)
    record = sandbox_record(
        config,
        kernel_id="k",
        work_dir=work,
        config_dir=conf,
        cwd=work,
        program=program,
        **kwargs,
    )
    args = record["args"]
    assert isinstance(args, list)
    return [str(a) for a in args]


def _index(args: list[str], *entry: str) -> int:
    for i in range(len(args) - len(entry) + 1):
        if tuple(args[i : i + len(entry)]) == entry:
            return i
    raise AssertionError(f"{entry} not in {args}")


def test_an_interpreter_under_a_private_folder_gets_its_parents_made(tmp_path: Path) -> None:
    private = tmp_path / "private"
    env = private / "env"
    (env / "bin").mkdir(parents=True)
    program = env / "bin" / "tool"
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    private.chmod(0o700)
    args = _record(tmp_path, SandboxConfig(), str(program))
    bind = _index(args, "--ro-bind", str(env), str(env))
    for parent in (private, tmp_path):
        assert _index(args, "--dir", str(parent)) < bind
    assert _index(args, "--tmpfs", "/tmp") < bind  # the binds go on top of the private /tmp


def test_hidden_paths_come_after_every_bind(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    (shared / "keys").mkdir(parents=True)
    (shared / "token").write_text("x")
    config = SandboxConfig(ro_paths=(shared,), hidden=(shared / "keys", shared / "token"))
    args = _record(tmp_path, config, "/bin/sh")
    last_bind = max(
        i for i, a in enumerate(args) if a in ("--bind", "--ro-bind") and args[i + 1] != "/dev/null"
    )
    assert _index(args, "--ro-bind", str(shared), str(shared)) <= last_bind
    assert _index(args, "--tmpfs", str(shared / "keys")) > last_bind
    assert _index(args, "--ro-bind", "/dev/null", str(shared / "token")) > last_bind


def test_a_ro_path_above_the_scratch_root_gets_it_masked(tmp_path: Path) -> None:
    # _record's kernel dir is tmp_path/k: the scratch root is tmp_path
    config = SandboxConfig(ro_paths=(tmp_path.parent,))
    args = _record(tmp_path, config, "/bin/sh", scratch_root=tmp_path)
    above = _index(args, "--ro-bind", str(tmp_path.parent), str(tmp_path.parent))
    mask = _index(args, "--tmpfs", str(tmp_path))
    made = _index(args, "--dir", str(tmp_path / "k"))
    own = _index(args, "--bind", str(tmp_path / "k" / "work"), str(tmp_path / "k" / "work"))
    assert above < mask < made < own
    # no ro_path above it: nothing masked
    plain = _record(tmp_path, SandboxConfig(), "/bin/sh", scratch_root=tmp_path)
    assert ("--tmpfs", str(tmp_path)) not in itertools.pairwise(plain)


def test_nvidia_binds_the_device_nodes_that_exist(tmp_path: Path) -> None:
    dev = Path("/dev")
    expected = sorted(
        str(p)
        for pattern in ("nvidia[0-9]*", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")
        for p in dev.glob(pattern)
    )
    args = _record(tmp_path, SandboxConfig(), "/bin/sh", nvidia=True)
    bound = sorted(args[i + 1] for i, a in enumerate(args) if a == "--dev-bind")
    assert [b for b in bound if b != "/dev/nvidia-caps" and "modeset" not in b] == expected
    assert "--dev-bind" not in _record(tmp_path, SandboxConfig(), "/bin/sh", nvidia=False)


# -- the syscall filter ---------------------------------------------------------------------

FILTER_SCRIPT = r"""
unshare -Ur true 2>/dev/null; echo unshare=$?
python3 - <<'PY'
import ctypes, errno, os, subprocess, threading
libc = ctypes.CDLL(None, use_errno=True)
SYS_add_key = 248  # x86_64
r = libc.syscall(SYS_add_key, b"user", b"k", b"v", 1, -2)  # KEY_SPEC_SESSION_KEYRING
print("add_key=" + ("refused" if r < 0 and ctypes.get_errno() == errno.EPERM else f"{r}/{ctypes.get_errno()}"))
t = threading.Thread(target=lambda: print("thread=ok", flush=True)); t.start(); t.join()
print("subprocess=" + subprocess.run(["echo", "ok"], capture_output=True, text=True).stdout.strip())
print("fork=" + ("ok" if os.waitpid(os.fork() or os._exit(0), 0) else "?"))
PY
"""


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="syscall numbers of x86_64")
async def test_the_syscall_filter_refuses_user_namespaces_and_keyrings(
    sandboxed: SandboxedFactory, tmp_path: Path, eventually: Eventually
) -> None:
    """Under the filter a kernel (and its terminal) cannot make a user namespace, as it
    could without it under a root agent, nor use the kernel keyrings its uid would share
    with every other kernel; threads, forks and subprocesses work as ever (``clone3``
    answers ENOSYS, the C library falls back to ``clone``)."""
    bpf = tmp_path / "filter" / "seccomp.bpf"
    write_syscall_filter(bpf)
    size = bpf.stat().st_size
    assert size > 0
    assert size % 8 == 0  # BPF instructions
    unfiltered = sandboxed(SandboxConfig())
    _, log = await run_to_exit(unfiltered, spec((FILTER_SCRIPT,)))
    if os.geteuid() == 0:  # without the filter, a root agent's sandbox allows it
        assert fields(log)["unshare"] == "0", log
    runtime = sandboxed(SandboxConfig(syscall_filter=bpf))
    info, log = await run_to_exit(runtime, spec((FILTER_SCRIPT,)))
    found = fields(log)
    assert found["unshare"] != "0", log
    assert found["add_key"] == "refused", log
    assert (found["thread"], found["subprocess"], found["fork"]) == ("ok", "ok", "ok"), log
    assert info.exit is not None, log
    assert info.exit.exit_code == 0, log
    # the terminal runs under the same filter
    kernel = spec(("echo ready; exec sleep 60",))
    await start_and_wait(runtime, kernel, eventually)
    terminal = await runtime.open_terminal(kernel.kernel_id, cols=120, rows=30)
    try:
        shell = Shell(terminal)
        assert await shell.run("unshare -Ur true 2>/dev/null; echo $?") != "0"
        assert await shell.run("grep ^Seccomp: /proc/self/status | tr -d '\\t'") == "Seccomp:2"
    finally:
        await terminal.close()


async def test_a_filter_file_that_is_missing_fails_the_probe(tmp_path: Path) -> None:
    problem = probe(SandboxConfig(syscall_filter=tmp_path / "absent.bpf"))
    assert problem is not None
    assert "absent.bpf" in problem


# -- the exec helper's user change ----------------------------------------------------------

STATUS_LINES = (
    "Uid",
    "Gid",
    "Groups",
    "CapInh",
    "CapPrm",
    "CapEff",
    "CapBnd",
    "CapAmb",
    "NoNewPrivs",
    "Seccomp",
)
REGAIN_SCRIPT = r"""
grep -E '^(Uid|Gid|Groups|CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs|Seccomp):' /proc/self/status
python3 -c 'import os; os.setresuid(0, 0, 0)' 2>/dev/null; echo setresuid=$?
python3 -c 'import os; os.setgroups([0])' 2>/dev/null; echo setgroups=$?
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="a user change needs a root agent")
async def test_the_exec_helper_drops_to_the_same_state_as_setpriv(
    make_runtime: RuntimeFactory,
    sandbox_support: str | None,
    exec_helper_build: Path | str,
    tmp_path: Path,
) -> None:
    """The helper's ``drop`` ends where ``setpriv --reuid --regid --clear-groups
    --inh-caps=-all --bounding-set=-all`` does: the same ids, groups, capability sets,
    no-new-privileges and seccomp mode, and no way back to root."""
    if sandbox_support is not None:
        pytest.skip(sandbox_support)
    if isinstance(exec_helper_build, str):
        pytest.skip(exec_helper_build)
    bpf = tmp_path / "filter" / "seccomp.bpf"
    try:
        write_syscall_filter(bpf)
    except OSError:
        bpf = None  # type: ignore[assignment]
    states: dict[str, dict[str, str]] = {}
    for way, helper in (("setpriv", None), ("helper", exec_helper_build)):
        config = SandboxConfig(syscall_filter=bpf, exec_helper=helper)
        runtime = make_runtime(sandbox=config, exec_helper=helper)
        try:
            kernel = spec((REGAIN_SCRIPT,))
            info, log = await run_to_exit(runtime, kernel)
            launch = json.loads(
                (runtime.scratch_root / kernel.kernel_id / "state" / "launch.json").read_text()
            )
        finally:
            await runtime.close()
        prefix = launch["sandbox"]["command_prefix"]
        assert prefix[0] == (str(helper) if helper else "/usr/bin/setpriv"), prefix
        assert launch["exec_helper"] == (str(helper) if helper else None)
        assert info.exit is not None, log
        assert info.exit.exit_code == 0, log
        status = {
            key: " ".join(value.split())
            for key, _, value in (line.partition(":") for line in log.splitlines())
            if key in STATUS_LINES
        }
        assert set(status) == set(STATUS_LINES), log
        assert status["Uid"] == " ".join([str(KERNEL_UID)] * 4), log
        assert int(status["CapBnd"], 16) == 0, log
        found = fields(log)
        assert found["setresuid"] != "0", log
        assert found["setgroups"] != "0", log
        states[way] = status
    assert states["helper"] == states["setpriv"]


def test_the_exec_helper_is_bound_after_the_scratch_root_is_masked(tmp_path: Path) -> None:
    helper = tmp_path / ".exec-helper" / "accelshare-exec-0123"
    helper.parent.mkdir()
    helper.write_text("")
    config = SandboxConfig(ro_paths=(tmp_path.parent,), exec_helper=helper)
    args = _record(tmp_path, config, "/bin/sh", scratch_root=tmp_path)
    # (bound as root and not: it changes the user, and applies the kernel's environment)
    mask = _index(args, "--tmpfs", str(tmp_path))
    bound = _index(args, "--ro-bind", str(helper), str(helper))
    assert mask < _index(args, "--dir", str(helper.parent)) < bound
    assert _index(args, "--bind", str(tmp_path / "k" / "work"), str(tmp_path / "k" / "work"))
