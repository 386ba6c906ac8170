"""The sandbox of an agent that is not root, run for real.

An agent that is not root cannot change user: bubblewrap runs its kernels as the
agent's own uid in a user namespace that maps only that uid (``--unshare-user``) and
allows no further ones (``--disable-userns``); the kernel's environment is applied
inside by the exec helper's ``env`` mode (or the agent's interpreter), and terminals
and commands of the execute API enter the sandbox with nsenter as that same user.

Each test here reads the report of ``unprivileged_agent.py``: a process runtime started
(once per way of starting kernels, the exec helper with the fork server or a forked
Python process, and per sandbox network, "none" or "outbound") as a dedicated
unprivileged user, with a scratch root and a secret file
of its own, which starts kernels and records what they saw.  Where the interpreter lies
under a folder that user cannot enter (a pyenv Python under ``/root``), the agent runs
in a mount namespace of its own in which a tmpfs covers that folder and only the
interpreter is bound back: the agent's user reaches it, and nothing else of the folder.

Skipped where this process is not root (it cannot start a process as another user),
where bubblewrap, setpriv or unshare is missing, where unprivileged user namespaces are
not allowed, and with the probe's own reason where bubblewrap cannot sandbox as that
user here.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_sandbox_environ import PRELOAD_SOURCE

import accelshare
from accelshare.cbuild import find_compiler

AGENT_SCRIPT = Path(__file__).with_name("unprivileged_agent.py")
#: The interpreter and the source the unprivileged agent runs with (this session's).
SOURCE_ROOT = Path(accelshare.__file__).resolve().parents[1]
HOST_NS = {ns: os.readlink(f"/proc/self/ns/{ns}") for ns in ("pid", "net", "mnt", "user")}
TOOLS = ("bwrap", "setpriv", "unshare", "mount")


def _missing() -> str | None:
    if os.geteuid() != 0:
        return "starting an agent as another user needs root"
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        return f"not installed: {', '.join(missing)}"
    if find_compiler() is None:
        return "no C compiler (cc / $CC) for the preloaded library"
    return None


pytestmark = pytest.mark.skipif(_missing() is not None, reason=_missing() or "")


def _free_id() -> int:
    """A uid (and gid) that no account and no process uses: the agent's alone."""
    with open("/etc/passwd") as f:
        taken = {int(line.split(":")[2]) for line in f if line.count(":") >= 3}
    with open("/etc/group") as f:
        taken |= {int(line.split(":")[2]) for line in f if line.count(":") >= 3}
    rng = random.Random()
    for _ in range(100):
        uid = rng.randrange(200_000, 2_000_000)
        if uid not in taken:
            return uid
    raise AssertionError("no free uid")


def _as_user(uid: int, argv: list[str]) -> list[str]:
    """``argv`` as ``uid``/``gid`` ``uid``, in no group, with no capability at all."""
    return [
        shutil.which("setpriv") or "setpriv",
        f"--reuid={uid}",
        f"--regid={uid}",
        "--clear-groups",
        "--inh-caps=-all",
        "--bounding-set=-all",
        *argv,
    ]


def _unreachable(path: Path) -> Path | None:
    """The outermost folder above ``path`` that a user who is neither its owner nor in
    its group cannot enter (no ``o+x``), if any."""
    for parent in reversed(path.parents):
        if not os.stat(parent).st_mode & stat.S_IXOTH:
            return parent
    return None


def _reachable_wrapper(needed: list[Path], stage: Path) -> str:
    """Shell commands that, in a fresh mount namespace, make each ``needed`` path
    reachable for any user: a folder above one that only root may enter is covered by a
    tmpfs (mode 0755) and the path bound back on it (through ``stage``)."""
    commands: list[str] = []
    for path in needed:
        blocked = _unreachable(path)
        if blocked is None:
            continue
        q = shlex.quote
        commands += [
            f"mount --bind {q(str(path))} {q(str(stage))}",
            f"mount -t tmpfs -o mode=0755 tmpfs {q(str(blocked))}",
            f"mkdir -p {q(str(path))}",
            f"mount --bind {q(str(stage))} {q(str(path))}",
            f"umount {q(str(stage))}",
        ]
    return " && ".join(commands)


class AgentHome:
    """The unprivileged agent's own folder: its scratch root, a secret file, and the
    files its kernels read (the exec helper, the preloaded library)."""

    def __init__(self, root: Path, uid: int) -> None:
        self.root = root
        self.uid = uid
        self.scratch_root = root / "scratch"
        self.shared = root / "shared"  # every kernel's, read-only
        self.secret = root / "secret.txt"
        self.host_marks = root / "host-marks.txt"


@pytest.fixture(scope="module")
def agent_home() -> Iterator[AgentHome]:
    uid = _free_id()
    root = Path(tempfile.mkdtemp(prefix="accelshare-userns-"))
    if _unreachable(root) is not None:
        shutil.rmtree(root)
        pytest.skip(f"the temporary folder {root} is not reachable for another user")
    home = AgentHome(root, uid)
    try:
        root.chmod(0o755)
        home.shared.mkdir()
        home.scratch_root.mkdir()
        home.secret.write_text("the agent's secret\n")
        home.secret.chmod(0o600)
        source = root / "mark.c"
        source.write_text(PRELOAD_SOURCE)
        compiler = find_compiler()
        assert compiler is not None
        subprocess.run(
            [
                *compiler,
                "-shared",
                "-fPIC",
                f'-DMARKS="{home.host_marks}"',
                "-o",
                str(home.shared / "libmark.so"),
                str(source),
            ],
            check=True,
            capture_output=True,
        )
        for path in (root, *root.rglob("*")):
            os.chown(path, uid, uid, follow_symlinks=False)
        why = _userns_refused(uid)
        if why is not None:
            pytest.skip(why)
        yield home
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _kill_processes_of(uid: int) -> None:
    """SIGKILL whatever still runs as ``uid`` (the test's own user: nothing else runs as
    it), should a failed agent have left a kernel behind."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue
        uids = next(
            (line.split()[1:] for line in status.splitlines() if line.startswith("Uid:")), []
        )
        if str(uid) in uids:  # (a /proc folder's owner is root for a non-dumpable process)
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(entry.name), signal.SIGKILL)


def _userns_refused(uid: int) -> str | None:
    """Why ``uid`` may not create a user namespace here (None: it may)."""
    done = subprocess.run(
        _as_user(uid, [shutil.which("unshare") or "unshare", "--user", "true"]),
        capture_output=True,
        check=False,
        timeout=30,
    )
    if done.returncode == 0:
        return None
    return (
        "unprivileged user namespaces are not allowed here (unshare --user as uid"
        f" {uid}: {done.stderr.decode(errors='replace').strip()})"
    )


@pytest.fixture(scope="module", params=["helper", "python", "helper-outbound", "python-outbound"])
def report(
    request: pytest.FixtureRequest, agent_home: AgentHome, exec_helper_build: Path | str
) -> dict[str, Any]:
    """What the unprivileged agent's kernels saw, started with the exec helper (through
    the fork server: its ``supervise``, then ``env`` inside) or by a forked Python
    process (the agent's interpreter applies the environment inside), with the
    sandbox's network ``"none"`` or ``"outbound"`` (slirp4netns, started by each)."""
    way, _, network = request.param.partition("-")
    if network and shutil.which("slirp4netns") is None:
        pytest.skip("slirp4netns is not installed (sandbox-network = 'outbound')")
    helper: Path | None = None
    if way == "helper":
        if isinstance(exec_helper_build, str):
            pytest.skip(f"no exec helper: {exec_helper_build}")
        helper = agent_home.shared / exec_helper_build.name
        if not helper.exists():
            shutil.copy2(exec_helper_build, helper)
            helper.chmod(0o755)
            os.chown(helper, agent_home.uid, agent_home.uid)
    settings = {
        "scratch_root": str(agent_home.scratch_root),
        "exec_helper": None if helper is None else str(helper),
        "preload": str(agent_home.shared / "libmark.so"),
        "ro_path": str(agent_home.shared),
        "secret": str(agent_home.secret),
        "network": network or "none",
    }
    agent = _as_user(
        agent_home.uid,
        [
            "env",
            "-i",
            "PATH=/usr/local/bin:/usr/bin:/bin",
            f"HOME={agent_home.root}",
            f"PYTHONPATH={SOURCE_ROOT}",
            sys.executable,
            str(AGENT_SCRIPT),
            json.dumps(settings),
        ],
    )
    stage = agent_home.root / ".stage"
    stage.mkdir(exist_ok=True)
    needed = [Path(sys.base_prefix), Path(sys.prefix), SOURCE_ROOT, AGENT_SCRIPT.parent]
    wrapper = _reachable_wrapper(needed, stage)
    if wrapper:
        script = f"{wrapper} && exec {shlex.join(agent)}"
        agent = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script]
    try:
        done = subprocess.run(agent, capture_output=True, check=False, timeout=120)
    finally:
        _kill_processes_of(agent_home.uid)
    stderr = done.stderr.decode(errors="replace")
    assert done.returncode == 0, f"the unprivileged agent failed ({done.returncode}): {stderr}"
    found: dict[str, Any] = json.loads(done.stdout)
    if found["probe"] is not None:
        pytest.skip(f"the sandbox's probe refuses as uid {agent_home.uid}: {found['probe']}")
    found["stderr"] = stderr
    found["network"] = network or "none"
    return found


def fields(log: str) -> dict[str, str]:
    """``key=value`` words of a kernel's output (the last one of each key wins)."""
    found: dict[str, str] = {}
    for word in log.replace("\n", " ").split(" "):
        key, sep, value = word.partition("=")
        if sep and key.isidentifier():
            found[key] = value
    return found


def marks(text: str) -> list[tuple[int, str, str]]:
    """``(euid, pid namespace, program)`` of each process that loaded the library."""
    found = []
    for line in text.splitlines():
        euid, ns, program = line.split(" ", 2)
        found.append((int(euid), ns, program))
    return found


def test_the_agent_runs_as_its_own_unprivileged_user(
    report: dict[str, Any], agent_home: AgentHome
) -> None:
    assert (report["uid"], report["gid"]) == (agent_home.uid, agent_home.uid)
    assert report["effective_ids"] == [agent_home.uid, agent_home.uid]
    # the agent itself is on the host's PID and network namespaces, in its user namespace
    assert {ns: report["ns"][ns] for ns in ("pid", "net", "user")} == {
        ns: HOST_NS[ns] for ns in ("pid", "net", "user")
    }


def test_kernels_run_as_the_agents_uid_in_namespaces_of_their_own(
    report: dict[str, Any], agent_home: AgentHome
) -> None:
    log = report["inspect"]["log"]
    seen = fields(log)
    assert (seen["uid"], seen["gid"]) == (str(agent_home.uid), str(agent_home.uid)), log
    for ns in ("pid", "net", "mnt", "user"):
        assert seen[f"ns_{ns}"] not in {HOST_NS[ns], report["ns"][ns]}, (ns, log)
    # and another kernel's are not this one's
    assert fields(report["running"]["log"])["ns_pid"] != seen["ns_pid"]


def test_the_network_is_the_sandboxs_own(report: dict[str, Any]) -> None:
    # "none": its own loopback only; "outbound": and slirp4netns's tap0
    expected = {"none": "lo,", "outbound": "lo,tap0,"}[report["network"]]
    assert fields(report["inspect"]["log"])["ifaces"] == expected, report["inspect"]["log"]


def test_kernels_cannot_create_user_namespaces(report: dict[str, Any]) -> None:
    # (the agent's user can, outside: the module is skipped otherwise)
    assert fields(report["inspect"]["log"])["userns"] == "refused", report["inspect"]["log"]


def test_kernels_see_their_work_folder_and_nothing_of_the_agents_files(
    report: dict[str, Any],
) -> None:
    log = report["inspect"]["log"]
    seen = fields(log)
    assert seen["work"] == "writable", log
    assert seen["secret"] == "hidden", log
    agent_dir = log.partition("agent_dir=")[2].splitlines()[0].split()
    assert "secret.txt" not in agent_dir, log
    scratch = log.partition("scratch=")[2].splitlines()[0].split()
    assert report["inspect"]["kernel_id"] in scratch, log
    assert report["running"]["kernel_id"] not in scratch, log


def test_the_session_environment_reaches_the_kernel_and_loads_only_inside(
    report: dict[str, Any], agent_home: AgentHome
) -> None:
    log = report["inspect"]["log"]
    seen = fields(log)
    assert seen["marker"] == "from-the-session", log
    assert seen["preload"] == str(agent_home.shared / "libmark.so"), log
    for ended in (report["inspect"], report["destroyed"]):
        found = marks(ended["marks"])
        assert any(program.endswith("sh") for _, _, program in found), found
        outside = [m for m in found if m[1] in {HOST_NS["pid"], report["ns"]["pid"]}]
        assert not outside, f"the session's library ran outside the sandbox: {found}"
        assert {m[0] for m in found} == {agent_home.uid}, found
    # only the kernels' processes (inside, with $PRELOAD_MARKS) loaded it: nothing did
    # with the agent's own environment (bwrap, nsenter)
    assert not agent_home.host_marks.exists(), agent_home.host_marks.read_text()


def capabilities(output: str) -> dict[str, int]:
    """The capability sets a process printed (``grep Cap /proc/self/status``)."""
    lines = [line.split(":") for line in output.splitlines() if line.startswith("Cap")]
    return {name: int(value, 16) for name, value in lines}


#: No capability in any set but the bounding one (the user namespace's own).
NO_CAPABILITIES = {"CapInh": 0, "CapPrm": 0, "CapEff": 0, "CapAmb": 0}


def test_kernels_hold_no_capability(report: dict[str, Any]) -> None:
    log = report["inspect"]["log"]
    assert capabilities(log) == NO_CAPABILITIES, log


def test_an_exit_code_is_recorded(report: dict[str, Any]) -> None:
    inspect = report["inspect"]
    assert inspect["exit"] == {"reason": "exited", "code": 7}, inspect["log"]
    assert inspect["exit_json"]["reason"] == "exited"
    assert inspect["exit_json"]["exit_code"] == 7


def test_destroy_ends_the_kernel_and_records_it(report: dict[str, Any]) -> None:
    destroyed = report["destroyed"]
    assert destroyed["exit"]["reason"] == "destroyed", destroyed
    assert destroyed["exit_json"]["reason"] == "destroyed", destroyed
    assert destroyed["exit_json"]["signal"] == 15, destroyed
    assert destroyed["alive"] == [], destroyed


def test_the_execute_api_runs_in_the_sandbox_as_the_agents_uid(
    report: dict[str, Any], agent_home: AgentHome
) -> None:
    done = report["exec"]
    assert done["code"] == 0, done["output"]
    seen = fields(done["output"])
    assert seen["uid"] == str(agent_home.uid), done["output"]
    assert seen["ns_pid"] == fields(report["running"]["log"])["ns_pid"], done["output"]
    assert seen["marker"] == "from-the-session", done["output"]
    # (nsenter's capabilities in bwrap's user namespace are gone)
    assert capabilities(done["output"]) == NO_CAPABILITIES, done["output"]


def test_a_terminal_runs_in_the_sandbox_as_the_agents_uid(
    report: dict[str, Any], agent_home: AgentHome
) -> None:
    ns_pid = fields(report["running"]["log"])["ns_pid"]
    assert f"<42>{agent_home.uid}:{ns_pid}" in report["terminal"], report["terminal"]


def test_app_ports_are_relayed_into_the_sandbox(
    report: dict[str, Any], agent_home: AgentHome
) -> None:
    # The agent may not enter the sandbox's network namespace from a thread of its own:
    # a spawned process (the exec helper's socket mode, or the agent's interpreter)
    # enters the user namespace that owns it first and hands the socket back.
    app = report["app"]
    assert "error" not in app, app["error"]
    word, uid, net_ns = app["reply"].split(" ")
    assert (word, uid) == ("pong", str(agent_home.uid)), app
    # (answered from inside: the kernel's own network namespace, not the agent's)
    assert net_ns not in {HOST_NS["net"], report["ns"]["net"]}, app
