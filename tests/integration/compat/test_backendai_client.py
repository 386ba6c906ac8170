"""The official Backend.AI client (backend.ai-client 25.5.2) against accelshare (issue #12).

The real ``backend.ai`` CLI and SDK (their own request signing, headers and GraphQL
queries, unchanged) drive a local cluster: one agent with two mock GPUs of 1.0
``cuda.shares`` each (``...2d01``, ``...2d02``, quantum 0.1).  See conftest.py for how
the client and the cluster are provided, and docs/compatibility.md for the level
these tests pin down.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from accelshare.devcluster import LocalCluster, free_port

from .conftest import Bai

pytestmark = pytest.mark.integration

AGENT = "i-dev-01"
GPU1 = "c59395cd-ac91-4cd3-a1b0-3d2568aa2d01"
GPU2 = "c59395cd-ac91-4cd3-a1b0-3d2568aa2d02"
ALLOC_MAP_QUERY = "query ($agent_id: String!) { agent(agent_id: $agent_id) { gpu_alloc_map } }"
CREATED = re.compile(r"Session ID ([0-9a-f-]{36}) is created and ready\.")
ENQUEUED = re.compile(r"Session ID ([0-9a-f-]{36}) is enqueued for scheduling\.")


def created_id(output: str) -> str:
    match = CREATED.search(output)
    assert match, f"no 'is created and ready' line in {output!r}"
    return match.group(1)


def picked(sessions: dict[str, str], *names: str) -> list[str | None]:
    """The statuses of these sessions (the cluster is shared with the other tests)."""
    return [sessions.get(name) for name in names]


def gpu_alloc_map(bai: Bai) -> dict[str, str]:
    """The documented query through the client's GraphQL call; checks the wire shape."""
    answer = bai.sdk("gql", query=ALLOC_MAP_QUERY, variables={"agent_id": AGENT})
    wire = answer["wire"]
    assert list(wire) == ["data"], wire  # no "errors"
    assert answer["data"] == wire["data"]
    raw = wire["data"]["agent"]["gpu_alloc_map"]
    assert isinstance(raw, str)  # a JSON *string*, as Backend.AI's JSONString
    alloc: dict[str, str] = json.loads(raw)
    return alloc


def test_version_negotiation_and_the_clients_own_signatures(
    bai: Bai, cluster: LocalCluster
) -> None:
    hello = bai.sdk("hello")
    assert hello["hello"]["version"] == "v8.20240915"
    assert hello["hello"]["manager"]
    assert hello["negotiated"] == [8, "20240915"]

    # Signed by the client (Date, X-BackendAI-Version, Authorization: BackendAI
    # signMethod=HMAC-SHA256, credential=...): accepted.
    keypair = bai.sdk("keypair")
    assert keypair["access_key"] == cluster.client_config().access_key
    assert keypair["is_active"] is True
    assert keypair["is_admin"] is True
    assert keypair["secret_key"] is None  # accelshare shows a secret only at creation

    # The same request signed with a wrong secret: refused with the reason.
    refused = bai.sdk("bad_secret")
    assert refused["status"] == 401
    assert refused["data"]["reason"] == "signature-mismatch"


def test_cli_fractional_sessions_alloc_map_and_pending_queue(bai: Bai) -> None:
    small = bai.ok(
        "session", "create", "-r", "cpu=1", "-r", "mem=2g", "-r", "cuda.shares=0.2",
        "--name", "compat-small", "python",
    )  # fmt: skip
    small_id = created_id(small.output)
    big = bai.ok(
        "session", "create", "-r", "cpu=1", "-r", "mem=2g", "-r", "cuda.shares=1.2",
        "--name", "compat-big", "python",
    )  # fmt: skip
    created_id(big.output)

    # The Backend.AI docs' example: 0.2 then 1.2 shares on two 1.0-share GPUs.
    alloc = gpu_alloc_map(bai)
    assert alloc == {GPU2: "0.80", GPU1: "0.60"}
    assert list(alloc) == [GPU2, GPU1]  # most allocated first

    listed = bai.ok("ps")
    assert "compat-small" in listed.stdout
    assert "compat-big" in listed.stdout
    assert bai.ok("session", "list").stdout.count("RUNNING") == 2
    assert picked(bai.sessions(), "compat-small", "compat-big") == ["RUNNING", "RUNNING"]

    agents = bai.ok("admin", "agent", "list")
    assert AGENT in agents.stdout
    assert "cuda.shares:1.4" in agents.stdout
    detail = bai.ok("--output", "json", "admin", "agent", "info", AGENT).json()["items"][0]
    assert detail["id"] == AGENT
    assert detail["status"] == "ALIVE"
    assert detail["available_slots"]["cuda.shares"] == "2"
    assert detail["occupied_slots"]["cuda.shares"] == "1.4"

    # 1.0 share: 0.4 + 0.2 free, so it waits (fragmented or not; the option's effect
    # is pinned down by test_cli_resource_opts_decide_whether_a_request_fragments).
    pending = bai.ok(
        "session", "create", "-r", "cpu=1", "-r", "mem=1g", "-r", "cuda.shares=1.0",
        "--enqueue-only", "--name", "compat-pending", "python",
    )  # fmt: skip
    match = ENQUEUED.search(pending.output)
    assert match, pending
    pending_id = match.group(1)
    assert bai.sessions()["compat-pending"] == "PENDING"

    def explained() -> str | None:  # the scheduler's reason, once its pass has run
        out = bai.ok("session", "info", pending_id).stdout
        return out if "cuda.shares needs 1" in out else None

    why = bai.until(explained, what="the PENDING reason of compat-pending")
    assert "PENDING" in why

    destroyed = bai.ok("session", "destroy", "compat-big")
    assert "Done." in destroyed.output

    def pending_runs() -> dict[str, str] | None:
        sessions = bai.sessions()
        return sessions if sessions.get("compat-pending") == "RUNNING" else None

    sessions = bai.until(pending_runs, what="compat-pending to become RUNNING")
    assert sessions["compat-big"] == "TERMINATED"
    assert gpu_alloc_map(bai) == {GPU1: "1.00", GPU2: "0.20"}

    info = bai.ok("session", "info", small_id)
    assert "compat-small" in info.stdout
    assert "cuda.shares:0.2" in info.stdout
    assert small_id in info.stdout

    bai.ok("session", "destroy", "compat-small", "compat-pending")
    assert (
        picked(bai.sessions(), "compat-small", "compat-big", "compat-pending") == ["TERMINATED"] * 3
    )
    assert gpu_alloc_map(bai) == {GPU1: "0.00", GPU2: "0.00"}


def test_cli_bare_create_prints_the_id_and_the_session_runs(bai: Bai) -> None:
    """The issue's first command as is: no --name (the client makes one up)."""
    result = bai.ok(
        "session", "create", "-r", "cpu=1", "-r", "mem=1g", "-r", "cuda.shares=0.2", "python"
    )  # fmt: skip
    assert result.stdout == ""
    # The client's whole output: its status line (on stderr), nothing else.
    printed = re.fullmatch(
        r"\W*Session ID ([0-9a-f-]{36}) is created and ready\.\s*", result.stderr
    )
    assert printed, result
    session_id = printed.group(1)
    assert created_id(result.output) == session_id

    info = bai.ok("session", "info", session_id).stdout
    assert session_id in info
    assert "RUNNING" in info
    assert "cuda.shares:0.2" in info
    generated = [name for name, status in bai.sessions().items() if status == "RUNNING"]
    assert len(generated) == 1, generated
    assert generated[0].startswith("pysdk-")  # the client's own generated name
    assert sorted(gpu_alloc_map(bai).values()) == ["0.00", "0.20"]

    assert "Done." in bai.ok("session", "destroy", generated[0]).output
    assert bai.sessions()[generated[0]] == "TERMINATED"


def test_cli_resource_opts_decide_whether_a_request_fragments(bai: Bai) -> None:
    """``--resource-opts allow_fractional_resource_fragmentation=...`` changes the outcome.

    0.6 share on each GPU (a second 0.6 cannot join the first), so 0.4 + 0.4 stay free:
    0.8 fits only split over both devices.
    """
    for name in ("compat-hold-1", "compat-hold-2"):
        created_id(
            bai.ok(
                "session", "create", "-r", "cpu=1", "-r", "mem=1g", "-r", "cuda.shares=0.6",
                "--name", name, "python",
            ).output
        )  # fmt: skip
    assert gpu_alloc_map(bai) == {GPU1: "0.60", GPU2: "0.60"}

    # Not allowed to fragment: enqueued, with the scheduler's reason saying why.
    whole = bai.ok(
        "session", "create", "-r", "cpu=1", "-r", "mem=1g", "-r", "cuda.shares=0.8",
        "--resource-opts", "allow_fractional_resource_fragmentation=false",
        "--name", "compat-whole", "python",
    )  # fmt: skip
    match = ENQUEUED.search(whole.output)
    assert match, whole
    assert not CREATED.search(whole.output)
    whole_id = match.group(1)

    def explained() -> str | None:
        out = bai.ok("session", "info", whole_id).stdout
        return out if "without fragmentation" in out else None

    why = bai.until(explained, what="the fragmentation reason of compat-whole")
    assert "PENDING" in why
    assert "cuda.shares needs 0.8, largest placement 0.4 without fragmentation" in why
    assert bai.sdk("info", name="compat-whole")["resourceOpts"] == {
        "allow_fractional_resource_fragmentation": False
    }

    # The same request allowed to fragment: created at once, 0.4 on each device.
    split = bai.ok(
        "session", "create", "-r", "cpu=1", "-r", "mem=1g", "-r", "cuda.shares=0.8",
        "--resource-opts", "allow_fractional_resource_fragmentation=true",
        "--name", "compat-split", "python",
    )  # fmt: skip
    created_id(split.output)
    assert bai.sdk("info", name="compat-split")["resourceOpts"] == {
        "allow_fractional_resource_fragmentation": True
    }
    assert gpu_alloc_map(bai) == {GPU1: "1.00", GPU2: "1.00"}
    sessions = bai.sessions()
    assert picked(sessions, "compat-whole", "compat-split") == ["PENDING", "RUNNING"]


def test_cli_logs_of_a_batch_session(bai: Bai) -> None:
    bai.ok(
        "session", "create", "--type", "batch", "-c", "echo hello-from-compat",
        "-r", "cpu=1", "-r", "mem=1g", "--name", "compat-batch", "shell",
    )  # fmt: skip

    def logged() -> str | None:
        out = bai.ok("session", "logs", "compat-batch").stdout
        return out if "hello-from-compat" in out else None

    assert "hello-from-compat" in bai.until(logged, what="the batch session's output")


SESSION_ID = re.compile(r"Session ID ([0-9a-f-]{36})")


def ended(bai: Bai, session_id: str) -> dict[str, Any]:
    """The session's info (the SDK's ``get_info``) once it has TERMINATED."""

    def terminated() -> dict[str, Any] | None:
        info: dict[str, Any] = bai.sdk("info", name=session_id)
        return info if info["status"] == "TERMINATED" else None

    return bai.until(terminated, what=f"session {session_id} to end")


def test_cli_batch_startup_command_runs_through_the_shell(bai: Bai) -> None:
    """The issue's command, as is: the startup command runs as Backend.AI runs it
    (``/bin/sh -c`` in the session's work dir, with its environ), in the ``python``
    environment too, and the session's result follows the exit code."""
    created = bai.ok(
        "session", "create", "--type", "batch", "--startup-command", "echo hi; echo $FOO",
        "-e", "FOO=bar", "-r", "cpu=1", "-r", "mem=1g", "python",
    )  # fmt: skip
    match = SESSION_ID.search(created.output)
    assert match, created
    info = ended(bai, match.group(1))
    assert (info["result"], info["exitCode"]) == ("SUCCESS", 0), info
    assert bai.sdk("logs", name=match.group(1)) == {"result": {"logs": "hi\nbar\n"}}
    assert "hi\nbar" in bai.ok("session", "logs", match.group(1)).stdout

    # `python` is the environment's interpreter, the work dir is the kernel's.
    code = "import os, sys; print(sys.executable, os.getcwd())"
    failed = bai.ok(
        "session", "create", "--type", "batch", "--name", "compat-exit",
        "--startup-command", f"python -c '{code}'; exit 3",
        "-r", "cpu=1", "-r", "mem=1g", "python",
    )  # fmt: skip
    match = SESSION_ID.search(failed.output)
    assert match, failed
    info = ended(bai, match.group(1))
    assert (info["result"], info["exitCode"]) == ("FAILURE", 3), info
    logs = bai.sdk("logs", name="compat-exit")["result"]["logs"]
    program, cwd = logs.split()
    assert program == sys.executable, logs  # the cluster's python image: this interpreter
    assert cwd.endswith("/work"), logs


def test_sdk_session_and_agent_calls(bai: Bai) -> None:
    resources = {"cpu": "1", "mem": "1g", "cuda.shares": "0.5"}
    created = bai.sdk("create", image="python", name="compat-sdk", resources=resources)
    assert created["status"] == "RUNNING"
    assert created["created"] is True
    again = bai.sdk("create", image="python", name="compat-sdk", resources=resources)
    assert again == {**created, "created": False}  # reuseIfExists: the same session

    info = bai.sdk("info", name="compat-sdk")
    assert info["sessionId"] == created["id"]
    assert info["status"] == "RUNNING"
    assert info["occupiedSlots"]["cuda.shares"] == "0.5"

    agents = bai.sdk("agents", agent_id=AGENT)
    assert agents["total"] == 1
    assert agents["items"][0]["id"] == AGENT
    assert json.loads(agents["detail"]["occupied_slots"])["cuda.shares"] == "0.5"
    assert 0 <= agents["detail"]["cpu_cur_pct"] <= 100  # the agent's live stats

    assert bai.sdk("logs", name="compat-sdk") == {"result": {"logs": ""}}
    destroyed = bai.sdk("destroy", name="compat-sdk")
    assert destroyed["sessionId"] == created["id"]
    assert destroyed["status"] == "TERMINATED"


def test_run_executes_code_in_a_session_and_rm_destroys_it(bai: Bai) -> None:
    """``backend.ai run``: the code runs in the session's kernel, its output streamed over
    ``/stream/session/{id}/execute``; ``--rm`` destroys the session afterwards."""
    code = "import sys; print('hello from', sys.executable); print('oops', file=sys.stderr)"
    ran = bai.ok(
        "run", "--rm", "-r", "cpu=1", "-r", "mem=1g", "--name", "compat-run", "-c", code, "python"
    )  # fmt: skip
    assert "hello from /" in ran.stdout
    assert "oops" in ran.stderr
    assert "Execution finished. (exit code = 0)" in ran.output
    assert bai.sessions()["compat-run"] == "TERMINATED"

    failing = bai.ok(
        "run", "--rm", "-r", "cpu=1", "-r", "mem=1g", "--name", "compat-run-exit",
        "-c", "import sys; sys.exit(7)", "python",
    )  # fmt: skip
    assert "Execution finished. (exit code = 7)" in failing.output
    assert bai.sessions()["compat-run-exit"] == "TERMINATED"

    kept = bai.ok("run", "-r", "cpu=1", "-r", "mem=1g", "--name", "compat-run-kept",
                  "-c", "print(6 * 7)", "python")  # fmt: skip
    assert "42" in kept.stdout
    assert bai.sessions()["compat-run-kept"] == "RUNNING"  # no --rm: it stays


def test_sdk_execute_steps_a_run_and_names_bad_run_ids(bai: Bai) -> None:
    resources = {"cpu": "1", "mem": "1g"}
    bai.sdk("create", image="python", name="compat-exec", resources=resources)
    code = "import time\nfor i in range(3):\n    print(i, flush=True); time.sleep(1)"
    answer = bai.sdk("execute", name="compat-exec", code=code, refusals=[["nosuch", "continue"]])
    results = answer["results"]
    assert len(results) > 1  # the output came in steps
    assert results[0]["status"] == "continued"
    assert results[-1]["exitCode"] == 0
    assert "".join(t for r in results for s, t in r["console"] if s == "stdout") == "0\n1\n2\n"
    (unknown,) = answer["refusals"]
    assert unknown["status"] == 404
    assert "runId" in json.dumps(unknown["data"])

    batch = bai.sdk(
        "execute", name="compat-exec", mode="batch",
        opts={"build": "echo building", "exec": "echo $HOME; exit 3"},
    )  # fmt: skip
    statuses = [r["status"] for r in batch["results"]]
    assert "build-finished" in statuses
    assert batch["results"][-1]["exitCode"] == 3
    bai.sdk("destroy", name="compat-exec")


def test_session_events_and_watch_follow_a_session_to_its_end(bai: Bai) -> None:
    """``session events`` prints Backend.AI's events of the session until it ends;
    ``session watch`` exits with a batch session's exit code."""
    created = bai.ok(
        "session", "create", "--type", "batch", "--startup-command", "sleep 1; exit 3",
        "-r", "cpu=1", "-r", "mem=1g", "--name", "compat-events", "python",
    )  # fmt: skip
    session_id = created_id(created.output) if CREATED.search(created.output) else None
    events = bai.ok("session", "events", "compat-events")
    lines = [line.split(" ", 1) for line in events.stdout.splitlines() if line.strip()]
    names = [name for name, _ in lines]
    assert names[0] == "session_enqueued", names
    for expected in ("session_scheduled", "kernel_creating", "session_started"):
        assert expected in names, names
    assert names[-4:] == [
        "kernel_terminated", "session_failure", "session_terminated", "server_close"
    ], names  # fmt: skip
    payload = json.loads(lines[-3][1])
    assert payload["sessionName"] == "compat-events"
    assert payload["exitCode"] == 3
    if session_id is not None:
        assert payload["sessionId"] == session_id
    only_session = bai.ok("events", "compat-events", "--scope", "session")
    assert "kernel_" not in only_session.stdout
    assert "session_started" in only_session.stdout

    bai.ok(
        "session", "create", "--type", "batch", "--startup-command", "sleep 2; exit 4",
        "-r", "cpu=1", "-r", "mem=1g", "--name", "compat-watch", "python",
    )  # fmt: skip
    watched = bai("session", "watch", "compat-watch")
    assert watched.code == 4, watched
    assert "session_failure" in watched.output

    missing = bai("session", "events", "compat-nosuch-events")
    assert "404" in missing.output
    assert "No session 'compat-nosuch-events'" in missing.output


def test_app_opens_a_local_proxy_to_a_sessions_service(bai: Bai) -> None:
    """``backend.ai apps`` lists a session's services; ``backend.ai app SESSION web -b``
    serves the session's web server on a local port, through the manager's tcpproxy."""
    bai.ok(
        "session", "create", "--type", "batch",
        "--startup-command", "python -m http.server 8765 --bind 127.0.0.1",
        "-e", "BACKENDAI_SERVICE_PORT_WEB=8765",
        "-r", "cpu=1", "-r", "mem=1g", "--name", "compat-app", "python",
    )  # fmt: skip
    listed = bai.ok("apps", "compat-app", "-l")
    assert "following app services: web" in listed.output
    port = free_port()
    proxy = subprocess.Popen(
        [str(bai.bin_dir / "backend.ai"), "app", "compat-app", "web", "-b", f"127.0.0.1:{port}"],
        env=bai.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:

        def page() -> str | None:
            try:
                answer = httpx.get(f"http://127.0.0.1:{port}/", timeout=5)
            except httpx.HTTPError:
                return None
            return answer.text if answer.status_code == 200 else None

        body = bai.until(page, what="the session's web page through the local proxy")
        assert "Directory listing" in body
    finally:
        proxy.terminate()
        proxy.wait(30)
    bai.ok("session", "destroy", "compat-app")


def test_what_does_not_work_fails_clearly(bai: Bai) -> None:
    # The client itself insists on a UUID for `session info` (no request is sent).
    by_name = bai("session", "info", "compat-nosuch")
    assert by_name.code != 0
    assert "must be given in the UUID format" in by_name.output

    # A filter the mini-language cannot parse: the error names the column.
    filtered = bai("ps", "--filter", 'name = "x"')
    assert filtered.code != 0
    assert "filter at column 6: bad syntax" in filtered.output

    # A folder that does not exist: 404 naming it (tests/integration/compat/test_vfolders.py
    # drives the folders themselves).
    folder = bai("vfolder", "info", "compat-nosuch")
    assert folder.code != 0
    assert "404" in folder.output
    assert "compat-nosuch" in folder.output

    missing = bai("session", "destroy", "compat-nosuch")
    assert missing.code != 0
    assert "404" in missing.output
    assert "No session 'compat-nosuch'" in missing.output


def test_status_history_and_rename(bai: Bai) -> None:
    """``session status-history`` prints the times the manager recorded; ``session
    rename`` renames a live session (id and allocation kept) and refuses a name in use."""
    created = bai.ok(
        "session", "create", "-r", "cpu=1", "-r", "mem=1g", "-r", "cuda.shares=0.3",
        "--name", "compat-hist", "python",
    )  # fmt: skip
    session_id = created_id(created.output)
    history = bai.ok("session", "status-history", session_id)
    assert "status_history: {" in history.output, history
    for status in ("'PENDING'", "'PREPARING'", "'RUNNING'", "'preparing'"):
        assert status in history.output, history
    assert "Actual Resource Allocation Time: {'result': {'seconds':" in history.output

    alloc = gpu_alloc_map(bai)
    renamed = bai.ok("session", "rename", "compat-hist", "compat-renamed")
    assert "Session renamed to compat-renamed." in renamed.output
    sessions = bai.sessions()
    assert sessions["compat-renamed"] == "RUNNING"
    assert bai.sdk("info", name="compat-renamed")["sessionId"] == session_id
    assert gpu_alloc_map(bai) == alloc

    bai.ok(
        "session", "create", "-r", "cpu=1", "-r", "mem=1g", "--name", "compat-other", "python"
    )  # fmt: skip
    taken = bai("session", "rename", "compat-renamed", "compat-other")
    assert taken.code != 0, taken
    assert "409" in taken.output
    assert "already exists" in taken.output
    assert bai.sdk("info", name=session_id)["sessionName"] == "compat-renamed"
    bai.ok("session", "destroy", "compat-renamed", "compat-other")


def test_tag_and_relative_starts_at(bai: Bai) -> None:
    """``--tag`` is kept and shown by ``session info``; ``--starts-at 20s`` (Backend.AI's
    delays) holds a batch session until then; a bad value is a 400 naming startsAt."""
    before = datetime.now(UTC)
    created = bai.ok(
        "session", "create", "--type", "batch", "--startup-command", "echo later",
        "--starts-at", "20s", "--tag", "mytag", "-r", "cpu=1", "-r", "mem=1g",
        "--name", "compat-later", "python",
    )  # fmt: skip
    match = SESSION_ID.search(created.output)
    assert match, created
    info = bai.sdk("info", name="compat-later")
    assert info["tag"] == "mytag"
    assert info["status"] == "PENDING"
    starts = datetime.fromisoformat(info["startsAt"])
    assert before + timedelta(seconds=20) <= starts <= datetime.now(UTC) + timedelta(seconds=20)
    shown = bai.ok("session", "info", match.group(1))
    assert "mytag" in shown.stdout, shown

    bad = bai(
        "session", "create", "--type", "batch", "--startup-command", "true",
        "--starts-at", "soon", "-r", "cpu=1", "-r", "mem=1g", "--name", "compat-bad", "python",
    )  # fmt: skip
    assert bad.code != 0, bad
    assert "400" in bad.output
    assert "startsAt" in bad.output
    bai.ok("session", "destroy", "compat-later")


def test_set_priority_of_a_pending_session_and_rescan_gpu_alloc_maps(bai: Bai) -> None:
    """``ComputeSession.update(priority=...)`` (``modify_compute_session``) changes a
    PENDING session's priority and refuses a RUNNING one's; ``rescan_gpu_alloc_maps`` is
    accepted (the maps are live: no task)."""
    created = bai.ok(
        "session", "create", "--type", "batch", "--startup-command", "true",
        "--starts-at", "1h", "-r", "cpu=1", "-r", "mem=1g", "--name", "compat-queued", "python",
    )  # fmt: skip
    match = SESSION_ID.search(created.output)
    assert match, created
    queued_id = match.group(1)
    changed = bai.sdk("update", id=queued_id, priority=42)
    assert changed["item"] == {"name": "compat-queued", "priority": 42}
    assert changed["clientMutationId"]
    assert bai.sdk("info", name=queued_id)["priority"] == 42

    # The CLI's `session set-priority` builds its session object from the name only, and
    # the client's update() insists on an id: it fails in the client, before any request.
    cli = bai("session", "set-priority", queued_id, "7")
    assert cli.code != 0
    assert "must have a valid session ID" in cli.output

    running = bai.ok(
        "session", "create", "-r", "cpu=1", "-r", "mem=1g", "--name", "compat-busy", "python"
    )  # fmt: skip
    refused = bai.sdk("update", id=created_id(running.output), priority=5)
    assert refused["status"] == 400  # the client's status for any GraphQL error
    assert "only while it is PENDING; it is RUNNING" in json.dumps(refused["data"])

    rescan = bai.sdk(
        "gql",
        query="mutation($a: String!) { rescan_gpu_alloc_maps(agent_id: $a) { task_id } }",
        variables={"a": AGENT},
    )
    assert rescan["data"] == {"rescan_gpu_alloc_maps": {"task_id": None}}
    bai.ok("session", "destroy", "compat-queued", "compat-busy")


def test_restart_keeps_the_session_and_its_devices(bai: Bai) -> None:
    """``session restart``: the kernel is created again on the same devices, the session
    keeps its id; a session that is not RUNNING is a 409 naming its status."""
    created = bai.ok(
        "session", "create", "-r", "cpu=1", "-r", "mem=1g", "-r", "cuda.shares=0.4",
        "--name", "compat-restart", "python",
    )  # fmt: skip
    session_id = created_id(created.output)
    before = bai.sdk("info", name=session_id)
    alloc = gpu_alloc_map(bai)
    assert "Done." in bai.ok("session", "restart", "compat-restart").output
    after = bai.sdk("info", name=session_id)
    assert (after["status"], after["sessionName"]) == ("RUNNING", "compat-restart")
    assert after["kernels"][0]["kernelId"] != before["kernels"][0]["kernelId"]
    assert after["kernels"][0]["deviceAllocs"] == before["kernels"][0]["deviceAllocs"]
    assert gpu_alloc_map(bai) == alloc
    ran = bai.ok("run", "--name", "compat-restart", "-c", "print('after restart')", "python")
    assert "after restart" in ran.stdout

    bai.ok("session", "destroy", "compat-restart")
    refused = bai("session", "restart", "compat-restart")
    assert refused.code != 0, refused
    assert "409" in refused.output
    assert "TERMINATED" in refused.output


def test_filter_and_order_expressions(bai: Bai) -> None:
    """``ps --filter ... --order ...`` and ``admin agent list --filter``: Backend.AI's
    mini-language, evaluated by the manager's database."""
    for name in ("compat-flt-a", "compat-flt-B"):
        bai.ok(
            "session", "create", "-r", "cpu=1", "-r", "mem=1g", "-r", "cuda.shares=0.1",
            "--name", name, "python",
        )  # fmt: skip
    try:
        listed = bai.ok(
            "--output", "json", "ps", "--format", "name,status",
            "--filter", 'name ilike "compat-flt-%" & status == "RUNNING"', "--order", "-name",
        ).json()  # fmt: skip
        assert [i["name"] for i in listed["items"]] == ["compat-flt-a", "compat-flt-B"]
        exact = bai.ok(
            "--output", "json", "ps", "--format", "name", "--filter", 'name like "compat-flt-b"'
        ).json()
        assert exact["items"] == []  # like is case-sensitive
        agents = bai.ok(
            "--output", "json", "admin", "agent", "list",
            "--filter", f'id == "{AGENT}" & schedulable == true', "--order", "-first_contact",
        ).json()  # fmt: skip
        assert [a["id"] for a in agents["items"]] == [AGENT]
        none = bai.ok(
            "--output", "json", "admin", "agent", "list", "--filter", 'id != "' + AGENT + '"'
        ).json()
        assert none["items"] == []
        unknown = bai("ps", "--filter", 'colour == "red"')
        assert unknown.code != 0
        assert "unknown field of compute_session_list" in unknown.output
    finally:
        for name in ("compat-flt-a", "compat-flt-B"):
            bai("session", "destroy", name)


def test_manager_status_freeze_and_unfreeze(bai: Bai) -> None:
    status = bai.ok("admin", "manager", "status")
    assert "running" in status.output
    me = bai.ok("--output", "json", "admin", "user", "info").json()["items"][0]["email"]

    def my_keys() -> list[str]:  # a GraphQL query: answered while frozen too
        listed = bai.ok("--output", "json", "admin", "keypair", "list", "--user-id", me).json()
        return sorted(k["access_key"] for k in listed["items"])

    keys = my_keys()
    frozen = bai.ok("admin", "manager", "freeze")
    assert "Manager is successfully frozen." in frozen.output
    try:
        assert "frozen" in bai.ok("admin", "manager", "status").output
        refused = bai(
            "session", "create", "-r", "cpu=1", "-r", "mem=1g", "--name", "compat-frozen",
            "python",
        )  # fmt: skip
        assert refused.code != 0
        assert "frozen" in refused.output
        # a GraphQL mutation: the client prints the 503 server-frozen problem
        added = bai("admin", "keypair", "add", me, "default")
        assert added.code != 0, added
        assert "503" in added.output, added
        assert "The server is frozen due to maintenance" in added.output, added
        assert my_keys() == keys
    finally:
        thawed = bai.ok("admin", "manager", "unfreeze")
    assert "Manager is successfully unfrozen." in thawed.output
    assert "running" in bai.ok("admin", "manager", "status").output


def test_scaling_group_get_available(bai: Bai) -> None:
    # (the client prints the raw answer before its table)
    available = bai.ok("admin", "scaling-group", "get-available", "default")
    assert "{'scaling_groups': [{'name': 'default'}" in available.output
    missing = bai("admin", "scaling-group", "get-available", "no-such-project")
    assert missing.code != 0
    assert "404" in missing.output


def test_an_unknown_image_is_refused_at_creation(bai: Bai) -> None:
    """The official client's `session create` with a misspelt image: the manager answers
    400 naming the image (and the close names), the client exits with it, and no session
    is recorded (never accepted and then cancelled)."""
    before = set(bai.sessions())
    refused = bai("session", "create", "-r", "cpu=1", "--name", "compat-typo", "pyhton")
    assert refused.code != 0, refused
    assert "400" in refused.output
    assert "Unknown image 'pyhton'" in refused.output
    assert "did you mean python" in refused.output
    assert set(bai.sessions()) == before
