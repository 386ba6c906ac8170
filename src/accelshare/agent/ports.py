"""Host ports for the kernels' app services (Backend.AI's ``[container] port-range``).

A session declares its app services in its environment, ``BACKENDAI_SERVICE_PORT_<NAME>
=<port>`` (the *container* port).  Two kernels on one agent may declare the same port
(two Jupyter sessions on 8888), so the agent gives each declared service its own host
port from ``[container] port-range``::

    pool = HostPortPool((30000, 31000))
    mapped = pool.allocate("k1", declared_services(environ))   # [ServicePortMapping]
    pool.release("k1")                                          # when the kernel ends

The process runtime tells the kernel to listen on the host port (the variable is
rewritten); the docker runtime publishes container port -> host port (or, on the host
network, rewrites the variable as well).  The mapping is kept in the kernel's meta file,
so that an agent restart re-reserves the same ports (:meth:`HostPortPool.reserve`), also
for a kernel re-adopted with an unknown allocation (its meta file, or for an orphan
whose scratch dir is gone, its processes' environment: :func:`ports_in_environ`), and
reported to the manager (:attr:`~accelshare.protocol.KernelReport.service_ports`),
whose app proxy connects to the agent host's port.
"""

from __future__ import annotations

import contextlib
import ipaddress
import re
import socket
from collections.abc import Callable, Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

from accelshare.protocol import ServicePortMapping

__all__ = [
    "PUBLISHED_PORTS_ENV",
    "SERVICE_PORT_ENV_PREFIX",
    "HostPortPool",
    "PortRangeExhausted",
    "declared_services",
    "mappings_from_json",
    "port_is_free",
    "ports_in_environ",
    "proxy_address",
]

SERVICE_PORT_ENV_PREFIX = "BACKENDAI_SERVICE_PORT_"
#: A sandboxed process kernel's relayed host ports, comma-separated (see ports_in_environ).
PUBLISHED_PORTS_ENV = "ACCELSHARE_PUBLISHED_PORTS"
_SERVICE_NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,31}$")


class PortRangeExhausted(RuntimeError):
    """No free host port is left in the configured range."""


def proxy_address(rpc_url: str, *, resolve: Callable[[str], str] = socket.gethostbyname) -> str:
    """The host address the manager's app proxy connects to for this agent's app ports
    (the docker runtime publishes them there only): the host of the agent's advertised
    RPC URL (what the proxy uses), as an IP address: ``127.0.0.1`` for ``localhost``
    (a single host), a name resolved with ``resolve``.

    >>> proxy_address("http://10.0.0.5:6001")
    '10.0.0.5'
    >>> proxy_address("http://localhost:6001")
    '127.0.0.1'

    A wildcard address or a name that does not resolve is a ``ValueError`` naming the
    URL (set ``[agent] rpc-advertise-url``).
    """
    host = urlsplit(rpc_url).hostname
    if not host:
        raise ValueError(f"agent RPC URL {rpc_url!r} has no host to publish app ports on")
    if host == "localhost":
        return "127.0.0.1"
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        try:
            return resolve(host)
        except OSError as e:
            raise ValueError(
                f"cannot resolve {host!r} (the host of the agent RPC URL {rpc_url!r}) to"
                f" publish app ports on: {e}; set [agent] rpc-advertise-url to an address"
                " the manager reaches"
            ) from e
    if address.is_unspecified:
        raise ValueError(
            f"agent RPC URL {rpc_url!r}: app ports cannot be published on the wildcard"
            " address; set [agent] rpc-advertise-url to an address the manager reaches"
        )
    return str(address)


def declared_services(environ: Mapping[str, str]) -> list[tuple[str, int]]:
    """``[(name, container_port)]`` declared in a kernel's environment, by name.

    >>> declared_services({"BACKENDAI_SERVICE_PORT_WEB": "8080", "X": "1"})
    [('web', 8080)]
    """
    found: list[tuple[str, int]] = []
    for key, value in environ.items():
        if not key.startswith(SERVICE_PORT_ENV_PREFIX):
            continue
        name = key[len(SERVICE_PORT_ENV_PREFIX) :].lower()
        if not _SERVICE_NAME_RE.match(name):
            continue
        with contextlib.suppress(ValueError):
            port = int(value)
            if 1 <= port <= 65535:
                found.append((name, port))
    return sorted(found)


def port_is_free(port: int) -> bool:
    """Whether nothing on this host listens on ``port`` (TCP, any address)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("", port))
        except OSError:
            return False
    return True


def ports_in_environ(pids: Iterable[int], port_range: tuple[int, int]) -> list[int]:
    """The host ports of ``port_range`` that the processes ``pids`` were told to listen on.

    For a re-adopted kernel whose meta file is gone (an orphan): the process runtime
    rewrites each ``BACKENDAI_SERVICE_PORT_<NAME>`` to the kernel's host port, or, for
    a sandboxed kernel (which keeps its declared ports), lists the host ports relayed to
    it in ``ACCELSHARE_PUBLISHED_PORTS`` (``"30001,30002"``), so its processes'
    environments (``/proc/<pid>/environ``) still say which ports it uses.  Unreadable
    processes are skipped.

    >>> ports_in_environ([], (30000, 30010))
    []
    """
    low, high = port_range
    found: set[int] = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                raw = f.read()
        except OSError:
            continue
        environ = {}
        for item in raw.split(b"\0"):
            key, sep, value = item.decode(errors="replace").partition("=")
            if sep:
                environ[key] = value
        found.update(p for _, p in declared_services(environ) if low <= p <= high)
        published = environ.get(PUBLISHED_PORTS_ENV, "").split(",")
        found.update(int(p) for p in published if p.isdigit() and low <= int(p) <= high)
    return sorted(found)


def mappings_from_json(value: Any) -> list[ServicePortMapping]:
    """The mappings kept in a kernel's meta file (bad entries are skipped)."""
    found: list[ServicePortMapping] = []
    for item in value if isinstance(value, list) else []:
        with contextlib.suppress(ValueError, TypeError):
            found.append(ServicePortMapping.model_validate(item))
    return found


class HostPortPool:
    """Host ports of ``port_range`` (inclusive), each held by at most one kernel.

    Ports are handed out round-robin (a port just freed is the last to be reused, so a
    late connection of the proxy does not reach the next session's app) and a port that
    something else on the host listens on is skipped (``is_free``).
    """

    def __init__(
        self,
        port_range: tuple[int, int],
        *,
        is_free: Callable[[int], bool] = port_is_free,
    ) -> None:
        low, high = port_range
        if not 1 <= low <= high <= 65535:
            raise ValueError(f"bad port range {list(port_range)}: expected [low, high]")
        self.port_range = (low, high)
        self._is_free = is_free
        self._held: dict[int, str] = {}  # host port -> kernel id
        self._next = low

    @property
    def held(self) -> Mapping[int, str]:
        return dict(self._held)

    def ports_of(self, kernel_id: str) -> list[int]:
        return sorted(p for p, k in self._held.items() if k == kernel_id)

    def allocate(
        self, kernel_id: str, services: Iterable[tuple[str, int]]
    ) -> list[ServicePortMapping]:
        """One host port per ``(name, container_port)``; all or none."""
        low, high = self.port_range
        size = high - low + 1
        mapped: list[ServicePortMapping] = []
        try:
            for name, container_port in services:
                port = self._take(kernel_id, low, size)
                mapped.append(
                    ServicePortMapping(name=name, container_port=container_port, host_port=port)
                )
        except PortRangeExhausted:
            for m in mapped:
                self._held.pop(m.host_port, None)
            raise
        return mapped

    def _take(self, kernel_id: str, low: int, size: int) -> int:
        for i in range(size):
            port = low + (self._next - low + i) % size
            if port in self._held or not self._is_free(port):
                continue
            self._held[port] = kernel_id
            self._next = low + (port - low + 1) % size
            return port
        raise PortRangeExhausted(
            f"no free host port for the kernel's app services in the port range "
            f"[{low}, {low + size - 1}] (container.port-range: {len(self._held)} held by "
            "kernels, the rest used on the host); widen the range or end sessions"
        )

    def reserve(self, kernel_id: str, ports: Iterable[int]) -> list[int]:
        """Hold ``ports`` for a re-adopted kernel; returns those another kernel held."""
        clashes = []
        for port in ports:
            holder = self._held.get(port)
            if holder is not None and holder != kernel_id:
                clashes.append(port)
                continue
            self._held[port] = kernel_id
        return clashes

    def release(self, kernel_id: str) -> list[int]:
        freed = self.ports_of(kernel_id)
        for port in freed:
            del self._held[port]
        return freed
