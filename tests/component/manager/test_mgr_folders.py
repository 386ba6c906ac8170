"""Storage folders through the ``/folders`` routes, against an in-process storage proxy
that implements the contract (``accelshare_testkit.fake_storage``): names, owners and
permissions, shares and invitations, limits, the trash, files and session mounts."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from accelshare.client import AccelshareClient
from accelshare.client.config import ClientConfig
from accelshare.manager.enums import VFolderStatus
from accelshare.manager.models import GroupMember, User, VFolder
from accelshare.protocol.storage import StorageErrorType
from accelshare_testkit.fake_storage import FakeStorageProxy

from .cluster import Cluster, running_cluster


@dataclass
class Env:
    cluster: Cluster
    proxy: FakeStorageProxy
    access_keys: dict[str, str] = field(default_factory=dict)  # e-mail -> access key

    async def user(
        self, email: str, *, role: str = "user", group: str | None = None
    ) -> httpx.AsyncClient:
        body: dict[str, Any] = {"email": email, "password": "long enough password", "role": role}
        if group:
            body["group"] = group
        response = await self.cluster.admin.post("/admin/users", json=body)
        assert response.status_code == 201, response.text
        keypair = response.json()["keypair"]
        self.access_keys[email] = keypair["access_key"]
        return self.cluster.client(keypair["access_key"], keypair["secret_key"])


@pytest.fixture
async def env(db_url: str, tmp_path: Path) -> AsyncIterator[Env]:
    """SQLite and PostgreSQL (``db_url``), a fake proxy with the volumes vol1 and vol2."""
    proxy = FakeStorageProxy(tmp_path / "volumes", volumes=["vol1", "vol2"])
    async with running_cluster(
        db_url,
        tmp_path / "state",
        storage_transport=proxy.transport,
    ) as cluster:
        await proxy.register(cluster.manager.store, "local")
        yield Env(cluster, proxy)


async def create(client: httpx.AsyncClient, name: str, **body: Any) -> httpx.Response:
    return await client.post("/folders", json={"name": name, **body})


def problem(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body: dict[str, Any] = response.json()
    return body


async def test_hosts_create_list_info(env: Env) -> None:
    alice = await env.user("alice@x.test")
    hosts = (await alice.get("/folders/_/hosts")).json()
    assert hosts["default"] == "local:vol1"
    assert hosts["allowed"] == ["local:vol1", "local:vol2"]
    assert (await alice.get("/folders/_/allowed_types")).json() == ["user", "group"]

    created = await create(alice, "data", host="local:vol2", cloneable=True)
    assert created.status_code == 201, created.text
    folder = created.json()
    assert folder["name"] == "data"
    assert folder["host"] == "local:vol2"
    assert folder["ownership_type"] == "user"
    assert folder["status"] == "ready"
    assert folder["permission"] == "wd"
    assert folder["is_owner"] is True
    assert (env.proxy.root / "vol2" / folder["id"]).is_dir()

    (env.proxy.root / "vol2" / folder["id"] / "a.txt").write_bytes(b"12345")
    ident = (await alice.request("GET", "/folders/_/id", json={"name": "data"})).json()
    assert ident == {"id": folder["id"], "name": "data"}
    info = (await alice.get(f"/folders/{folder['id']}")).json()
    assert info["numFiles"] == 1
    assert info["used_bytes"] == 5
    assert info["is_owner"] is True
    assert info["type"] == "user"
    assert info["cloneable"] is True
    listed = (await alice.get("/folders")).json()
    assert [f["name"] for f in listed] == ["data"]

    # default host
    second = (await create(alice, "second")).json()
    assert second["host"] == "local:vol1"


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("", "name is required"),
        ("a/b", "no '/'"),
        (".hidden", "not starting with '.'"),
        ("x" * 65, "1 to 64 characters"),
        ("bad\x00name", "control character"),
    ],
)
async def test_bad_names_are_refused(env: Env, name: str, words: str) -> None:
    alice = await env.user("alice@x.test")
    body = problem(await create(alice, name), 400)
    assert body["field"] == "name"
    assert words in body["detail"]
    assert env.proxy.calls == []  # nothing reached the proxy


async def test_names_unique_per_owner_and_unknown_hosts(env: Env) -> None:
    alice = await env.user("alice@x.test")
    bob = await env.user("bob@x.test")
    assert (await create(alice, "data")).status_code == 201
    body = problem(await create(alice, "data"), 409)
    assert "already exists" in body["detail"]
    assert (await create(bob, "data")).status_code == 201  # another owner
    body = problem(await create(alice, "x", host="local:nope"), 400)
    assert body["field"] == "host"
    assert "local:vol1" in body["expected"]
    body = problem(await create(alice, "x", host="other:vol1"), 400)
    assert body["field"] == "host"
    assert "No storage proxy 'other'" in body["detail"]
    body = problem(await create(alice, "x", host="novolume"), 400)
    assert body["expected"] == "<proxy>:<volume>"


async def test_someone_elses_folder_is_404(env: Env) -> None:
    alice = await env.user("alice@x.test")
    bob = await env.user("bob@x.test")
    folder = (await create(alice, "private")).json()
    for path in (f"/folders/{folder['id']}", "/folders/private"):
        assert (await bob.get(path)).status_code == 404
    assert (await bob.request("DELETE", "/folders", json={"id": folder["id"]})).status_code == 404
    assert (
        await bob.post(f"/folders/{folder['id']}/request-upload", json={"path": "a", "size": 1})
    ).status_code == 404
    assert (await bob.get("/folders")).json() == []
    # the superadmin sees it with all=true
    everything = (await env.cluster.admin.request("GET", "/folders", json={"all": True})).json()
    assert "private" in [f["name"] for f in everything]


async def test_invite_accept_and_read_only_share(env: Env) -> None:
    alice = await env.user("alice@x.test")
    bob = await env.user("bob@x.test")
    folder = (await create(alice, "shared")).json()
    fid = folder["id"]
    answer = await alice.post(
        f"/folders/{fid}/invite", json={"perm": "ro", "user_ids": ["bob@x.test", "nobody@x.test"]}
    )
    assert answer.status_code == 201
    assert answer.json() == {"invited_ids": ["bob@x.test"]}
    # a second invitation while one is pending is not sent
    again = await alice.post(
        f"/folders/{fid}/invite", json={"perm": "ro", "user_ids": ["bob@x.test"]}
    )
    assert again.json() == {"invited_ids": []}
    # bob invites to alice's folder: not his
    assert (
        await bob.post(f"/folders/{fid}/invite", json={"perm": "rw", "user_ids": ["alice@x.test"]})
    ).status_code == 404

    invitations = (await bob.get("/folders/invitations/list")).json()["invitations"]
    assert [(i["inviter"], i["vfolder_name"], i["perm"]) for i in invitations] == [
        ("alice@x.test", "shared", "ro")
    ]
    assert (await alice.get("/folders/invitations/list")).json() == {"invitations": []}
    accepted = await bob.post("/folders/invitations/accept", json={"inv_id": invitations[0]["id"]})
    assert accepted.status_code == 200, accepted.text

    listed = (await bob.get("/folders")).json()
    assert [(f["name"], f["permission"], f["is_owner"]) for f in listed] == [
        ("shared", "ro", False)
    ]
    assert (await bob.get("/folders/shared")).json()["permission"] == "ro"
    # read-only: downloads yes, uploads / mkdir / delete no
    (env.proxy.root / "vol1" / fid / "f.txt").write_bytes(b"hi")
    assert (
        await bob.post(f"/folders/{fid}/request-download", json={"path": "f.txt"})
    ).status_code == 200
    for method, path, body in [
        ("POST", "request-upload", {"path": "g.txt", "size": 1}),
        ("POST", "mkdir", {"path": "d"}),
        ("DELETE", "delete-files", {"files": ["f.txt"]}),
        ("POST", "move-file", {"src": "f.txt", "dst": "g.txt"}),
    ]:
        refused = problem(await bob.request(method, f"/folders/{fid}/{path}", json=body), 403)
        assert "read-only" in refused["detail"], path
    # only the owner renames or deletes
    assert (await bob.post(f"/folders/{fid}/rename", json={"new_name": "mine"})).status_code == 403
    assert (await bob.request("DELETE", "/folders", json={"id": fid})).status_code == 403
    # bob leaves: the folder is gone from his list
    assert (await bob.post(f"/folders/{fid}/leave", json={})).status_code == 200
    assert (await bob.get("/folders")).json() == []


async def test_reject_and_cancel_invitations(env: Env) -> None:
    alice = await env.user("alice@x.test")
    bob = await env.user("bob@x.test")
    fid = (await create(alice, "f")).json()["id"]
    await alice.post(f"/folders/{fid}/invite", json={"perm": "rw", "user_ids": ["bob@x.test"]})
    inv = (await bob.get("/folders/invitations/list")).json()["invitations"][0]
    rejected = await bob.request(
        "DELETE", "/folders/invitations/delete", json={"inv_id": inv["id"]}
    )
    assert rejected.json() == {"msg": "Invitation rejected"}
    assert (
        await bob.post("/folders/invitations/accept", json={"inv_id": inv["id"]})
    ).status_code == 404
    assert (await bob.get("/folders")).json() == []


async def test_project_folders_and_shares(env: Env) -> None:
    alice = await env.user("alice@x.test", group="default")
    bob = await env.user("bob@x.test", group="default")
    carol = await env.user("carol@x.test")
    async with env.cluster.manager.db.begin(write=True) as db:  # carol leaves the project
        carol_id = (
            await db.execute(sa.select(User.id).where(User.email == "carol@x.test"))
        ).scalar_one()
        await db.execute(sa.delete(GroupMember).where(GroupMember.user_id == carol_id))
    created = await create(env.cluster.admin, "team", group="default", permission="ro")
    assert created.status_code == 201, created.text
    team = created.json()
    assert team["ownership_type"] == "group"
    assert team["group"] is not None
    # members see it with the folder's permission; outsiders do not
    assert [(f["name"], f["permission"]) for f in (await bob.get("/folders")).json()] == [
        ("team", "ro")
    ]
    assert (await carol.get("/folders")).json() == []
    assert (await carol.get(f"/folders/{team['id']}")).status_code == 404
    # a member may not create a project folder in a project they are not in
    assert (await create(carol, "x", group="default")).status_code == 403
    # share rw with alice
    shared = await env.cluster.admin.post(
        f"/folders/{team['id']}/share", json={"permission": "rw", "emails": ["alice@x.test"]}
    )
    assert shared.status_code == 201
    assert shared.json() == {"shared_emails": ["alice@x.test"]}
    outsider = problem(
        await env.cluster.admin.post(
            f"/folders/{team['id']}/share", json={"permission": "rw", "emails": ["carol@x.test"]}
        ),
        400,
    )
    assert "carol@x.test" in outsider["detail"]
    assert (await alice.get(f"/folders/{team['id']}")).json()["permission"] == "rw"
    assert (
        await alice.post(f"/folders/{team['id']}/mkdir", json={"path": "out"})
    ).status_code == 201
    assert (await bob.post(f"/folders/{team['id']}/mkdir", json={"path": "x"})).status_code == 403
    unshared = await env.cluster.admin.request(
        "DELETE", f"/folders/{team['id']}/unshare", json={"emails": ["alice@x.test"]}
    )
    assert unshared.json() == {"unshared_emails": ["alice@x.test"]}
    assert (await alice.get(f"/folders/{team['id']}")).json()["permission"] == "ro"


async def test_trash_restore_purge(env: Env) -> None:
    alice = await env.user("alice@x.test")
    fid = (await create(alice, "old")).json()["id"]
    assert (await alice.request("DELETE", "/folders", json={"id": fid})).status_code == 204
    info = (await alice.get(f"/folders/{fid}")).json()
    assert info["status"] == "delete-pending"
    # in the trash: no uploads, its name still taken
    assert (
        problem(
            await alice.post(f"/folders/{fid}/request-upload", json={"path": "a", "size": 1}), 409
        )["folder_status"]
        == "delete-pending"
    )
    assert (await create(alice, "old")).status_code == 409
    assert (
        await alice.post("/folders/restore-from-trash-bin", json={"id": fid})
    ).status_code == 204
    assert (await alice.get(f"/folders/{fid}")).json()["status"] == "ready"
    # purge needs the trash first
    assert (await alice.post("/folders/delete-from-trash-bin", json={"id": fid})).status_code == 409
    await alice.request("DELETE", "/folders", json={"id": fid})
    assert (await alice.post("/folders/delete-from-trash-bin", json={"id": fid})).status_code == 204
    assert (await alice.get(f"/folders/{fid}")).status_code == 404
    assert not (env.proxy.root / "vol1" / fid).exists()
    assert (await create(alice, "old")).status_code == 201


async def test_old_trash_is_purged(env: Env) -> None:
    alice = await env.user("alice@x.test")
    old = (await create(alice, "old")).json()["id"]
    new = (await create(alice, "new")).json()["id"]
    await alice.request("DELETE", "/folders", json={"id": old})
    await alice.request("DELETE", "/folders", json={"id": new})
    service = env.cluster.manager.folders
    async with env.cluster.manager.db.begin(write=True) as db:
        await db.execute(
            sa.update(VFolder)
            .where(VFolder.id == uuid.UUID(old))
            .values(status_changed_at=service.clock() - timedelta(days=40))
        )
    assert await service.purge_old_trash(timedelta(days=30)) == [old]
    assert (await alice.get(f"/folders/{old}")).status_code == 404
    assert (await alice.get(f"/folders/{new}")).json()["status"] == "delete-pending"
    assert await service.purge_old_trash(None) == []  # the fixture's manager keeps 30 days


async def test_count_limit_and_quota_from_the_policy(env: Env) -> None:
    alice = await env.user("alice@x.test")
    patched = await env.cluster.admin.patch(
        "/admin/resource-policies/default", json={"max_vfolder_count": 2, "max_vfolder_size": 10}
    )
    assert patched.status_code == 200, patched.text
    assert patched.json()["max_vfolder_count"] == 2
    assert patched.json()["max_vfolder_size"] == 10
    too_big = await env.cluster.admin.patch(
        "/admin/resource-policies/default", json={"max_vfolder_size": 2**63}
    )
    assert too_big.status_code == 400
    assert too_big.json()["field"] == "max_vfolder_size"
    one = (await create(alice, "one")).json()
    assert one["max_size"] == 10
    assert env.proxy.quotas[("vol1", one["id"])] == 10
    assert (await create(alice, "two")).status_code == 201
    body = problem(await create(alice, "three"), 412)
    assert body["field"] == "max_vfolder_count"
    assert "2" in body["detail"]
    # the proxy refuses an upload over the quota; the manager passes its refusal on
    over = problem(
        await alice.post(f"/folders/{one['id']}/request-upload", json={"path": "big", "size": 11}),
        412,
    )
    assert "quota" in over["detail"]


async def test_files(env: Env) -> None:
    alice = await env.user("alice@x.test")
    fid = (await create(alice, "work")).json()["id"]
    made = (
        await alice.post(f"/folders/{fid}/mkdir", json={"path": ["a", "a/b"], "parents": False})
    ).json()
    assert [s["item"] for s in made["results"]["success"]] == ["a", "a/b"]
    again = (await alice.post(f"/folders/{fid}/mkdir", json={"path": "a"})).json()
    assert [f["item"] for f in again["results"]["failed"]] == ["a"]

    ticket = (
        await alice.post(f"/folders/{fid}/request-upload", json={"path": "a/data.bin", "size": 4})
    ).json()
    async with env.proxy.client() as storage:
        patch = await storage.patch(
            "/upload",
            params={"token": ticket["token"]},
            content=b"abcd",
            headers={"Upload-Offset": "0", "Content-Type": "application/offset+octet-stream"},
        )
        assert patch.status_code == 204
        ticket = (
            await alice.post(f"/folders/{fid}/request-download", json={"path": "a/data.bin"})
        ).json()
        assert ticket["url"].endswith("/download")
        assert (
            await storage.get("/download", params={"token": ticket["token"]})
        ).content == b"abcd"

    listing = (await alice.get(f"/folders/{fid}/files", params={"path": "a"})).json()
    assert sorted((i["name"], i["type"]) for i in listing["items"]) == [
        ("b", "DIR"),
        ("data.bin", "FILE"),
    ]

    files = json.loads(listing["files"])
    assert {f["filename"] for f in files} == {"b", "data.bin"}
    assert all("mtime" in f for f in files)

    assert (
        await alice.post(
            f"/folders/{fid}/rename-file", json={"target_path": "a/data.bin", "new_name": "d2.bin"}
        )
    ).json() == {}
    assert (
        await alice.post(f"/folders/{fid}/move-file", json={"src": "a/d2.bin", "dst": "moved.bin"})
    ).json() == {}
    assert (env.proxy.root / "vol1" / fid / "moved.bin").read_bytes() == b"abcd"
    # traversal is refused by the proxy, with its words
    bad = problem(
        await alice.post(f"/folders/{fid}/move-file", json={"src": "moved.bin", "dst": "../x"}), 400
    )
    assert "leaves the folder" in bad["detail"]
    not_empty = await alice.request("DELETE", f"/folders/{fid}/delete-files", json={"files": ["a"]})
    assert not_empty.status_code == 409
    assert (
        await alice.request(
            "DELETE", f"/folders/{fid}/delete-files", json={"files": ["a"], "recursive": True}
        )
    ).status_code == 204
    names = [i["name"] for i in (await alice.get(f"/folders/{fid}/files")).json()["items"]]
    assert names == ["moved.bin"]


async def test_rename_and_clone(env: Env) -> None:
    alice = await env.user("alice@x.test")
    bob = await env.user("bob@x.test")
    src = (await create(alice, "src")).json()
    (env.proxy.root / "vol1" / src["id"] / "model.pt").write_bytes(b"weights")
    assert (
        await alice.post(f"/folders/{src['id']}/rename", json={"new_name": "source"})
    ).status_code == 204
    assert (await alice.get("/folders/source")).json()["id"] == src["id"]
    assert (
        await alice.post(f"/folders/{src['id']}/rename", json={"new_name": "a/b"})
    ).status_code == 400

    clone = await alice.post(f"/folders/{src['id']}/clone", json={"target_name": "copy"})
    assert clone.status_code == 201, clone.text
    copy = clone.json()
    assert copy["name"] == "copy"
    assert copy["id"] != src["id"]
    assert "bgtask_id" not in copy
    assert (env.proxy.root / "vol1" / copy["id"] / "model.pt").read_bytes() == b"weights"
    # shared read-only with bob, not cloneable: bob may not clone it
    await alice.post(
        f"/folders/{src['id']}/invite", json={"perm": "ro", "user_ids": ["bob@x.test"]}
    )
    inv = (await bob.get("/folders/invitations/list")).json()["invitations"][0]
    await bob.post("/folders/invitations/accept", json={"inv_id": inv["id"]})
    assert problem(await bob.post(f"/folders/{src['id']}/clone", json={"target_name": "mine"}), 403)


async def test_a_failing_proxy_leaves_no_folder(env: Env) -> None:
    alice = await env.user("alice@x.test")
    env.proxy.fail["create"] = StorageErrorType.EXISTS
    refused = problem(await create(alice, "never"), 409)
    assert "injected exists" in refused["detail"]
    assert (await alice.get("/folders")).json() == []
    # a wrong secret is the manager's configuration, not the caller's fault: 503
    await env.cluster.manager.store.put("volumes/proxies/local/secret", "wrong")
    assert (await create(alice, "never")).status_code == 503
    assert (await alice.get("/folders")).json() == []


async def test_unbuilt_routes_answer_501(env: Env) -> None:
    alice = await env.user("alice@x.test")
    fid = (await create(alice, "f")).json()["id"]
    for method, path in [
        ("GET", "/folders/_/fstab"),
        ("POST", "/folders/_/sharing"),
        ("POST", f"/folders/{fid}/nosuch"),
    ]:
        response = await alice.request(method, path, json={})
        assert response.status_code == 501, path
        assert "accelshare does not support" in response.json()["detail"]


async def user_id(env: Env, email: str) -> str:
    async with env.cluster.manager.db.begin() as db:
        found = (await db.execute(sa.select(User.id).where(User.email == email))).scalar_one()
    return str(found)


async def folder_row(env: Env, folder_id: str) -> VFolder:
    async with env.cluster.manager.db.begin() as db:
        row = await db.get(VFolder, uuid.UUID(folder_id))
    assert row is not None
    return row


async def share_ro(
    owner: httpx.AsyncClient, guest: httpx.AsyncClient, fid: str, email: str
) -> None:
    """``fid`` shared with ``email`` read-only (invited and accepted)."""
    sent = await owner.post(f"/folders/{fid}/invite", json={"perm": "ro", "user_ids": [email]})
    assert sent.json() == {"invited_ids": [email]}, sent.text
    pending = (await guest.get("/folders/invitations/list")).json()["invitations"]
    inv = next(i for i in pending if i["vfolder_id"] == fid)
    assert (await guest.post("/folders/invitations/accept", json={"inv_id": inv["id"]})).is_success


async def test_update_options(env: Env) -> None:
    alice = await env.user("alice@x.test")
    bob = await env.user("bob@x.test")
    carol = await env.user("carol@x.test")
    fid = (await create(alice, "opts")).json()["id"]
    await share_ro(alice, bob, fid, "bob@x.test")
    # not cloneable: bob, with a read-only share, may not clone it
    assert (await bob.post(f"/folders/{fid}/clone", json={"target_name": "c"})).status_code == 403

    changed = await alice.post(f"/folders/{fid}/update-options", json={"cloneable": True})
    assert changed.status_code == 201, changed.text
    assert changed.json() == {"id": fid, "name": "opts", "permission": "rw", "cloneable": True}
    assert (await alice.get(f"/folders/{fid}")).json()["cloneable"] is True
    assert (await bob.post(f"/folders/{fid}/clone", json={"target_name": "c"})).status_code == 201

    # by name; a missing field and null both keep it
    changed = await alice.post("/folders/opts/update-options", json={"permission": "ro"})
    assert changed.json()["permission"] == "ro"
    assert changed.json()["cloneable"] is True
    kept = await alice.post(
        f"/folders/{fid}/update-options", json={"permission": None, "cloneable": None}
    )
    assert kept.status_code == 201
    assert kept.json() == {"id": fid, "name": "opts", "permission": "ro", "cloneable": True}
    row = await folder_row(env, fid)
    assert (row.permission.value, row.cloneable) == ("ro", True)
    assert (await alice.post(f"/folders/{fid}/update-options")).status_code == 201  # no body
    row = await folder_row(env, fid)
    assert (row.permission.value, row.cloneable) == ("ro", True)

    # bad values: 400 naming the field; nothing changes
    for body, field_name in [
        ({"permission": "rx"}, "permission"),
        ({"permission": 1}, "permission"),
        ({"cloneable": "yes"}, "cloneable"),
        ({"cloneable": 1, "permission": "rw"}, "cloneable"),
    ]:
        bad = problem(await alice.post(f"/folders/{fid}/update-options", json=body), 400)
        assert bad["field"] == field_name, body
        assert bad["received"] == body[field_name]
    row = await folder_row(env, fid)
    assert (row.permission.value, row.cloneable) == ("ro", True)

    # a read-only share may not change it (403); a stranger does not see it (404)
    assert (
        problem(await bob.post(f"/folders/{fid}/update-options", json={"cloneable": False}), 403)[
            "field"
        ]
        == "name"
    )
    assert (
        await carol.post(f"/folders/{fid}/update-options", json={"cloneable": False})
    ).status_code == 404
    # the superadmin may (an admin of the folder's domain)
    assert (
        await env.cluster.admin.post(f"/folders/{fid}/update-options", json={"cloneable": False})
    ).json()["cloneable"] is False
    # a folder in the trash: restore it first
    await alice.request("DELETE", "/folders", json={"id": fid})
    assert (
        await alice.post(f"/folders/{fid}/update-options", json={"cloneable": True})
    ).status_code == 409


async def test_update_options_of_a_project_folder(env: Env) -> None:
    """A project folder's permission is what its members get."""
    bob = await env.user("bob@x.test", group="default")
    team = (await create(env.cluster.admin, "team", group="default", permission="ro")).json()
    assert (await bob.get(f"/folders/{team['id']}")).json()["permission"] == "ro"
    assert (
        await bob.post(f"/folders/{team['id']}/update-options", json={"permission": "rw"})
    ).status_code == 403
    assert (
        await env.cluster.admin.post(
            f"/folders/{team['id']}/update-options", json={"permission": "rw"}
        )
    ).status_code == 201
    assert (await bob.get(f"/folders/{team['id']}")).json()["permission"] == "rw"
    assert (await bob.post(f"/folders/{team['id']}/mkdir", json={"path": "d"})).status_code == 201


async def test_list_and_change_shares(env: Env) -> None:
    alice = await env.user("alice@x.test")
    bob = await env.user("bob@x.test")
    carol = await env.user("carol@x.test")
    dave = await env.user("dave@x.test")
    fid = (await create(alice, "lent")).json()["id"]
    other = (await create(carol, "carols")).json()["id"]
    await share_ro(alice, bob, fid, "bob@x.test")
    await share_ro(alice, carol, fid, "carol@x.test")
    await share_ro(carol, bob, other, "bob@x.test")
    bob_id, carol_id = await user_id(env, "bob@x.test"), await user_id(env, "carol@x.test")
    alice_id = await user_id(env, "alice@x.test")

    def item(folder: str, name: str, owner: str, to: str, email: str, perm: str) -> Any:
        return {
            "vfolder_id": str(uuid.UUID(folder)),
            "vfolder_name": name,
            "status": "ready",
            "owner": owner,
            "type": "user",
            "shared_to": {"uuid": to, "email": email},
            "perm": perm,
        }

    lent_shares = [
        item(fid, "lent", alice_id, bob_id, "bob@x.test", "ro"),
        item(fid, "lent", alice_id, carol_id, "carol@x.test", "ro"),
    ]
    # the owner sees the shares of its folders only; one folder's with ?vfolder_id=
    listed = await alice.get("/folders/_/shared")
    assert listed.status_code == 200, listed.text
    assert listed.json() == {"shared": lent_shares}
    assert (await alice.get("/folders/_/shared", params={"vfolder_id": fid})).json() == {
        "shared": lent_shares
    }
    assert (await bob.get("/folders/_/shared")).json() == {"shared": []}
    everything = (await env.cluster.admin.get("/folders/_/shared")).json()["shared"]
    assert [(s["vfolder_name"], s["shared_to"]["email"]) for s in everything] == [
        ("carols", "bob@x.test"),
        ("lent", "bob@x.test"),
        ("lent", "carol@x.test"),
    ]
    domain_admin = await env.user("root@x.test", role="admin")  # of the default domain
    assert (await domain_admin.get("/folders/_/shared")).json()["shared"] == everything
    assert (
        problem(await bob.get("/folders/_/shared", params={"vfolder_id": fid}), 403)["field"]
        == "vfolder_id"
    )
    assert (
        problem(await dave.get("/folders/_/shared", params={"vfolder_id": fid}), 404)["field"]
        == "vfolder_id"
    )
    bad = problem(await alice.get("/folders/_/shared", params={"vfolder_id": "lent"}), 400)
    assert (bad["field"], bad["received"]) == ("vfolder_id", "lent")

    # bob's share becomes rw: he may write
    changed = await alice.post(
        "/folders/_/shared", json={"vfolder": fid, "user": bob_id, "perm": "rw"}
    )
    assert changed.status_code == 200, changed.text
    assert (await bob.get(f"/folders/{fid}")).json()["permission"] == "rw"
    assert (await bob.post(f"/folders/{fid}/mkdir", json={"path": "d"})).status_code == 201
    assert (await alice.get("/folders/_/shared")).json()["shared"][0]["perm"] == "rw"

    # who may: not a guest (403), not a stranger (404); a superadmin may
    body = {"vfolder": fid, "user": carol_id, "perm": "rw"}
    assert problem(await bob.post("/folders/_/shared", json=body), 403)["field"] == "vfolder"
    assert problem(await dave.post("/folders/_/shared", json=body), 404)["field"] == "vfolder"
    assert (await env.cluster.admin.post("/folders/_/shared", json=body)).status_code == 200
    assert (await carol.get(f"/folders/{fid}")).json()["permission"] == "rw"

    # bad input: 400 naming the field; unknown folder, user or share: 404
    for bad_body, field_name in [
        ({"vfolder": "lent", "user": bob_id, "perm": "ro"}, "vfolder"),
        ({"user": bob_id, "perm": "ro"}, "vfolder"),
        ({"vfolder": fid, "user": "bob@x.test", "perm": "ro"}, "user"),
        ({"vfolder": fid, "user": bob_id, "perm": "all"}, "perm"),
        ({"vfolder": fid, "user": bob_id}, "perm"),
    ]:
        refused = problem(await alice.post("/folders/_/shared", json=bad_body), 400)
        assert refused["field"] == field_name, bad_body
        if field_name == "perm":
            assert refused["expected"] == "ro, rw, wd or null"
    for bad_body in [
        {"vfolder": str(uuid.uuid4()), "user": bob_id, "perm": "ro"},
        {"vfolder": fid, "user": str(uuid.uuid4()), "perm": "ro"},
        {"vfolder": fid, "user": await user_id(env, "dave@x.test"), "perm": "ro"},
    ]:
        assert (await alice.post("/folders/_/shared", json=bad_body)).status_code == 404
    assert (await bob.get(f"/folders/{fid}")).json()["permission"] == "rw"

    # perm null removes the share ("permission" is the same key)
    removed = await alice.post(
        "/folders/_/shared", json={"vfolder": fid, "user": bob_id, "permission": None}
    )
    assert removed.status_code == 200, removed.text
    assert (await bob.get(f"/folders/{fid}")).status_code == 404
    assert [f["name"] for f in (await bob.get("/folders")).json()] == ["carols"]
    assert [
        s["shared_to"]["email"] for s in (await alice.get("/folders/_/shared")).json()["shared"]
    ] == ["carol@x.test"]
    again = await alice.post(
        "/folders/_/shared", json={"vfolder": fid, "user": bob_id, "perm": None}
    )
    assert problem(again, 404)["field"] == "user"


async def test_change_ownership(env: Env) -> None:
    alice = await env.user("alice@x.test")
    bob = await env.user("bob@x.test")
    carol = await env.user("carol@x.test")
    folder = (await create(alice, "moved")).json()
    fid = folder["id"]
    path = env.proxy.root / "vol1" / fid
    (path / "a.txt").write_bytes(b"kept")
    await share_ro(alice, bob, fid, "bob@x.test")
    await share_ro(alice, carol, fid, "carol@x.test")
    body = {"vfolder": fid, "user_email": "bob@x.test"}

    # only a superadmin
    refused = problem(await alice.post("/folders/_/change-ownership", json=body), 403)
    assert refused["reason"] == "insufficient-role"
    assert "superadmin" in refused["detail"]
    domain_admin = await env.user("root@x.test", role="admin")
    assert (
        problem(await domain_admin.post("/folders/_/change-ownership", json=body), 403)[
            "required_role"
        ]
        == "superadmin"
    )
    assert (await folder_row(env, fid)).user_id == uuid.UUID(await user_id(env, "alice@x.test"))

    moved = await env.cluster.admin.post("/folders/_/change-ownership", json=body)
    assert moved.status_code == 200, moved.text
    assert moved.json() == {
        "id": fid,
        "name": "moved",
        "user": await user_id(env, "bob@x.test"),
        "user_email": "bob@x.test",
    }
    # bob owns it (his share is gone: he has everything), alice has nothing; carol keeps hers
    info = (await bob.get("/folders/moved")).json()
    assert (info["id"], info["is_owner"], info["permission"]) == (fid, True, "wd")
    assert info["numFiles"] == 1
    assert (await alice.get(f"/folders/{fid}")).status_code == 404
    assert (await alice.get("/folders")).json() == []
    assert [
        s["shared_to"]["email"] for s in (await bob.get("/folders/_/shared")).json()["shared"]
    ] == ["carol@x.test"]
    assert (await carol.get(f"/folders/{fid}")).json()["permission"] == "ro"
    # the files stay where they are: the proxy knows the folder by its id
    assert (path / "a.txt").read_bytes() == b"kept"
    names = [i["name"] for i in (await bob.get(f"/folders/{fid}/files")).json()["items"]]
    assert names == ["a.txt"]
    assert (
        await bob.post(f"/folders/{fid}/request-upload", json={"path": "b.txt", "size": 1})
    ).status_code == 200

    # bad input: 400 naming the field; unknown folder or user: 404
    admin = env.cluster.admin
    for bad_body, field_name in [
        ({"vfolder": "moved", "user_email": "bob@x.test"}, "vfolder"),
        ({"user_email": "bob@x.test"}, "vfolder"),
        ({"vfolder": fid}, "user_email"),
        ({"vfolder": fid, "user_email": 3}, "user_email"),
    ]:
        assert (
            problem(await admin.post("/folders/_/change-ownership", json=bad_body), 400)["field"]
            == field_name
        ), bad_body
    unknown = {"vfolder": str(uuid.uuid4()), "user_email": "carol@x.test"}
    assert (
        problem(await admin.post("/folders/_/change-ownership", json=unknown), 404)["field"]
        == "vfolder"
    )
    nobody = {"vfolder": fid, "user_email": "nobody@x.test"}
    assert (
        problem(await admin.post("/folders/_/change-ownership", json=nobody), 404)["field"]
        == "user_email"
    )

    # a project folder is refused; so is a name the new owner uses (the trash included)
    team = (await create(admin, "team", group="default")).json()
    project = {"vfolder": team["id"], "user_email": "carol@x.test"}
    assert (
        problem(await admin.post("/folders/_/change-ownership", json=project), 400)["field"]
        == "vfolder"
    )
    clash = (await create(carol, "moved")).json()
    await carol.request("DELETE", "/folders", json={"id": clash["id"]})
    to_carol = {"vfolder": fid, "user_email": "carol@x.test"}
    conflict = problem(await admin.post("/folders/_/change-ownership", json=to_carol), 409)
    assert "carol@x.test" in conflict["detail"]
    assert (await folder_row(env, fid)).user_id == uuid.UUID(await user_id(env, "bob@x.test"))

    # the new owner's max_vfolder_count, as when creating one
    assert (
        await admin.patch("/admin/resource-policies/default", json={"max_vfolder_count": 1})
    ).status_code == 200
    own = await create(await env.user("erin@x.test"), "erins")  # erin has one
    assert own.status_code == 201, own.text
    limited = problem(
        await admin.post(
            "/folders/_/change-ownership", json={"vfolder": fid, "user_email": "erin@x.test"}
        ),
        412,
    )
    assert limited["field"] == "max_vfolder_count"
    # nor while the proxy purges it
    async with env.cluster.manager.db.begin(write=True) as db:
        await db.execute(
            sa.update(VFolder)
            .where(VFolder.id == uuid.UUID(fid))
            .values(status=VFolderStatus.DELETE_ONGOING)
        )
    busy = problem(await admin.post("/folders/_/change-ownership", json=to_carol), 409)
    assert busy["folder_status"] == "delete-ongoing"
    async with env.cluster.manager.db.begin(write=True) as db:
        await db.execute(
            sa.update(VFolder)
            .where(VFolder.id == uuid.UUID(fid))
            .values(status=VFolderStatus.READY)
        )
    # a user with room gets it; giving it to its owner changes nothing
    assert (
        await admin.patch("/admin/resource-policies/default", json={"max_vfolder_count": 2})
    ).status_code == 200
    to_erin = {"vfolder": fid, "user_email": "erin@x.test"}
    assert (await admin.post("/folders/_/change-ownership", json=to_erin)).status_code == 200
    assert (await admin.post("/folders/_/change-ownership", json=to_erin)).status_code == 200
    assert (await folder_row(env, fid)).user_id == uuid.UUID(await user_id(env, "erin@x.test"))


async def test_session_mounts(env: Env) -> None:
    alice = await env.user("alice@x.test")
    bob = await env.user("bob@x.test")
    agent = await env.cluster.add_agent("i-node01")
    data = (await create(alice, "data")).json()
    models = (await create(alice, "models")).json()
    secret = (await create(bob, "secret")).json()
    lent = (await create(bob, "lent")).json()
    await bob.post(
        f"/folders/{lent['id']}/invite", json={"perm": "ro", "user_ids": ["alice@x.test"]}
    )
    inv = (await alice.get("/folders/invitations/list")).json()["invitations"][0]
    await alice.post("/folders/invitations/accept", json={"inv_id": inv["id"]})

    async def start(name: str, **config: Any) -> httpx.Response:
        body = {
            "image": "python:3.11",
            "name": name,
            "enqueueOnly": True,
            "config": {"resources": {"cpu": 1, "mem": "1g"}, **config},
        }
        return await alice.post("/session", json=body)

    # Backend.AI's forms: a name, mount_map, and permission options
    created = await start(
        "s1",
        mounts=["data", "models", "lent"],
        mount_map={"models": "/opt/models"},
        mount_options={
            "data": {"type": "bind", "permission": None},
            "models": {"permission": "ro"},
        },
    )
    assert created.status_code == 201, created.text
    session_id = created.json()["sessionId"]
    await env.cluster.wait_status(session_id, "RUNNING")
    shown = await env.cluster.session(session_id)
    assert {m["name"]: m["kernel_path"] for m in shown["mounts"]} == {
        "data": "/home/work/data",
        "models": "/opt/models",
        "lent": "/home/work/lent",
    }
    request = agent.create_requests[-1]
    mounts = {m.name: m for m in request.mounts}
    assert set(mounts) == {"data", "models", "lent"}
    assert mounts["data"].kernel_path == "/home/work/data"
    assert mounts["data"].host_path == str(env.proxy.root / "vol1" / data["id"])
    assert not mounts["data"].read_only
    assert mounts["models"].kernel_path == "/opt/models"
    assert mounts["models"].read_only  # asked read-only
    assert mounts["lent"].read_only  # a read-only share

    # a mounted folder cannot be deleted; the error names the session
    refused = problem(await alice.request("DELETE", "/folders", json={"id": data["id"]}), 409)
    assert "'s1'" in refused["detail"]
    assert refused["sessions"] == ["s1"]

    # unknown folders, someone else's, bad paths: 400 naming the folder; nothing enqueued
    for config, words in [
        ({"mounts": ["nope"]}, "'nope'"),
        ({"mounts": [secret["name"]]}, "'secret'"),
        ({"mounts": ["data:/home/work/../etc"]}, "absolute path without '..'"),
        ({"mounts": ["data", "models:/home/work/data"]}, "both mounted at /home/work/data"),
    ]:
        body = problem(await start("bad", **config), 400)
        assert words in body["detail"], body
    assert models["id"]  # used above by name

    # a superadmin creating a session for alice mounts alice's folders
    for_alice = await env.cluster.admin.post(
        "/session",
        json={
            "image": "python:3.11",
            "name": "s2",
            "enqueueOnly": True,
            "owner_access_key": env.access_keys["alice@x.test"],
            "config": {"resources": {"cpu": 1, "mem": "1g"}, "mounts": ["models"]},
        },
    )
    assert for_alice.status_code == 201, for_alice.text
    await env.cluster.wait_status(for_alice.json()["sessionId"], "RUNNING")
    assert [m.name for m in agent.create_requests[-1].mounts] == ["models"]
    # a user naming another user's key mounts nothing of theirs
    sneaky = await bob.post(
        "/session",
        json={
            "image": "python:3.11",
            "owner_access_key": env.access_keys["alice@x.test"],
            "config": {"resources": {"cpu": 1, "mem": "1g"}, "mounts": ["models"]},
        },
    )
    assert sneaky.status_code == 400
    assert "No folder 'models'" in sneaky.json()["detail"]

    # once the session ends, the folder can go
    assert (await alice.delete("/session/s1")).status_code in (200, 204)
    await env.cluster.wait_status(session_id, "TERMINATED")
    assert (await alice.request("DELETE", "/folders", json={"id": data["id"]})).status_code == 204


async def test_the_sdk_round_trip(env: Env, tmp_path: Path) -> None:
    """``client.folders`` (what ``accelshare vfolder`` calls): create, upload in tus
    chunks, list, download whole, trash and purge."""
    response = await env.cluster.admin.post(
        "/admin/users", json={"email": "dana@x.test", "password": "long enough password"}
    )
    keypair = response.json()["keypair"]
    config = ClientConfig("http://127.0.0.1:8081", keypair["access_key"], keypair["secret_key"])
    async with AccelshareClient(
        config,
        transport=httpx.ASGITransport(app=env.cluster.app),
        storage_transport=env.proxy.transport,
    ) as client:
        assert (await client.folders.hosts())["default"] == "local:vol1"
        created = await client.folders.create("sdk", cloneable=True)
        updated = await client.folders.update_options("sdk", permission="ro")
        assert (updated["permission"], updated["cloneable"]) == ("ro", True)
        updated = await client.folders.update_options("sdk", cloneable=False)
        assert (updated["permission"], updated["cloneable"]) == ("ro", False)
        source = tmp_path / "blob.bin"
        payload = bytes(range(256)) * 1000  # 256000 bytes: several chunks
        source.write_bytes(payload)
        done: list[int] = []
        await client.folders.upload(
            "sdk", source, "in/blob.bin", chunk_bytes=65536, progress=lambda d, _t: done.append(d)
        )
        assert done == [65536, 131072, 196608, 256000]
        assert (await client.folders.mkdir("sdk", ["out"]))["success"][0]["item"] == "out"
        listing = await client.folders.ls("sdk", "in")
        assert [(i["name"], i["size"]) for i in listing] == [("blob.bin", 256000)]
        downloads = tmp_path / "downloads"
        downloads.mkdir()
        target = await client.folders.download("sdk", "in/blob.bin", downloads)
        assert target == downloads / "blob.bin"
        assert target.read_bytes() == payload
        assert not (downloads / "blob.bin.partial").exists()
        with pytest.raises(FileExistsError):
            await client.folders.download("sdk", "in/blob.bin", downloads)
        assert [f["name"] for f in await client.folders.list_folders()] == ["sdk"]
        await client.folders.move("sdk", "in/blob.bin", "out/blob.bin")
        await client.folders.rm("sdk", ["in"])
        assert {i["name"] for i in await client.folders.ls("sdk")} == {"out"}
        await client.folders.delete("sdk")
        assert (await client.folders.info("sdk"))["status"] == "delete-pending"
        await client.folders.purge("sdk")
        assert await client.folders.list_folders() == []
        assert created["name"] == "sdk"


async def test_concurrent_creates_of_one_name_leave_one_folder(env: Env) -> None:
    alice = await env.user("alice@x.test")
    answers = await asyncio.gather(*(create(alice, "race") for _ in range(4)))
    assert sorted(a.status_code for a in answers) == [201, 409, 409, 409]
    winner = next(a.json() for a in answers if a.status_code == 201)
    on_disk = sorted(p.name for p in (env.proxy.root / "vol1").iterdir())
    assert on_disk == [winner["id"]]  # the losers' proxy folders were removed again


async def test_a_purge_the_proxy_refuses_is_kept_as_delete_error(env: Env) -> None:
    alice = await env.user("alice@x.test")
    fid = (await create(alice, "stuck")).json()["id"]
    await alice.request("DELETE", "/folders", json={"id": fid})
    env.proxy.fail["delete"] = StorageErrorType.BAD_REQUEST
    assert (await alice.post("/folders/delete-from-trash-bin", json={"id": fid})).status_code == 400
    assert (await alice.get(f"/folders/{fid}")).json()["status"] == "delete-error"
    assert (await alice.post("/folders/delete-from-trash-bin", json={"id": fid})).status_code == 204
    assert (await alice.get(f"/folders/{fid}")).status_code == 404


VFOLDER_LIST = (
    "query($f: String, $o: String) { vfolder_list(limit: 10, offset: 0, filter: $f,"
    " order: $o) { items { name status permission ownership_type } total_count } }"
)


async def test_graphql_vfolder_list_takes_filter_and_order(env: Env) -> None:
    alice = await env.user("alice@x.test")
    for name in ("b-data", "a-models", "c-old"):
        assert (
            await create(alice, name, permission="ro" if name == "a-models" else "rw")
        ).status_code == 201
    old = (await alice.request("GET", "/folders/_/id", json={"name": "c-old"})).json()["id"]
    await alice.request("DELETE", "/folders", json={"id": old})

    async def names(variables: dict[str, Any]) -> list[str]:
        answer = await alice.post(
            "/admin/gql", json={"query": VFOLDER_LIST, "variables": variables}
        )
        body = answer.json()
        assert not body.get("errors"), body
        return [i["name"] for i in body["data"]["vfolder_list"]["items"]]

    assert await names({}) == ["b-data", "a-models", "c-old"]  # oldest first
    assert await names({"o": "name"}) == ["a-models", "b-data", "c-old"]
    assert await names({"f": 'status == "READY"', "o": "-name"}) == ["b-data", "a-models"]
    assert await names({"f": 'permission in ["READ_ONLY"]'}) == ["a-models"]
    assert await names({"f": 'name ilike "%DATA%"'}) == ["b-data"]
    bad = await alice.post(
        "/admin/gql", json={"query": VFOLDER_LIST, "variables": {"f": "nosuch == 1"}}
    )
    assert "nosuch" in bad.json()["errors"][0]["message"]


def scoped_list(field: str) -> str:
    return (
        "query($l: Int!, $o: Int!, $f: String, $ord: String) {"
        f" {field}(limit: $l, offset: $o, filter: $f, order: $ord)"
        " { items { name permission ownership_type } total_count } }"
    )


async def scoped(
    client: httpx.AsyncClient, field: str, limit: int = 10, offset: int = 0, **more: str
) -> tuple[list[tuple[str, str]], int]:
    """``(name, permission)`` of one page of ``field`` and its ``total_count``."""
    answer = await client.post(
        "/admin/gql",
        json={"query": scoped_list(field), "variables": {"l": limit, "o": offset, **more}},
    )
    body = answer.json()
    assert not body.get("errors"), body
    page = body["data"][field]
    return [(i["name"], i["permission"]) for i in page["items"]], page["total_count"]


async def test_graphql_own_invited_and_project_lists(env: Env) -> None:
    """Backend.AI's ``vfolder_own_list`` (the caller's user folders),
    ``vfolder_invited_list`` (others' user folders shared with it) and
    ``vfolder_project_list`` (its projects' folders): each only the caller's, paged."""
    admin = env.cluster.admin
    alice = await env.user("alice@x.test", group="default")
    bob = await env.user("bob@x.test", group="default")
    made = await admin.post(
        "/admin/gql",
        json={
            "query": "mutation ($n: String!, $p: GroupInput!) {"
            " create_group(name: $n, props: $p) { ok group { id } } }",
            "variables": {"n": "lab", "p": {"domain_name": "default"}},
        },
    )
    lab = made.json()["data"]["create_group"]["group"]["id"]
    async with env.cluster.manager.db.begin(write=True) as db:  # bob joins lab, alice not
        db.add(
            GroupMember(
                group_id=uuid.UUID(lab), user_id=uuid.UUID(await user_id(env, "bob@x.test"))
            )
        )
    for client, name, extra in [
        (alice, "a-one", {}),
        (alice, "a-two", {}),
        (bob, "b-shared", {}),
        (bob, "b-private", {}),
        (admin, "team", {"group": "default", "permission": "ro"}),
        (admin, "lab-data", {"group": "lab"}),
        (admin, "admin-own", {}),
    ]:
        assert (await create(client, name, **extra)).status_code == 201, name
    shared = (await bob.request("GET", "/folders/_/id", json={"name": "b-shared"})).json()["id"]
    invited = await bob.post(
        f"/folders/{shared}/invite", json={"perm": "ro", "user_ids": ["alice@x.test"]}
    )
    assert invited.status_code == 201, invited.text
    pending = (await alice.get("/folders/invitations/list")).json()["invitations"]
    accepted = await alice.post("/folders/invitations/accept", json={"inv_id": pending[0]["id"]})
    assert accepted.status_code == 200, accepted.text
    team = (await admin.request("GET", "/folders/_/id", json={"name": "team"})).json()["id"]
    # a project folder shared with alice is hers through the project, not an invitation
    share = await admin.post(
        f"/folders/{team}/share", json={"permission": "rw", "emails": ["alice@x.test"]}
    )
    assert share.status_code == 201, share.text

    assert await scoped(alice, "vfolder_own_list") == ([("a-one", "wd"), ("a-two", "wd")], 2)
    assert await scoped(alice, "vfolder_invited_list") == ([("b-shared", "ro")], 1)
    assert await scoped(alice, "vfolder_project_list") == ([("team", "rw")], 1)
    assert await scoped(bob, "vfolder_own_list") == ([("b-shared", "wd"), ("b-private", "wd")], 2)
    assert await scoped(bob, "vfolder_invited_list") == ([], 0)
    assert await scoped(bob, "vfolder_project_list") == ([("team", "ro"), ("lab-data", "rw")], 2)
    # a superadmin's own list is its own folders, not every folder (vfolder_list: all)
    assert await scoped(admin, "vfolder_own_list") == ([("admin-own", "wd")], 1)
    assert (await scoped(admin, "vfolder_list"))[1] == 7
    # pages, filter and order as vfolder_list's
    assert await scoped(alice, "vfolder_own_list", limit=1, offset=1) == ([("a-two", "wd")], 2)
    assert await scoped(alice, "vfolder_own_list", ord="-name") == (
        [("a-two", "wd"), ("a-one", "wd")],
        2,
    )
    assert await scoped(bob, "vfolder_project_list", f='name ilike "lab%"') == (
        [("lab-data", "rw")],
        1,
    )
    for query_field in ("vfolder_own_list", "vfolder_invited_list", "vfolder_project_list"):
        bad = await alice.post(
            "/admin/gql", json={"query": scoped_list(query_field), "variables": {"l": 0, "o": 0}}
        )
        assert bad.json()["errors"][0]["message"].startswith(f"{query_field}(limit): expected")
        wrong = await alice.post(
            "/admin/gql",
            json={
                "query": scoped_list(query_field),
                "variables": {"l": 5, "o": 0, "f": "nosuch == 1"},
            },
        )
        assert "nosuch" in wrong.json()["errors"][0]["message"]


async def test_folder_changes_are_refused_while_frozen(env: Env) -> None:
    """Backend.AI's vfolder routes under ``server_status_required(ALL_ALLOWED)``: 503
    ``server-frozen`` while the manager is frozen, nothing changed; the files inside a
    folder are still worked on; unfrozen, the same requests succeed."""
    alice = await env.user("alice@x.test", group="default")
    bob = await env.user("bob@x.test", group="default")
    await env.user("carol@x.test")
    admin = env.cluster.admin
    fid = (await create(alice, "kept")).json()["id"]
    trashed = (await create(alice, "trashed")).json()["id"]
    assert (await alice.request("DELETE", "/folders", json={"id": trashed})).status_code == 204
    team = (await create(admin, "team", group="default")).json()["id"]
    given = (await create(alice, "given")).json()["id"]
    bob_id = await user_id(env, "bob@x.test")
    for folder_id in (fid, *[(await create(alice, n)).json()["id"] for n in ("other", "other2")]):
        await alice.post(
            f"/folders/{folder_id}/invite", json={"perm": "ro", "user_ids": ["bob@x.test"]}
        )
    pending = (await bob.get("/folders/invitations/list")).json()["invitations"]
    by_name = {i["vfolder_name"]: i["id"] for i in pending}
    invitations = [by_name["kept"], by_name["other"], by_name["other2"]]  # kept: accepted now
    accepted = await bob.post("/folders/invitations/accept", json={"inv_id": invitations[0]})
    assert accepted.status_code == 200, accepted.text
    # in an order that succeeds once unfrozen
    writes: list[tuple[httpx.AsyncClient, str, str, dict[str, Any]]] = [
        (alice, "POST", "/folders", {"name": "new"}),
        (alice, "POST", f"/folders/{fid}/rename", {"new_name": "renamed"}),
        (alice, "POST", f"/folders/{fid}/invite", {"perm": "ro", "user_ids": ["carol@x.test"]}),
        (alice, "POST", f"/folders/{fid}/clone", {"target_name": "copy"}),
        (alice, "POST", f"/folders/{fid}/update-options", {"cloneable": True}),
        (alice, "POST", "/folders/_/shared", {"vfolder": fid, "user": bob_id, "perm": "rw"}),
        (
            admin,
            "POST",
            "/folders/_/change-ownership",
            {"vfolder": given, "user_email": "carol@x.test"},
        ),
        (admin, "POST", f"/folders/{team}/share", {"permission": "rw", "emails": ["alice@x.test"]}),
        (admin, "DELETE", f"/folders/{team}/unshare", {"emails": ["alice@x.test"]}),
        (bob, "POST", "/folders/invitations/accept", {"inv_id": invitations[1]}),
        (bob, "DELETE", "/folders/invitations/delete", {"inv_id": invitations[2]}),
        (bob, "POST", f"/folders/{fid}/leave", {}),
        (alice, "POST", "/folders/restore-from-trash-bin", {"id": trashed}),
        (alice, "DELETE", "/folders", {"id": trashed}),
        (alice, "POST", "/folders/purge", {"id": trashed}),
        (alice, "DELETE", "/folders", {"id": fid}),
        (alice, "POST", "/folders/delete-from-trash-bin", {"id": fid}),
    ]

    async def records() -> list[Any]:
        seen = [(await c.get("/folders")).json() for c in (alice, bob, admin)]
        seen.append((await bob.get("/folders/invitations/list")).json())
        seen.append(sorted(p.name for p in (env.proxy.root / "vol1").iterdir()))
        return seen

    before = await records()
    frozen = await admin.put("/manager/status", json={"status": "frozen"})
    assert frozen.status_code == 204, frozen.text
    for client, method, path, body in writes:
        refused = problem(await client.request(method, path, json=body), 503)
        assert refused["type"].endswith("/server-frozen"), (method, path, refused)
    assert await records() == before
    # the files inside a folder, and reads, go on (Backend.AI: READ_ALLOWED)
    made = await alice.post(f"/folders/{fid}/mkdir", json={"path": "during"})
    assert made.status_code == 201, made.text
    upload = await alice.post(f"/folders/{fid}/request-upload", json={"path": "a", "size": 1})
    assert upload.status_code == 200, upload.text
    looked_up = await alice.request("GET", "/folders/_/id", json={"name": "kept"})
    assert looked_up.json()["id"] == fid

    thawed = await admin.put("/manager/status", json={"status": "running"})
    assert thawed.status_code == 204, thawed.text
    for client, method, path, body in writes:
        response = await client.request(method, path, json=body)
        assert response.status_code < 300, (method, path, response.text)
    names = sorted(f["name"] for f in (await alice.get("/folders")).json())
    assert names == ["copy", "new", "other", "other2", "team"]
