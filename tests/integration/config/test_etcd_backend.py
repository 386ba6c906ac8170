"""etcd-only behaviour: restarts, unreachable servers, connections that die silently."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from accelshare.config import (
    ConfigStore,
    ConfigStoreError,
    ConfigStoreSettings,
    ConfigStoreUnavailable,
    EtcdSettings,
    WatchEvent,
    WatchEventType,
    open_config_store,
)
from accelshare.config.etcd import EtcdBackend
from accelshare_testkit.etcd_server import EtcdProcess, find_etcd_binary
from accelshare_testkit.servers import free_port

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        find_etcd_binary() is None, reason="no etcd binary (apt-get install etcd-server)"
    ),
]


@pytest.fixture
def own_etcd(tmp_path: Path) -> Iterator[EtcdProcess]:
    """A private etcd: these tests stop and restart it."""
    with EtcdProcess(tmp_path / "etcd") as etcd:
        yield etcd


def _store(etcd: EtcdProcess, *, timeout_s: float = 5.0) -> ConfigStore:
    backend = EtcdBackend(host=etcd.host, port=etcd.port, timeout_s=timeout_s)
    return ConfigStore(backend, namespace=f"t{uuid.uuid4().hex[:8]}")


async def test_a_watch_loses_no_event_across_an_etcd_restart(
    own_etcd: EtcdProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    received: list[WatchEvent] = []
    backend = EtcdBackend(host=own_etcd.host, port=own_etcd.port)
    # While the gate is closed the watcher cannot reconnect, so the events written
    # meanwhile can only reach it by the watch resuming from its last revision.
    gate = asyncio.Event()
    gate.set()
    connect = backend._connected

    async def gated_connect() -> object:
        await gate.wait()
        return await connect()

    monkeypatch.setattr(backend, "_connected", gated_connect)
    async with ConfigStore(backend, namespace=f"t{uuid.uuid4().hex[:8]}") as store:
        ready = asyncio.Event()

        async def follow() -> None:
            async for event in store.watch_prefix("cfg", ready=ready):
                received.append(event)
                if len(received) == 7:
                    return

        task = asyncio.create_task(follow())
        await asyncio.wait_for(ready.wait(), 10)
        await store.put("cfg/1", "before")
        await store.put("cfg/2", "before")

        gate.clear()
        await asyncio.to_thread(own_etcd.restart)
        other = EtcdBackend(host=own_etcd.host, port=own_etcd.port)
        async with ConfigStore(other, namespace=store.namespace) as writer:
            await writer.put("cfg/3", "after")
            await writer.put_prefix("cfg", {"4": "after", "5": "after"})
            await writer.delete("cfg/1")
        assert len(received) == 2
        gate.set()
        await store.put("cfg/6", "after, through the watcher's own connection")

        await asyncio.wait_for(task, 20)
    assert [(e.key, e.event) for e in received] == [
        ("cfg/1", WatchEventType.PUT),
        ("cfg/2", WatchEventType.PUT),
        ("cfg/3", WatchEventType.PUT),
        ("cfg/4", WatchEventType.PUT),
        ("cfg/5", WatchEventType.PUT),
        ("cfg/1", WatchEventType.DELETE),
        ("cfg/6", WatchEventType.PUT),
    ]
    revisions = [e.revision for e in received]
    assert revisions == sorted(revisions)


async def test_requests_during_a_restart_are_retried(own_etcd: EtcdProcess) -> None:
    async with _store(own_etcd, timeout_s=15) as store:
        await store.put("cfg/x", "1")
        own_etcd.stop()
        restarting = asyncio.create_task(asyncio.to_thread(own_etcd.start))
        await store.put("cfg/x", "2")  # waits for etcd instead of failing
        await restarting
        assert await store.get("cfg/x") == "2"


async def test_an_unreachable_etcd_is_a_clear_error_not_a_hang() -> None:
    port = free_port()  # nothing listens there
    settings = ConfigStoreSettings(
        backend="etcd", etcd=EtcdSettings(addr=f"127.0.0.1:{port}", timeout_s=1.0)
    )
    started = time.monotonic()
    with pytest.raises(ConfigStoreUnavailable) as excinfo:
        await open_config_store(settings)
    elapsed = time.monotonic() - started
    assert f"etcd at 127.0.0.1:{port} is unreachable" in str(excinfo.value)
    assert "gave up after 1 s" in str(excinfo.value)
    assert elapsed < 5


async def test_a_watch_gives_up_after_the_reconnect_timeout(own_etcd: EtcdProcess) -> None:
    backend = EtcdBackend(
        host=own_etcd.host, port=own_etcd.port, timeout_s=0.5, reconnect_timeout_s=0.5
    )
    async with ConfigStore(backend, namespace="t") as store:
        ready = asyncio.Event()

        async def follow() -> None:
            async for _ in store.watch("cfg/x", ready=ready):
                pass

        task = asyncio.create_task(follow())
        await asyncio.wait_for(ready.wait(), 10)
        own_etcd.stop()
        with pytest.raises(ConfigStoreUnavailable, match="the watch of"):
            await asyncio.wait_for(task, 15)


async def test_credentials(own_etcd: EtcdProcess) -> None:
    import aetcd
    from aetcd import rpc

    async with aetcd.Client(host=own_etcd.host, port=own_etcd.port) as admin:
        auth = rpc.AuthStub(admin.channel)
        await auth.UserAdd(rpc.AuthUserAddRequest(name="root", password="pw"))
        await auth.RoleAdd(rpc.AuthRoleAddRequest(name="root"))
        await auth.UserGrantRole(rpc.AuthUserGrantRoleRequest(user="root", role="root"))
        await auth.AuthEnable(rpc.AuthEnableRequest())

    backend = EtcdBackend(host=own_etcd.host, port=own_etcd.port, user="root", password="pw")
    async with ConfigStore(backend) as store:
        ready = asyncio.Event()
        events = store.watch("config/x", ready=ready)
        first = asyncio.create_task(anext(events))
        await asyncio.wait_for(ready.wait(), 10)
        await store.put("config/x", "1")
        assert (await asyncio.wait_for(first, 10)).value == "1"
        await events.aclose()
        async with store.lock("l", timeout_s=5):
            lease_id = await store.put_with_lease("nodes/manager/m", "up", ttl_s=5)
            await store.refresh_lease(lease_id)

    wrong = EtcdBackend(host=own_etcd.host, port=own_etcd.port, user="root", password="no")
    async with ConfigStore(wrong) as store:
        with pytest.raises(ConfigStoreError, match="authentication failed"):
            await store.get("config/x")


class SilentProxy:
    """A TCP proxy to etcd whose connections can die without closing.

    After :meth:`go_silent` the connections open so far stay open but carry nothing
    either way (the bytes are read and dropped), as when a network partition or a
    firewall drops a connection's packets: no FIN, no RST, so only keepalive pings can
    tell.  Connections opened afterwards are forwarded again.
    """

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.connections = 0
        self.port = 0
        self._epoch = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: list[asyncio.StreamWriter] = []

    def go_silent(self) -> None:
        self._epoch += 1

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[SilentProxy]:
        server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        try:
            yield self
        finally:
            server.close()
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            for writer in self._writers:
                writer.close()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        epoch = self._epoch
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        self._writers += [writer, up_writer]
        for source, sink in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(self._pipe(source, sink, epoch))
            self._tasks.add(task)

    async def _pipe(
        self, source: asyncio.StreamReader, sink: asyncio.StreamWriter, epoch: int
    ) -> None:
        while data := await source.read(65536):
            if epoch == self._epoch:  # else: silent, the bytes go nowhere
                sink.write(data)
                await sink.drain()
        if epoch == self._epoch:
            sink.close()


async def test_a_watch_survives_a_connection_that_dies_silently(tmp_path: Path) -> None:
    # The test etcd accepts pings every second (its default minimum is 5 s); the watcher
    # pings every second and gives a ping one second to be answered.
    with EtcdProcess(tmp_path / "etcd", extra_args=["--grpc-keepalive-min-time=500ms"]) as etcd:
        async with SilentProxy(etcd.host, etcd.port).running() as proxy:
            namespace = f"t{uuid.uuid4().hex[:8]}"
            watcher = EtcdBackend(
                host="127.0.0.1",
                port=proxy.port,
                timeout_s=2,
                keepalive_time_s=1,
                keepalive_timeout_s=1,
            )
            direct = EtcdBackend(host=etcd.host, port=etcd.port)
            async with (
                ConfigStore(watcher, namespace=namespace) as store,
                ConfigStore(direct, namespace=namespace) as writer,
            ):
                ready = asyncio.Event()
                events = store.watch("cfg/x", ready=ready)
                try:
                    first = asyncio.create_task(anext(events))
                    await asyncio.wait_for(ready.wait(), 10)
                    await writer.put("cfg/x", "1")
                    assert (await asyncio.wait_for(first, 10)).value == "1"
                    assert proxy.connections == 1
                    # Idle for more than two ping intervals: with gRPC's default of two
                    # pings without data the watcher would have stopped pinging by now
                    # (and no flow-control ping of the first event is still in flight).
                    await asyncio.sleep(3.5)
                    proxy.go_silent()
                    await writer.put("cfg/x", "2")
                    # Without keepalive the watch waits on the dead connection forever.
                    second = await asyncio.wait_for(anext(events), 20)
                finally:
                    await events.aclose()
                assert (second.key, second.value, second.event) == (
                    "cfg/x",
                    "2",
                    WatchEventType.PUT,
                )
                assert proxy.connections == 2  # the watch resumed on a new connection
