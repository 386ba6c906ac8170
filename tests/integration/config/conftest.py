"""Fixtures for the configuration-store suite: a real etcd and one harness per backend.

Every store test takes ``harness`` (or ``store``) and so runs twice: against the
embedded SQLite store in a temporary directory and against a real ``etcd`` started
once per session on free loopback ports.  Each test gets its own namespace, so tests
never see each other's keys.  The etcd half skips only if no ``etcd`` binary exists.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from accelshare.config import ConfigStore, ConfigStoreSettings, make_scope_prefix_map
from accelshare.config.backend import KVBackend
from accelshare.config.embedded import EmbeddedBackend
from accelshare.config.etcd import EtcdBackend
from accelshare.config.settings import EmbeddedSettings, EtcdSettings
from accelshare_testkit.etcd_server import EtcdProcess, find_etcd_binary

# The test etcd refuses transactions of more operations than this, which the
# all-or-nothing test relies on (etcd's own default is 128).
ETCD_MAX_TXN_OPS = 1000


@pytest.fixture(scope="session")
def etcd_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdProcess]:
    if find_etcd_binary() is None:
        pytest.skip("no etcd binary: apt-get install etcd-server (or set ACCELSHARE_ETCD_BINARY)")
    data_dir = tmp_path_factory.mktemp("etcd") / "data"
    with EtcdProcess(data_dir, max_txn_ops=ETCD_MAX_TXN_OPS) as etcd:
        yield etcd


@dataclass
class FakeClock:
    """Wall-clock time plus an offset that tests advance (the embedded store's leases)."""

    offset_s: float = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset_s


@dataclass
class Harness:
    kind: str  # "embedded" or "etcd"
    namespace: str
    tmp_path: Path
    etcd: EtcdProcess | None = None
    clock: FakeClock = field(default_factory=FakeClock)

    def backend(self, *, timeout_s: float = 5.0) -> KVBackend:
        backend: KVBackend
        if self.etcd is not None:
            backend = EtcdBackend(
                host=self.etcd.host, port=self.etcd.port, timeout_s=timeout_s, lock_ttl_s=3
            )
        else:
            backend = EmbeddedBackend(
                self.db_path, timeout_s=timeout_s, poll_interval_s=0.01, clock=self.clock
            )
        return backend

    def store(
        self, *, scaling_group: str | None = "gpu", node_id: str | None = "i-1"
    ) -> ConfigStore:
        return ConfigStore(
            self.backend(),
            namespace=self.namespace,
            scope_prefix_map=make_scope_prefix_map(scaling_group=scaling_group, node_id=node_id),
        )

    @property
    def db_path(self) -> Path:
        return self.tmp_path / "store" / "config-store.db"

    def settings(self) -> ConfigStoreSettings:
        if self.etcd is not None:
            return ConfigStoreSettings(
                backend="etcd", etcd=EtcdSettings(addr=self.etcd.addr, namespace=self.namespace)
            )
        return ConfigStoreSettings(
            backend="embedded",
            embedded=EmbeddedSettings(path=self.db_path, namespace=self.namespace),
        )

    def env(self) -> dict[str, str]:
        """Environment variables that select this store (for subprocesses)."""
        if self.etcd is not None:
            return {
                "ACCELSHARE_ETCD_ADDR": self.etcd.addr,
                "ACCELSHARE_CONFIG_NAMESPACE": self.namespace,
            }
        return {
            "ACCELSHARE_CONFIG_STORE": str(self.db_path),
            "ACCELSHARE_CONFIG_NAMESPACE": self.namespace,
        }

    def config_toml(self) -> Path:
        """A daemon-style TOML file that selects this store."""
        path = self.tmp_path / f"{self.kind}.toml"
        if self.etcd is not None:
            text = f'[etcd]\naddr = "{self.etcd.addr}"\nnamespace = "{self.namespace}"\n'
        else:
            text = f'[config-store]\npath = "{self.db_path}"\nnamespace = "{self.namespace}"\n'
        path.write_text(text)
        return path

    def expire_leases(self, seconds: float) -> None:
        """Let ``seconds`` pass for leases: instantly on the embedded store (its clock
        is injected); etcd keeps real time, so the caller waits for the DELETE event."""
        self.clock.offset_s += seconds

    async def let_lease_time_pass(self, seconds: float) -> None:
        """Let ``seconds`` really pass for leases on both backends: the embedded store's
        clock jumps; on etcd, which keeps its own time, the test waits them out."""
        if self.etcd is None:
            self.clock.offset_s += seconds
        else:
            await asyncio.sleep(seconds)


@pytest.fixture(params=["embedded", "etcd"])
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Harness:
    namespace = f"t{uuid.uuid4().hex[:12]}"
    if request.param == "etcd":
        etcd = request.getfixturevalue("etcd_server")
        return Harness("etcd", namespace, tmp_path, etcd=etcd)
    return Harness("embedded", namespace, tmp_path)


@pytest.fixture
async def store(harness: Harness) -> AsyncIterator[ConfigStore]:
    store = harness.store()
    yield store
    await store.close()
