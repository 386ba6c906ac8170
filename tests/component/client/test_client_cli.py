"""The ``accelshare`` command line against a real local cluster (conftest.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from accelshare.client.cli import app
from accelshare.devcluster import LocalCluster

Cli = Callable[..., Any]  # conftest.py's ``cli`` fixture: accelshare ARGS... -> CliResult


AGENT = "i-dev-01"
GQL = "query ($agent_id: String!) { agent(agent_id: $agent_id) { id gpu_alloc_map } }"


def _sid(stdout: str) -> str:
    return stdout.split("Session ID ", 1)[1].split(maxsplit=1)[0]


def test_create_info_list_destroy(cli: Cli) -> None:
    created = cli("session", "create", "-r", "cpu=1", "-r", "mem=256", "--name", "cli-a", "python")
    assert created.code == 0, created
    assert created.stdout.startswith("Session ID ")
    assert created.stdout.rstrip().endswith("is created and ready.")
    sid = _sid(created.stdout)
    info = cli("session", "info", "cli-a", "--json")
    assert info.code == 0
    doc = json.loads(info.stdout)
    assert doc["sessionId"] == sid
    assert doc["requestedSlots"]["mem"] == str(256 * 2**20)  # a bare mem number is MiB
    shown = cli("session", "info", sid)
    assert "RUNNING" in shown.stdout
    assert "history" in shown.stdout
    listed = cli("session", "list")
    assert sid in listed.stdout
    assert "cli-a" in listed.stdout
    as_json = json.loads(cli("session", "list", "--json").stdout)
    assert [s["sessionId"] for s in as_json] == [sid]
    destroyed = cli("session", "destroy", "cli-a")
    assert destroyed.code == 0
    assert destroyed.stdout.strip() == f"Session ID {sid} is terminated."
    assert cli("session", "list").stdout.startswith("No sessions.")
    assert sid in cli("session", "list", "--all").stdout


def test_create_lists_services_and_apps_prints_their_urls(cli: Cli) -> None:
    created = cli(
        "session", "create", "-r", "cpu=1", "-r", "mem=256", "--service", "web=18080", "python"
    )
    assert created.code == 0, created
    assert "service web (http, port 18080)" in created.stdout
    sid = _sid(created.stdout)
    apps = cli("session", "apps", sid)
    assert apps.code == 0, apps
    lines = apps.stdout.splitlines()
    assert re.fullmatch(rf"web\thttp://127\.0\.0\.1:\d+/session/{sid}/apps/web/", lines[0])
    assert re.fullmatch(rf"terminal\tws://127\.0\.0\.1:\d+/session/{sid}/terminal .*", lines[1])
    doc = json.loads(cli("session", "apps", sid, "--json").stdout)
    assert doc["apps"][0]["port"] == 18080
    assert cli("session", "destroy", sid).code == 0
    gone = cli("session", "apps", sid)
    assert gone.code == 1, gone


@pytest.mark.parametrize(
    ("command", "exit_code"),
    [
        # words: a command line, like `docker run IMAGE CMD...`; `python` is the image's
        (["python", "--", "python", "-c", "print(42)"], 0),
        (["python", "--", "python", "-c", "import sys; sys.exit(5)"], 5),
        (["python", "--", "echo hello; exit 3"], 3),  # one word: the command line, whole
        (["shell", "--", "echo hello; exit 3"], 3),
        (["shell", "--", "test", "a b", "=", "a b"], 0),  # words: quoted, so still one "a b"
    ],
)
def test_batch_command_runs_in_the_sessions_environment(
    cli: Cli, command: list[str], exit_code: int
) -> None:
    created = cli("session", "create", "-r", "cpu=1", "-r", "mem=256", *command)
    assert created.code == 0, created
    sid = _sid(created.stdout)
    waited = cli("session", "wait", sid, "--status", "TERMINATED", "--timeout", "60")
    assert waited.code == 0, waited
    doc = json.loads(cli("session", "info", sid, "--json").stdout)
    assert doc["type"] == "batch"
    assert doc["exitCode"] == exit_code, doc


def test_alloc_map_bars_json_and_graphql(cli: Cli) -> None:
    for shares in ("0.2", "1.2"):
        created = cli(
            "session",
            "create",
            "-r",
            "cpu=1",
            "-r",
            "mem=1g",
            "-r",
            f"cuda.shares={shares}",
            "python",
        )
        assert "is created and ready." in created.stdout, created
    bars = cli("agent", "alloc-map", AGENT, "--plugin", "cuda")
    assert bars.code == 0
    lines = [line.split() for line in bars.stdout.splitlines()[1:]]
    assert sorted(((ln[1], ln[2], ln[3], ln[5]) for ln in lines), key=lambda t: t[2]) == [
        ("cuda.shares", "██████░░░░", "0.60", "1.00"),
        ("cuda.shares", "████████░░", "0.80", "1.00"),
    ]
    assert all(line[0].startswith("c59395cd-…") for line in lines)  # shortened ids
    full = cli("agent", "alloc-map", AGENT, "--full-ids", "-p", "cuda")
    assert "c59395cd-ac91-4cd3-a1b0-3d2568aa2d01" in full.stdout
    doc = json.loads(cli("agent", "alloc-map", AGENT, "--json").stdout)
    cuda = doc["maps"]["cuda"]["devices"]
    assert sorted(d["allocated"] for d in cuda) == ["0.6", "0.8"]
    compat = cli("agent", "alloc-map", AGENT, "--compat", "--json")
    assert sorted(json.loads(compat.stdout)["alloc_map"].values()) == ["0.60", "0.80"]
    answer = cli("admin", "query", GQL, "--variables", json.dumps({"agent_id": AGENT}))
    assert answer.code == 0
    gpu = json.loads(json.loads(answer.stdout)["data"]["agent"]["gpu_alloc_map"])
    assert sorted(gpu.values()) == ["0.60", "0.80"]
    info = cli("agent", "info", AGENT)
    assert "ALIVE" in info.stdout
    assert "0.60 / 1.00" in info.stdout
    assert "2 GiB / 16 GiB" in info.stdout  # mem of the two sessions
    listed = cli("agent", "list")
    assert AGENT in listed.stdout
    assert "cuda.shares 1.4/2" in listed.stdout


def test_pending_reason_why_and_start_by_itself(cli: Cli) -> None:
    one = cli("session", "create", "-r", "cuda.shares=1", "--name", "fill-1", "python")
    two = cli("session", "create", "-r", "cuda.shares=1", "--name", "fill-2", "python")
    assert "is created and ready." in one.stdout + two.stdout
    third = cli("session", "create", "-r", "cuda.shares=1", "--name", "fill-3", "python")
    assert third.code == 0
    assert "is enqueued (PENDING: " in third.stdout
    assert "cuda.shares needs 1" in third.stdout
    why = cli("session", "why", "fill-3")
    assert why.code == 0
    assert "PENDING" in why.stdout
    assert AGENT in why.stdout
    assert json.loads(cli("session", "why", "fill-3", "--json").stdout)["status"] == "PENDING"
    assert cli("session", "destroy", "fill-1").code == 0
    waited = cli("session", "wait", "fill-3", "--timeout", "30")
    assert waited.code == 0, waited
    assert waited.stdout.strip().endswith("is RUNNING.")
    events = cli("session", "events", "fill-1", "--json")
    statuses = [json.loads(line)["status"] for line in events.stdout.splitlines()]
    assert statuses[0] == "PENDING"
    assert statuses[-1] == "TERMINATED"


def test_enqueue_only_and_wait_timeout(cli: Cli) -> None:
    blocker = cli("session", "create", "-r", "cuda.shares=0.5", "--name", "blocker", "python")
    assert blocker.code == 0
    created = cli(
        "session", "create", "--enqueue-only", "-r", "cuda.shares=2", "--name", "q", "python"
    )
    assert created.code == 0
    assert "is enqueued (PENDING: enqueued)" in created.stdout
    waited = cli("session", "wait", "q", "--timeout", "0.5")
    assert waited.code == 1
    assert "is PENDING, not RUNNING" in waited.stderr


def test_logs_of_a_session(cli: Cli) -> None:
    created = cli("session", "create", "--name", "logged", "python")
    assert created.code == 0
    logs = cli("session", "logs", "logged")
    assert logs.code == 0  # an idle kernel has printed nothing


def test_config_slots(cli: Cli) -> None:
    slots = json.loads(cli("config", "slots", "--json").stdout)
    assert slots["cuda.shares"] == "count"
    details = cli("config", "slots", "--details")
    assert "fGPU" in details.stdout


def test_admin_commands(cli: Cli) -> None:
    tag = uuid.uuid4().hex[:8]
    email = f"cli-{tag}@example.com"
    made = cli("admin", "policy", "create", f"p-{tag}", "--slots", "cpu=2", "--max-sessions", "3")
    assert made.code == 0, made
    user = cli(
        "admin",
        "user",
        "create",
        email,
        "--password",
        "password-123",
        "--policy",
        f"p-{tag}",
        "--json",
    )
    assert user.code == 0, user
    keypair = json.loads(user.stdout)["keypair"]
    assert keypair["resource_policy"] == f"p-{tag}"
    users = cli("admin", "user", "list")
    assert email in users.stdout
    keys = json.loads(cli("admin", "keypair", "list", "--user", email, "--json").stdout)
    assert [k["access_key"] for k in keys] == [keypair["access_key"]]
    extra = cli("admin", "keypair", "create", email)
    assert "Secret key: " in extra.stdout
    assert "secret_key" not in keys[0]
    updated = cli("admin", "keypair", "update", keypair["access_key"], "--inactive", "--json")
    assert json.loads(updated.stdout)["is_active"] is False
    deleted = cli("admin", "keypair", "delete", keypair["access_key"], "--json")
    assert json.loads(deleted.stdout) == {"result": "deleted"}
    changed = cli("admin", "user", "update", email, "--slots", "cpu=4", "--json")
    assert json.loads(changed.stdout)["user"]["total_resource_slots"] == {"cpu": "4"}
    assert cli("admin", "user", "update", email, "--slots", "cpu=4").stdout == (
        f"User {email} updated.\n"
    )
    gone = cli("admin", "user", "delete", email, "--json")
    assert json.loads(gone.stdout)["user"]["status"] == "deleted"
    policies = json.loads(cli("admin", "policy", "list", "--json").stdout)
    assert {p["name"]: p["max_concurrent_sessions"] for p in policies}[f"p-{tag}"] == 3
    sg = f"sg-{tag}"
    made_sg = cli(
        "admin", "sgroup", "create", sg, "--scheduler", "lifo", "--opt", "pending_timeout=30"
    )
    assert made_sg.code == 0, made_sg
    groups = json.loads(cli("admin", "sgroup", "list", "--json").stdout)
    assert {g["name"]: g["scheduler_opts"].get("pending_timeout") for g in groups}[sg] == 30
    opened = cli("admin", "sgroup", "associate", sg, "--domain", "default")
    assert opened.code == 0, opened
    assert "domains: default" in opened.stdout
    shown = json.loads(cli("admin", "sgroup", "associations", sg, "--json").stdout)
    assert shown == {"domains": ["default"], "groups": [], "keypairs": []}
    closed = cli("admin", "sgroup", "dissociate", sg, "--domain", "default", "--json")
    assert json.loads(closed.stdout)["domains"] == []
    neither = cli("admin", "sgroup", "associate", sg)
    assert neither.code == 2
    assert "exactly one of --domain, --group or --access-key" in neither.stderr
    assert cli("admin", "sgroup", "update", sg, "--inactive").code == 0
    assert cli("admin", "sgroup", "delete", sg).code == 0
    denied = cli(
        "agent",
        "list",
        env={
            "ACCELSHARE_ACCESS_KEY": keypair["access_key"],
            "ACCELSHARE_SECRET_KEY": keypair["secret_key"],
        },
    )
    assert denied.code == 1
    assert denied.stderr.startswith("error: ")


# -- bad arguments: one clear line on stderr, nothing on stdout, a non-zero exit -----------------


@pytest.mark.parametrize(
    ("args", "code", "words"),
    [
        (["session", "create", "-r", "cpu", "python"], 2, "expected KEY=VALUE"),
        (["session", "create", "-r", "cpu=1", "-r", "cpu=2", "python"], 2, "given twice"),
        (["session", "create", "-r", "cpu=-1", "python"], 2, "cannot be negative"),
        (["session", "create", "-r", "cpu=1"], 2, "missing IMAGE"),
        (
            ["session", "create", "-r", "nope.device=1", "python"],
            1,
            "Unknown requested resource slot: nope.device",
        ),
        (
            ["session", "create", "-r", "cuda.shares=0.25", "python"],
            1,
            "nearest valid amounts: 0.2 and 0.3",
        ),
        # amounts the core's strict parser refuses never leave the CLI (a usage error)
        (["session", "create", "-r", "cpu=lots", "python"], 2, "-r cpu=lots: expected"),
        (["session", "create", "-r", "cuda.shares=1_0", "python"], 2, "no '_' separators"),
        (["session", "create", "-r", "cpu=２", "python"], 2, "ASCII digits only"),
        (["session", "create", "--type", "daemon", "python"], 2, "interactive or batch"),
        (
            ["session", "create", "--starts-at", "tomorrow", "python", "--", "true"],
            2,
            "ISO 8601",
        ),
        (["session", "create", "--starts-at", "+5m", "python"], 2, "is for batch sessions"),
        (
            ["session", "create", "--starts-at", "+5m", "-t", "interactive", "shell", "--", "x"],
            2,
            "is for batch sessions",
        ),
        (["session", "create", "-e", "1X=2", "python"], 2, "NAME=VALUE"),
        (["session", "create", "--service", "Web=80", "python"], 2, "NAME=PORT"),
        (["session", "info", "no-such-session"], 1, "accelshare session list"),
        (["agent", "info", "i-nowhere"], 1, "accelshare agent list"),
        (["admin", "query", "{ agent }", "--variables", "{nope"], 2, "not valid JSON"),
        (["admin", "query", "{ nonsense }"], 1, "GraphQL query failed"),
    ],
    ids=lambda v: "-".join(v) if isinstance(v, list) else None,
)
def test_bad_arguments_give_one_line(cli: Cli, args: list[str], code: int, words: str) -> None:
    result = cli(*args)
    assert result.code == code, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result
    assert lines[0].startswith("error: ")
    assert words in lines[0]
    if args[:2] != ["admin", "query"]:
        assert result.stdout == ""


# -- errors click finds itself (types, ranges, choices, missing arguments): one line, exit 2 --


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["session", "create", "--priority", "abc", "python"], "'--priority'"),
        (["session", "create", "--priority", "101", "python"], "'--priority'"),
        (["session", "create", "--max-wait", "-1", "python"], "'--max-wait'"),
        (["session", "create", "--no-such-flag", "python"], "No such option: --no-such-flag"),
        (["session", "info"], "Missing argument 'REF'"),
        (["session", "destroy"], "Missing argument"),
        (["agent", "alloc-map"], "Missing argument"),
        (["dev", "up", "--agents", "0"], "'--agents'"),
        (["dev", "up", "--allocation-mode", "half"], "'half'"),
        (["dev", "up", "--port", "0"], "'--port'"),
        (["mgr", "etcd", "get"], "Missing argument"),
        (["mgr", "dbschema", "show", "--config", "/no/such/manager.toml"], "'--config'"),
        (["admin", "user", "create"], "Missing argument"),
        (["session", "nope"], "No such command 'nope'"),
    ],
    ids=lambda v: "-".join(v) if isinstance(v, list) else None,
)
def test_usage_errors_are_one_line_with_a_hint(args: list[str], words: str) -> None:
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr  # no usage box
    assert lines[0].startswith("error: "), lines
    assert words in lines[0]
    group = [a for a in args if not a.startswith("-")]
    path = " ".join(["accelshare", *group[: 3 if args[0] in ("mgr", "admin") else 2]])
    if args[:2] == ["session", "nope"]:
        path = "accelshare session"
    assert lines[0].endswith(f"; try '{path} --help'"), lines[0]


def test_no_keys_configured_says_what_to_do(tmp_path: object) -> None:
    env = {k: None for k in os.environ if k.startswith(("ACCELSHARE_", "BACKEND_"))}
    result = CliRunner().invoke(app, ["session", "list"], env={**env, "HOME": str(tmp_path)})
    assert result.exit_code == 1
    assert "source .accelshare/client.env" in result.stderr


# -- help --------------------------------------------------------------------------------------


def _commands(group: Any, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found = []
    for name, command in getattr(group, "commands", {}).items():
        found.append((*path, name))
        found.extend(_commands(command, (*path, name)))
    return found


ALL_COMMANDS = _commands(typer.main.get_command(app))


def _command(path: tuple[str, ...]) -> Any:
    command: Any = typer.main.get_command(app)
    for name in path:
        command = command.commands[name]
    return command


LEAF_COMMANDS = [path for path in ALL_COMMANDS if not hasattr(_command(path), "commands")]


def _squashed(text: str) -> str:
    """Without any whitespace: help is rewrapped (and may break at hyphens)."""
    return "".join(text.split())


def test_the_command_tree_is_walked() -> None:
    assert ("session", "create") in LEAF_COMMANDS
    assert ("mgr", "etcd", "put-json") in LEAF_COMMANDS
    assert ("admin", "keypair", "list") in LEAF_COMMANDS
    assert len(LEAF_COMMANDS) >= 40


@pytest.mark.parametrize("path", ALL_COMMANDS, ids=" ".join)
def test_every_command_has_help(path: tuple[str, ...]) -> None:
    """Every command and option is described, and the rendered --help shows each help
    text whole: nothing in [brackets] ("[etcd] table", "[default: 2g]") is swallowed as
    markup."""
    result = CliRunner().invoke(app, [*path, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.stdout
    shown = _squashed(result.stdout)
    command = _command(path)
    assert (command.help or "").strip(), f"{' '.join(path)} has no description"
    assert _squashed(command.help) in shown, f"{' '.join(path)}: its description is mangled"
    for param in command.params:
        text = getattr(param, "help", None) or ""
        if param.param_type_name == "option" and param.name != "help":
            assert text.strip(), f"{' '.join(path)} {param.opts[0]} has no help"
        for bracketed in re.findall(r"\[[^\]]*\]", text):
            assert _squashed(bracketed) in shown, f"{' '.join(path)}: {bracketed} is lost"
        assert _squashed(text) in shown, f"{' '.join(path)} {param.opts[0]}: help is mangled"


def test_help_keeps_the_bracketed_words_the_audit_found() -> None:
    expected = {
        ("dev", "up"): [
            "[default: configs/accelerator/two-fgpu.toml",
            "[default: 2g]",
            "[default: 8]",
            "[default: 0.1]",
        ],
        ("mgr", "etcd", "get"): ["with an [etcd] or [config-store] table"],
        ("mgr", "dbschema", "show"): ["its [db] table"],
        ("admin", "sgroup", "create"): ["[agent] scaling-group"],
    }
    for path, words in expected.items():
        shown = _squashed(CliRunner().invoke(app, [*path, "--help"]).stdout)
        for word in words:
            assert _squashed(word) in shown, (path, word)


@pytest.mark.parametrize("path", LEAF_COMMANDS, ids=" ".join)
def test_every_command_takes_json(path: tuple[str, ...]) -> None:
    """The README's promise: every command takes --help and --json."""
    options = {opt for param in _command(path).params for opt in param.opts}
    assert "--json" in options, f"`accelshare {' '.join(path)}` has no --json"
    assert "--help" in CliRunner().invoke(app, [*path, "--help"]).stdout


def test_the_real_entry_point(cluster: LocalCluster) -> None:
    """``python -m accelshare.client.cli`` (what the console script runs) in a process."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELSHARE_", "BACKEND_"))}
    result = subprocess.run(
        [sys.executable, "-m", "accelshare.client.cli", "agent", "list", "--json"],
        env={**env, **cluster.client_env()},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert [a["id"] for a in json.loads(result.stdout)] == [AGENT]
