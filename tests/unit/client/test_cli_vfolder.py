"""``accelshare vfolder ...``: what each command asks of ``client.folders`` and prints
(the client's calls themselves are tested against a manager in
tests/component/manager/test_mgr_folders.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from accelshare.client.cli import app
from accelshare.client.cli import vfolder as vfolder_cli


class FakeFolders:
    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def __getattr__(self, method: str) -> Any:
        async def record(*args: Any, **kwargs: Any) -> Any:
            self.calls.append((method, args, kwargs))
            return ANSWERS.get(method)

        return record


ANSWERS: dict[str, Any] = {
    "hosts": {"default": "local:vol1", "allowed": ["local:vol1", "local:vol2"]},
    "create": {"name": "data", "id": "ab" * 16},
    "invite": ["bob@x.test"],
    "ls": [{"name": "a.txt", "size": 3, "mtime": 0.0, "mode": "-rw-r--r--"}],
    "mkdir": {"success": [{"item": "d", "msg": None}], "failed": [{"item": "e", "msg": "exists"}]},
}


class FakeClient:
    def __init__(self) -> None:
        self.folders = FakeFolders()


@pytest.fixture
def client(monkeypatch: pytest.MonkeyPatch) -> FakeClient:
    fake = FakeClient()

    def fake_call_api(work: Any, **_: Any) -> Any:
        return asyncio.run(work(fake))

    monkeypatch.setattr(vfolder_cli, "call_api", fake_call_api)
    return fake


def run(*args: str) -> Any:
    return CliRunner().invoke(app, ["vfolder", *args], env={"COLUMNS": "200"})


def test_list_hosts_prints_like_the_official_client(client: FakeClient) -> None:
    result = run("list-hosts")
    assert result.exit_code == 0, result.output
    assert "Default vfolder host: local:vol1" in result.output
    assert "Usable hosts: local:vol1, local:vol2" in result.output


def test_create_passes_every_option(client: FakeClient) -> None:
    result = run("create", "data", "local:vol2", "-g", "team", "-p", "ro", "--cloneable")
    assert result.exit_code == 0, result.output
    assert 'Virtual folder "data" is created.' in result.output
    assert client.folders.calls == [
        (
            "create",
            ("data",),
            {
                "host": "local:vol2",
                "group": "team",
                "usage_mode": "general",
                "permission": "ro",
                "cloneable": True,
            },
        )
    ]


def test_a_bad_permission_is_refused_before_anything_is_sent(client: FakeClient) -> None:
    result = run("invite", "data", "bob@x.test", "-p", "rwx")
    assert result.exit_code == 2
    assert "ro, rw or wd (received 'rwx')" in result.output
    assert client.folders.calls == []


def test_invite_ls_and_a_failed_mkdir(client: FakeClient) -> None:
    assert "\t- bob@x.test" in run("invite", "data", "bob@x.test", "-p", "ro").output
    calls = client.folders.calls
    assert calls == [("invite", ("data", ["bob@x.test"]), {"permission": "ro"})]
    listing = run("ls", "data", "sub")
    assert "a.txt" in listing.output
    assert calls[1:] == [("ls", ("data", "sub"), {})]
    made = run("mkdir", "data", "d", "e", "-p")
    assert made.exit_code == 1  # one failed
    assert "created d" in made.output
    assert "failed e: exists" in made.output


def test_upload_names_files_relative_to_the_base_dir(client: FakeClient, tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "x.csv").write_text("1,2\n")
    result = run("upload", "data", "sub/x.csv", "-b", str(tmp_path))
    assert result.exit_code == 0, result.output
    method, args, _ = client.folders.calls[-1]
    assert method == "upload"
    assert args == ("data", tmp_path / "sub" / "x.csv", "sub/x.csv")
    missing = run("upload", "data", "nope.csv", "-b", str(tmp_path))
    assert missing.exit_code == 2
    assert "nope.csv: not a file" in missing.output


def test_update_options_sends_only_what_is_given(client: FakeClient) -> None:
    result = run("update-options", "data", "-p", "ro", "--set-cloneable", "true")
    assert result.exit_code == 0, result.output
    assert "Updated." in result.output
    assert run("update-options", "data", "--set-cloneable", "no").exit_code == 0
    assert run("update-options", "data").exit_code == 0
    assert client.folders.calls == [
        ("update_options", ("data",), {"permission": "ro", "cloneable": True}),
        ("update_options", ("data",), {"permission": None, "cloneable": False}),
        ("update_options", ("data",), {"permission": None, "cloneable": None}),
    ]


def test_update_options_refuses_bad_values_before_anything_is_sent(client: FakeClient) -> None:
    bad_perm = run("update-options", "data", "-p", "rwx")
    assert bad_perm.exit_code == 2
    assert "ro, rw or wd (received 'rwx')" in bad_perm.output
    bad_bool = run("update-options", "data", "--set-cloneable", "maybe")
    assert bad_bool.exit_code == 2
    assert "--set-cloneable is true or false (received 'maybe')" in bad_bool.output
    assert client.folders.calls == []
