"""``accelshare vfolder ...`` against the local cluster and its storage proxy."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

Cli = Callable[..., Any]  # conftest.py's ``cli`` fixture: accelshare ARGS... -> CliResult


def test_vfolder_commands(cli: Cli, tmp_path: Path) -> None:
    name = f"cli-{uuid.uuid4().hex[:8]}"
    hosts = cli("vfolder", "list-hosts")
    assert hosts.code == 0, hosts
    assert "Default vfolder host: local:volume1" in hosts.stdout

    created = cli("vfolder", "create", name)
    assert created.code == 0, created
    assert f'Virtual folder "{name}" is created.' in created.stdout

    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    payload = b"x" * 300_000
    (src / "a" / "big.bin").write_bytes(payload)
    assert cli("vfolder", "mkdir", name, "a").code == 0
    uploaded = cli("vfolder", "upload", name, "a/big.bin", "-b", str(src))
    assert uploaded.code == 0, uploaded
    assert "Uploaded a/big.bin as a/big.bin" in uploaded.stdout

    listed = json.loads(cli("vfolder", "ls", name, "a", "--json").stdout)
    assert [(i["name"], i["size"]) for i in listed] == [("big.bin", 300_000)]
    info = json.loads(cli("vfolder", "info", name, "--json").stdout)
    assert info["numFiles"] == 1
    assert info["used_bytes"] == 300_000

    dest = tmp_path / "dest"
    dest.mkdir()
    got = cli("vfolder", "download", name, "a/big.bin", "--dest", str(dest))
    assert got.code == 0, got
    assert (dest / "big.bin").read_bytes() == payload
    again = cli("vfolder", "download", name, "a/big.bin", "--dest", str(dest))
    assert again.code == 1
    assert "exists" in again.stderr

    assert cli("vfolder", "mv", name, "a/big.bin", "b.bin").code == 0
    assert cli("vfolder", "rm", name, "a").code == 0
    names = [i["name"] for i in json.loads(cli("vfolder", "ls", name, "--json").stdout)]
    assert names == ["b.bin"]
    bad = cli("vfolder", "mv", name, "b.bin", "../escape")
    assert bad.code == 1
    assert "HTTP 400" in bad.stderr

    updated = cli("vfolder", "update-options", name, "--set-cloneable", "true", "--json")
    assert updated.code == 0, updated
    assert json.loads(updated.stdout)["cloneable"] is True
    assert json.loads(cli("vfolder", "info", name, "--json").stdout)["cloneable"] is True

    assert cli("vfolder", "clone", name, f"{name}-copy").code == 0
    assert cli("vfolder", "rename", name, f"{name}-r").code == 0
    assert cli("vfolder", "delete", f"{name}-r").code == 0
    trashed = json.loads(cli("vfolder", "info", f"{name}-r", "--json").stdout)
    assert trashed["status"] == "delete-pending"
    assert cli("vfolder", "purge", f"{name}-r").code == 0
    listed_names = [f["name"] for f in json.loads(cli("vfolder", "list", "--json").stdout)]
    assert f"{name}-copy" in listed_names
    assert f"{name}-r" not in listed_names


def test_session_create_mounts_folders(cli: Cli) -> None:
    name = f"cli-{uuid.uuid4().hex[:8]}"
    assert cli("vfolder", "create", name).code == 0
    unknown = cli("session", "create", "-r", "cpu=1", "-r", "mem=256", "-m", "cli-nosuch", "python")
    assert unknown.code == 1
    assert "No folder 'cli-nosuch' to mount" in unknown.stderr
    created = cli(
        "session", "create", "-r", "cpu=1", "-r", "mem=256", "-m", f"{name}:/data:ro",
        "--name", f"{name}-s", "python",
    )  # fmt: skip
    assert created.code == 0, created
    refused = cli("vfolder", "delete", name)
    assert refused.code == 1
    assert f"'{name}-s'" in refused.stderr
    assert cli("session", "destroy", f"{name}-s").code == 0
    assert cli("vfolder", "delete", name).code == 0
