"""The rest of the official client's admin commands (backend.ai-client 25.5.2) against
accelshare: storage volumes, ``last_used``, the announcement, ``admin etcd``, image
aliases, scaling-group associations, and one of each kind of refusal (a 501 problem, a
GraphQL error).

The cluster is shared with the other compat tests: names made here start with
``adm2-`` and everything set is removed again.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from accelshare.client import AccelshareClient
from accelshare.devcluster import LocalCluster

from .conftest import Bai

pytestmark = pytest.mark.integration


def out(bai: Bai, *args: str) -> Any:
    return bai.ok("--output", "json", *args).json()


def test_admin_storage_list_and_info(bai: Bai) -> None:
    listed = out(bai, "admin", "storage", "list")
    volumes = {v["id"]: v for v in listed["items"]}
    assert "local:volume1" in volumes, listed  # dev up's storage proxy
    assert volumes["local:volume1"]["backend"] == "vfs"

    detail = bai.ok("admin", "storage", "info", "local:volume1").stdout
    assert "vfs" in detail
    assert "volume1" in detail  # the path
    missing = bai("admin", "storage", "info", "local:adm2-none")
    assert missing.code != 0
    assert "no volume 'adm2-none'" in missing.output


def test_vfolder_types(bai: Bai) -> None:
    assert bai.ok("admin", "resource", "vfolder-types").stdout.split() == ["user", "group"]


def test_keypair_last_used(bai: Bai) -> None:
    bai.ok("admin", "user", "info")  # a signed request: the key is used
    mine = out(bai, "admin", "keypair", "info")["items"][0]
    assert mine["last_used"], mine  # recorded off the request path, within the minute


def test_announcement(bai: Bai) -> None:
    try:
        bai.ok("admin", "announcement", "update", "-m", "adm2 maintenance at 18:00")
        got = bai.ok("admin", "announcement", "get")
        assert "adm2 maintenance at 18:00" in got.stdout
        # every later command shows it (on stderr)
        assert "adm2 maintenance at 18:00" in bai.ok("admin", "user", "info").stderr
    finally:
        bai.ok("admin", "announcement", "delete", input="y\n")
    assert "No announcements." in bai.ok("admin", "announcement", "get").stdout


def test_admin_etcd(bai: Bai) -> None:
    try:
        assert "Successfully set" in bai.ok("admin", "etcd", "set", "adm2/one", "x").output
        bai.ok("admin", "etcd", "set", "adm2/tree", '{"a": "1", "b": {"c": "2"}}')
        assert '"x"' in bai.ok("admin", "etcd", "get", "adm2/one").output
        tree = bai.ok("admin", "etcd", "get", "adm2", "--prefix").output
        for text in ('"one": "x"', '"c": "2"'):
            assert text in tree, tree
    finally:
        bai.ok("admin", "etcd", "delete", "adm2", "--prefix")
    assert bai.ok("admin", "etcd", "get", "adm2", "--prefix").output.strip().endswith("null")


def test_image_alias_and_dealias(bai: Bai) -> None:
    made = bai.ok("admin", "image", "alias", "adm2-py", "python")
    assert "adm2-py" in made.output
    try:
        images = out(bai, "admin", "image", "list")["items"]
        python = [i for i in images if "adm2-py" in (i.get("aliases") or [])]
        assert python, images
    finally:
        bai.ok("admin", "image", "dealias", "adm2-py")
    images = out(bai, "admin", "image", "list")["items"]
    assert not [i for i in images if "adm2-py" in (i.get("aliases") or [])]


def test_refusals_name_what_to_use(bai: Bai) -> None:
    # a 501 problem
    license_ = bai("admin", "license", "show")
    assert license_.code != 0
    assert "501" in license_.output
    assert "accelshare has no license" in license_.output
    # a GraphQL error
    rescan = bai("admin", "image", "rescan")
    assert rescan.code != 0
    assert "accelshare admin image add" in rescan.output


def test_scaling_group_associations_change_what_a_user_may_use(bai: Bai) -> None:
    """``associate-scaling-group`` / ``dissociate-scaling-group``: a new scaling group is
    open to nobody until associated with a domain; closing the default one to the domain
    refuses the sessions that would have used it."""

    def available() -> str:
        return bai.ok("admin", "scaling-group", "get-available", "default").output

    bai.ok("admin", "scaling-group", "add", "adm2-gpu", "--description", "a team's GPUs")
    try:
        assert "'adm2-gpu'" not in available()
        for _ in range(2):  # associating again changes nothing and succeeds
            associated = bai.ok(
                "admin", "scaling-group", "associate-scaling-group", "adm2-gpu", "default"
            )
            assert "Scaling group adm2-gpu is associated with domain default." in associated.output
        assert "{'name': 'adm2-gpu'}" in available()
        # The client 25.5.2 dissociates, then fails printing the answer: it looks for a
        # `scaling_group` item the mutation's `{ok msg}` never has (so with Backend.AI too)
        dissociated = bai(
            "admin", "scaling-group", "dissociate-scaling-group", "adm2-gpu", "default"
        )
        assert dissociated.code != 0
        assert "KeyError: 'scaling_group'" in dissociated.output
        assert "print_mutation_result" in dissociated.output
        assert "'adm2-gpu'" not in available()

        # the SDK's calls: a project, then every association of the project
        project = out(bai, "admin", "group", "info", "default")["items"][0]["id"]
        answer = bai.sdk("sgroup", call="associate_group", args=["adm2-gpu", project])
        assert answer["ok"] is True, answer
        assert "{'name': 'adm2-gpu'}" in available()
        answer = bai.sdk("sgroup", call="dissociate_group", args=["adm2-gpu", project])
        assert answer["ok"] is True, answer
        assert "'adm2-gpu'" not in available()
        bai.sdk("sgroup", call="associate_group", args=["adm2-gpu", project])
        answer = bai.sdk("sgroup", call="dissociate_all_group", args=[project])
        assert answer["ok"] is True, answer
        assert "'adm2-gpu'" not in available()

        answer = bai.sdk("sgroup", call="dissociate_domain", args=["default", "default"])
        assert answer["ok"] is True, answer
        try:
            assert "'default'" not in available()
            refused = bai("session", "create", "-r", "cpu=1", "--name", "compat-sg-shut", "python")
            assert refused.code != 0, refused
            assert "400" in refused.output
            assert "No scaling group is open to your sessions" in refused.output
        finally:
            bai.ok("admin", "scaling-group", "associate-scaling-group", "default", "default")
        # open again (no session made here: `ps` of the shared cluster shows one page)
        assert "{'name': 'default'}" in available()

        unknown = bai("admin", "scaling-group", "associate-scaling-group", "adm2-none", "default")
        assert unknown.code != 0
        assert "No scaling group 'adm2-none'" in unknown.output
    finally:
        bai.ok("admin", "scaling-group", "delete", "adm2-gpu")


def test_image_forget(bai: Bai, cluster: LocalCluster) -> None:
    """``image forget REF`` (GraphQL ``forget_image_by_id``) removes a throwaway image and
    its alias from the catalogue; a plain user is refused; an unknown image is an error."""

    async def add() -> None:
        async with AccelshareClient(cluster.client_config()) as client:
            await client.images.add("adm2-forget:1.0", aliases=["adm2-forget"])

    asyncio.run(add())
    listed = out(bai, "admin", "image", "list")["items"]
    assert [i["name"] for i in listed if "adm2-forget" in (i.get("aliases") or [])] == [
        "adm2-forget"
    ]

    async def user() -> tuple[str, str]:
        async with AccelshareClient(cluster.client_config()) as client:
            made = await client.admin.create_user("adm2-forget@example.com", "long enough password")
        assert made.keypair is not None
        assert made.keypair.secret_key is not None
        return made.keypair.access_key, made.keypair.secret_key

    denied = bai.as_user(*asyncio.run(user()))("image", "forget", "adm2-forget:1.0")
    assert denied.code != 0
    assert "This needs the superadmin role" in denied.output, denied
    assert "Image forgotten" not in denied.output

    forgotten = bai.ok("image", "forget", "adm2-forget:1.0")
    assert "Image forgotten: adm2-forget:1.0" in forgotten.output
    listed = out(bai, "admin", "image", "list")["items"]
    assert not [i for i in listed if i["name"] == "adm2-forget"], listed
    again = bai("image", "forget", "adm2-forget:1.0")
    assert again.code != 0
    assert "No image or alias 'adm2-forget:1.0'" in again.output


@pytest.mark.parametrize(
    ("command", "says"),
    [
        (("service", "list"), "Not supported by accelshare: model serving."),
        (("network", "list"), "Not supported by accelshare: inter-session networks."),
        (
            ("image", "list", "--customized"),
            "Not supported by accelshare: customized images (sessions committed as images).",
        ),
    ],
)
def test_missing_features_are_refused_clearly(
    bai: Bai, command: tuple[str, ...], says: str
) -> None:
    refused = bai(*command)
    assert refused.code != 0
    assert says in refused.output, refused
    assert "docs/compatibility.md" in refused.output
    assert "Cannot query field" not in refused.output
