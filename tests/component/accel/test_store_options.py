"""Accelerator options read from a real (embedded) config store, merged over scopes."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from accelshare.accel import (
    PluginConfigError,
    PluginContext,
    UnknownOptionError,
    load_compute_plugins,
)
from accelshare.accel.cuda import LibcudaDriver, PynvmlLayer
from accelshare.accel.cuda import create_plugin as create_cuda_plugin
from accelshare.accel.cuda.fake import FakeGpu, FakeNvml
from accelshare.accel.mock.plugin import load_mock_options
from accelshare.accel.options import parse_accelerator_options, read_accelerator_options
from accelshare.client.cli import app
from accelshare.common import AllocationMode
from accelshare.config import ConfigScopes, ConfigStore, open_config_store
from accelshare.config.agent_file import load_agent_config, parse_agent_config
from accelshare.config.settings import ConfigStoreSettings, EmbeddedSettings

REPO = Path(__file__).resolve().parents[3]
SAMPLES = REPO / "configs" / "accelerator"
U = "c59395cd-ac91-4cd3-a1b0-3d2568aa2d0"


@pytest.fixture
async def store(tmp_path: Path) -> Any:
    settings = ConfigStoreSettings(embedded=EmbeddedSettings(path=tmp_path / "store.db"))
    opened = await open_config_store(settings, scaling_group="gpu", node_id="i-node01")
    yield opened
    await opened.close()


async def test_plugin_key_then_mock_fallback(store: ConfigStore) -> None:
    await store.put_prefix(
        "config/plugins/accelerator",
        {
            "mock": {"allocation_mode": "fractional", "unit_proc": "10", "quantum_size": "0.05"},
            "cuda": {"unit_proc": "12"},
        },
    )
    raw = await read_accelerator_options(store, "cuda", fallback_keys=("mock",))
    assert raw.values == {
        "unit_proc": "12",
        "allocation_mode": "fractional",
        "quantum_size": "0.05",
    }
    assert (
        raw.sources["unit_proc"] == "config store config/plugins/accelerator/cuda/ (global scope)"
    )
    assert raw.sources["allocation_mode"] == (
        "config store config/plugins/accelerator/mock/ (global scope)"
    )
    options = parse_accelerator_options(raw)
    assert (options.allocation_mode, options.unit_proc) == (AllocationMode.FRACTIONAL, 12)
    assert options.quantum_size == Decimal("0.05")
    # the real cuda plugin has no fallback
    assert (await read_accelerator_options(store, "cuda")).values == {"unit_proc": "12"}


async def test_scopes_node_over_scaling_group_over_global(store: ConfigStore) -> None:
    key = "config/plugins/accelerator/cuda/allocation_mode"
    await store.put(key, "discrete", scope=ConfigScopes.GLOBAL)
    await store.put("config/plugins/accelerator/cuda/unit_mem", "1g", scope=ConfigScopes.GLOBAL)
    await store.put(key, "fractional", scope=ConfigScopes.SCALING_GROUP)
    raw = await read_accelerator_options(store, "cuda")
    assert raw.values == {"allocation_mode": "fractional", "unit_mem": "1g"}
    await store.put(key, "discrete", scope=ConfigScopes.NODE)
    assert (await read_accelerator_options(store, "cuda")).values["allocation_mode"] == "discrete"


async def test_the_operator_json_file(store: ConfigStore, tmp_path: Path) -> None:
    """The spec's put-json example: 10 SMs and 1 GiB make 1.0 share."""
    doc = {
        "config": {
            "plugins": {
                "accelerator": {
                    "cuda": {
                        "allocation_mode": "fractional",
                        "unit_mem": 1073741824,
                        "unit_proc": 10,
                    }
                }
            }
        }
    }
    await store.put_prefix("", doc)
    config = load_agent_config(REPO / "configs" / "agent.toml")
    loaded = await load_compute_plugins(PluginContext(config, store))
    try:
        inventory = loaded.plugins["cuda"].inventory
        assert [str(d.capacity) for d in inventory.devices] == ["10.80"] * 4
        assert inventory.capacities() == {"cuda.shares": Decimal("43.20")}
    finally:
        await loaded.close()


async def test_bad_store_value_stops_with_the_store_key(store: ConfigStore) -> None:
    await store.put("config/plugins/accelerator/mock/allocation_mode", "shared")
    with pytest.raises(PluginConfigError) as info:
        await load_mock_options(PluginContext(store=store), "cuda")
    assert str(info.value) == (
        "config store config/plugins/accelerator/mock/ (global scope): key 'allocation_mode': "
        "expected 'discrete' or 'fractional', received 'shared'"
    )


G, S, N = ConfigScopes.GLOBAL, ConfigScopes.SCALING_GROUP, ConfigScopes.NODE
PREFIX = {
    G: "config store config/plugins/accelerator",
    S: "config store sgroup/gpu/config/plugins/accelerator",
    N: "config store nodes/agents/i-node01/config/plugins/accelerator",
}


@pytest.mark.parametrize(
    ("placed", "winner"),
    [
        pytest.param([(G, "cuda")], (G, "cuda"), id="global-own"),
        pytest.param([(G, "cuda"), (G, "mock")], (G, "cuda"), id="own-beats-mock-in-a-scope"),
        pytest.param([(G, "cuda"), (S, "cuda")], (S, "cuda"), id="sgroup-over-global"),
        pytest.param([(S, "cuda"), (N, "cuda")], (N, "cuda"), id="node-over-sgroup"),
        pytest.param([(G, "cuda"), (N, "mock")], (N, "mock"), id="node-mock-over-global-own"),
        pytest.param([(G, "cuda"), (S, "mock")], (S, "mock"), id="sgroup-mock-over-global-own"),
        pytest.param([(S, "cuda"), (S, "mock"), (G, "mock")], (S, "cuda"), id="sgroup-own"),
        pytest.param(
            [(G, "cuda"), (G, "mock"), (S, "cuda"), (S, "mock"), (N, "cuda"), (N, "mock")],
            (N, "cuda"),
            id="everywhere",
        ),
    ],
)
async def test_precedence_in_the_real_store(
    store: ConfigStore,
    placed: list[tuple[ConfigScopes, str]],
    winner: tuple[ConfigScopes, str],
) -> None:
    """Each placement gets its own unit_proc value; the winner's value and source show."""
    value = {where: str(10 + i) for i, where in enumerate(placed)}
    for (scope, key), text in value.items():
        await store.put(f"config/plugins/accelerator/{key}/unit_proc", text, scope=scope)
    options = await load_mock_options(PluginContext(store=store), "cuda")
    assert options.unit_proc == int(value[winner])
    scope, key = winner
    assert options.source("unit_proc") == f"{PREFIX[scope]}/{key}/ ({scope.value} scope)"


@pytest.mark.parametrize(
    ("scope", "key"),
    [(G, "cuda"), (S, "cuda"), (N, "mock"), (G, "mock")],
)
async def test_a_misspelt_option_stops_the_agent(
    store: ConfigStore, scope: ConfigScopes, key: str
) -> None:
    await store.put(f"config/plugins/accelerator/{key}/alocation_mode", "fractional", scope=scope)
    config = parse_agent_config(
        {
            "agent": {
                "allowed-compute-plugins": ["mock"],
                "mock-accelerator-config": str(SAMPLES / "two-fgpu.toml"),
            },
            "resource": {"cpu-count": 2, "memory-size": "4g"},
        }
    )
    with pytest.raises(UnknownOptionError) as info:
        await load_compute_plugins(PluginContext(config, store))
    assert str(info.value) == (
        f"{PREFIX[scope]}/{key}/ ({scope.value} scope): key 'alocation_mode': unknown option "
        "(set to 'fractional'); did you mean 'allocation_mode'? known options: "
        "allocation_mode, unit_mem, unit_proc, quantum_size, device_mask, reserved_memory"
    )


async def test_a_misspelt_cuda_option_stops_the_real_cuda_plugin(store: ConfigStore) -> None:
    await store.put("config/plugins/accelerator/cuda/alocation_mode", "fractional")
    nvml = FakeNvml([FakeGpu.h100(0)])
    with pytest.raises(UnknownOptionError, match="'alocation_mode'"):
        await create_cuda_plugin(PluginContext(store=store), nvml=PynvmlLayer(nvml))
    assert nvml.init_count == 0  # options are checked before NVML is touched


async def test_cuda_fractional_through_the_factory(store: ConfigStore) -> None:
    """The real factory path: options from the store, NVML, then the CUDA driver."""
    await store.put("config/plugins/accelerator/cuda/allocation_mode", "fractional", scope=S)
    nvml = FakeNvml([FakeGpu.h100(0), FakeGpu.a100(1)])
    plugin = await create_cuda_plugin(
        PluginContext(store=store),
        nvml=PynvmlLayer(nvml),
        driver=LibcudaDriver(loader=nvml.libcuda().load),
    )
    try:
        assert [str(d.capacity) for d in plugin.inventory.devices] == ["16.50", "13.50"]
        assert [d.processors for d in plugin.inventory.devices] == [132, 108]
    finally:
        await plugin.close()
    with pytest.raises(PluginConfigError) as info:
        await create_cuda_plugin(
            PluginContext(store=store),
            nvml=PynvmlLayer(nvml),
            driver=LibcudaDriver(loader=nvml.libcuda(library_missing=True).load),
        )
    assert info.value.source == f"{PREFIX[S]}/cuda/ (sgroup scope)"
    assert info.value.key == "allocation_mode"
    assert nvml.init_count == nvml.shutdown_count == 2  # NVML closed after the refusal


def write_agent_toml(tmp_path: Path, mock: str = "two-fgpu.toml", extra: str = "") -> Path:
    path = tmp_path / "agent.toml"
    path.write_text(
        f"""
[agent]
id = "i-cli"
scaling-group = "gpu"
allowed-compute-plugins = ["mock"]
mock-accelerator-config = "{SAMPLES / mock}"
{extra}
[resource]
cpu-count = 2
memory-size = "4g"

[config-store]
path = "{tmp_path / "store.db"}"
"""
    )
    return path


def test_cli_plugins_json(tmp_path: Path) -> None:
    agent_toml = write_agent_toml(tmp_path)
    runner = CliRunner()
    result = runner.invoke(
        app,
        [
            "mgr",
            "etcd",
            "put",
            "config/plugins/accelerator/cuda/allocation_mode",
            "fractional",
            "--config",
            str(agent_toml),
            "--create",  # a new cluster's first setting makes its store
        ],
    )
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["agent", "plugins", "--config", str(agent_toml), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert list(doc["plugins"]) == ["cpu", "mem", "cuda"]
    cuda = doc["plugins"]["cuda"]
    assert cuda["slots"] == {"cuda.shares": {"type": "count", "capacity": "2.00"}}
    assert cuda["allocation_mode"] == "fractional"
    assert cuda["quantum_size"] == "0.1"
    assert cuda["entry_point"] == "mock"
    assert [d["device_id"] for d in cuda["devices"]] == [f"{U}1", f"{U}2"]
    first = cuda["devices"][0]
    assert (first["numa_node"], first["memory_bytes"], first["processors"]) == (0, 2**31, 108)
    assert first["shares"] == "1.00"
    assert cuda["metadata"]["cuda.shares"]["display_unit"] == "fGPU"
    assert doc["plugins"]["mem"]["slots"] == {"mem": {"type": "bytes", "capacity": str(4 * 2**30)}}
    assert doc["plugins"]["cpu"]["quantum_size"] is None
    assert doc["skipped"] == {}


def test_cli_plugins_text_and_no_store(tmp_path: Path) -> None:
    agent_toml = write_agent_toml(tmp_path, "cuda-mock-mig.toml")
    result = CliRunner().invoke(
        app, ["agent", "plugins", "--config", str(agent_toml), "--no-config-store"]
    )
    assert result.exit_code == 0, result.output
    assert "cuda.device:10g-mig" in result.stdout
    assert f"MIG-{U}3/3/0" in result.stdout
    assert "GPU [fGPU]" not in result.stdout
    assert "GPU [GPU]" in result.stdout
    assert not (tmp_path / "store.db").exists()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ('allocation-order = "cuda"', "key 'agent.allocation-order'"),
        ('blocked-compute-plugins = ["cpu"]', "cpu and mem are intrinsic"),
    ],
)
def test_cli_errors_exit_non_zero(tmp_path: Path, extra: str, message: str) -> None:
    agent_toml = write_agent_toml(tmp_path, extra=extra)
    result = CliRunner().invoke(app, ["agent", "plugins", "--config", str(agent_toml), "--json"])
    assert result.exit_code == 1
    assert message in " ".join(result.output.split())
