"""A real local cluster (manager + one agent with the 2-fGPU mock, as child processes)
for the SDK and CLI tests, started once for this directory by the same code as
``accelshare dev up`` on a free port and a temporary data dir.

Each test leaves no live session behind (``clean`` destroys what is left), so the
tests do not depend on their order.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from accelshare.client import AccelshareClient
from accelshare.client.cli import app
from accelshare.devcluster import DevClusterOptions, LocalCluster, free_port


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    data_dir = tmp_path_factory.mktemp("cluster")
    local = LocalCluster(DevClusterOptions(data_dir=data_dir, port=free_port()))
    try:
        local.start()
    except Exception as e:
        logs = Path(data_dir, "logs")
        tails = {p.name: p.read_text(errors="replace")[-3000:] for p in logs.glob("*.log")}
        pytest.fail(f"the local cluster did not start: {e}\n{tails}")
    yield local
    local.stop(destroy_sessions=True)


@pytest.fixture
def clean(cluster: LocalCluster) -> Iterator[LocalCluster]:
    """The cluster; every session still live after the test is destroyed."""
    yield cluster
    cluster.destroy_sessions()


@pytest.fixture
async def sdk(clean: LocalCluster) -> AsyncIterator[AccelshareClient]:
    async with AccelshareClient(clean.client_config()) as client:
        yield client


class Cli:
    """``accelshare ...`` in-process (typer's runner) with the cluster's keys."""

    def __init__(self, env: dict[str, str | None]) -> None:
        self.env = env
        self.runner = CliRunner()

    def __call__(
        self, *args: str, env: dict[str, str] | None = None, input: str | None = None
    ) -> CliResult:
        result = self.runner.invoke(app, list(args), env={**self.env, **(env or {})}, input=input)
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            raise result.exception
        return CliResult(result.exit_code, result.stdout, result.stderr)


class CliResult:
    def __init__(self, code: int, stdout: str, stderr: str) -> None:
        self.code, self.stdout, self.stderr = code, stdout, stderr

    def __repr__(self) -> str:
        return f"CliResult(code={self.code}, stdout={self.stdout!r}, stderr={self.stderr!r})"


@pytest.fixture
def cli(clean: LocalCluster) -> Cli:
    env: dict[str, str | None] = {
        k: None for k in os.environ if k.startswith(("ACCELSHARE_", "BACKEND_"))
    }
    env.update(clean.client_env())
    return Cli(env)
