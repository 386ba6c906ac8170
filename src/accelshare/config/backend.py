"""The small storage interface each backend (etcd, embedded SQLite) implements.

Backends know nothing about scopes, quoting or nested trees: they store full string
keys (``/accelshare/local/config/x``) with string values, and offer

- ``get`` of one key, ``get_tree`` of a key and everything under ``key + "/"`` as one
  consistent snapshot with its revision;
- ``commit``: a list of writes applied in one transaction, all or nothing, optionally
  guarded ("nothing in this tree changed after revision R");
- ``watch`` of a key or a tree, starting from a revision, that survives backend restarts;
- leases (keys that vanish when not refreshed) and a cross-process lock.

``ConfigStore`` (store.py) builds the public API on these primitives, so quoting,
scopes and merging are written and tested once.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import AsyncGenerator, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass

from .types import WatchEvent

__all__ = [
    "Delete",
    "DeleteTree",
    "GuardFailed",
    "KVBackend",
    "Put",
    "TreeGuard",
    "TreeSnapshot",
    "TxnOp",
    "in_tree",
]


@dataclass(frozen=True, slots=True)
class Put:
    key: str
    value: str
    lease_id: int = 0  # 0: no lease


@dataclass(frozen=True, slots=True)
class Delete:
    key: str


@dataclass(frozen=True, slots=True)
class DeleteTree:
    """Delete ``key`` itself and every key under ``key + "/"``."""

    key: str


TxnOp = Put | Delete | DeleteTree


@dataclass(frozen=True, slots=True)
class TreeSnapshot:
    revision: int
    pairs: list[tuple[str, str]]  # (full key, value), sorted by key


@dataclass(frozen=True, slots=True)
class TreeGuard:
    """Commit only if the tree rooted at ``key`` is still as read at ``revision``.

    No key in it may have been written (put *or deleted*) after ``revision``.  ``keys``
    are the keys the snapshot held: a backend that cannot see deletions in its history
    (etcd compares only keys that exist) checks that each of them still exists.  Build
    it with :meth:`of` so the two always come from the same snapshot.
    """

    key: str
    revision: int
    keys: tuple[str, ...]

    @classmethod
    def of(cls, key: str, snapshot: TreeSnapshot) -> TreeGuard:
        """The guard for ``snapshot``, which ``get_tree(key)`` returned."""
        return cls(key, snapshot.revision, tuple(k for k, _ in snapshot.pairs))


class GuardFailed(Exception):
    """The guarded tree changed since it was read; the caller reads again and retries."""


def in_tree(key: str, root: str) -> bool:
    """Whether ``key`` is ``root`` or lies under ``root + "/"``."""
    return key == root or key.startswith(root + "/")


class KVBackend(abc.ABC):
    """Storage primitives.  Every method may raise ``ConfigStoreUnavailable``."""

    #: Human-readable target for messages, e.g. "etcd at 127.0.0.1:2379".
    description: str = "config store"

    @abc.abstractmethod
    async def get(self, key: str) -> str | None: ...

    @abc.abstractmethod
    async def get_tree(self, key: str) -> TreeSnapshot: ...

    @abc.abstractmethod
    async def commit(self, ops: Sequence[TxnOp], *, guard: TreeGuard | None = None) -> int:
        """Apply ``ops`` in one transaction and return its revision.

        Raises ``GuardFailed`` (nothing written) when the guard does not hold and
        ``TransactionRejected`` (nothing written) when the backend refuses the batch.
        """

    @abc.abstractmethod
    def watch(
        self,
        key: str,
        *,
        tree: bool,
        start_revision: int | None = None,
        ready: asyncio.Event | None = None,
    ) -> AsyncGenerator[WatchEvent, None]:
        """Events on ``key`` (and under ``key + "/"`` if ``tree``), oldest first.

        Starts after the current revision unless ``start_revision`` is given; sets
        ``ready`` once events can no longer be missed.  Never ends by itself.
        """

    @abc.abstractmethod
    async def grant_lease(self, ttl_s: int) -> int: ...

    @abc.abstractmethod
    async def refresh_lease(self, lease_id: int) -> None:
        """Restart the lease's TTL; ``LeaseNotFound`` if it expired or was revoked."""

    @abc.abstractmethod
    async def revoke_lease(self, lease_id: int) -> None:
        """Delete the lease and its keys now; a missing lease is not an error."""

    @abc.abstractmethod
    def lock(self, key: str, *, timeout_s: float | None) -> AbstractAsyncContextManager[None]:
        """Mutual exclusion across processes and hosts sharing this backend."""

    @abc.abstractmethod
    async def close(self) -> None: ...
