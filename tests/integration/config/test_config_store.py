"""The store contract, run against both backends (embedded SQLite and a real etcd)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any

import pytest

from accelshare.config import (
    ConfigScopes,
    ConfigStore,
    InvalidConfigInput,
    InvalidKey,
    InvalidTree,
    LeaseNotFound,
    LockTimeout,
    ScopeNotConfigured,
    TransactionRejected,
    WatchEvent,
    WatchEventType,
)
from accelshare.config.backend import GuardFailed, Put, TreeGuard
from accelshare.config.embedded import _Txn

from .conftest import ETCD_MAX_TXN_OPS, Harness

pytestmark = pytest.mark.integration

G = ConfigScopes.GLOBAL
# Names that need quoting: '/', spaces, '%', unicode, a dot-only name, an empty value.
NASTY_TREE: dict[str, Any] = {
    "config": {
        "plugins": {
            "accelerator": {
                "cuda": {"allocation_mode": "fractional", "unit_mem": "1073741824"},
                "cuda.device:10g-mig": {"": "unique", "note": "own value and children"},
            }
        },
        "a/b": "slash",
        "with space": "x y",
        "50%": "percent",
        "%41": "looks quoted",
        "한국어 ключ é": "유니코드 ✓",
        "empty": "",
        ".": "dot",
    },
    "resource-group-states": {"default": {"agselector.roundrobin": "3"}},
}


async def take(events: AsyncGenerator[WatchEvent, None], count: int) -> list[WatchEvent]:
    got: list[WatchEvent] = []
    try:
        async for event in events:
            got.append(event)
            if len(got) == count:
                break
    finally:
        await events.aclose()
    return got


async def watching(events_of: Any, count: int) -> asyncio.Task[list[WatchEvent]]:
    """Start a watch in a task and return once it is established."""
    ready = asyncio.Event()
    task = asyncio.create_task(take(events_of(ready), count))
    await asyncio.wait_for(ready.wait(), 10)
    return task


# -- single keys ------------------------------------------------------------------------


async def test_put_get_delete(store: ConfigStore) -> None:
    assert await store.get("config/agent/max-container-count") is None
    await store.put("config/agent/max-container-count", "8")
    assert await store.get("config/agent/max-container-count") == "8"
    await store.put("config/agent/max-container-count", "")
    assert await store.get("config/agent/max-container-count") == ""  # empty is a value
    await store.delete("config/agent/max-container-count")
    assert await store.get("config/agent/max-container-count") is None
    await store.delete("config/agent/max-container-count")  # deleting nothing is fine


async def test_plain_and_quoted_key_forms_address_the_same_key(store: ConfigStore) -> None:
    await store.put("cfg/with space/é", "1")
    assert await store.get("cfg/with%20space/%C3%A9") == "1"
    assert await store.get_prefix("cfg", scope=G) == {"with space": {"é": "1"}}
    await store.put_prefix("cfg", {"a/b": "2"})
    assert await store.get("cfg/a%2Fb") == "2"


@pytest.mark.parametrize("key", ["", "/", "a//b"])
async def test_bad_keys_are_refused(store: ConfigStore, key: str) -> None:
    with pytest.raises(InvalidKey):
        await store.put(key, "v")
    with pytest.raises(InvalidKey):
        await store.get(key)


# -- trees ------------------------------------------------------------------------------


async def test_get_prefix_nests_unquotes_and_keeps_own_values(store: ConfigStore) -> None:
    await store.put_prefix("", NASTY_TREE)
    assert await store.get_prefix("", scope=G) == NASTY_TREE
    mig = await store.get_prefix("config/plugins/accelerator/cuda.device:10g-mig", scope=G)
    assert mig == {"": "unique", "note": "own value and children"}


async def test_get_prefix_does_not_leak_into_siblings(store: ConfigStore) -> None:
    await store.put_prefix("cfg", {"a": {"": "own", "b": "1"}, "ab": "2", "a-b": "3", "a.c": "4"})
    assert await store.get_prefix("cfg/a", scope=G) == {"": "own", "b": "1"}
    assert await store.get_prefix("cfg/missing", scope=G) == {}


async def test_put_prefix_stringifies_values(store: ConfigStore) -> None:
    await store.put_prefix("cfg", {"int": 1073741824, "true": True, "false": False, "float": 0.5})
    assert await store.get_prefix("cfg", scope=G) == {
        "int": "1073741824",
        "true": "true",
        "false": "false",
        "float": "0.5",
    }


@pytest.mark.parametrize(
    "tree",
    [
        {"ok": "1", "bad": None},
        {"ok": "1", "bad": [1, 2]},
        {"ok": "1", "nested": {"": {"x": "1"}}},
        {1: "non-string key"},
    ],
    ids=["null", "list", "object-under-empty-key", "int-key"],
)
async def test_put_prefix_refuses_unstorable_trees_and_writes_nothing(
    store: ConfigStore, tree: dict[Any, Any]
) -> None:
    with pytest.raises(InvalidTree):
        await store.put_prefix("cfg", tree)
    assert await store.get_prefix("cfg", scope=G) == {}


async def test_the_root_cannot_hold_a_value(store: ConfigStore) -> None:
    with pytest.raises(InvalidKey):
        await store.put_prefix("", {"": "root value"})


async def test_put_prefix_is_all_or_nothing(
    harness: Harness, store: ConfigStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failure in the middle of a put_prefix leaves the tree as it was.

    embedded: the transaction fails after half of the rows were written inside it;
    etcd: the server refuses the transaction (more operations than --max-txn-ops), which
    a store that split the tree into several transactions would have half-applied.
    """
    await store.put("cfg/k0000", "before")
    tree = {f"k{i:04d}": str(i) for i in range(ETCD_MAX_TXN_OPS + 50)}
    if harness.kind == "embedded":
        original = _Txn.put_many

        def fail_halfway(self: _Txn, puts: list[Put]) -> None:
            original(self, puts[: len(puts) // 2])
            raise OSError("injected failure")

        monkeypatch.setattr(_Txn, "put_many", fail_halfway)
        expected: type[Exception] = OSError
    else:
        expected = TransactionRejected
    with pytest.raises(expected) as excinfo:
        await store.put_prefix("cfg", tree)
    if harness.kind == "etcd":
        assert "max-txn-ops" in str(excinfo.value)
        assert "nothing was written" in str(excinfo.value)
    assert await store.get_prefix("cfg", scope=G) == {"k0000": "before"}


async def test_put_prefix_replace_makes_the_subtree_exact(store: ConfigStore) -> None:
    await store.put_prefix("cfg", {"keep": "1", "stale": {"x": "2"}, "": "own"})
    await store.put("cfgx", "sibling")
    await store.put_prefix("cfg", {"keep": "9", "new": "3"}, replace=True)
    assert await store.get_prefix("cfg", scope=G) == {"keep": "9", "new": "3"}
    assert await store.get("cfgx") == "sibling"


async def test_guarded_commit_fails_when_the_tree_changed(
    harness: Harness, store: ConfigStore
) -> None:
    backend = store.backend
    root = f"/accelshare/{store.namespace}/cfg"
    await store.put("cfg/a", "1")
    snapshot = await backend.get_tree(root)
    await store.put("cfg/b", "2")  # a concurrent writer
    with pytest.raises(GuardFailed):
        await backend.commit([Put(root + "/c", "3")], guard=TreeGuard.of(root, snapshot))
    assert await store.get("cfg/c") is None
    fresh = await backend.get_tree(root)
    await backend.commit([Put(root + "/c", "3")], guard=TreeGuard.of(root, fresh))
    assert await store.get("cfg/c") == "3"


@pytest.mark.parametrize("deleted", ["cfg/b", "cfg"], ids=["child", "own-value"])
async def test_guarded_commit_fails_when_another_client_deleted_a_key(
    harness: Harness, store: ConfigStore, deleted: str
) -> None:
    # What move_prefix does, with a delete by another client between its read and its
    # commit: the commit must fail, or the deleted key would come back under "moved".
    backend = store.backend
    root = f"/accelshare/{store.namespace}/cfg"
    await store.put_prefix("cfg", {"": "own", "a": "1", "b": "2"})
    snapshot = await backend.get_tree(root)
    assert [k for k, _ in snapshot.pairs] == [root, root + "/a", root + "/b"]
    async with harness.store() as other:
        await other.delete(deleted)
    moved = f"/accelshare/{store.namespace}/moved"
    ops = [Put(moved + key[len(root) :], value) for key, value in snapshot.pairs]
    with pytest.raises(GuardFailed):
        await backend.commit(ops, guard=TreeGuard.of(root, snapshot))
    assert await store.get_prefix("moved", scope=G) == {}
    # Read again and the same commit goes through, without the deleted key.
    fresh = await backend.get_tree(root)
    ops = [Put(moved + key[len(root) :], value) for key, value in fresh.pairs]
    await backend.commit(ops, guard=TreeGuard.of(root, fresh))
    expected = {"": "own", "a": "1", "b": "2"}
    del expected[deleted.removeprefix("cfg").removeprefix("/")]
    assert await store.get_prefix("moved", scope=G) == expected


async def test_guarded_commit_fails_when_a_key_was_deleted_and_recreated(
    harness: Harness, store: ConfigStore
) -> None:
    backend = store.backend
    root = f"/accelshare/{store.namespace}/cfg"
    await store.put_prefix("cfg", {"a": "1", "b": "2"})
    snapshot = await backend.get_tree(root)
    async with harness.store() as other:
        await other.delete("cfg/b")
        await other.put("cfg/b", "2")  # same value, but a different key's life
    with pytest.raises(GuardFailed):
        await backend.commit([Put(root + "/c", "3")], guard=TreeGuard.of(root, snapshot))
    assert await store.get("cfg/c") is None


async def test_delete_prefix_takes_the_subtree_and_its_own_value(store: ConfigStore) -> None:
    await store.put_prefix("cfg", {"a": {"": "own", "b": {"c": "1"}}, "ab": "2", "a-b": "3"})
    await store.delete_prefix("cfg/a")
    assert await store.get_prefix("cfg", scope=G) == {"ab": "2", "a-b": "3"}


async def test_move_prefix(store: ConfigStore) -> None:
    await store.put_prefix("old", {"": "own", "x y": {"z": "1"}, "w": ""})
    await store.put("oldish", "stays")
    assert await store.move_prefix("old", "new/place") == 3
    assert await store.get_prefix("old", scope=G) == {}
    assert await store.get_prefix("new/place", scope=G) == {"": "own", "x y": {"z": "1"}, "w": ""}
    assert await store.get("oldish") == "stays"
    assert await store.move_prefix("old", "elsewhere") == 0
    with pytest.raises(InvalidKey):
        await store.move_prefix("new", "new/place/deeper")
    with pytest.raises(InvalidKey):
        await store.move_prefix("new/place", "new")


async def test_backup_and_restore_reproduce_the_tree_exactly(store: ConfigStore) -> None:
    await store.put_prefix("", NASTY_TREE)
    await store.put("config/raw key/é", "written with put")
    await store.put("x", "node", scope=ConfigScopes.NODE)
    root = f"/accelshare/{store.namespace}"
    raw_before = (await store.backend.get_tree(root)).pairs

    backup = await store.get_prefix("", scope=G)
    await store.delete_prefix("", scope=G)
    assert await store.get_prefix("", scope=G) == {}
    await store.put_prefix("", backup)

    assert await store.get_prefix("", scope=G) == backup
    assert (await store.backend.get_tree(root)).pairs == raw_before


# -- scopes -----------------------------------------------------------------------------


async def test_merged_reads_prefer_node_then_scaling_group_then_global(store: ConfigStore) -> None:
    base = "config/plugins/accelerator/cuda"
    await store.put_prefix(
        base, {"allocation_mode": "discrete", "unit_mem": "1g", "unit_proc": "8"}
    )
    await store.put_prefix(
        base, {"allocation_mode": "fractional", "unit_mem": "2g"}, scope=ConfigScopes.SCALING_GROUP
    )
    await store.put_prefix(base, {"unit_mem": "4g", "only_node": "n"}, scope=ConfigScopes.NODE)

    assert await store.get(f"{base}/unit_mem") == "4g"
    assert await store.get(f"{base}/allocation_mode") == "fractional"
    assert await store.get(f"{base}/unit_proc") == "8"
    assert await store.get(f"{base}/unit_mem", scope=ConfigScopes.SCALING_GROUP) == "2g"
    assert await store.get(f"{base}/unit_mem", scope=G) == "1g"
    assert await store.get_prefix(base) == {
        "allocation_mode": "fractional",
        "unit_mem": "4g",
        "unit_proc": "8",
        "only_node": "n",
    }
    # The scopes live where Backend.AI puts them.
    assert await store.get(f"sgroup/gpu/{base}/unit_mem", scope=G) == "2g"
    assert await store.get(f"nodes/agents/i-1/{base}/unit_mem", scope=G) == "4g"


async def test_an_empty_value_in_a_nearer_scope_still_wins(store: ConfigStore) -> None:
    await store.put("config/x", "global")
    await store.put("config/x", "", scope=ConfigScopes.NODE)
    assert await store.get("config/x") == ""


async def test_scopes_must_be_configured_and_merged_is_read_only(harness: Harness) -> None:
    async with harness.store(scaling_group=None, node_id=None) as store:
        await store.put("config/x", "g")
        assert await store.get("config/x") == "g"  # merged = global only
        with pytest.raises(ScopeNotConfigured):
            await store.put("config/x", "v", scope=ConfigScopes.NODE)
        with pytest.raises(InvalidConfigInput):
            await store.put("config/x", "v", scope=ConfigScopes.MERGED)
        view = store.scoped(scaling_group="cpu", node_id="i-2")
        await view.put("config/x", "node", scope=ConfigScopes.NODE)
        await view.close()  # a view does not close the shared backend
        assert await store.get("nodes/agents/i-2/config/x") == "node"


# -- watches ----------------------------------------------------------------------------


async def test_watch_a_key(store: ConfigStore) -> None:
    await store.put("config/x", "before the watch")
    task = await watching(lambda ready: store.watch("config/x", ready=ready), 3)
    await store.put("config/y", "other key")
    await store.put("config/x", "1")
    await store.put("config/x", "2")
    await store.delete("config/x")
    events = await asyncio.wait_for(task, 10)
    assert [(e.key, e.value, e.event) for e in events] == [
        ("config/x", "1", WatchEventType.PUT),
        ("config/x", "2", WatchEventType.PUT),
        ("config/x", "", WatchEventType.DELETE),
    ]
    assert events[0].revision < events[1].revision < events[2].revision


async def test_watch_prefix_sees_the_subtree_only(store: ConfigStore) -> None:
    task = await watching(lambda ready: store.watch_prefix("cfg/a", ready=ready), 4)
    await store.put("cfg/ab", "sibling")
    await store.put("cfg/a-b", "sibling")
    await store.put("cfg/a", "own")
    await store.put_prefix("cfg/a", {"b c": "1", "d": "2"})  # one transaction, two events
    await store.delete_prefix("cfg/a/d")
    events = await asyncio.wait_for(task, 10)
    assert [(e.key, e.value, e.event) for e in events] == [
        ("cfg/a", "own", WatchEventType.PUT),
        ("cfg/a/b%20c", "1", WatchEventType.PUT),
        ("cfg/a/d", "2", WatchEventType.PUT),
        ("cfg/a/d", "", WatchEventType.DELETE),
    ]
    assert events[1].revision == events[2].revision


async def test_watch_keys_are_relative_to_the_scope(store: ConfigStore) -> None:
    task = await watching(
        lambda ready: store.watch_prefix("", scope=ConfigScopes.NODE, ready=ready), 1
    )
    await store.put("config/x", "global: not seen")
    await store.put("config/x", "node", scope=ConfigScopes.NODE)
    (event,) = await asyncio.wait_for(task, 10)
    assert (event.key, event.value) == ("config/x", "node")


async def test_a_watch_sees_writes_of_another_store(harness: Harness, store: ConfigStore) -> None:
    async with harness.store() as other:
        task = await watching(lambda ready: store.watch("config/x", ready=ready), 1)
        await other.put("config/x", "from another client")
        (event,) = await asyncio.wait_for(task, 10)
        assert event.value == "from another client"


# -- leases -----------------------------------------------------------------------------


async def test_a_lease_key_disappears_when_the_lease_expires(
    harness: Harness, store: ConfigStore
) -> None:
    task = await watching(lambda ready: store.watch("nodes/manager/m-1", ready=ready), 2)
    lease_id = await store.put_with_lease("nodes/manager/m-1", "up", ttl_s=1)
    assert await store.get("nodes/manager/m-1") == "up"
    harness.expire_leases(2)
    events = await asyncio.wait_for(task, 15)
    assert [e.event for e in events] == [WatchEventType.PUT, WatchEventType.DELETE]
    assert await store.get("nodes/manager/m-1") is None
    with pytest.raises(LeaseNotFound):
        await store.refresh_lease(lease_id)


async def test_a_refreshed_lease_keeps_its_key(harness: Harness, store: ConfigStore) -> None:
    # 3 s pass in all, past the 2 s TTL, but never more than 1 s without a refresh: the
    # key survives only if each refresh really restarts the TTL.  On etcd this is real
    # time (etcd honours TTLs down to 1 s with the test server's raft timings).
    lease_id = await store.put_with_lease("nodes/manager/m-1", "up", ttl_s=2)
    for _ in range(3):
        await harness.let_lease_time_pass(1)
        await store.refresh_lease(lease_id)
        assert await store.get("nodes/manager/m-1") == "up"
    await store.revoke_lease(lease_id)
    assert await store.get("nodes/manager/m-1") is None
    await store.revoke_lease(lease_id)  # revoking twice is fine
    with pytest.raises(LeaseNotFound):
        await store.refresh_lease(lease_id)


async def test_lease_ttl_must_be_positive(store: ConfigStore) -> None:
    with pytest.raises(InvalidConfigInput):
        await store.put_with_lease("nodes/manager/m-1", "up", ttl_s=0)


# -- locks ------------------------------------------------------------------------------


async def test_lock_is_exclusive_between_clients(harness: Harness, store: ConfigStore) -> None:
    async with harness.store() as other:
        order: list[str] = []
        async with store.lock("scheduler"):
            with pytest.raises(LockTimeout):
                async with other.lock("scheduler", timeout_s=0.3):
                    pass

            async def contender() -> None:
                async with other.lock("scheduler", timeout_s=10):
                    order.append("other")

            task = asyncio.create_task(contender())
            await asyncio.sleep(0.2)
            order.append("first releases")
        await asyncio.wait_for(task, 10)
        assert order == ["first releases", "other"]
        async with other.lock("another-name", timeout_s=1):
            pass  # different names do not exclude each other


async def test_lock_keys_stay_out_of_the_tree(store: ConfigStore) -> None:
    async with store.lock("scheduler"):
        assert await store.get_prefix("", scope=G) == {}
