"""Test hosts in network namespaces: several "machines" on one, talking over veth links.

    with TestNetwork() as net:
        server = net.add_host("srv")          # namespace + veth + 10.X.Y.10/24
        gpu = net.add_host("gpu")             # 10.X.Y.11
        net.attach_root()                     # this process reaches them at 10.X.Y.*
        proc = server.popen(["redis-server", ...])
        net.cut(gpu) / net.restore(gpu)       # unplug / replug a host's cable

The hosts hang off one bridge that lives in its own "switch" namespace, so no
firewall of the real machine (dockerd's FORWARD DROP policy, say) sits between them;
cutting a host takes its link down on the switch side.  Every namespace, link and
process made here is removed on exit, also when the test fails.  Root and iproute2
are needed: :func:`netns_unavailable` says why they are not there (tests skip).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import random
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any

__all__ = ["Host", "TestNetwork", "netns_unavailable", "wait_for_port"]


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def netns_unavailable() -> str | None:
    """Why network namespaces cannot be made here (None: they can)."""
    if shutil.which("ip") is None:
        return "no 'ip' command (apt-get install iproute2)"
    if os.geteuid() != 0:
        return "network namespaces need root"
    name = f"asprobe{os.getpid() % 100000}"
    made = _ip("netns", "add", name, check=False)
    if made.returncode != 0:
        return f"'ip netns add' failed: {made.stderr.strip()}"
    _ip("netns", "del", name, check=False)
    return None


def wait_for_port(host: str, port: int, *, timeout_s: float = 30.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError as e:
            if time.monotonic() > deadline:
                msg = f"{what or 'service'} not listening on {host}:{port}: {e}"
                raise TimeoutError(msg) from None
            time.sleep(0.05)


@dataclass
class Host:
    name: str  # the namespace
    address: str  # its IPv4 address on the test network
    switch_port: str  # its cable's end in the switch namespace
    processes: list[subprocess.Popen[Any]] = field(default_factory=list)

    def command(self, argv: Sequence[str]) -> list[str]:
        return ["ip", "netns", "exec", self.name, *argv]

    def run(self, argv: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess[Any]:
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        kwargs.setdefault("timeout", 120)
        return subprocess.run(self.command(argv), check=False, **kwargs)

    def popen(
        self,
        argv: Sequence[str],
        *,
        log: Path | None = None,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> subprocess.Popen[Any]:
        """Start a daemon in this host (its own process group; stopped on exit)."""
        out: IO[bytes] | int = subprocess.DEVNULL
        if log is not None:
            out = log.open("ab")
        try:
            process = subprocess.Popen(
                self.command(argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=cwd,
                start_new_session=True,
            )
        finally:
            if not isinstance(out, int):
                out.close()
        self.processes.append(process)
        return process


class TestNetwork:
    __test__ = False  # not a pytest class

    def __init__(self, *, subnet: str | None = None) -> None:
        tag = f"{random.randrange(16**4):04x}"
        self.prefix = f"as{tag}"  # interface names stay under 15 characters
        if subnet is None:
            subnet = f"10.{random.randrange(200, 250)}.{random.randrange(1, 250)}.0/24"
        self.network = ipaddress.ip_network(subnet)
        self.switch = f"{self.prefix}sw"
        self.hosts: dict[str, Host] = {}
        self._namespaces: list[str] = []
        self._root_link: str | None = None
        self.root_address: str | None = None

    def _addr(self, index: int) -> str:
        return str(self.network.network_address + index)

    def __enter__(self) -> TestNetwork:
        try:
            _ip("netns", "add", self.switch)
            self._namespaces.append(self.switch)
            _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
            _ip("-n", self.switch, "link", "set", "br0", "up")
            _ip("-n", self.switch, "link", "set", "lo", "up")
        except BaseException:
            self.close()
            raise
        return self

    def _cable(self, end_a: str, ns_b: str | None, end_b: str) -> None:
        """A veth pair: ``end_a`` on the switch's bridge, ``end_b`` in ``ns_b`` (None: root)."""
        _ip("link", "add", end_a, "type", "veth", "peer", "name", end_b)
        _ip("link", "set", end_a, "netns", self.switch)
        if ns_b is not None:
            _ip("link", "set", end_b, "netns", ns_b)
        _ip("-n", self.switch, "link", "set", end_a, "master", "br0")
        _ip("-n", self.switch, "link", "set", end_a, "up")

    def add_host(self, name: str) -> Host:
        if len(name) > 5 or not name.isalnum():
            raise ValueError(f"host name {name!r}: 1-5 letters or digits")
        index = 10 + len(self.hosts)
        namespace = f"{self.prefix}{name}"
        _ip("netns", "add", namespace)
        self._namespaces.append(namespace)
        port = f"{self.prefix}{name}s"
        self._cable(port, namespace, f"{self.prefix}{name}h")
        _ip("-n", namespace, "link", "set", f"{self.prefix}{name}h", "name", "eth0")
        address = self._addr(index)
        _ip("-n", namespace, "addr", "add", f"{address}/{self.network.prefixlen}", "dev", "eth0")
        _ip("-n", namespace, "link", "set", "eth0", "up")
        _ip("-n", namespace, "link", "set", "lo", "up")
        host = Host(namespace, address, port)
        self.hosts[name] = host
        return host

    def attach_root(self) -> str:
        """Give this (root-namespace) process an address on the network too."""
        port, self._root_link = f"{self.prefix}rts", f"{self.prefix}rt"
        self._cable(port, None, self._root_link)
        self.root_address = self._addr(1)
        _ip("addr", "add", f"{self.root_address}/{self.network.prefixlen}", "dev", self._root_link)
        _ip("link", "set", self._root_link, "up")
        return self.root_address

    def cut(self, host: Host) -> None:
        """Unplug ``host``'s cable (its processes keep running, nothing reaches them)."""
        _ip("-n", self.switch, "link", "set", host.switch_port, "down")

    def restore(self, host: Host) -> None:
        _ip("-n", self.switch, "link", "set", host.switch_port, "up")

    def close(self) -> None:
        for host in self.hosts.values():
            for process in host.processes:
                _stop(process)
        if self._root_link is not None:
            _ip("link", "del", self._root_link, check=False)
        for namespace in reversed(self._namespaces):
            # anything still running inside (a kernel of an agent) is killed first
            pids = _ip("netns", "pids", namespace, check=False).stdout.split()
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
            _ip("netns", "del", namespace, check=False)
        self._namespaces.clear()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _stop(process: subprocess.Popen[Any], timeout_s: float = 10.0) -> None:
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
