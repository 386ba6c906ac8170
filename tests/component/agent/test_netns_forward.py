"""NetnsForwarder against real servers in a real network namespace (``unshare --net``).

One namespace holder per module: a small Python server (HTTP, echo-after-EOF, streaming
echo) on 127.0.0.1 inside a fresh network namespace whose loopback is brought up first.
Needs root (setns into another network namespace) and ``unshare``/``ip``; skips otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import selectors
import shutil
import socket
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from accelshare.agent.runtime import netns_forward
from accelshare.agent.runtime.netns_forward import NetnsForwarder

_SERVER = textwrap.dedent(
    """
    import http.server, socketserver, sys, threading

    http_port, collect_port, echo_port = map(int, sys.argv[1:4])

    class Collect(socketserver.BaseRequestHandler):
        # Answers only after the client's EOF: what it received, unchanged.
        def handle(self):
            chunks = []
            while data := self.request.recv(65536):
                chunks.append(data)
            self.request.sendall(b"".join(chunks))

    class Echo(socketserver.BaseRequestHandler):
        def handle(self):
            while data := self.request.recv(65536):
                self.request.sendall(data)

    class Http(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = b"inside the namespace " + self.path.encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    class Server(socketserver.ThreadingTCPServer):
        daemon_threads = True
        allow_reuse_address = True
        request_queue_size = 128  # the default 5 drops bursts of SYNs (1 s retries)

    for port, handler in ((http_port, Http), (collect_port, Collect), (echo_port, Echo)):
        server = Server(("127.0.0.1", port), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
    print("ready", flush=True)
    sys.stdin.read()  # until the test closes our stdin (or kills us)
    """
)

TIMEOUT = 5.0  # per client operation; everything here takes milliseconds


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _netns_unsupported() -> str | None:
    if os.geteuid() != 0:
        return "entering another network namespace (setns) needs root"
    for tool in ("unshare", "ip"):
        if shutil.which(tool) is None:
            return f"the {tool!r} command is not installed"
    result = subprocess.run(
        ["unshare", "--net", "--", "ip", "link", "set", "lo", "up"],
        capture_output=True,
        text=True,
        check=False,
        timeout=10,
    )
    if result.returncode != 0:
        return f"network namespaces are not available here: {result.stderr.strip()}"
    return None


@dataclass(frozen=True)
class Namespace:
    path: str  # /proc/<pid>/ns/net of the server
    pid: int
    http_port: int  # inside the namespace; free on the host when chosen
    collect_port: int
    echo_port: int
    closed_port: int  # nothing listens on it inside


@pytest.fixture(scope="module")
def netns(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Namespace]:
    reason = _netns_unsupported()
    if reason is not None:
        pytest.skip(reason)
    script = Path(tmp_path_factory.mktemp("netns")) / "server.py"
    script.write_text(_SERVER)
    ports = [_free_port() for _ in range(4)]
    proc = subprocess.Popen(
        [
            "unshare",
            "--net",
            "--",
            "sh",
            "-c",
            'ip link set lo up && exec "$0" "$@"',
            sys.executable,
            str(script),
            *map(str, ports[:3]),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            assert sel.select(10), "the namespace's server did not start"
        assert proc.stdout.readline() == b"ready\n"
        yield Namespace(f"/proc/{proc.pid}/ns/net", proc.pid, *ports)
    finally:
        proc.kill()
        proc.wait(10)
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()


@pytest.fixture
async def forwards() -> AsyncIterator[list[NetnsForwarder]]:
    """Forwarders a test started, closed afterwards whatever happened."""
    started: list[NetnsForwarder] = []
    yield started
    for forwarder in started:
        await forwarder.close()


async def _start(
    forwards: list[NetnsForwarder],
    netns: Namespace,
    *pairs: tuple[int, int],
    max_connections: int = netns_forward.DEFAULT_MAX_CONNECTIONS,
) -> NetnsForwarder:
    forwarder = await NetnsForwarder.start(
        netns_path=netns.path,
        listen_host="127.0.0.1",
        ports=pairs,
        max_connections=max_connections,
    )
    forwards.append(forwarder)
    return forwarder


async def _connect(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port, limit=1 << 20)


async def _read_to_end(reader: asyncio.StreamReader) -> bytes:
    """Everything until EOF; a reset counts as the end too."""
    chunks: list[bytes] = []
    with contextlib.suppress(ConnectionResetError):
        async with asyncio.timeout(TIMEOUT):
            while data := await reader.read(1 << 20):
                chunks.append(data)
    return b"".join(chunks)


async def _echo_round_trip(port: int, payload: bytes = b"ping") -> None:
    reader, writer = await _connect(port)
    try:
        writer.write(payload)
        async with asyncio.timeout(TIMEOUT):
            assert await reader.readexactly(len(payload)) == payload
    finally:
        writer.close()


def _net_ns_of_this_thread() -> str:
    return os.readlink("/proc/thread-self/ns/net")


async def test_http_get_through_the_forwarded_port(
    netns: Namespace, forwards: list[NetnsForwarder]
) -> None:
    before = _net_ns_of_this_thread()
    forwarder = await _start(forwards, netns, (netns.http_port, 0))
    (host_port,) = forwarder.host_ports
    assert host_port != 0
    assert forwarder.ports == ((netns.http_port, host_port),)
    async with httpx.AsyncClient(timeout=TIMEOUT) as client:
        for path in ("/", "/lab"):
            response = await client.get(f"http://127.0.0.1:{host_port}{path}")
            assert response.status_code == 200
            assert response.text == f"inside the namespace {path}"
    # The event loop's thread never left the agent's namespace.
    assert _net_ns_of_this_thread() == before


async def test_the_target_port_is_not_reachable_on_the_host(
    netns: Namespace, forwards: list[NetnsForwarder]
) -> None:
    await _start(forwards, netns, (netns.http_port, 0))
    with pytest.raises(ConnectionRefusedError):
        await _connect(netns.http_port)


async def test_several_ports_and_a_streaming_echo(
    netns: Namespace, forwards: list[NetnsForwarder]
) -> None:
    host_echo = _free_port()
    forwarder = await _start(forwards, netns, (netns.http_port, 0), (netns.echo_port, host_echo))
    assert forwarder.host_ports[1] == host_echo
    await asyncio.gather(*(_echo_round_trip(host_echo, b"x%d" % i) for i in range(20)))


@pytest.mark.parametrize("server", ["echo", "collect"])
async def test_large_payloads_both_ways(
    netns: Namespace, forwards: list[NetnsForwarder], server: str
) -> None:
    port = netns.echo_port if server == "echo" else netns.collect_port
    forwarder = await _start(forwards, netns, (port, 0))
    payload = os.urandom(8 << 20)
    reader, writer = await _connect(forwarder.host_ports[0])

    async def send() -> None:
        writer.write(payload)
        await writer.drain()
        writer.write_eof()

    _, received = await asyncio.gather(send(), _read_to_end(reader))
    writer.close()
    assert len(received) == len(payload)
    assert received == payload


async def test_half_close_still_gets_the_reply(
    netns: Namespace, forwards: list[NetnsForwarder]
) -> None:
    forwarder = await _start(forwards, netns, (netns.collect_port, 0))
    with socket.create_connection(("127.0.0.1", forwarder.host_ports[0]), timeout=TIMEOUT) as sock:
        sock.sendall(b"hello, ")
        sock.sendall(b"namespace")
        sock.shutdown(socket.SHUT_WR)
        received = b""
        while data := await asyncio.to_thread(sock.recv, 65536):
            received += data
    assert received == b"hello, namespace"


async def test_nothing_listening_inside_closes_the_client_at_once(
    netns: Namespace, forwards: list[NetnsForwarder]
) -> None:
    forwarder = await _start(forwards, netns, (netns.closed_port, 0))
    loop = asyncio.get_running_loop()
    reader, writer = await _connect(forwarder.host_ports[0])
    started = loop.time()
    assert await _read_to_end(reader) == b""
    assert loop.time() - started < 2
    writer.close()
    assert forwarder.active_connections == 0


async def test_close_ends_live_relays_and_frees_the_port(
    netns: Namespace, forwards: list[NetnsForwarder]
) -> None:
    host_port = _free_port()
    forwarder = await _start(forwards, netns, (netns.echo_port, host_port))
    reader, writer = await _connect(host_port)
    writer.write(b"live")
    async with asyncio.timeout(TIMEOUT):
        assert await reader.readexactly(4) == b"live"
    assert forwarder.active_connections == 1

    await forwarder.close()
    assert forwarder.closed
    assert forwarder.active_connections == 0
    assert await _read_to_end(reader) == b""  # ended, not left hanging
    writer.close()
    with pytest.raises(ConnectionRefusedError):
        await _connect(host_port)
    await forwarder.close()  # idempotent

    # The port can be listened on again, by another forwarder.
    again = await _start(forwards, netns, (netns.echo_port, host_port))
    assert again.host_ports == (host_port,)
    await _echo_round_trip(host_port)


async def test_connections_beyond_the_limit_are_closed(
    netns: Namespace, forwards: list[NetnsForwarder]
) -> None:
    forwarder = await _start(forwards, netns, (netns.echo_port, 0), max_connections=2)
    port = forwarder.host_ports[0]
    first = await _connect(port)
    second = await _connect(port)
    for reader, writer in (first, second):
        writer.write(b"ok")
        async with asyncio.timeout(TIMEOUT):
            assert await reader.readexactly(2) == b"ok"
    assert forwarder.active_connections == 2

    reader, writer = await _connect(port)
    assert await _read_to_end(reader) == b""
    writer.close()

    first[1].close()
    async with asyncio.timeout(TIMEOUT):
        while forwarder.active_connections > 1:
            await asyncio.sleep(0.01)
    await _echo_round_trip(port)
    second[1].close()


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


async def test_a_busy_host_port_is_named_and_nothing_stays_open(
    netns: Namespace, forwards: list[NetnsForwarder]
) -> None:
    free = _free_port()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        busy_port = busy.getsockname()[1]
        await _start(forwards, netns, (netns.echo_port, 0))  # the helper thread is up
        fds = _open_fds()
        with pytest.raises(OSError, match=rf"127\.0\.0\.1:{busy_port}\b") as caught:
            await NetnsForwarder.start(
                netns_path=netns.path,
                listen_host="127.0.0.1",
                ports=[(netns.http_port, free), (netns.echo_port, busy_port)],
            )
        assert caught.value.errno is not None
        assert _open_fds() == fds  # no listening socket, no namespace fd left behind
    with socket.socket() as again:
        again.bind(("127.0.0.1", free))


async def test_a_wrong_namespace_path_is_a_clear_error(tmp_path: Path) -> None:
    # Opening the path comes first: these need neither root nor namespaces.
    async def start(path: str) -> NetnsForwarder:
        return await NetnsForwarder.start(
            netns_path=path, listen_host="127.0.0.1", ports=[(8888, 0)]
        )

    with pytest.raises(FileNotFoundError, match="cannot open network namespace /proc/"):
        await start("/proc/999999999/ns/net")
    if not Path("/proc/self/ns/uts").exists():
        pytest.skip("no /proc/self/ns here")
    with pytest.raises(OSError, match="is a uts namespace, not a network namespace"):
        await start("/proc/self/ns/uts")
    regular = tmp_path / "not-a-namespace"
    regular.write_text("")
    with pytest.raises(OSError, match="is not a namespace file"):
        await start(str(regular))


async def test_sockets_live_in_the_namespace_opened_at_start(
    netns: Namespace, forwards: list[NetnsForwarder]
) -> None:
    # A port that the host does listen on...
    with socket.socket() as host_server:
        host_server.bind(("127.0.0.1", 0))
        host_server.listen()
        port = host_server.getsockname()[1]
        # ...forwarded into the empty namespace of a holder that exits right after start():
        # the forwarder keeps the namespace it opened, and connects nowhere else.
        holder = subprocess.Popen(["unshare", "--net", "--", "sleep", "30"])
        try:
            async with asyncio.timeout(TIMEOUT):
                while os.readlink(f"/proc/{holder.pid}/ns/net") == os.readlink("/proc/self/ns/net"):
                    await asyncio.sleep(0.005)
            forwarder = await NetnsForwarder.start(
                netns_path=f"/proc/{holder.pid}/ns/net", listen_host="127.0.0.1", ports=[(port, 0)]
            )
            forwards.append(forwarder)
        finally:
            holder.kill()
            holder.wait(10)
        reader, writer = await _connect(forwarder.host_ports[0])
        assert await _read_to_end(reader) == b""  # refused in there (lo is even down)
        writer.close()
        host_server.setblocking(False)
        with pytest.raises(BlockingIOError):
            host_server.accept()  # the host's listener never saw a connection


async def test_invalid_arguments_are_refused_before_anything_opens() -> None:
    with pytest.raises(ValueError, match="invalid port pair"):
        await NetnsForwarder.start(
            netns_path="/proc/self/ns/net", listen_host="127.0.0.1", ports=[(0, 8080)]
        )
    with pytest.raises(ValueError, match="max_connections"):
        await NetnsForwarder.start(
            netns_path="/proc/self/ns/net",
            listen_host="127.0.0.1",
            ports=[(8080, 0)],
            max_connections=0,
        )


async def test_a_helper_thread_that_cannot_come_back_is_retired(
    netns: Namespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The real setns, except that going back to the agent's namespace fails once: that
    # thread is then really stuck in the kernel's namespace and must never be used again.
    real = netns_forward._setns
    calls: list[int] = []

    def failing_return(fd: int, nstype: int) -> None:
        calls.append(fd)
        if len(calls) == 2:
            raise OSError(errno.EPERM, "injected")
        real(fd, nstype)

    monkeypatch.setattr(netns_forward, "_setns", failing_return)
    ns_fd = os.open(netns.path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        with pytest.raises(OSError, match="injected"):
            await netns_forward._socket_in_namespace(ns_fd)
        retired = netns_forward._current_worker
        assert retired is not None
        assert retired.broken
        sock = await netns_forward._socket_in_namespace(ns_fd)
        assert netns_forward._current_worker is not retired
        with sock:
            sock.setblocking(False)
            async with asyncio.timeout(TIMEOUT):
                await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", netns.echo_port))
                await asyncio.get_running_loop().sock_sendall(sock, b"back")
                assert await asyncio.get_running_loop().sock_recv(sock, 4) == b"back"
    finally:
        os.close(ns_fd)


@pytest.fixture(params=["helper", "interpreter"])
def spawned_way(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, exec_helper_build: Path | str
) -> str | None:
    """The way of an agent that is not root: each socket made by a spawned process (the
    exec helper's ``socket`` mode, or the agent's interpreter), the helper thread never
    used.  Returns the exec helper to pass (None: the interpreter)."""
    monkeypatch.setattr(netns_forward, "_thread_way_allowed", lambda: False)
    if request.param == "interpreter":
        return None
    if isinstance(exec_helper_build, str):
        pytest.skip(f"no exec helper: {exec_helper_build}")
    return str(exec_helper_build)


async def test_a_spawned_process_makes_the_sockets_where_the_thread_may_not(
    netns: Namespace, forwards: list[NetnsForwarder], spawned_way: str | None
) -> None:
    before = _net_ns_of_this_thread()
    fds = _open_fds()
    forwarder = await NetnsForwarder.start(
        netns_path=netns.path,
        listen_host="127.0.0.1",
        ports=[(netns.http_port, 0), (netns.echo_port, 0)],
        exec_helper=spawned_way,
    )
    assert forwarder._maker is not None  # (not the helper thread's way)
    http_port, echo_port = forwarder.host_ports
    async with httpx.AsyncClient(timeout=TIMEOUT) as client:
        for path in ("/", "/lab"):
            response = await client.get(f"http://127.0.0.1:{http_port}{path}")
            assert response.status_code == 200
            assert response.text == f"inside the namespace {path}"
    await asyncio.gather(*(_echo_round_trip(echo_port, b"x" * n) for n in range(1, 9)))
    assert _net_ns_of_this_thread() == before
    # nothing of it stays open: no namespace fd, no socket
    await forwarder.close()
    assert _open_fds() == fds


async def test_a_spawned_process_that_fails_is_a_clear_error(
    netns: Namespace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(netns_forward, "_thread_way_allowed", lambda: False)
    fds = _open_fds()
    # a "helper" that enters nothing and reports EPERM as the real one words it
    refusing = tmp_path / "refusing"
    refusing.write_text(
        f"#!{sys.executable}\nimport os, sys\n"
        "os.write(int(sys.argv[4]), b'PermissionError: [Errno 1] Operation not permitted"
        " (entering it)')\nsys.exit(1)\n"
    )
    refusing.chmod(0o755)
    with pytest.raises(
        PermissionError,
        match=r"^\[Errno 1\] cannot create a socket in network namespace /proc/\d+/ns/net:"
        r" Operation not permitted \(entering it\)",
    ):
        await NetnsForwarder.start(
            netns_path=netns.path,
            listen_host="127.0.0.1",
            ports=[(netns.http_port, 0)],
            exec_helper=str(refusing),
        )
    # one that sends neither a socket nor an error
    with pytest.raises(OSError, match=r"exec helper \S+/true sent no socket: and no error"):
        await NetnsForwarder.start(
            netns_path=netns.path,
            listen_host="127.0.0.1",
            ports=[(netns.http_port, 0)],
            exec_helper=shutil.which("true") or "/bin/true",
        )
    assert _open_fds() == fds
