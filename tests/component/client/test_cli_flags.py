"""``session create`` flags and ``--json`` outputs through the real CLI, against the real
local cluster of conftest.py (manager + one agent with two 1.0-share mock GPUs)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any

from accelshare.devcluster import LocalCluster

Cli = Callable[..., Any]  # conftest.py's ``cli`` fixture: accelshare ARGS... -> CliResult

# a batch session that lasts
LONG = ["python", "--", "python", "-c", "import time; time.sleep(120)"]


def _sid(stdout: str) -> str:
    return stdout.split("Session ID ", 1)[1].split(maxsplit=1)[0]


def _info(cli: Cli, ref: str) -> dict[str, Any]:
    result = cli("session", "info", ref, "--json")
    assert result.code == 0, result
    doc: dict[str, Any] = json.loads(result.stdout)
    return doc


def test_priority_is_recorded(cli: Cli) -> None:
    created = cli("session", "create", "--priority", "42", "--name", "prio", "python")
    assert created.code == 0, created
    assert _info(cli, "prio")["priority"] == 42
    assert "priority       42" in cli("session", "info", "prio").stdout
    default = cli("session", "create", "--name", "prio-default", "python")
    assert default.code == 0, default
    assert _info(cli, "prio-default")["priority"] == 10


def test_resource_opts_forbid_fragmentation(cli: Cli) -> None:
    """0.6 + 0.6 leave 0.4 free on each GPU: 0.8 fits only split over both, which
    allow_fractional_resource_fragmentation=false forbids."""
    for name in ("frag-a", "frag-b"):
        made = cli("session", "create", "-r", "cuda.shares=0.6", "--name", name, "python")
        assert "is created and ready." in made.stdout, made
    refused = cli(
        "session", "create", "-r", "cuda.shares=0.8", "--name", "no-split",
        "--resource-opts", "allow_fractional_resource_fragmentation=false", "python",
    )  # fmt: skip
    assert refused.code == 0, refused
    assert "is enqueued (PENDING: " in refused.stdout
    assert "without fragmentation" in refused.stdout
    split = cli("session", "create", "-r", "cuda.shares=0.8", "--name", "split", "python")
    assert "is created and ready." in split.stdout, split
    held = _info(cli, "split")["kernels"][0]["deviceAllocs"]["cuda.shares"]
    assert sorted(held.values()) == ["0.4", "0.4"]
    assert _info(cli, "no-split")["status"] == "PENDING"


def test_a_request_no_agent_could_hold_is_refused_unless_waiting_for_agents(cli: Cli) -> None:
    """3 shares on the agent's two 1.0-share GPUs: refused with each slot's largest
    placement; ``--wait-for-agents`` queues it, and its reason says what it waits for."""
    refused = cli("session", "create", "-r", "cuda.shares=3", "--name", "huge", "python")
    assert refused.code != 0, refused
    assert "could hold this session" in refused.stderr + refused.stdout
    assert "cuda.shares 2" in refused.stderr + refused.stdout
    queued = cli(
        "session", "create", "-r", "cuda.shares=3", "--name", "huge", "--wait-for-agents",
        "python",
    )  # fmt: skip
    assert queued.code == 0, queued
    assert "is enqueued (PENDING: No agent could hold the request even if it were empty" in (
        queued.stdout
    )
    assert _info(cli, "huge")["status"] == "PENDING"


def test_starts_at_waits_before_start_time_then_runs(cli: Cli) -> None:
    created = cli("session", "create", "--starts-at", "+2s", "--name", "later", *LONG)
    assert created.code == 0, created
    assert "is enqueued (PENDING: Before start time (" in created.stdout
    waited = cli("session", "wait", "later", "--status", "RUNNING", "--timeout", "30")
    assert waited.code == 0, waited
    doc = _info(cli, "later")
    assert doc["status"] == "RUNNING"
    assert doc["type"] == "batch"
    history = doc["statusHistory"]
    assert history[0]["to"] == "PENDING"
    assert history[-1]["to"] == "RUNNING"
    starts_at = datetime.fromisoformat(doc["startsAt"])
    assert datetime.fromisoformat(doc["startedAt"]) >= starts_at
    first_pending = datetime.fromisoformat(history[0]["at"])
    assert (starts_at - first_pending).total_seconds() > 1  # +2s, not "now"


def test_environ_reaches_the_command_and_logs_show_it(cli: Cli) -> None:
    tag = uuid.uuid4().hex[:8]
    created = cli(
        "session", "create", "-e", "FOO=bar", "-e", f"TAG={tag}", "--name", "env-echo",
        "shell", "--", 'echo "FOO=$FOO"; echo "tag $TAG" >&2; echo done',
    )  # fmt: skip
    assert created.code == 0, created
    sid = _sid(created.stdout)
    waited = cli("session", "wait", "env-echo", "--status", "TERMINATED", "--timeout", "60")
    assert waited.code == 0, waited
    logs = cli("session", "logs", "env-echo")
    assert logs.code == 0, logs
    assert logs.stdout.splitlines() == ["FOO=bar", f"tag {tag}", "done"]
    as_json = cli("session", "logs", sid, "--json")
    assert as_json.code == 0, as_json
    assert json.loads(as_json.stdout) == {
        "session_id": sid,
        "session_name": "env-echo",
        "logs": f"FOO=bar\ntag {tag}\ndone\n",
    }


def test_logs_json_of_an_unknown_session(cli: Cli) -> None:
    result = cli("session", "logs", "no-such-session", "--json")
    assert result.code == 1, result
    assert result.stdout == "", result
    # the CLI's own line is the last; a log record of another test's leftover task may be
    # written to the same (captured) stderr before it by logging's last-resort handler
    assert result.stderr.splitlines()[-1].startswith("error: "), result


def test_mgr_etcd_json(cli: Cli, cluster: LocalCluster) -> None:
    config = str(cluster.layout.manager_toml)  # its [config-store] is the cluster's
    key = f"test/cli-{uuid.uuid4().hex[:8]}"

    def etcd(*args: str) -> Any:
        result = cli("mgr", "etcd", *args, "--config", config, "--json")
        assert result.code == 0, result
        return json.loads(result.stdout)

    assert etcd("put", f"{key}/a", "1") == {
        "ok": True,
        "key": f"{key}/a",
        "value": "1",
        "scope": "global",
    }
    assert etcd("get", f"{key}/a") == {"key": f"{key}/a", "scope": "global", "value": "1"}
    mode = etcd("get", "config/plugins/accelerator/cuda/allocation_mode")
    assert mode["value"] == "fractional"
    tree = json.dumps({"b": {"c": "2"}, "d": "3"})
    written = cli("mgr", "etcd", "put-json", key, "-", "--config", config, "--json", input=tree)
    assert written.code == 0, written
    assert json.loads(written.stdout) == {
        "ok": True,
        "key": key,
        "keys": 2,
        "replace": False,
        "scope": "global",
    }
    assert etcd("get", key, "--prefix") == {"a": "1", "b": {"c": "2"}, "d": "3"}
    assert etcd("move-subtree", f"{key}/b", f"{key}/e")["moved"] == 1
    assert etcd("delete", f"{key}/d") == {
        "ok": True,
        "key": f"{key}/d",
        "prefix": False,
        "scope": "global",
    }
    assert etcd("get", key, "--prefix") == {"a": "1", "e": {"c": "2"}}
    assert etcd("delete", key, "--prefix")["prefix"] is True
    assert etcd("get", key, "--prefix") == {}
    missing = cli("mgr", "etcd", "get", f"{key}/a", "--config", config, "--json")
    assert missing.code == 1
    assert missing.stderr.startswith("error: no value at")


def test_mgr_dbschema_json(cli: Cli, cluster: LocalCluster) -> None:
    config = str(cluster.layout.manager_toml)
    shown = cli("mgr", "dbschema", "show", "--config", config, "--json")
    assert shown.code == 0, shown
    doc = json.loads(shown.stdout)
    assert doc["exists"] is True
    assert doc["is_current"] is True
    assert doc["current"] == doc["head"]
    assert doc["database"].endswith("manager.db")
    upgraded = json.loads(cli("mgr", "dbschema", "upgrade", "--config", config, "--json").stdout)
    assert upgraded["current"] == doc["head"]
    assert upgraded["is_current"] is True
