"""Plugin selection (allow/block lists, aliases) and loading (duplicates, prefixes)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from accelshare.accel import (
    ComputePlugin,
    KernelMetric,
    KernelResources,
    KernelStatTarget,
    NodeMetric,
    PluginContext,
    PluginEntry,
    PluginInventory,
    PluginLoadError,
    PluginUnavailable,
    installed_plugin_entries,
    load_compute_plugins,
    select_plugins,
)
from accelshare.accel.types import Device, NumberFormat, SlotMetadata
from accelshare.common import AllocationMode, SlotTypes
from accelshare.config.agent_file import AgentConfig, parse_agent_config

from .builders import SAMPLES


class StubPlugin:
    """The smallest ComputePlugin: one device in the given slots."""

    def __init__(self, key: str, slots: Sequence[str], log: list[str] | None = None) -> None:
        self.log = log if log is not None else []
        fmt = NumberFormat(binary=False, round_length=0)
        self._inventory = PluginInventory(
            key=key,
            version="1",
            slot_types=dict.fromkeys(slots, SlotTypes.COUNT),
            devices=tuple(Device(f"{slot}-0", slot, Decimal(1), "stub", 0, 0, 1) for slot in slots),
            allocation_mode=AllocationMode.DISCRETE,
            strategy="EVENLY",
            quantum_size=None,
            exclusive_slot_types=frozenset(),
            metadata={s: SlotMetadata(s, s, s, s, s, fmt) for s in slots},
        )

    @property
    def inventory(self) -> PluginInventory:
        return self._inventory

    def kernel_resources(self, allocation: Mapping[str, Mapping[str, Decimal]]) -> KernelResources:
        return KernelResources()

    async def node_stats(self) -> Sequence[NodeMetric]:
        return []

    async def kernel_stats(self, kernels: Mapping[str, KernelStatTarget]) -> Sequence[KernelMetric]:
        return []

    async def close(self) -> None:
        self.log.append(f"closed {self._inventory.key}")


def entry(name: str, make: Any, module: str | None = None) -> PluginEntry:
    async def factory(ctx: PluginContext) -> Any:
        return make()

    return PluginEntry(name, f"{module or 'tests.stub.' + name}:create_plugin", lambda: factory)


def unavailable(name: str) -> PluginEntry:
    def make() -> Any:
        raise PluginUnavailable(f"{name}: no hardware")

    return entry(name, make)


LOG: list[str] = []
CPU = entry("cpu", lambda: StubPlugin("cpu", ["cpu"], LOG), "accelshare.accel.cpu")
MEM = entry("mem", lambda: StubPlugin("mem", ["mem"], LOG), "accelshare.accel.mem")
MOCK = entry("mock", lambda: StubPlugin("cuda", ["cuda.device"], LOG), "accelshare.accel.mock")
CUDA = entry("cuda", lambda: StubPlugin("cuda", ["cuda.shares"], LOG), "accelshare.accel.cuda")
TPU = entry("tpu", lambda: StubPlugin("tpu", ["tpu.device"], LOG), "vendor.tpu_plugin")
ENTRIES = [CPU, CUDA, MEM, MOCK, TPU]


def names(allowed: list[str] | None, blocked: list[str] = []) -> list[tuple[str, bool]]:  # noqa: B006
    return [(s.entry.name, s.explicit) for s in select_plugins(ENTRIES, allowed, blocked)]


@pytest.mark.parametrize(
    ("allowed", "selected"),
    [
        (["mock"], ["cpu", "mem", "mock"]),
        (["accelshare.accel.mock"], ["cpu", "mem", "mock"]),  # module path
        (["accelshare.accel.mock:create_plugin"], ["cpu", "mem", "mock"]),  # entry-point value
        (["ai.backend.accelerator.mock"], ["cpu", "mem", "mock"]),  # Backend.AI alias
        (["ai.backend.accelerator.cuda_open"], ["cpu", "mem", "cuda"]),
        (["ai.backend.accelerator.cuda"], ["cpu", "mem", "cuda"]),
        (["tpu", "mock", "mock"], ["cpu", "mem", "tpu", "mock"]),  # allow-list order, no repeats
        (["cpu", "mem"], ["cpu", "mem"]),
        ([], ["cpu", "mem"]),
    ],
)
def test_allow_list(allowed: list[str], selected: list[str]) -> None:
    assert [n for n, _ in names(allowed)] == selected
    assert all(explicit for _, explicit in names(allowed))


def test_no_allow_list_means_every_installed_plugin_implicitly() -> None:
    assert names(None) == [
        ("cpu", True),
        ("mem", True),
        ("cuda", False),
        ("mock", False),
        ("tpu", False),
    ]


def test_block_list() -> None:
    assert [n for n, _ in names(None, ["cuda", "vendor.tpu_plugin"])] == ["cpu", "mem", "mock"]
    assert [n for n, _ in names(["mock", "cuda"], ["ai.backend.accelerator.cuda"])] == [
        "cpu",
        "mem",
        "mock",
    ]
    assert [n for n, _ in names(["mock"], ["not-installed"])] == ["cpu", "mem", "mock"]


def test_blocking_an_intrinsic_plugin_is_an_error() -> None:
    with pytest.raises(PluginLoadError, match="cpu and mem are intrinsic"):
        names(None, ["mem"])


def test_unknown_allowed_plugin_is_an_error() -> None:
    with pytest.raises(PluginLoadError, match=r"'rocm'.*installed: cpu, cuda, mem, mock, tpu"):
        names(["rocm"])


def test_installed_entry_points() -> None:
    entries = {e.name: e for e in installed_plugin_entries()}
    assert {"cpu", "mem", "mock", "cuda"} <= set(entries)
    assert entries["mock"].module == "accelshare.accel.mock"
    assert entries["cuda"].value == "accelshare.accel.cuda:create_plugin"
    assert callable(entries["cpu"].load())


TEST_GROUP = "accelshare.test_compute_plugins"


def install_dist(site: Path, name: str, plugins: dict[str, str]) -> None:
    """A minimal installed distribution (``*.dist-info``) registering ``plugins``."""
    info = site / f"{name.replace('-', '_')}-1.0.dist-info"
    info.mkdir(parents=True)
    info.joinpath("METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    lines = [f"[{TEST_GROUP}]", *(f"{k} = {v}" for k, v in plugins.items())]
    info.joinpath("entry_points.txt").write_text("\n".join(lines) + "\n")


def test_two_distributions_registering_the_same_plugin_name_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    install_dist(tmp_path, "vendor-tpu", {"tpu": "vendor_tpu.plugin:create_plugin"})
    install_dist(tmp_path, "other-tpu", {"tpu": "other_tpu:create_plugin"})
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(PluginLoadError) as info:
        installed_plugin_entries(TEST_GROUP)
    message = str(info.value)
    assert "two installed packages register the compute plugin 'tpu'" in message
    assert "vendor_tpu.plugin:create_plugin" in message
    assert "other_tpu:create_plugin" in message
    assert "uninstall one of them" in message


def test_the_same_registration_in_two_distributions_is_one_plugin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    install_dist(tmp_path, "vendor-tpu", {"tpu": "vendor_tpu:create_plugin"})
    install_dist(tmp_path, "vendor-tpu-extras", {"tpu": "vendor_tpu:create_plugin"})
    monkeypatch.syspath_prepend(str(tmp_path))
    entries = installed_plugin_entries(TEST_GROUP)
    assert [(e.name, e.value) for e in entries] == [
        ("cpu", "accelshare.accel.cpu:create_plugin"),
        ("mem", "accelshare.accel.mem:create_plugin"),
        ("tpu", "vendor_tpu:create_plugin"),
    ]


def ctx(**agent: Any) -> PluginContext:
    return PluginContext(parse_agent_config({"agent": agent}))


async def test_load_in_order_with_origins() -> None:
    loaded = await load_compute_plugins(
        ctx(**{"allowed-compute-plugins": ["tpu", "mock"]}), entries=ENTRIES
    )
    assert list(loaded.plugins) == ["cpu", "mem", "tpu", "cuda"]
    assert loaded.origins == {"cpu": "cpu", "mem": "mem", "tpu": "tpu", "cuda": "mock"}
    assert all(isinstance(p, ComputePlugin) for p in loaded.plugins.values())
    LOG.clear()
    await loaded.close()
    assert LOG == ["closed cuda", "closed tpu", "closed mem", "closed cpu"]


async def test_duplicate_keys_stop_loading_and_close_what_was_loaded() -> None:
    LOG.clear()
    with pytest.raises(PluginLoadError) as info:
        await load_compute_plugins(
            ctx(**{"allowed-compute-plugins": ["mock", "cuda"]}), entries=ENTRIES
        )
    message = str(info.value)
    assert "'mock' and 'cuda' both declare the key 'cuda'" in message
    assert "allowed-compute-plugins" in message
    assert LOG == ["closed cuda", "closed cuda", "closed mem", "closed cpu"]


@pytest.mark.parametrize(
    ("slots", "bad"),
    [
        (["gpu.device"], "gpu.device"),
        (["tpu"], "tpu"),
        (["tpux.device"], "tpux.device"),
        (["tpu.device", "cpu"], "cpu"),
    ],
)
async def test_slot_outside_prefix(slots: list[str], bad: str) -> None:
    rogue = entry("tpu", lambda: StubPlugin("tpu", slots))
    with pytest.raises(PluginLoadError, match=f"slot {bad!r} outside its prefix 'tpu.'"):
        await load_compute_plugins(
            ctx(**{"allowed-compute-plugins": ["tpu"]}), entries=[CPU, MEM, rogue]
        )


async def test_explicitly_allowed_but_unavailable_is_fatal() -> None:
    with pytest.raises(
        PluginLoadError, match=r"'cuda' is enabled in agent.toml but cannot run: cuda: no hardware"
    ):
        await load_compute_plugins(
            ctx(**{"allowed-compute-plugins": ["cuda"]}), entries=[CPU, MEM, unavailable("cuda")]
        )


async def test_implicit_and_unavailable_is_skipped_with_its_reason() -> None:
    loaded = await load_compute_plugins(ctx(), entries=[CPU, MEM, unavailable("cuda"), TPU])
    assert list(loaded.plugins) == ["cpu", "mem", "tpu"]
    assert loaded.skipped == {"cuda": "cuda: no hardware"}


async def test_intrinsic_unavailable_is_fatal() -> None:
    with pytest.raises(PluginLoadError, match="'mem'"):
        await load_compute_plugins(ctx(), entries=[CPU, unavailable("mem")])


async def test_factory_returning_something_else() -> None:
    odd = entry("odd", object)
    with pytest.raises(PluginLoadError, match="does not implement the ComputePlugin protocol"):
        await load_compute_plugins(
            ctx(**{"allowed-compute-plugins": ["odd"]}), entries=[CPU, MEM, odd]
        )


async def test_broken_import() -> None:
    broken = PluginEntry.from_value("broken", "accelshare.accel.no_such_module:create_plugin")
    with pytest.raises(PluginLoadError, match="cannot be imported"):
        await load_compute_plugins(
            ctx(**{"allowed-compute-plugins": ["broken"]}), entries=[CPU, MEM, broken]
        )


def real_config(**agent: Any) -> AgentConfig:
    return parse_agent_config(
        {
            "agent": {"mock-accelerator-config": str(SAMPLES / "two-fgpu.toml"), **agent},
            "resource": {"cpu-count": 4, "memory-size": "8g"},
        }
    )


async def test_real_entry_points_with_a_backend_ai_agent_toml() -> None:
    config = real_config(**{"allow-compute-plugins": ["ai.backend.accelerator.mock"]})
    loaded = await load_compute_plugins(PluginContext(config))
    try:
        assert list(loaded.plugins) == ["cpu", "mem", "cuda"]
        assert loaded.origins["cuda"] == "mock"
        assert loaded.plugins["cuda"].inventory.capacities() == {"cuda.device": Decimal(2)}
        assert loaded.plugins["cpu"].inventory.capacities() == {"cpu": Decimal(4)}
    finally:
        await loaded.close()


async def test_real_cuda_explicitly_allowed_without_a_driver_refuses_to_start() -> None:
    from accelshare.accel.cuda.nvml import PynvmlLayer

    try:
        layer = PynvmlLayer()
        layer.open()
    except PluginUnavailable:
        pass
    else:  # pragma: no cover - a GPU machine
        layer.close()
        pytest.skip("this machine has an NVIDIA driver")
    config = real_config(**{"allowed-compute-plugins": ["cuda"]})
    with pytest.raises(PluginLoadError, match="NVML"):
        await load_compute_plugins(PluginContext(config))
    # Without an allow list both are tried: cuda is skipped (named in the report), the
    # mock GPUs load.
    loaded = await load_compute_plugins(PluginContext(real_config()))
    try:
        assert "cuda" in loaded.skipped
        assert "NVML" in loaded.skipped["cuda"]
        assert loaded.origins["cuda"] == "mock"
    finally:
        await loaded.close()
