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

*An agent that is not root.*  Entering a network namespace takes ``CAP_SYS_ADMIN`` over
the user namespace that owns it; an agent that is not root holds that only inside that
user namespace (the one bubblewrap made for the sandbox), and a multithreaded process
cannot enter a user namespace.  So where the agent is not root (or the helper thread is
refused, ``EPERM``) each socket is made by a short single-threaded process instead,
started with ``posix_spawn``: it enters the owning user namespace (``NS_GET_USERNS`` on
the namespace's fd, got once at start), then the network namespace, creates the
unconnected socket and sends it back over a unix socket (``SCM_RIGHTS``); the agent
connects it as above.  That process is the exec helper's ``socket`` mode where the
agent has the helper (~1 ms a connection), else the agent's interpreter (``python -I -S
-c``, setns through ctypes; ~20 ms a connection).  Its failure comes back as text over
the same unix socket (``OSError`` with its errno here).

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
import re
import signal
import socket
import sys
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
_NS_GET_USERNS = 0xB701  # _IO(0xb7, 0x1), Linux 4.9+
_NS_GET_NSTYPE = 0xB703  # _IO(0xb7, 0x3), Linux 4.11+
_SPAWN_TIMEOUT = 10.0  # seconds a socket-making process may take
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


def _thread_way_allowed() -> bool:
    """Whether sockets are made on the helper thread (root), not by a spawned process."""
    return os.geteuid() == 0


#: The socket-making process where the agent has no exec helper: what the helper's
#: ``socket`` mode does (argv: NETNS_FD USERNS_FD SOCK_FD).
_PYTHON_SOCKET_MAKER = """
import ctypes, os, socket, sys
net, user, out = map(int, sys.argv[1:4])
try:
    libc = ctypes.CDLL(None, use_errno=True)
    def enter(fd, kind, what):
        if libc.setns(fd, kind) != 0:
            e = ctypes.get_errno()
            raise OSError(e, f"{os.strerror(e)} ({what})")
    if os.fstat(user)[1:3] != os.stat("/proc/self/ns/user")[1:3]:
        enter(user, 0x10000000, "entering the user namespace that owns it")
    enter(net, 0x40000000, "entering it")
    made = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    socket.send_fds(socket.socket(fileno=out), [b"\\0"], [made.fileno()])
except OSError as e:
    os.write(out, f"{type(e).__name__}: {e}".encode())
    sys.exit(1)
"""

_ERROR_TEXT = re.compile(r"\w+: \[Errno (\d+)\] (.*)", re.DOTALL)


class _SpawnedSocketMaker:
    """Sockets of a network namespace made by a spawned single-threaded process (see
    *An agent that is not root* above); owns the user namespace's fd."""

    def __init__(self, ns_fd: int, exec_helper: str | None) -> None:
        try:
            self._userns_fd: int | None = fcntl.ioctl(ns_fd, _NS_GET_USERNS)
        except OSError as exc:
            raise OSError(exc.errno, f"its owning user namespace: {exc.strerror or exc}") from exc
        os.set_inheritable(self._userns_fd, False)
        self._ns_fd = ns_fd
        if exec_helper is not None:
            self._program = [exec_helper, "socket"]
            self.way = f"exec helper {exec_helper}"
        else:
            self._program = [sys.executable, "-I", "-S", "-c", _PYTHON_SOCKET_MAKER]
            self.way = f"interpreter {sys.executable}"
        self._pending: set[asyncio.Future[socket.socket]] = set()

    async def create(self) -> socket.socket:
        """A new TCP socket of the namespace (made by a spawned process)."""
        if self._userns_fd is None:
            raise OSError(errno.EBADF, "the network namespace was released")
        future = asyncio.get_running_loop().run_in_executor(
            None, self._create_blocking, self._userns_fd
        )
        self._pending.add(future)
        future.add_done_callback(self._pending.discard)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            future.add_done_callback(_close_orphan)
            raise

    def _create_blocking(self, userns_fd: int) -> socket.socket:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        with ours, theirs:
            sources = (self._ns_fd, userns_fd, theirs.fileno())
            # (dup2 to numbers above every source: none is overwritten before it is
            # copied, and the copies are inheritable; nothing else of the agent's is)
            targets = [max(sources) + 1 + i for i in range(3)]
            pid = os.posix_spawn(
                self._program[0],
                [*self._program, *(str(t) for t in targets)],
                {"PATH": "/usr/bin:/bin"},
                file_actions=[
                    (os.POSIX_SPAWN_DUP2, fd, target)
                    for fd, target in zip(sources, targets, strict=True)
                ],
            )
            theirs.close()
            try:
                ours.settimeout(_SPAWN_TIMEOUT)
                data, fds = b"", []
                try:
                    while True:
                        chunk, got, _, _ = socket.recv_fds(ours, 4096, 1)
                        fds += got
                        if not chunk:
                            break
                        data += chunk
                except TimeoutError:
                    for fd in fds:
                        os.close(fd)
                    raise OSError(
                        errno.ETIMEDOUT,
                        f"the socket-making process ({self.way}) did not answer"
                        f" within {_SPAWN_TIMEOUT:g} s",
                    ) from None
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
        for extra in fds[1:]:
            os.close(extra)
        if fds:
            return socket.socket(fileno=fds[0])
        text = data.decode(errors="replace").strip()
        found = _ERROR_TEXT.fullmatch(text)
        if found is not None:  # ("PermissionError: [Errno 1] Operation not permitted ...")
            raise OSError(int(found.group(1)), found.group(2))
        raise OSError(errno.EIO, f"{self.way} sent no socket: {text or 'and no error'}")

    async def close(self) -> None:
        """Release the user namespace's fd, after every socket still being made."""
        if self._pending:
            await asyncio.wait(set(self._pending))
        if self._userns_fd is not None:
            fd, self._userns_fd = self._userns_fd, None
            os.close(fd)


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
        self._maker: _SpawnedSocketMaker | None = None  # None: the helper thread's way
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
        exec_helper: str | None = None,
    ) -> NetnsForwarder:
        """Listen on every ``(container_port, host_port)`` pair's host port.

        ``host_port`` 0 takes any free port (see :attr:`ports`).  ``exec_helper``: the
        agent's exec helper, which makes the sockets where the helper thread may not
        (an agent that is not root); the agent's interpreter does without it.  Raises
        OSError naming the namespace path when it is not a network namespace we can
        enter, or naming the host port that cannot be bound; nothing stays open then.
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
                await self._trial(exec_helper)
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

    async def _trial(self, exec_helper: str | None) -> None:
        """Whether we may enter the namespace at all (EPERM without CAP_SYS_ADMIN over
        it), and which way: the helper thread, else a spawned process."""
        assert self._ns_fd is not None
        if _thread_way_allowed():
            try:
                (await _socket_in_namespace(self._ns_fd)).close()
                return
            except PermissionError:
                pass
        self._maker = _SpawnedSocketMaker(self._ns_fd, exec_helper)
        (await self._maker.create()).close()
        log.debug("netns forward %s: sockets made by %s", self._netns_path, self._maker.way)

    async def _new_socket(self, ns_fd: int) -> socket.socket:
        if self._maker is not None:
            return await self._maker.create()
        return await _socket_in_namespace(ns_fd)

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
        if self._maker is not None:
            await self._maker.close()  # (after the sockets it is still making)
        if self._ns_fd is not None:
            fd, self._ns_fd = self._ns_fd, None
            if self._maker is not None:
                os.close(fd)
            else:
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
            sock = await self._new_socket(ns_fd)
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
