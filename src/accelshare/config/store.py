"""The configuration store: one async API over the etcd and embedded backends.

All keys live under ``/<key_prefix>/<namespace>/`` (``/accelshare/local/`` by default).
Scopes map to key prefixes given at construction (``scope_prefix_map``), as in
Backend.AI's ``AsyncEtcd``::

    {ConfigScopes.GLOBAL: "", ConfigScopes.SCALING_GROUP: "sgroup/gpu", ConfigScopes.NODE: "nodes/agents/i-1"}

(``make_scope_prefix_map(scaling_group="gpu", node_id="i-1")`` builds it.)  A ``MERGED`` read
looks up node, then scaling group, then global; the first found wins, and for
``get_prefix`` the trees are deep-merged with the same precedence.  Writes and watches
name one concrete scope (``GLOBAL`` by default).

Key paths and trees follow ``keys.py``: components are stored URL-quoted,
``get_prefix`` returns unquoted names and exposes a key's own value under ``""`` when
it also has children, ``put_prefix`` flattens, quotes and stringifies and writes in one
transaction.

Who calls what: daemons open a store with ``open_config_store(settings)``
(factory.py), read their options with merged ``get``/``get_prefix``, keep liveness keys
with ``put_with_lease`` + ``refresh_lease``, and follow changes with ``watch_prefix``.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncGenerator, Mapping
from contextlib import AbstractAsyncContextManager, aclosing
from typing import Any
from urllib.parse import quote

from .backend import Delete, DeleteTree, GuardFailed, KVBackend, Put, TreeGuard, in_tree
from .errors import InvalidConfigInput, InvalidKey, ScopeNotConfigured, TransactionRejected
from .keys import (
    NestedDict,
    flatten_tree,
    join_key,
    merge_trees,
    normalize_component,
    split_key,
    stringify_value,
    unflatten_pairs,
)
from .types import ConfigScopes, WatchEvent, WatchEventType

__all__ = [
    "DEFAULT_KEY_PREFIX",
    "DEFAULT_NAMESPACE",
    "ConfigScopes",
    "ConfigStore",
    "NestedDict",
    "WatchEvent",
    "WatchEventType",
    "make_scope_prefix_map",
]

DEFAULT_NAMESPACE = "local"
DEFAULT_KEY_PREFIX = "accelshare"
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
# Lowest precedence first: a later scope overrides an earlier one in merged reads.
_MERGE_ORDER = (ConfigScopes.GLOBAL, ConfigScopes.SCALING_GROUP, ConfigScopes.NODE)
# Guarded read-modify-write (replace, move) retries this often before giving up.
_GUARD_RETRIES = 20


def make_scope_prefix_map(
    *, scaling_group: str | None = None, node_id: str | None = None
) -> dict[ConfigScopes, str]:
    """Backend.AI's layout: global ``""``, ``sgroup/<name>``, ``nodes/agents/<id>``."""
    prefixes = {ConfigScopes.GLOBAL: ""}
    if scaling_group is not None:
        prefixes[ConfigScopes.SCALING_GROUP] = (
            f"sgroup/{_scope_name(scaling_group, 'scaling group name')}"
        )
    if node_id is not None:
        prefixes[ConfigScopes.NODE] = f"nodes/agents/{_scope_name(node_id, 'node id')}"
    return prefixes


def _scope_name(name: str, what: str) -> str:
    if not name or "/" in name:
        raise InvalidKey(
            f"invalid {what} {name!r}",
            expected="a non-empty name without '/'",
            received=name,
        )
    return normalize_component(name)


def _check_name(value: str, what: str) -> str:
    if not _NAME_RE.match(value):
        raise InvalidConfigInput(
            f"invalid {what} {value!r}",
            expected="letters, digits, '_', '.', '-' (not starting with '_', '.' or '-')",
            received=value,
        )
    return value


class ConfigStore:
    """The cluster-wide configuration tree.  Use as ``async with`` or call ``close()``."""

    def __init__(
        self,
        backend: KVBackend,
        *,
        namespace: str = DEFAULT_NAMESPACE,
        key_prefix: str = DEFAULT_KEY_PREFIX,
        scope_prefix_map: Mapping[ConfigScopes, str] | None = None,
        owns_backend: bool = True,
    ) -> None:
        self._backend = backend
        self._namespace = _check_name(namespace, "namespace")
        self._key_prefix = _check_name(key_prefix, "key prefix")
        self._root = f"/{key_prefix}/{namespace}"
        self._lock_root = f"/{key_prefix}/_locks/{namespace}"
        prefixes = dict(scope_prefix_map or {ConfigScopes.GLOBAL: ""})
        prefixes.setdefault(ConfigScopes.GLOBAL, "")
        if ConfigScopes.MERGED in prefixes:
            raise InvalidConfigInput("the merged scope has no prefix of its own")
        self._scope_prefix_map = {
            scope: join_key(*split_key(prefix, allow_root=True, what=f"{scope} scope prefix"))
            for scope, prefix in prefixes.items()
        }
        self._owns_backend = owns_backend

    # -- identity -------------------------------------------------------------------

    @property
    def backend(self) -> KVBackend:
        return self._backend

    @property
    def namespace(self) -> str:
        return self._namespace

    @property
    def scope_prefix_map(self) -> dict[ConfigScopes, str]:
        return dict(self._scope_prefix_map)

    def scoped(
        self, *, scaling_group: str | None = None, node_id: str | None = None
    ) -> ConfigStore:
        """A view of the same backend with other scaling-group / node scopes; closing it is a no-op."""
        return ConfigStore(
            self._backend,
            namespace=self._namespace,
            key_prefix=self._key_prefix,
            scope_prefix_map=make_scope_prefix_map(scaling_group=scaling_group, node_id=node_id),
            owns_backend=False,
        )

    # -- reads ----------------------------------------------------------------------

    async def get(self, key: str, *, scope: ConfigScopes = ConfigScopes.MERGED) -> str | None:
        """The value of ``key``, or ``None``.  Merged: node, then scaling group, then global."""
        path = join_key(*split_key(key))
        roots = [self._scope_root(s) for s in reversed(self._read_scopes(scope))]
        values = await asyncio.gather(*(self._backend.get(join_key(r, path)) for r in roots))
        return next((value for value in values if value is not None), None)

    async def get_prefix(
        self, prefix: str, *, scope: ConfigScopes = ConfigScopes.MERGED
    ) -> NestedDict:
        """The nested tree under ``prefix`` (``""`` = the scope's root); ``{}`` if empty."""
        path = join_key(*split_key(prefix, allow_root=True, what="prefix"))
        roots = [join_key(self._scope_root(s), path) for s in self._read_scopes(scope)]
        snapshots = await asyncio.gather(*(self._backend.get_tree(r) for r in roots))
        result: NestedDict = {}
        for root, snapshot in zip(roots, snapshots, strict=True):
            tree = unflatten_pairs((_relative(k, root), v) for k, v in snapshot.pairs)
            result = merge_trees(result, tree)
        return result

    # -- writes ---------------------------------------------------------------------

    async def put(self, key: str, value: str, *, scope: ConfigScopes = ConfigScopes.GLOBAL) -> None:
        full = join_key(self._scope_root(scope), *split_key(key))
        await self._backend.commit([Put(full, stringify_value(value, key))])

    async def delete(self, key: str, *, scope: ConfigScopes = ConfigScopes.GLOBAL) -> None:
        full = join_key(self._scope_root(scope), *split_key(key))
        await self._backend.commit([Delete(full)])

    async def put_prefix(
        self,
        prefix: str,
        tree: Mapping[str, Any],
        *,
        scope: ConfigScopes = ConfigScopes.GLOBAL,
        replace: bool = False,
    ) -> None:
        """Write ``tree`` under ``prefix`` in one transaction: all of it or nothing.

        With ``replace`` the keys under ``prefix`` that ``tree`` does not contain are
        deleted in the same transaction, so the subtree ends up exactly ``tree``.
        """
        components = split_key(prefix, allow_root=True, what="prefix")
        root = join_key(self._scope_root(scope), *components)
        flat = flatten_tree(tree)
        if "" in flat and not components:
            raise InvalidKey(
                "the root of a scope cannot hold a value (a '' key at the top of the tree)",
                expected="an object without a '' key at the top",
                received=flat[""],
            )
        puts = [Put(join_key(root, rel), value) for rel, value in flat.items()]
        if not replace:
            if puts:
                await self._backend.commit(puts)
            return
        new_keys = {op.key for op in puts}
        for _ in range(_GUARD_RETRIES):
            snapshot = await self._backend.get_tree(root)
            stale = [Delete(key) for key, _ in snapshot.pairs if key not in new_keys]
            try:
                await self._backend.commit([*stale, *puts], guard=TreeGuard.of(root, snapshot))
            except GuardFailed:
                continue
            return
        raise TransactionRejected(f"the tree {prefix!r} kept changing; gave up replacing it")

    async def delete_prefix(
        self, prefix: str, *, scope: ConfigScopes = ConfigScopes.GLOBAL
    ) -> None:
        """Delete ``prefix`` and everything under it (``""``: the whole scope)."""
        root = join_key(self._scope_root(scope), *split_key(prefix, allow_root=True, what="prefix"))
        await self._backend.commit([DeleteTree(root)])

    async def move_prefix(
        self, src: str, dst: str, *, scope: ConfigScopes = ConfigScopes.GLOBAL
    ) -> int:
        """Move the subtree at ``src`` (its own value included) to ``dst`` atomically.

        Keys already under ``dst`` stay unless overwritten; moved keys lose their lease.
        Returns how many keys moved.
        """
        scope_root = self._scope_root(scope)
        src_root = join_key(scope_root, *split_key(src, what="source key"))
        dst_root = join_key(scope_root, *split_key(dst, what="destination key"))
        if in_tree(dst_root, src_root) or in_tree(src_root, dst_root):
            raise InvalidKey(
                f"cannot move {src!r} to {dst!r}: one contains the other",
                expected="two disjoint subtrees",
                received=(src, dst),
            )
        for _ in range(_GUARD_RETRIES):
            snapshot = await self._backend.get_tree(src_root)
            if not snapshot.pairs:
                return 0
            ops = [Put(dst_root + key[len(src_root) :], value) for key, value in snapshot.pairs]
            try:
                await self._backend.commit(
                    [*ops, DeleteTree(src_root)], guard=TreeGuard.of(src_root, snapshot)
                )
            except GuardFailed:
                continue
            return len(ops)
        raise TransactionRejected(f"the tree {src!r} kept changing; gave up moving it")

    # -- watches --------------------------------------------------------------------

    def watch(
        self,
        key: str,
        *,
        scope: ConfigScopes = ConfigScopes.GLOBAL,
        ready: asyncio.Event | None = None,
    ) -> AsyncGenerator[WatchEvent, None]:
        """Changes of one key, from now on; ``ready`` is set once none can be missed."""
        scope_root = self._scope_root(scope)
        return self._watch(join_key(scope_root, *split_key(key)), scope_root, False, ready)

    def watch_prefix(
        self,
        prefix: str,
        *,
        scope: ConfigScopes = ConfigScopes.GLOBAL,
        ready: asyncio.Event | None = None,
    ) -> AsyncGenerator[WatchEvent, None]:
        """Changes of ``prefix`` and everything under it; keys relative to the scope."""
        scope_root = self._scope_root(scope)
        root = join_key(scope_root, *split_key(prefix, allow_root=True, what="prefix"))
        return self._watch(root, scope_root, True, ready)

    async def _watch(
        self, key: str, scope_root: str, tree: bool, ready: asyncio.Event | None
    ) -> AsyncGenerator[WatchEvent, None]:
        async with aclosing(self._backend.watch(key, tree=tree, ready=ready)) as events:
            async for event in events:
                yield WatchEvent(
                    _relative(event.key, scope_root), event.value, event.event, event.revision
                )

    # -- leases and locks -----------------------------------------------------------

    async def put_with_lease(
        self, key: str, value: str, ttl_s: int, *, scope: ConfigScopes = ConfigScopes.GLOBAL
    ) -> int:
        """Write a liveness key that disappears ``ttl_s`` seconds after the last refresh.

        Returns the lease id for ``refresh_lease`` / ``revoke_lease``.
        """
        if ttl_s < 1:
            raise InvalidConfigInput(
                "a lease TTL must be at least 1 s", expected="ttl_s >= 1", received=ttl_s
            )
        full = join_key(self._scope_root(scope), *split_key(key))
        lease_id = await self._backend.grant_lease(ttl_s)
        await self._backend.commit([Put(full, stringify_value(value, key), lease_id)])
        return lease_id

    async def refresh_lease(self, lease_id: int) -> None:
        await self._backend.refresh_lease(lease_id)

    async def revoke_lease(self, lease_id: int) -> None:
        await self._backend.revoke_lease(lease_id)

    def lock(
        self, name: str, *, timeout_s: float | None = None
    ) -> AbstractAsyncContextManager[None]:
        """A lock shared by every process using this namespace; ``LockTimeout`` if not
        acquired within ``timeout_s`` (``None``: wait forever).  Lock keys live outside
        the namespace tree, so they never show up in ``get_prefix`` backups."""
        if not name:
            raise InvalidKey("a lock name must not be empty", expected="a name", received=name)
        return self._backend.lock(f"{self._lock_root}/{quote(name, safe='')}", timeout_s=timeout_s)

    async def close(self) -> None:
        if self._owns_backend:
            await self._backend.close()

    async def __aenter__(self) -> ConfigStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- helpers --------------------------------------------------------------------

    def _scope_root(self, scope: ConfigScopes) -> str:
        if scope is ConfigScopes.MERGED:
            raise InvalidConfigInput(
                "the merged scope is read-only: write to global, sgroup or node",
                expected="global, sgroup or node",
                received=str(scope),
            )
        prefix = self._scope_prefix_map.get(scope)
        if prefix is None:
            what = "a scaling group name" if scope is ConfigScopes.SCALING_GROUP else "a node id"
            raise ScopeNotConfigured(
                f"the {scope} scope is not configured: give {what}",
                expected=what,
                received=None,
            )
        return join_key(self._root, prefix)

    def _read_scopes(self, scope: ConfigScopes) -> list[ConfigScopes]:
        """Scopes to read, lowest precedence first."""
        if scope is ConfigScopes.MERGED:
            return [s for s in _MERGE_ORDER if s in self._scope_prefix_map]
        return [scope]


def _relative(key: str, root: str) -> str:
    """``/a/b/c`` relative to ``/a/b`` is ``c``; the root itself is ``""``."""
    return key[len(root) :].lstrip("/")
