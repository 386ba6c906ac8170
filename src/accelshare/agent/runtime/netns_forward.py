"""Host TCP ports relayed into another network namespace (a sandboxed kernel's app ports).

A process-runtime kernel that runs in a sandbox with a network namespace of its own
(loopback only) serves its apps (Jupyter, ...) on ``127.0.0.1:<container_port>`` *inside*
that namespace, where the app proxy cannot reach them.  :class:`NetnsForwarder` listens on
``<listen_host>:<host_port>`` in the agent's namespace and, for each connection it
accepts, opens a TCP connection to ``127.0.0.1:<container_port>`` in the kernel's
namespace and relays the bytes both ways.

Design
------

*Connecting inside a namespace without moving the agent.*  A socket belongs to the
network namespace of the thread that created it, for its whole life, whichever thread
uses it afterwards; ``setns(fd, CLONE_NEWNET)`` changes the namespace of the calling
thread only.  So one long-lived helper thread (a ``ThreadPoolExecutor`` with a single
worker, shared by every forwarder of the process) enters the kernel's namespace, creates
the socket, and goes back to its own namespace (an fd of ``/proc/thread-self/ns/net``
opened by that thread before it first moved).  The event-loop thread never changes
namespace: it gets the new, unconnected socket back and connects it with
``loop.sock_connect``.  If the helper ever failed to go back, it is retired (whatever is
queued on it fails) and a fresh thread takes over; Python 3.12+'s ``os.setns`` is used
when present, ``setns(2)`` through ctypes otherwise.

*A namespace, not a pid.*  The namespace file (``/proc/<pid>/ns/net`` or a bind mount
of one) is opened once, in :meth:`NetnsForwarder.start`, and checked to be a network
namespace (``NS_GET_NSTYPE``) that we may enter (one trial socket).  Every connection
enters it through that fd, so a pid recycled after the kernel died cannot redirect the
traffic to another process's namespace; the fd also keeps the namespace alive (with
nothing listening, connections are refused) until :meth:`NetnsForwarder.close`.  The fd
is closed on the helper thread, after any socket creation still queued there, so its
number cannot be reused under a pending ``setns``.

*Relaying.*  Two pumps per connection.  When one side sends EOF the other side's write
half is shut down (``SHUT_WR``) and the opposite direction goes on, so requests that
half-close (``shutdown(SHUT_WR)`` then read the reply) work; the connection pair is
closed when both directions have ended.  An error on either side, or
:meth:`NetnsForwarder.close`, aborts both at once.  A target that refuses (the app is
not up yet) or does not answer within ``connect_timeout`` gets the accepted client
connection closed at once (logged at debug level; the app proxy answers 502).

*Bounds.*  At most ``max_connections`` relayed connections per forwarder (each holds two
fds); beyond that, a new connection is accepted and closed straight away.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import ctypes
import errno
import fcntl
import functools
import logging
import os
import socket
import threading
from collections.abc import Callable, Sequence

__all__ = ["DEFAULT_MAX_CONNECTIONS", "NetnsForwarder"]

log = logging.getLogger(__name__)

DEFAULT_MAX_CONNECTIONS = 256
DEFAULT_CONNECT_TIMEOUT = 10.0
_TARGET_HOST = "127.0.0.1"
_CHUNK = 64 * 1024
_CLOSE_GRACE = 5.0  # seconds a finished relay waits for its buffered bytes to go out

CLONE_NEWNET = 0x40000000
_NS_GET_NSTYPE = 0xB703  # _IO(0xb7, 0x3), Linux 4.11+
_NS_TYPE_NAMES = {
    0x00020000: "mount",
    0x02000000: "cgroup",
    0x04000000: "uts",
    0x08000000: "ipc",
    0x10000000: "user",
    0x20000000: "pid",
    CLONE_NEWNET: "network",
    0x00000080: "time",
}


def _libc_setns() -> Callable[[int, int], None]:
    libc = ctypes.CDLL(None, use_errno=True)
    func = libc.setns
    func.argtypes = [ctypes.c_int, ctypes.c_int]
    func.restype = ctypes.c_int

    def setns(fd: int, nstype: int) -> None:
        if func(fd, nstype) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))

    return setns


_os_setns: Callable[[int, int], None] | None = getattr(os, "setns", None)  # Python 3.12+
_setns: Callable[[int, int], None] = _os_setns if _os_setns is not None else _libc_setns()


class _NamespaceWorker:
    """The single helper thread that creates sockets in other network namespaces."""

    def __init__(self) -> None:
        self.executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="accelshare-netns"
        )
        self.broken = False
        self._home_fd: int | None = None  # touched by the worker thread only

    def create_socket(self, ns_fd: int) -> socket.socket:
        """Runs on the worker thread: a new TCP socket of the namespace behind ``ns_fd``."""
        if self.broken:
            raise OSError(errno.EAGAIN, "the network-namespace helper thread was retired")
        if self._home_fd is None:
            self._home_fd = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        _setns(ns_fd, CLONE_NEWNET)
        sock: socket.socket | None = None
        try:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        finally:
            try:
                _setns(self._home_fd, CLONE_NEWNET)
            except OSError as exc:
                # This thread now lives in the kernel's namespace: never use it again.
                self.broken = True
                log.critical("netns helper thread cannot return to the agent's namespace: %s", exc)
                if sock is not None:
                    sock.close()
                raise
        return sock


_worker_lock = threading.Lock()
_current_worker: _NamespaceWorker | None = None


def _worker() -> _NamespaceWorker:
    global _current_worker  # noqa: PLW0603 - one helper thread per process, made on first use
    with _worker_lock:
        if _current_worker is None or _current_worker.broken:
            if _current_worker is not None:
                _current_worker.executor.shutdown(wait=False)
            _current_worker = _NamespaceWorker()
        return _current_worker


def _forget_worker_in_child() -> None:
    # A forked child has no helper thread, only the parent's executor object (and maybe
    # a lock some other thread of the parent held).
    global _current_worker, _worker_lock  # noqa: PLW0603
    _current_worker = None
    _worker_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_worker_in_child)


async def _socket_in_namespace(ns_fd: int) -> socket.socket:
    """A new TCP socket in the namespace behind ``ns_fd`` (made on the helper thread)."""
    worker = _worker()
    future = asyncio.wrap_future(worker.executor.submit(worker.create_socket, ns_fd))
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        # The thread goes on; close the socket it hands back to nobody.
        future.add_done_callback(_close_orphan)
        raise


def _close_orphan(future: asyncio.Future[socket.socket]) -> None:
    if not future.cancelled() and future.exception() is None:
        future.result().close()


async def _run_on_worker(func: Callable[[], None]) -> None:
    worker = _worker()
    await asyncio.wrap_future(worker.executor.submit(func))


def _open_namespace(netns_path: str) -> int:
    """An fd of the network namespace at ``netns_path``; OSError naming the path if not one."""
    try:
        fd = os.open(netns_path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise OSError(
            exc.errno, f"cannot open network namespace {netns_path}: {exc.strerror}", netns_path
        ) from exc
    try:
        try:
            nstype = fcntl.ioctl(fd, _NS_GET_NSTYPE)
        except OSError as exc:
            raise OSError(
                errno.EINVAL, f"{netns_path} is not a namespace file ({exc.strerror})", netns_path
            ) from exc
        if nstype != CLONE_NEWNET:
            kind = _NS_TYPE_NAMES.get(nstype, hex(nstype))
            raise OSError(
                errno.EINVAL,
                f"{netns_path} is a {kind} namespace, not a network namespace",
                netns_path,
            )
    except BaseException:
        os.close(fd)
        raise
    return fd


class NetnsForwarder:
    """Host ports relayed to ``127.0.0.1:<container_port>`` in another network namespace.

    Make one with :meth:`start`; :meth:`close` it when the kernel goes away.
    """

    def __init__(
        self,
        *,
        netns_path: str,
        ns_fd: int,
        max_connections: int,
        connect_timeout: float,
    ) -> None:
        self._netns_path = netns_path
        self._ns_fd: int | None = ns_fd
        self._max_connections = max_connections
        self._connect_timeout = connect_timeout
        self._servers: list[asyncio.Server] = []
        self._ports: list[tuple[int, int]] = []
        self._relays: set[asyncio.Task[None]] = set()
        self._closed = False
        self._limit_logged = False

    @classmethod
    async def start(
        cls,
        *,
        netns_path: str,
        listen_host: str,
        ports: Sequence[tuple[int, int]],
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    ) -> NetnsForwarder:
        """Listen on every ``(container_port, host_port)`` pair's host port.

        ``host_port`` 0 takes any free port (see :attr:`ports`).  Raises OSError naming
        the namespace path when it is not a network namespace we can enter, or naming the
        host port that cannot be bound; nothing stays open then.
        """
        for container_port, host_port in ports:
            if not 0 < container_port < 65536 or not 0 <= host_port < 65536:
                raise ValueError(f"invalid port pair ({container_port}, {host_port})")
        if max_connections < 1:
            raise ValueError(f"max_connections must be at least 1, received {max_connections}")
        ns_fd = _open_namespace(netns_path)
        self = cls(
            netns_path=netns_path,
            ns_fd=ns_fd,
            max_connections=max_connections,
            connect_timeout=connect_timeout,
        )
        try:
            try:
                # Whether we may enter it at all (EPERM without CAP_SYS_ADMIN over it).
                (await _socket_in_namespace(ns_fd)).close()
            except OSError as exc:
                raise OSError(
                    exc.errno,
                    f"cannot create a socket in network namespace {netns_path}: {exc.strerror}",
                    netns_path,
                ) from exc
            for container_port, host_port in ports:
                await self._listen(listen_host, container_port, host_port)
        except BaseException:
            await self.close()
            raise
        return self

    async def _listen(self, listen_host: str, container_port: int, host_port: int) -> None:
        try:
            server = await asyncio.start_server(
                functools.partial(self._accepted, container_port),
                host=listen_host,
                port=host_port,
                reuse_address=True,
            )
        except OSError as exc:
            raise OSError(
                exc.errno,
                f"cannot listen on {listen_host}:{host_port} (for port {container_port} in"
                f" {self._netns_path}): {exc.strerror or exc}",
            ) from exc
        self._servers.append(server)
        bound = int(server.sockets[0].getsockname()[1]) if server.sockets else host_port
        self._ports.append((container_port, bound))

    @property
    def ports(self) -> tuple[tuple[int, int], ...]:
        """``(container_port, host_port)`` pairs, with the host ports actually bound."""
        return tuple(self._ports)

    @property
    def host_ports(self) -> tuple[int, ...]:
        """The bound host ports, in the order the pairs were given."""
        return tuple(host for _, host in self._ports)

    @property
    def active_connections(self) -> int:
        """Connections being relayed (or connecting) right now."""
        return len(self._relays)

    @property
    def closed(self) -> bool:
        return self._closed

    async def close(self) -> None:
        """Stop listening, abort the live relays and release the namespace.  Idempotent."""
        if self._closed:
            return
        self._closed = True
        for server in self._servers:
            server.close()
        relays = list(self._relays)
        for task in relays:
            task.cancel()
        if relays:
            await asyncio.gather(*relays, return_exceptions=True)
        for server in self._servers:
            with contextlib.suppress(Exception):
                await server.wait_closed()
        if self._ns_fd is not None:
            fd, self._ns_fd = self._ns_fd, None
            # After any socket creation still queued on the helper thread with this fd.
            await _run_on_worker(functools.partial(os.close, fd))

    def _accepted(
        self, container_port: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        if self._closed or self._ns_fd is None:
            writer.transport.abort()
            return
        if len(self._relays) >= self._max_connections:
            if not self._limit_logged:
                self._limit_logged = True
                log.warning(
                    "netns forward %s: %d connections already relayed, refusing more",
                    self._netns_path,
                    self._max_connections,
                )
            writer.transport.abort()
            return
        self._limit_logged = False
        task = asyncio.get_running_loop().create_task(
            self._relay(self._ns_fd, container_port, reader, writer)
        )
        self._relays.add(task)
        task.add_done_callback(self._relays.discard)

    async def _relay(
        self,
        ns_fd: int,
        container_port: int,
        client_reader: asyncio.StreamReader,
        client_writer: asyncio.StreamWriter,
    ) -> None:
        try:
            upstream = await self._connect(ns_fd, container_port)
        except BaseException:
            client_writer.transport.abort()
            raise
        if upstream is None:
            client_writer.transport.abort()
            return
        upstream_reader, upstream_writer = upstream
        pumps = [
            asyncio.create_task(_pump(client_reader, upstream_writer)),
            asyncio.create_task(_pump(upstream_reader, client_writer)),
        ]
        try:
            await asyncio.gather(*pumps)
            await _close_gracefully(client_writer, upstream_writer)
        except Exception as exc:
            log.debug("netns forward to port %d ended: %r", container_port, exc)
        finally:
            for pump in pumps:
                pump.cancel()
            # An error, or close(): both at once, buffered bytes dropped (a no-op when
            # both are already closed).
            client_writer.transport.abort()
            upstream_writer.transport.abort()

    async def _connect(
        self, ns_fd: int, container_port: int
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        try:
            sock = await _socket_in_namespace(ns_fd)
        except OSError as exc:
            log.warning("netns forward %s: cannot create a socket: %s", self._netns_path, exc)
            return None
        try:
            sock.setblocking(False)
            async with asyncio.timeout(self._connect_timeout):
                await asyncio.get_running_loop().sock_connect(sock, (_TARGET_HOST, container_port))
            return await asyncio.open_connection(sock=sock, limit=_CHUNK)
        except (OSError, TimeoutError) as exc:
            sock.close()
            log.debug(
                "netns forward %s: port %d does not answer: %r",
                self._netns_path,
                container_port,
                exc,
            )
            return None
        except BaseException:
            sock.close()
            raise


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy until EOF, then shut down the write half of the other side."""
    while data := await reader.read(_CHUNK):
        writer.write(data)
        await writer.drain()
    if writer.can_write_eof():
        writer.write_eof()


async def _close_gracefully(*writers: asyncio.StreamWriter) -> None:
    for writer in writers:
        writer.close()
    try:
        async with asyncio.timeout(_CLOSE_GRACE):
            for writer in writers:
                with contextlib.suppress(OSError):
                    await writer.wait_closed()
    except TimeoutError:  # a peer that does not read what is left: drop it
        for writer in writers:
            writer.transport.abort()
