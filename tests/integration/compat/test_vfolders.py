"""The official client's ``vfolder`` commands (and ``session create -m``) against a
local cluster with its storage proxy (issue #29): the client is unchanged, its bytes go
to the proxy with tus and come back whole."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import uuid
from pathlib import Path

import pytest

from accelshare.client import AccelshareClient
from accelshare.devcluster import LocalCluster

from .conftest import Bai


def _default_host(bai: Bai) -> str:
    hosts = bai.ok("vfolder", "list-hosts").output
    return hosts.split("Default vfolder host: ", 1)[1].split()[0]


def _user(cluster: LocalCluster, email: str) -> tuple[str, str]:
    """A new user of the default project; its access and secret key."""
    return _new_user(cluster, email)[1:]


def _new_user(cluster: LocalCluster, email: str) -> tuple[str, str, str]:
    """A new user of the default project; its id, access and secret key."""

    async def create() -> tuple[str, str, str]:
        async with AccelshareClient(cluster.client_config()) as client:
            created = await client.admin.create_user(email, "long enough password")
        assert created.keypair is not None
        assert created.keypair.secret_key is not None
        return created.user.id, created.keypair.access_key, created.keypair.secret_key

    return asyncio.run(create())


def _options(cluster: LocalCluster, name: str) -> dict[str, object]:
    """The folder's own permission and cloneable flag (accelshare's SDK: an
    ``update-options`` that changes nothing answers them; the official client's
    ``vfolder info`` shows the caller's permission, not the folder's)."""

    async def read() -> dict[str, object]:
        async with AccelshareClient(cluster.client_config()) as client:
            return await client.folders.update_options(name)

    return asyncio.run(read())


@pytest.fixture
def storage(bai: Bai) -> Bai:
    """The client, once the cluster's storage proxy serves a volume (the proxy,
    ``accelshare.storage``, is what ``dev up`` runs next to the manager)."""
    if importlib.util.find_spec("accelshare.storage") is None:
        pytest.skip("this build has no storage proxy (accelshare.storage)")
    hosts = bai("vfolder", "list-hosts")
    usable = hosts.output.partition("Usable hosts:")[2].strip()
    if hosts.code != 0 or not usable:
        pytest.fail(f"the local cluster's storage proxy serves no volume: {hosts}")
    return bai


def test_folder_life_cycle(storage: Bai, tmp_path: Path) -> None:
    bai = storage
    name = f"compat-{uuid.uuid4().hex[:8]}"
    hosts = bai.ok("vfolder", "list-hosts").output
    assert "Default vfolder host: " in hosts
    default_host = hosts.split("Default vfolder host: ", 1)[1].split()[0]
    assert ":" in default_host

    created = bai.ok("vfolder", "create", name, default_host, "--cloneable").output
    assert f'Virtual folder "{name}" is created.' in created
    listed = bai.ok("--output", "json", "vfolder", "list").json()
    mine = [f for f in listed["items"] if f["name"] == name]
    assert len(mine) == 1
    assert mine[0]["host"] == default_host
    filtered = bai.ok(
        "--output", "json", "vfolder", "list",
        "--filter", f'name == "{name}" & status == "READY" & permission in ["READ_WRITE"]',
    ).json()  # fmt: skip
    assert [f["name"] for f in filtered["items"]] == [name]
    info = bai.ok("vfolder", "info", name).output
    assert f'Virtual folder "{name}"' in info
    assert "- Number of files: 0" in info

    # upload from a directory, with a sub-directory made first
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    payload = bytes(range(256)) * 4096  # 1 MiB
    (src / "data.bin").write_bytes(payload)
    (src / "sub" / "note.txt").write_text("hello\n")
    up = bai.in_dir(src)
    up.ok("vfolder", "mkdir", name, "sub")
    assert "Done." in up.ok("vfolder", "upload", name, "data.bin", "sub/note.txt").output
    listing = bai.ok("vfolder", "ls", name).output
    assert "data.bin" in listing
    assert "1048576" in listing
    assert "note.txt" in bai.ok("vfolder", "ls", name, "sub").output
    assert "- Number of files: 2" in bai.ok("vfolder", "info", name).output

    # download, whole
    dst = tmp_path / "dst"
    dst.mkdir()
    bai.in_dir(dst).ok("vfolder", "download", name, "data.bin")
    assert (dst / "data.bin").read_bytes() == payload

    # mv, rm, rename
    assert "Moved." in bai.ok("vfolder", "mv", name, "data.bin", "sub/moved.bin").output
    assert "moved.bin" in bai.ok("vfolder", "ls", name, "sub").output
    assert "Done." in bai.ok("vfolder", "rm", "-r", name, "sub", input="y\n").output
    assert "sub" not in bai.ok("vfolder", "ls", name).output
    renamed = f"{name}-2"
    assert "Renamed." in bai.ok("vfolder", "rename", name, renamed).output
    assert renamed in json.dumps(bai.ok("--output", "json", "vfolder", "list").json())

    # clone, then delete (to the trash)
    clone = f"{name}-c"
    up.ok("vfolder", "upload", renamed, "data.bin")
    cloned = bai.ok("vfolder", "clone", renamed, clone, default_host).output
    assert "Cloning the vfolder is complete." in cloned
    copy = tmp_path / "copy"
    copy.mkdir()
    bai.in_dir(copy).ok("vfolder", "download", clone, "data.bin")
    assert (copy / "data.bin").read_bytes() == payload
    assert "Deleted." in bai.ok("vfolder", "delete", clone).output
    assert "delete-pending" in bai.ok("vfolder", "info", clone).output


def test_invite_share_and_read_only(storage: Bai, cluster: LocalCluster, tmp_path: Path) -> None:
    bai = storage
    name = f"compat-{uuid.uuid4().hex[:8]}"
    email = f"{name}@example.com"
    bob = bai.as_user(*_user(cluster, email))
    bai.ok("vfolder", "create", name, _default_host(bai))
    invited = bai.ok("vfolder", "invite", name, email, "-p", "ro").output
    assert "Invitation sent to:" in invited
    assert email in invited
    pending = bob.sdk("invitations")
    assert [i["vfolder_name"] for i in pending] == [name]
    bob.sdk("accept", inv_id=pending[0]["id"])
    info = bob.ok("vfolder", "info", name).output
    assert "- Owner: False" in info
    assert "- Permission: ro" in info
    (tmp_path / "x.txt").write_text("x")
    refused = bob.in_dir(tmp_path)("vfolder", "upload", name, "x.txt")
    assert refused.code != 0
    assert "read-only" in refused.output

    # a project folder shared with a member, read-write
    project = f"{name}-p"
    created = bai("vfolder", "create", project, _default_host(bai), "-g", "default")
    assert created.code == 0, created
    shared = bai.ok("vfolder", "share", project, email, "-p", "rw").output
    assert email in shared
    assert "- Permission: rw" in bob.ok("vfolder", "info", project).output


def test_session_create_mounts_a_folder(storage: Bai) -> None:
    bai = storage
    name = f"compat-{uuid.uuid4().hex[:8]}"
    bai.ok("vfolder", "create", name, _default_host(bai))
    unknown = bai(
        "session", "create", "-m", "compat-nosuch", "-r", "cpu=1", "-r", "mem=1g", "python"
    )
    assert unknown.code != 0
    assert "compat-nosuch" in unknown.output
    created = bai.ok(
        "session", "create", "-m", name, "-r", "cpu=1", "-r", "mem=1g",
        "--name", f"{name}-s", "python",
    )  # fmt: skip
    assert "created and ready" in created.output
    refused = bai("vfolder", "delete", name)
    assert refused.code != 0
    assert f"{name}-s" in refused.output
    bai.ok("session", "destroy", f"{name}-s")


def test_update_options(storage: Bai, cluster: LocalCluster) -> None:
    bai = storage
    name = f"compat-{uuid.uuid4().hex[:8]}"
    bai.ok("vfolder", "create", name, _default_host(bai))
    assert "- Clone Allowed: False" in bai.ok("vfolder", "info", name).output
    updated = bai.ok("vfolder", "update-options", name, "-p", "ro", "--set-cloneable", "true")
    assert "Updated." in updated.output
    assert "- Clone Allowed: True" in bai.ok("vfolder", "info", name).output
    options = _options(cluster, name)
    assert (options["name"], options["permission"], options["cloneable"]) == (name, "ro", True)
    # what is not given stays as it is
    bai.ok("vfolder", "update-options", name, "--set-cloneable", "false")
    options = _options(cluster, name)
    assert (options["permission"], options["cloneable"]) == ("ro", False)
    bad = bai("vfolder", "update-options", name, "-p", "rx")
    assert bad.code != 0
    assert "permission" in bad.output
    assert _options(cluster, name)["permission"] == "ro"


def test_admin_shared_vfolders_and_ownership(
    storage: Bai, cluster: LocalCluster, tmp_path: Path
) -> None:
    """``admin vfolder list-shared-vfolders`` / ``shared-vfolder-info`` /
    ``update-shared-vf-permission`` / ``remove-shared-vf-permission`` /
    ``change-vfolder-ownership``, as the superadmin."""
    bai = storage
    name = f"compat-{uuid.uuid4().hex[:8]}"
    email = f"{name}@example.com"
    bob_id, *bob_keys = _new_user(cluster, email)
    bob = bai.as_user(*bob_keys)
    bai.ok("vfolder", "create", name, _default_host(bai))
    shown = bai.ok("vfolder", "info", name).output
    folder_id = shown.split("(ID: ", 1)[1].split(")", 1)[0]
    vfid = str(uuid.UUID(folder_id))
    bai.ok("vfolder", "invite", name, email, "-p", "ro")
    pending = bob.sdk("invitations")
    bob.sdk("accept", inv_id=next(i["id"] for i in pending if i["vfolder_name"] == name))

    assert "Default vfolder host: " in bai.ok("admin", "vfolder", "list-hosts").output
    listed = bai.ok("admin", "vfolder", "list-shared-vfolders").output
    assert f'Virtual folder "{name}" (ID: {vfid})' in listed
    assert f"- email: {email}" in listed
    assert f"- uuid: {bob_id}" in listed
    shown = bai.ok("admin", "vfolder", "shared-vfolder-info", vfid).output
    assert f'Virtual folder "{name}" (ID: {vfid})' in shown
    assert "- Permission: ro" in shown
    assert "- Folder Type: user" in shown
    assert f"- email: {email}" in shown

    updated = bai.ok("admin", "vfolder", "update-shared-vf-permission", vfid, bob_id, "-p", "rw")
    assert "Updated." in updated.output
    assert "- Permission: rw" in bob.ok("vfolder", "info", name).output
    assert "- Permission: rw" in bai.ok("admin", "vfolder", "shared-vfolder-info", vfid).output
    bad = bai("admin", "vfolder", "update-shared-vf-permission", vfid, bob_id, "-p", "all")
    assert bad.code != 0
    assert "perm" in bad.output

    removed = bai.ok("admin", "vfolder", "remove-shared-vf-permission", vfid, bob_id)
    assert "Removed." in removed.output
    assert bob("vfolder", "info", name).code != 0
    assert f"(ID: {vfid})" not in bai.ok("admin", "vfolder", "list-shared-vfolders").output

    # the folder, with a file in it, becomes bob's; the file stays
    (tmp_path / "kept.txt").write_text("kept\n")
    bai.in_dir(tmp_path).ok("vfolder", "upload", name, "kept.txt")
    moved = bai.ok("admin", "vfolder", "change-vfolder-ownership", vfid, email)
    assert f"Now ownership of VFolder:{vfid} goes to User:{email}" in moved.output
    info = bob.ok("vfolder", "info", name).output
    assert "- Owner: True" in info
    assert f"- User ID: {bob_id}" in info
    assert "- Number of files: 1" in info
    assert "kept.txt" in bob.ok("vfolder", "ls", name).output
    got = tmp_path / "got"
    got.mkdir()
    bob.in_dir(got).ok("vfolder", "download", name, "kept.txt")
    assert (got / "kept.txt").read_text() == "kept\n"
    assert "- Owner: False" in bai.ok("vfolder", "info", name).output  # a superadmin sees it
    refused = bob("admin", "vfolder", "change-vfolder-ownership", vfid, email)
    assert refused.code != 0
    assert "superadmin" in refused.output


def test_list_own_invited_and_project(storage: Bai, cluster: LocalCluster) -> None:
    """``vfolder list-own``, ``list-invited``, ``list-project`` (GraphQL
    ``vfolder_own_list``, ``vfolder_invited_list``, ``vfolder_project_list``): a new
    user's own folders, the folders shared with it by invitation, its project's."""
    bai = storage
    name = f"compat-{uuid.uuid4().hex[:8]}"
    email = f"{name}@example.com"
    bob = bai.as_user(*_user(cluster, email))
    host = _default_host(bai)
    bai.ok("vfolder", "create", f"{name}-given", host)
    bai.ok("vfolder", "create", f"{name}-p", host, "-g", "default")
    bob.ok("vfolder", "create", f"{name}-bob", host)
    bai.ok("vfolder", "invite", f"{name}-given", email, "-p", "ro")
    pending = bob.sdk("invitations")
    bob.sdk("accept", inv_id=next(i["id"] for i in pending if i["vfolder_name"] == f"{name}-given"))

    def names(client: Bai, command: str) -> list[str]:
        listed = client.ok("--output", "json", "vfolder", command).json()
        return [item["name"] for item in listed["items"]]

    assert names(bob, "list-own") == [f"{name}-bob"]
    assert names(bob, "list-invited") == [f"{name}-given"]
    project = names(bob, "list-project")
    assert f"{name}-p" in project
    assert not {f"{name}-bob", f"{name}-given"} & set(project)
    mine = names(bai, "list-own")
    assert f"{name}-given" in mine
    assert not {f"{name}-bob", f"{name}-p"} & set(mine)
    # the table the client prints
    table = bob.ok("vfolder", "list-invited").output
    assert f"{name}-given" in table
    assert "ro" in table
