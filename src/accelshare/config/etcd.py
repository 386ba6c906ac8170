"""The etcd backend (v3 API over gRPC, through the ``aetcd`` client).

``aetcd`` opens the channel and authenticates; the requests themselves go through its
raw gRPC stubs, because its convenience wrappers drop what this backend needs (the
response header's revision for a consistent ``get_tree``, the ``created`` response of
a watch).

Failure handling, the part that matters in production:

- every request is retried while etcd is unreachable (``UNAVAILABLE``, deadline
  exceeded), with a short backoff, until ``timeout_s`` has passed; then it raises
  ``ConfigStoreUnavailable`` naming the address, never hangs;
- a watch is a gRPC stream of its own.  When the stream breaks (etcd restarted, the
  network dropped) it is re-created from the revision after the last event it
  delivered, so no event is lost or repeated.  It gives up with
  ``ConfigStoreUnavailable`` after ``reconnect_timeout_s`` without etcd (``None``:
  never);
- a connection that dies *silently* (a network partition, a NAT or firewall dropping
  its state: nothing closes the socket) would leave a watch waiting forever, since
  the watch has no deadline.  HTTP/2 keepalive pings find it: every
  ``keepalive_time_s`` while a call is open, and a ping unanswered for
  ``keepalive_timeout_s`` closes the connection, which breaks the watch's stream so
  it reconnects as above;
- ``put_prefix``'s single transaction is bounded by the server's ``--max-txn-ops``
  (128 by default) and ``--max-request-bytes`` (1.5 MiB): a larger tree is refused
  whole with ``TransactionRejected`` explaining which limit to raise -- it is never
  split into several transactions, which would break all-or-nothing;
- locks are a key created with ``create_revision == 0`` under a lease that a
  background task keeps alive; releasing revokes the lease, so a crashed holder's
  lock vanishes after ``lock_ttl_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

import aetcd
import aetcd.exceptions
from aetcd import rpc  # the etcd v3 protobuf messages and gRPC stubs, re-exported

from accelshare.aio import cancel_and_wait

from .backend import (
    Delete,
    DeleteTree,
    GuardFailed,
    KVBackend,
    Put,
    TreeGuard,
    TreeSnapshot,
    TxnOp,
    in_tree,
)
from .errors import (
    ConfigStoreError,
    ConfigStoreUnavailable,
    LeaseNotFound,
    LockTimeout,
    TransactionRejected,
)
from .types import WatchEvent, WatchEventType

__all__ = ["EtcdBackend"]

log = logging.getLogger(__name__)
T = TypeVar("T")

_RETRYABLE = {rpc.StatusCode.UNAVAILABLE, rpc.StatusCode.DEADLINE_EXCEEDED}
# etcd refuses pings more frequent than its --grpc-keepalive-min-time (5 s by default)
# with GOAWAY "too_many_pings", so the interval stays above that.
DEFAULT_KEEPALIVE_TIME_S = 10.0
DEFAULT_KEEPALIVE_TIMEOUT_S = 5.0
_CHANNEL_OPTIONS: dict[str, Any] = {
    # Reconnect quickly after an etcd restart instead of gRPC's default backoff (up to 120 s).
    "grpc.initial_reconnect_backoff_ms": 100,
    "grpc.min_reconnect_backoff_ms": 100,
    "grpc.max_reconnect_backoff_ms": 1000,
    # Large trees: get_prefix of tens of thousands of keys exceeds gRPC's 4 MiB default.
    "grpc.max_receive_message_length": 256 * 1024 * 1024,
    "grpc.max_send_message_length": 256 * 1024 * 1024,
    # Keepalive pings only while a call is open: etcd does not permit pings on a
    # connection without streams (its enforcement policy's PermitWithoutStream is
    # false), and an idle connection has no watch to save.  A watch is a call that may
    # not send a byte for hours, so pings must not wait for data (gRPC's default
    # allows only 2 pings without data).
    "grpc.keepalive_permit_without_calls": 0,
    "grpc.http2.max_pings_without_data": 0,
}


def channel_options(keepalive_time_s: float, keepalive_timeout_s: float) -> dict[str, Any]:
    """The gRPC channel options of a backend (``aetcd.Client(options=...)``)."""
    if keepalive_time_s <= 0 or keepalive_timeout_s <= 0:
        raise ValueError(
            "etcd keepalive: expected keepalive_time_s > 0 and keepalive_timeout_s > 0,"
            f" received {keepalive_time_s!r} and {keepalive_timeout_s!r}"
        )
    return {
        **_CHANNEL_OPTIONS,
        "grpc.keepalive_time_ms": round(keepalive_time_s * 1000),
        "grpc.keepalive_timeout_ms": round(keepalive_timeout_s * 1000),
        # How long any ping (keepalive or gRPC's own flow-control ping) may go
        # unanswered.  With its default of 60 s a dead connection lingered a minute
        # despite the keepalive timeout (test_etcd_backend.py, the silent proxy test).
        "grpc.http2.ping_timeout_ms": round(keepalive_timeout_s * 1000),
    }


class _StreamEnded(Exception):
    """The server closed a watch stream."""


def _b(text: str) -> bytes:
    return text.encode()


class EtcdBackend(KVBackend):
    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 2379,
        user: str | None = None,
        password: str | None = None,
        timeout_s: float = 5.0,
        reconnect_timeout_s: float | None = 60.0,
        lock_ttl_s: int = 10,
        keepalive_time_s: float = DEFAULT_KEEPALIVE_TIME_S,
        keepalive_timeout_s: float = DEFAULT_KEEPALIVE_TIMEOUT_S,
    ) -> None:
        self.description = f"etcd at {host}:{port}"
        self._timeout_s = timeout_s
        self._reconnect_timeout_s = reconnect_timeout_s
        self._lock_ttl_s = lock_ttl_s
        self._client = aetcd.Client(
            host=host,
            port=port,
            username=user or None,
            password=password or None,
            timeout=timeout_s,
            options=channel_options(keepalive_time_s, keepalive_timeout_s),
            connect_wait_timeout=timeout_s,
        )
        self._closed = False

    # -- plumbing -------------------------------------------------------------------

    async def _connected(self) -> Any:
        if self._closed:
            raise ConfigStoreError(f"the connection to {self.description} is closed")
        await self._client.connect()
        return self._client

    async def _rpc(self, call: Callable[[Any], Awaitable[T]]) -> T:
        """Run ``call(client)``, retrying while etcd is unreachable, for ``timeout_s``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._timeout_s
        delay = 0.05
        reauthenticated = False
        while True:
            try:
                async with asyncio.timeout_at(deadline):
                    client = await self._connected()
                    return await call(client)
            except TimeoutError:
                reason = "no answer"
            except rpc.AioRpcError as e:
                if e.code() in _RETRYABLE:
                    reason = e.details() or e.code().name
                elif _is_auth_expiry(e) and not reauthenticated:
                    # etcd's simple auth tokens expire; log in again once.
                    reauthenticated = True
                    await self._client.close()
                    continue
                else:
                    raise self._translate(e) from e
            except (
                aetcd.exceptions.ConnectionFailedError,
                aetcd.exceptions.ConnectionTimeoutError,
            ) as e:
                reason = str(e) or type(e).__name__
            except aetcd.exceptions.ClientError as e:
                raise ConfigStoreError(f"{self.description}: {e}") from e
            if loop.time() + delay >= deadline:
                raise ConfigStoreUnavailable(
                    f"{self.description} is unreachable ({reason});"
                    f" gave up after {self._timeout_s:g} s"
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)

    def _translate(self, e: rpc.AioRpcError) -> ConfigStoreError:
        details = e.details() or ""
        if "too many operations in txn request" in details:
            return TransactionRejected(
                f"{self.description} refused the transaction: {details}; nothing was written"
                " (raise etcd's --max-txn-ops, 128 by default, above the number of keys;"
                " a guarded commit also compares each key it read, plus 2)"
            )
        if "request is too large" in details:
            return TransactionRejected(
                f"{self.description} refused the transaction: {details}; nothing was written"
                " (raise etcd's --max-request-bytes, 1.5 MiB by default)"
            )
        if e.code() is rpc.StatusCode.UNAUTHENTICATED or "authentication failed" in details:
            return ConfigStoreError(f"{self.description} rejected the credentials: {details}")
        return ConfigStoreError(f"{self.description}: {details or e.code().name}")

    # -- key-value ------------------------------------------------------------------

    async def get(self, key: str) -> str | None:
        async def call(client: Any) -> str | None:
            response = await client.kvstub.Range(
                rpc.RangeRequest(key=_b(key)), metadata=client.metadata
            )
            return response.kvs[0].value.decode() if response.kvs else None

        return await self._rpc(call)

    async def get_tree(self, key: str) -> TreeSnapshot:
        # The key itself and the range under key + "/", read in one transaction so both
        # come from the same revision.
        request = rpc.TxnRequest(
            success=[
                rpc.RequestOp(request_range=rpc.RangeRequest(key=_b(key))),
                rpc.RequestOp(
                    request_range=rpc.RangeRequest(key=_b(key + "/"), range_end=_b(key + "0"))
                ),
            ]
        )

        async def call(client: Any) -> TreeSnapshot:
            response = await client.kvstub.Txn(request, metadata=client.metadata)
            pairs = [
                (kv.key.decode(), kv.value.decode())
                for part in response.responses
                for kv in part.response_range.kvs
            ]
            pairs.sort()
            return TreeSnapshot(response.header.revision, pairs)

        return await self._rpc(call)

    async def commit(self, ops: Sequence[TxnOp], *, guard: TreeGuard | None = None) -> int:
        request_ops: list[Any] = []
        for op in ops:
            if isinstance(op, Put):
                request = rpc.PutRequest(key=_b(op.key), value=_b(op.value), lease=op.lease_id)
                request_ops.append(rpc.RequestOp(request_put=request))
            elif isinstance(op, Delete):
                request = rpc.DeleteRangeRequest(key=_b(op.key))
                request_ops.append(rpc.RequestOp(request_delete_range=request))
            elif isinstance(op, DeleteTree):
                for start, end in ((op.key, ""), (op.key + "/", op.key + "0")):
                    request = rpc.DeleteRangeRequest(key=_b(start), range_end=_b(end))
                    request_ops.append(rpc.RequestOp(request_delete_range=request))
        compare = [] if guard is None else _guard_compares(guard)
        request = rpc.TxnRequest(compare=compare, success=request_ops)

        async def call(client: Any) -> int:
            response = await client.kvstub.Txn(request, metadata=client.metadata)
            if not response.succeeded:
                raise GuardFailed(guard.key if guard else "")
            return int(response.header.revision)

        return await self._rpc(call)

    # -- leases ---------------------------------------------------------------------

    async def grant_lease(self, ttl_s: int) -> int:
        async def call(client: Any) -> int:
            response = await client.leasestub.LeaseGrant(
                rpc.LeaseGrantRequest(TTL=ttl_s, ID=0), metadata=client.metadata
            )
            if response.error:
                raise ConfigStoreError(f"{self.description} refused a lease: {response.error}")
            return int(response.ID)

        return await self._rpc(call)

    async def refresh_lease(self, lease_id: int) -> None:
        async def call(client: Any) -> int:
            stream = client.leasestub.LeaseKeepAlive(
                [rpc.LeaseKeepAliveRequest(ID=lease_id)], metadata=client.metadata
            )
            try:
                async for reply in stream:
                    return int(reply.TTL)
            finally:
                stream.cancel()
            return 0

        if await self._rpc(call) <= 0:
            raise LeaseNotFound(lease_id)

    async def revoke_lease(self, lease_id: int) -> None:
        async def call(client: Any) -> None:
            try:
                await client.leasestub.LeaseRevoke(
                    rpc.LeaseRevokeRequest(ID=lease_id), metadata=client.metadata
                )
            except rpc.AioRpcError as e:
                if e.code() is not rpc.StatusCode.NOT_FOUND:
                    raise

        await self._rpc(call)

    # -- watches --------------------------------------------------------------------

    async def watch(
        self,
        key: str,
        *,
        tree: bool,
        start_revision: int | None = None,
        ready: asyncio.Event | None = None,
    ) -> AsyncGenerator[WatchEvent, None]:
        loop = asyncio.get_running_loop()
        next_revision = start_revision  # the first revision not delivered yet
        down_since: float | None = None
        delay = 0.1
        while True:
            stream: Any = None
            try:
                client = await self._connected()
                create = rpc.WatchCreateRequest(
                    key=_b(key), start_revision=next_revision or 0, progress_notify=True
                )
                if tree:
                    # [key, key + "0") holds the key and its subtree (plus siblings such
                    # as "key-x", dropped below).
                    create.range_end = _b(key + "0")
                stream = rpc.WatchStub(client.channel).Watch(metadata=client.metadata)
                await stream.write(rpc.WatchRequest(create_request=create))
                responses = aiter(stream)
                async with asyncio.timeout(self._timeout_s):
                    response = await anext(responses)
                if response.compact_revision:
                    next_revision = self._compacted(key, next_revision, response.compact_revision)
                    continue
                if response.canceled:
                    raise ConfigStoreError(
                        f"{self.description} refused to watch {key!r}: {response.cancel_reason}"
                    )
                if next_revision is None:
                    next_revision = response.header.revision + 1
                if ready is not None:
                    ready.set()
                if down_since is not None:
                    log.info("watch of %r on %s resumed", key, self.description)
                down_since, delay = None, 0.1
                async for response in responses:
                    if response.compact_revision:
                        next_revision = self._compacted(
                            key, next_revision, response.compact_revision
                        )
                        break
                    if response.canceled:
                        break
                    if not response.events:
                        # A progress notification: nothing up to this revision is pending.
                        next_revision = max(next_revision, response.header.revision + 1)
                        continue
                    for event in response.events:
                        event_key = event.kv.key.decode()
                        next_revision = event.kv.mod_revision + 1
                        if tree and not in_tree(event_key, key):
                            continue
                        if event.type == rpc.Event.DELETE:
                            yield WatchEvent(
                                event_key, "", WatchEventType.DELETE, event.kv.mod_revision
                            )
                        else:
                            yield WatchEvent(
                                event_key,
                                event.kv.value.decode(),
                                WatchEventType.PUT,
                                event.kv.mod_revision,
                            )
                else:
                    raise _StreamEnded
            except (
                StopAsyncIteration,
                rpc.AioRpcError,
                _StreamEnded,
                TimeoutError,
                aetcd.exceptions.ConnectionFailedError,
                aetcd.exceptions.ConnectionTimeoutError,
            ) as e:
                if self._closed:
                    return
                # CANCELLED: the channel was closed under us (re-authentication); retry.
                if isinstance(e, rpc.AioRpcError) and e.code() not in (
                    *_RETRYABLE,
                    rpc.StatusCode.CANCELLED,
                ):
                    raise self._translate(e) from e
                now = loop.time()
                if down_since is None:
                    down_since = now
                    log.warning(
                        "watch of %r on %s broke, reconnecting: %r", key, self.description, e
                    )
                if (
                    self._reconnect_timeout_s is not None
                    and now - down_since > self._reconnect_timeout_s
                ):
                    raise ConfigStoreUnavailable(
                        f"{self.description} stayed unreachable for"
                        f" {self._reconnect_timeout_s:g} s; the watch of {key!r} gave up"
                    ) from e
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
            finally:
                if stream is not None:
                    stream.cancel()

    def _compacted(self, key: str, wanted: int | None, compacted: int) -> int:
        log.warning(
            "etcd compacted its history past revision %s; the watch of %r resumes at %d"
            " and may have missed changes in between",
            wanted,
            key,
            compacted,
        )
        return compacted

    # -- locks ----------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def lock(self, key: str, *, timeout_s: float | None) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        token = uuid.uuid4().hex.encode()
        lease_id = await self.grant_lease(self._lock_ttl_s)
        keeper = asyncio.create_task(self._keep_alive(lease_id, key), name=f"lock-keeper {key}")
        try:
            while True:
                holder_revision = await self._try_lock(key, token, lease_id)
                if holder_revision is None:
                    break
                remaining = None if deadline is None else deadline - loop.time()
                if remaining is not None and remaining <= 0:
                    raise LockTimeout(key, timeout_s or 0.0)
                await self._wait_deleted(key, holder_revision, remaining)
            yield
        finally:
            await cancel_and_wait([keeper])
            try:
                await self.revoke_lease(lease_id)  # deletes the lock key with it
            except ConfigStoreError as e:
                log.warning(
                    "releasing the lock %r: %s (it expires in %d s)", key, e, self._lock_ttl_s
                )

    async def _try_lock(self, key: str, token: bytes, lease_id: int) -> int | None:
        """Create the lock key; ``None`` if we hold it, else the holder's mod revision."""
        request = rpc.TxnRequest(
            compare=[
                rpc.Compare(
                    key=_b(key),
                    target=rpc.Compare.CREATE,
                    result=rpc.Compare.EQUAL,
                    create_revision=0,
                )
            ],
            success=[
                rpc.RequestOp(request_put=rpc.PutRequest(key=_b(key), value=token, lease=lease_id))
            ],
            failure=[rpc.RequestOp(request_range=rpc.RangeRequest(key=_b(key)))],
        )

        async def call(client: Any) -> int | None:
            response = await client.kvstub.Txn(request, metadata=client.metadata)
            if response.succeeded:
                return None
            kvs = response.responses[0].response_range.kvs
            if not kvs:
                return int(response.header.revision)  # released in between: try again
            if kvs[0].value == token:
                return None  # a retried request had already taken it
            return int(kvs[0].mod_revision)

        return await self._rpc(call)

    async def _wait_deleted(self, key: str, after_revision: int, timeout_s: float | None) -> None:
        async def deleted() -> None:
            events = self.watch(key, tree=False, start_revision=after_revision + 1)
            async with contextlib.aclosing(events):
                async for event in events:
                    if event.event is WatchEventType.DELETE:
                        return

        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(deleted(), timeout_s)

    async def _keep_alive(self, lease_id: int, key: str) -> None:
        while True:
            await asyncio.sleep(self._lock_ttl_s / 3)
            try:
                await self.refresh_lease(lease_id)
            except LeaseNotFound:
                log.error("the lease of the lock %r expired: the lock is lost", key)
                return
            except ConfigStoreError as e:
                log.warning("refreshing the lock %r: %s", key, e)

    # -- lifecycle ------------------------------------------------------------------

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._client.close()


def _guard_compares(guard: TreeGuard) -> list[Any]:
    """etcd compares that hold only while the tree is as it was at ``guard.revision``.

    A range compare applies to the keys that exist *now*: "every key's mod_revision
    <= R" catches a put (a new or changed key) but not a delete -- a deleted key is
    simply no longer compared.  So each key of the snapshot must also still exist
    (``version > 0``; a key deleted and re-created has a newer mod_revision and fails
    the range compare).  etcd counts compares against ``--max-txn-ops`` like writes:
    a guarded commit of n snapshotted keys needs n + 2 compares.
    """
    compares = [
        rpc.Compare(
            key=_b(start),
            range_end=_b(end),
            target=rpc.Compare.MOD,
            result=rpc.Compare.LESS,
            mod_revision=guard.revision + 1,
        )
        for start, end in ((guard.key, ""), (guard.key + "/", guard.key + "0"))
    ]
    compares.extend(
        rpc.Compare(
            key=_b(key),
            target=rpc.Compare.VERSION,
            result=rpc.Compare.GREATER,
            version=0,
        )
        for key in guard.keys
    )
    return compares


def _is_auth_expiry(e: rpc.AioRpcError) -> bool:
    return "invalid auth token" in (e.details() or "")
