"""``backend.ai session upload``, ``session download`` and ``session ls`` (backend.ai-client
25.5.2, unchanged) against a local cluster: files go into and out of a running session's
working folder through the manager and the agent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from accelshare.devcluster import LocalCluster

from .conftest import Bai

pytestmark = pytest.mark.integration


def test_upload_ls_download_and_refusals(bai: Bai, tmp_path: Path) -> None:
    bai.ok("session", "create", "--name", "compat-files", "-r", "cpu=1", "-r", "mem=1g", "python")
    local = tmp_path / "local"
    (local / "data").mkdir(parents=True)
    (local / "data" / "hello.txt").write_text("hello from the client\n")
    blob = os.urandom(3 * 1024 * 1024 + 5)  # over the manager's 1 MiB body limit
    (local / "big.bin").write_bytes(blob)

    up = bai.ok("session", "upload", "compat-files", "data/hello.txt", "big.bin", cwd=local)
    assert "Uploaded." in up.output

    # the files are in the session's working folder, seen from inside
    ran = bai.sdk(
        "execute",
        name="compat-files",
        code=(
            "import os; home = os.path.expanduser('~');"
            " print(os.getcwd(), home, sorted(os.listdir(home)));"
            " print(open(home + '/data/hello.txt').read().strip(),"
            " os.path.getsize(home + '/big.bin'))"
        ),
    )
    console = json.dumps(ran["results"])
    assert "hello from the client" in console
    assert str(len(blob)) in console

    listed = bai.ok("session", "ls", "compat-files").output
    assert "big.bin" in listed
    assert "data" in listed
    inner = bai.ok("session", "ls", "compat-files", "/home/work/data").output
    assert "hello.txt" in inner

    dest = tmp_path / "down"
    dest.mkdir()
    down = bai.ok(
        "session", "download", "compat-files", "data/hello.txt", "/home/work/big.bin",
        "--dest", str(dest),
    )  # fmt: skip
    assert "Downloaded to" in down.output
    assert (dest / "hello.txt").read_text() == "hello from the client\n"
    assert (dest / "big.bin").read_bytes() == blob
    folder = tmp_path / "folder"
    folder.mkdir()
    bai.ok("session", "download", "compat-files", "data", "--dest", str(folder))
    assert (folder / "data" / "hello.txt").read_text() == "hello from the client\n"

    # out of the working folder, missing files: refused, naming the path
    outside = bai("session", "download", "compat-files", "../../etc/passwd", "--dest", str(dest))
    assert outside.code != 0
    assert "400" in outside.output
    assert not (dest / "passwd").exists()
    system = bai("session", "ls", "compat-files", "/etc")
    assert system.code != 0
    assert "/home/work" in system.output
    missing = bai("session", "download", "compat-files", "nope.txt", "--dest", str(dest))
    assert missing.code != 0
    assert "404" in missing.output

    bai.ok("session", "destroy", "compat-files")
    ended = bai("session", "ls", "compat-files")
    assert ended.code != 0
    assert "409" in ended.output
    assert "TERMINATED" in ended.output


def test_run_uploads_its_files_then_executes(bai: Bai, tmp_path: Path) -> None:
    """``backend.ai run IMAGE FILES --exec CMD``: the files are uploaded, the client's
    default clean and build ("*") do nothing, and the command runs with the files there."""
    local = tmp_path / "src"
    local.mkdir()
    (local / "main.py").write_text("print('sum', sum(range(10)))\n")
    ran = bai(
        "run", "--rm", "-r", "cpu=1", "-r", "mem=1g", "--name", "compat-run-files",
        "--exec", "python main.py; exit 3", "python", "main.py", cwd=local,
    )  # fmt: skip
    assert "sum 45" in ran.output, ran.output
    # the client reports the command's exit code (a batch `run` itself exits 0)
    assert "Execution finished. (exit code = 3)" in ran.output, ran.output


def _accelshare(cluster: LocalCluster, *args: str, cwd: Path | None = None) -> Any:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELSHARE_")}
    env.update(cluster.client_env())
    return subprocess.run(
        [sys.executable, "-m", "accelshare.client.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=120,
        check=False,
    )


def test_accelshare_session_upload_download_ls(
    bai: Bai, cluster: LocalCluster, tmp_path: Path
) -> None:
    """The same through ``accelshare session upload|download|ls``."""
    bai.ok("session", "create", "--name", "cli-files", "-r", "cpu=1", "-r", "mem=1g", "python")
    local = tmp_path / "local"
    (local / "in").mkdir(parents=True)
    (local / "in" / "a.txt").write_text("alpha\n")
    up = _accelshare(cluster, "session", "upload", "cli-files", "in/a.txt", cwd=local)
    assert up.returncode == 0, up.stderr
    assert "uploaded /home/work/in/a.txt" in up.stdout
    listed = _accelshare(cluster, "session", "ls", "cli-files", "in", "--json")
    assert listed.returncode == 0, listed.stderr
    (entry,) = json.loads(listed.stdout)
    assert (entry["filename"], entry["size"]) == ("a.txt", 6)
    dest = tmp_path / "dest"
    down = _accelshare(cluster, "session", "download", "cli-files", "in", "--dest", str(dest))
    assert down.returncode == 0, down.stderr
    assert (dest / "in" / "a.txt").read_text() == "alpha\n"
    # --json: what went where
    up_json = _accelshare(
        cluster, "session", "upload", "cli-files", "in/a.txt", "--json", cwd=local
    )
    assert json.loads(up_json.stdout) == {"uploaded": ["/home/work/in/a.txt"]}, up_json.stderr
    again = tmp_path / "again"
    down_json = _accelshare(
        cluster, "session", "download", "cli-files", "in/a.txt", "--dest", str(again), "--json"
    )
    assert json.loads(down_json.stdout) == {"downloaded": [str(again / "a.txt")]}, down_json.stderr
    assert (again / "a.txt").read_text() == "alpha\n"
    refused = _accelshare(cluster, "session", "ls", "cli-files", "../..")
    assert refused.returncode != 0
    assert "'..'" in refused.stderr
