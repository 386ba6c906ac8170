"""What ``accelshare dev up`` generates, read back by the daemons' own loaders, and its
refusals of bad options (before anything starts)."""

from __future__ import annotations

import asyncio
import os
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import accelshare
from accelshare.client.cli import app
from accelshare.client.config import load_client_config
from accelshare.config import config_store_env, load_config_store_settings, open_config_store
from accelshare.config.agent_file import load_agent_config
from accelshare.devcluster import ClusterLayout, ClusterStartError, DevClusterOptions, LocalCluster
from accelshare.devcluster.cluster import resolve_mock_config
from accelshare.devcluster.layout import (
    accelerator_options,
    agent_ids,
    check_accelerator_options,
    cli_bin_dir,
    render_agent_toml,
    render_client_env,
    render_manager_toml,
)
from accelshare.manager.config import load_manager_config

REPO = Path(__file__).resolve().parents[3]


def test_generated_configs_load(tmp_path: Path) -> None:
    layout = ClusterLayout.of(tmp_path / "data dir")  # a space: quoting must hold
    options = DevClusterOptions(data_dir=layout.root, port=18099, cpus=8, mem_bytes=16 * 2**30)
    layout.root.mkdir()
    layout.manager_toml.write_text(render_manager_toml(layout, options))
    manager = load_manager_config(layout.manager_toml)
    assert manager.data_dir == layout.root
    assert manager.manager.service_host_port == ("127.0.0.1", 18099)
    assert manager.credentials_file == layout.credentials
    assert manager.cluster_secret_file == layout.cluster_secret
    store = load_config_store_settings(layout.manager_toml, env={})
    assert (store.backend, store.embedded.path) == ("embedded", layout.config_store)

    toml = layout.agent_toml("i-dev-01")
    toml.parent.mkdir(parents=True)
    toml.write_text(render_agent_toml(layout, options, "i-dev-01", 16001))
    agent = load_agent_config(toml)
    assert agent.unknown_keys == ()
    assert agent.agent.id == "i-dev-01"
    assert agent.agent.rpc_listen_addr == "127.0.0.1:16001"
    assert agent.agent.cluster_secret_file == layout.cluster_secret
    assert agent.mock_accelerator_path() == layout.mock_config
    assert (agent.resource.cpu_count, agent.resource.memory_size) == (8, 16 * 2**30)
    assert agent.container.runtime == "process"
    assert agent.manager.endpoint == "http://127.0.0.1:18099"
    agent_store = load_config_store_settings(toml, env={})
    assert agent_store.embedded.path == layout.config_store  # the store is shared


def test_client_env_is_sourceable_and_readable(tmp_path: Path) -> None:
    path = tmp_path / "client.env"
    bin_dir = tmp_path / "a venv" / "bin"  # a space: quoting must hold
    path.write_text(
        render_client_env("http://127.0.0.1:8081", "AKIAEXAMPLE", "s3cret", bin_dir=bin_dir)
    )
    config = load_client_config(config_file=path, env={})
    assert (config.endpoint, config.access_key, config.secret_key) == (
        "http://127.0.0.1:8081",
        "AKIAEXAMPLE",
        "s3cret",
    )
    shown = subprocess.run(
        ["sh", "-c", f". '{path}'; sh -c 'echo $ACCELSHARE_ENDPOINT $ACCELSHARE_ACCESS_KEY'"],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": os.environ["PATH"]},
    )
    assert shown.stdout.split() == ["http://127.0.0.1:8081", "AKIAEXAMPLE"]  # exported
    twice = subprocess.run(
        ["sh", "-c", f". '{path}'; . '{path}'; echo \"$PATH\""],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert twice.stdout.strip() == f"{bin_dir}:/usr/bin:/bin"  # in front, and only once


def test_client_env_exports_the_cluster_store(tmp_path: Path) -> None:
    """client.env as `dev up` writes it names the cluster's config store: sourced in a
    shell that had another store selected, `accelshare mgr etcd` reaches the cluster's
    from any folder, and says so at --verbose (issue #33)."""
    layout = ClusterLayout.of(tmp_path / "data dir")  # a space: quoting must hold
    layout.root.mkdir()
    layout.manager_toml.write_text(render_manager_toml(layout, DevClusterOptions()))
    settings = load_config_store_settings(layout.manager_toml, env={})
    store_env = config_store_env(settings)
    assert store_env == {
        "ACCELSHARE_CONFIG_STORE": str(layout.config_store),
        "ACCELSHARE_ETCD_ADDR": "",
        "ACCELSHARE_CONFIG_NAMESPACE": "local",
    }
    text = render_client_env("http://127.0.0.1:8081", "AK", "SK", store_env=store_env)
    assert f"export ACCELSHARE_CONFIG_STORE='{layout.config_store}'\n" in text
    path = layout.client_env
    path.write_text(text)
    config = load_client_config(config_file=path, env={})  # the SDK still reads it
    assert (config.endpoint, config.access_key) == ("http://127.0.0.1:8081", "AK")

    async def seed() -> None:
        async with await open_config_store(settings) as store:
            await store.put("config/plugins/accelerator/cuda/allocation_mode", "fractional")

    asyncio.run(seed())
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    package_root = Path(accelshare.__file__).resolve().parents[1]
    shown = subprocess.run(
        [
            "bash",
            "-c",
            f"source {shlex.quote(str(path))} && cd {shlex.quote(str(elsewhere))}"
            f" && {shlex.quote(sys.executable)} -m accelshare.client.cli mgr etcd get -v"
            " config/plugins/accelerator/cuda/allocation_mode",
        ],
        capture_output=True,
        text=True,
        check=False,
        env={
            "PATH": os.environ["PATH"],
            "PYTHONPATH": str(package_root),
            # what the shell had before: another store, selected two ways
            "ACCELSHARE_ETCD_ADDR": "127.0.0.1:1",
            "ACCELSHARE_CONFIG_NAMESPACE": "other",
        },
    )
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == "fractional\n"
    assert shown.stderr == (
        f"using the embedded store at {layout.config_store}"
        " (namespace 'local'; from $ACCELSHARE_CONFIG_STORE)\n"
    )
    assert list(elsewhere.iterdir()) == []  # no store made where the command ran


def test_sourcing_client_env_puts_accelshare_on_path(tmp_path: Path) -> None:
    """The README's `source .accelshare/client.env` then `accelshare ...`, in a shell
    whose PATH does not have the venv: client.env (written as `dev up` writes it)
    brings this Python's `accelshare`."""
    bin_dir = cli_bin_dir()
    assert bin_dir is not None, "no accelshare script next to this Python (make venv)"
    assert bin_dir.is_absolute()
    path = tmp_path / "client.env"
    path.write_text(render_client_env("http://127.0.0.1:8081", "AK", "SK", bin_dir=bin_dir))
    bare_path = "/usr/bin:/bin"
    assert str(bin_dir) not in bare_path
    found = subprocess.run(
        ["bash", "-c", f"source '{path}' && command -v accelshare && accelshare --help"],
        capture_output=True,
        text=True,
        check=False,
        env={"PATH": bare_path, "HOME": str(tmp_path)},
    )
    assert found.returncode == 0, found.stderr
    assert found.stdout.splitlines()[0] == str(bin_dir / "accelshare")
    assert "Usage: accelshare" in found.stdout
    without = subprocess.run(
        ["bash", "-c", "command -v accelshare"],
        capture_output=True,
        text=True,
        check=False,
        env={"PATH": bare_path},
    )
    assert without.returncode != 0  # the test proves something: not on PATH before


def test_accelerator_options_and_agent_ids() -> None:
    assert accelerator_options(DevClusterOptions()) == {
        "allocation_mode": "fractional",
        "unit_mem": None,
        "unit_proc": None,
        "quantum_size": None,
    }
    options = DevClusterOptions(
        allocation_mode="discrete", unit_mem="1g", unit_proc=10, quantum="0.05"
    )
    assert accelerator_options(options) == {
        "allocation_mode": "discrete",
        "unit_mem": "1g",
        "unit_proc": "10",
        "quantum_size": "0.05",
    }
    assert check_accelerator_options(options) is None
    assert check_accelerator_options(DevClusterOptions(unit_mem="1m")) == (
        "--unit-mem '1m': expected a byte size >= 512 MiB such as '1g' or 1073741824"
    )
    assert agent_ids(3) == ["i-dev-01", "i-dev-02", "i-dev-03"]


def test_mock_config_resolution(tmp_path: Path) -> None:
    assert resolve_mock_config(None, cwd=REPO) == REPO / "configs/accelerator/two-fgpu.toml"
    # from elsewhere: the checkout this package runs from
    assert resolve_mock_config(None, cwd=tmp_path).name == "two-fgpu.toml"
    with pytest.raises(ClusterStartError, match="no such file"):
        resolve_mock_config(tmp_path / "missing.toml")


def _dev_up(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, ["dev", "up", *args])
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--mem", "lots"], "--mem 'lots'"),
        (["--mem", "0"], "--mem '0': expected a size > 0"),
        (["--mock-config", "/no/such.toml"], "--mock-config /no/such.toml: no such file"),
        (["--unit-mem", "1m"], "--unit-mem '1m': expected a byte size >= 512 MiB"),
        (["--quantum", "2"], "--quantum '2': expected a decimal number > 0 and <= 1"),
        (["--quantum", "abc"], "--quantum 'abc'"),
        (["--allocation-mode", "halves"], "'halves'"),
        (["--agents", "0"], "'--agents'"),
    ],
    ids=["mem", "mem-zero", "mock-config", "unit-mem", "quantum", "quantum-text", "mode", "agents"],
)
def test_dev_up_refuses_bad_options(tmp_path: Path, args: list[str], words: str) -> None:
    """Bad arguments, whoever finds them (typer or dev up): exit code 2, one line, and
    nothing started or written."""
    exit_code, stdout, stderr = _dev_up("--data-dir", str(tmp_path / "d"), *args)
    assert exit_code == 2, stderr
    assert stdout == ""
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("error: ")
    assert words in lines[0]
    assert not (tmp_path / "d").exists()


def test_port_in_use_and_second_dev_up_refused(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cluster = LocalCluster(DevClusterOptions(data_dir=tmp_path, port=port))
        with pytest.raises(ClusterStartError, match=f"port {port} .* is in use"):
            cluster.start()
    first = LocalCluster(DevClusterOptions(data_dir=tmp_path, port=port))
    first._take_lock()
    try:
        second = LocalCluster(DevClusterOptions(data_dir=tmp_path, port=port))
        with pytest.raises(ClusterStartError, match=r"another `accelshare dev up` \(pid \d+\)"):
            second._take_lock()
    finally:
        first.stop()
