"""The plugin conformance suite: every installed plugin, built through its entry point.

The cases are parametrized over ``installed_plugin_entries()`` (the
``accelshare.compute_plugins`` entry-point group plus the intrinsic cpu and mem), so a
newly registered plugin cannot escape the suite: without an entry in :data:`CASES` its
tests fail, naming the entry point and where to add the fixture.  Each case calls the
entry point's own factory with the configuration it needs (a fake host tree for cpu
and mem, every sample ``configs/accelerator/*.toml`` in both modes for mock -- the
mode set in a real embedded config store --, a fake NVML + libcuda machine for cuda)
and carries the slot capacities expected *independently* of the plugin: derived from
the sample file's raw TOML, the fake GPUs' fields, or the fake host tree.

What every ComputePlugin must satisfy:
- its declaration is valid (slot prefixes, unique device ids, metadata per slot);
- declared slot capacities equal the independent expectation (and the devices of
  each slot add up to it); whole devices and MIG slices count 1;
- an allocation map can be built, and what a kernel gets for an allocation is
  deterministic (same result whatever the dict order, every time, strings only);
- stats are within their declared ranges and only name known devices/kernels, before
  and after a plugin that follows allocations (:class:`ObservesAllocations`) is told some;
- metadata covers every exposed slot and names it.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any, cast

import pytest

from accelshare.accel import (
    ComputePlugin,
    KernelStatTarget,
    ObservesAllocations,
    PluginContext,
    PluginEntry,
    PluginFactory,
    installed_plugin_entries,
    validate_inventory,
)
from accelshare.accel.cuda import LibcudaDriver, PynvmlLayer
from accelshare.accel.cuda.fake import FakeGpu, FakeNvml
from accelshare.accel.maps import build_alloc_map
from accelshare.common import Allocation, AllocationMode, SlotName, SlotTypes
from accelshare.config import ConfigStore, open_config_store
from accelshare.config.agent_file import parse_agent_config
from accelshare.config.settings import ConfigStoreSettings, EmbeddedSettings

from .builders import GIB, SAMPLES

D = Decimal
Build = Callable[[PluginFactory, Path], Awaitable[ComputePlugin]]


@dataclass(frozen=True)
class Case:
    """One way to build a plugin through its factory, and what it must declare."""

    id: str
    build: Build  # (the entry point's factory, a scratch folder) -> the plugin
    expected: Mapping[str, Decimal]  # slot -> capacity, computed without the plugin


# -- independent expectations ------------------------------------------------------

_SIZE = re.compile(r"^\s*(\d+)\s*([kmgtp]?)i?b?\s*$", re.IGNORECASE)


def _bytes(value: object) -> int:
    """``"40G"`` -> 40·2^30 (binary suffixes, as the spec says), ints as bytes."""
    if isinstance(value, int):
        return value
    match = _SIZE.match(str(value))
    assert match, f"unexpected size {value!r} in a sample file"
    exponent = " kmgtp".index(match[2].lower() or " ")
    return int(match[1]) * int(1024**exponent)


def _shares(memory: int, sms: int, unit_mem: int = 2 * GIB, unit_proc: int = 8) -> Decimal:
    """min(memory/unit_mem, sms/unit_proc) truncated to hundredths, with Fractions."""
    exact = min(Fraction(memory, unit_mem), Fraction(sms, unit_proc))
    return D(int(exact * 100)) / 100


def _expected(
    key: str, devices: list[tuple[int, int, str | None]], mode: AllocationMode
) -> dict[str, Decimal]:
    """Slot capacities of accelerator devices given as (memory, SMs, MIG profile or None)."""
    main = f"{key}.device" if mode is AllocationMode.DISCRETE else f"{key}.shares"
    capacities: dict[str, Decimal] = {main: D(0)}
    migs = Counter(profile for _, _, profile in devices if profile is not None)
    for memory, sms, profile in devices:
        if profile is None:
            amount = D(1) if mode is AllocationMode.DISCRETE else _shares(memory, sms)
            capacities[main] += amount
    for profile, count in migs.items():
        capacities[f"cuda.device:{re.sub(r'[^A-Za-z0-9._-]', '-', profile)}-mig"] = D(count)
    return capacities


def expected_from_sample(
    path: Path, mode: AllocationMode, masked: frozenset[str] = frozenset()
) -> dict[str, Decimal]:
    """From the raw TOML of a sample file (not through the plugin's parser)."""
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    devices = [
        (
            _bytes(d["memory_size"]),
            int(d["subproc_count"]),
            d["model_name"].split("-", 1)[1] if d.get("is_mig_device", False) else None,
        )
        for d in data["devices"]
        if d["mother_uuid"] not in masked
    ]
    return _expected(data["slot_name"], devices, mode)


# -- building through the factories ------------------------------------------------


async def _store(folder: Path, values: Mapping[str, str]) -> ConfigStore:
    settings = ConfigStoreSettings(embedded=EmbeddedSettings(path=folder / "store.db"))
    store = await open_config_store(settings, scaling_group="default", node_id="i-conformance")
    for key, value in values.items():
        await store.put(key, value)
    return store


async def _with_store(
    factory: Any, folder: Path, options: Mapping[str, str], agent: Mapping[str, Any], **kw: Any
) -> ComputePlugin:
    store = await _store(folder, options) if options else None
    try:
        ctx = PluginContext(parse_agent_config(dict(agent)), store, folder)
        return cast(ComputePlugin, await factory(ctx, **kw))
    finally:
        if store is not None:
            await store.close()


def _mode_options(prefix_key: str, mode: AllocationMode, **extra: str) -> dict[str, str]:
    options = {f"config/plugins/accelerator/{prefix_key}/{k}": v for k, v in extra.items()}
    if mode is AllocationMode.FRACTIONAL:
        options[f"config/plugins/accelerator/{prefix_key}/allocation_mode"] = "fractional"
    return options


def mock_cases() -> list[Case]:
    cases: list[Case] = []
    samples = sorted(SAMPLES.glob("*.toml"))
    assert samples, f"no sample configs in {SAMPLES}"
    for path in samples:
        slot_name = tomllib.loads(path.read_text(encoding="utf-8"))["slot_name"]
        for mode in AllocationMode:
            agent = {"agent": {"mock-accelerator-config": str(path)}}
            options = _mode_options(slot_name, mode)

            async def build(
                factory: PluginFactory, folder: Path, o: Any = options, a: Any = agent
            ) -> ComputePlugin:
                return await _with_store(factory, folder, o, a)

            cases.append(Case(f"{path.stem}-{mode.value}", build, expected_from_sample(path, mode)))
    mig = SAMPLES / "cuda-mock-mig.toml"
    masked = "c59395cd-ac91-4cd3-a1b0-3d2568aa2d01"

    async def build_masked(factory: PluginFactory, folder: Path) -> ComputePlugin:
        # set through the mock/ fallback prefix, the way Backend.AI configures the mock
        options = _mode_options("mock", AllocationMode.FRACTIONAL, device_mask=masked)
        return await _with_store(
            factory, folder, options, {"agent": {"mock-accelerator-config": str(mig)}}
        )

    cases.append(
        Case(
            "cuda-mock-mig-masked-via-mock-prefix",
            build_masked,
            expected_from_sample(mig, AllocationMode.FRACTIONAL, frozenset({masked})),
        )
    )
    return cases


def conformance_gpus() -> list[FakeGpu]:
    """An A100, an H100 and an A100 split into MIG instances."""
    return [
        FakeGpu.a100(0, numa_node=0),
        FakeGpu.h100(1, numa_node=1),
        FakeGpu.a100(2, mig=["1g.5gb", "1g.5gb", "3g.20gb"], numa_node=1),
    ]


def cuda_cases() -> list[Case]:
    cases: list[Case] = []
    for mode in AllocationMode:
        gpus = conformance_gpus()
        devices: list[tuple[int, int, str | None]] = []
        for gpu in gpus:
            if gpu.mig is None:
                devices.append((gpu.memory_bytes, gpu.multiprocessors, None))
            else:
                devices += [(m.memory_bytes, m.multiprocessors, m.profile) for m in gpu.mig]

        async def build(
            factory: PluginFactory, folder: Path, m: AllocationMode = mode
        ) -> ComputePlugin:
            nvml = FakeNvml(conformance_gpus())
            nvml.gpus[0].mem_used, nvml.gpus[0].util_percent = 10 * GIB, 50
            return await _with_store(
                factory,
                folder,
                _mode_options("cuda", m),
                {},
                nvml=PynvmlLayer(nvml),
                driver=LibcudaDriver(loader=nvml.libcuda().load),
            )

        cases.append(Case(f"fake-nvml-{mode.value}", build, _expected("cuda", devices, mode)))
    return cases


def fake_host(root: Path) -> Path:
    """A cgroup v1 host: 16 GiB of RAM, 6 GiB memory limit, a 2.5-core CPU quota."""
    files = {
        "proc/meminfo": f"MemTotal: {16 * 1024 * 1024} kB\n",
        "proc/self/cgroup": "4:memory:/agent\n2:cpu,cpuacct:/agent\n",
        "proc/self/mountinfo": (
            "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n"
            "35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
        ),
        "sys/fs/cgroup/memory/agent/memory.limit_in_bytes": str(6 * GIB),
        "sys/fs/cgroup/cpu,cpuacct/agent/cpu.cfs_quota_us": "250000",
        "sys/fs/cgroup/cpu,cpuacct/agent/cpu.cfs_period_us": "100000",
        "sys/devices/system/node/node0/cpulist": "0-1023\n",
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def intrinsic_case(case_id: str, resource: dict[str, Any], expected: dict[str, Decimal]) -> Case:
    async def build(factory: PluginFactory, folder: Path) -> ComputePlugin:
        ctx = PluginContext(parse_agent_config({"resource": resource}), None, fake_host(folder))
        return await factory(ctx)

    return Case(case_id, build, expected)


def cpu_cases() -> list[Case]:
    # the first floor(2.5) = 2 cores of this process's affinity, nothing reserved
    affinity = len(os.sched_getaffinity(0))
    return [
        intrinsic_case("cgroup-quota", {"reserved-cpu": 0}, {"cpu": D(min(affinity, 2))}),
        intrinsic_case("cpu-count", {"cpu-count": 16}, {"cpu": D(16)}),
    ]


def mem_cases() -> list[Case]:
    return [
        # min(16 GiB, 6 GiB cgroup limit) - 1 GiB reserved
        intrinsic_case("cgroup-limit", {"reserved-mem": "1g"}, {"mem": D(5 * GIB)}),
        intrinsic_case("memory-size", {"memory-size": "32g"}, {"mem": D(32 * GIB)}),
    ]


# Entry-point name -> its conformance cases.  A plugin registered in the
# accelshare.compute_plugins group must have an entry here.
CASES: dict[str, Callable[[], list[Case]]] = {
    "cpu": cpu_cases,
    "mem": mem_cases,
    "mock": mock_cases,
    "cuda": cuda_cases,
}


def _params() -> list[Any]:
    params: list[Any] = []
    for entry in installed_plugin_entries():
        make = CASES.get(entry.name)
        if make is None:
            params.append(pytest.param((entry, None), id=f"{entry.name}-NO-CONFORMANCE-FIXTURE"))
            continue
        params += [pytest.param((entry, c), id=f"{entry.name}-{c.id}") for c in make()]
    return params


PARAMS = _params()


@dataclass
class Built:
    plugin: ComputePlugin
    case: Case


@pytest.fixture(params=PARAMS, name="built")
async def built_fixture(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Built]:
    entry, case = cast(tuple[PluginEntry, Case | None], request.param)
    if case is None:
        pytest.fail(
            f"the compute plugin entry point {entry.name!r} ({entry.value}) has no "
            f"conformance fixture: add a list of Case to CASES in {__file__}"
        )
    plugin = await case.build(entry.load(), tmp_path)
    assert isinstance(plugin, ComputePlugin)
    yield Built(plugin, case)
    await plugin.close()


def test_every_installed_entry_point_has_conformance_cases() -> None:
    installed = {e.name: e.value for e in installed_plugin_entries()}
    missing = {name: value for name, value in installed.items() if name not in CASES}
    assert not missing, f"entry points without conformance cases: {missing}"
    stale = set(CASES) - set(installed)
    assert not stale, f"conformance cases for plugins that are not installed: {stale}"
    assert {"cpu", "mem", "mock", "cuda"} <= set(installed)
    assert all(make() for make in CASES.values())


# -- the checks ----------------------------------------------------------------------


def one_of_each(plugin: ComputePlugin) -> list[Allocation]:
    """For every slot with capacity: allocate on a fresh map one unit, one quantum ×3, or
    for a bytes slot its whole declared capacity."""
    inv = plugin.inventory
    allocations: list[Allocation] = []
    for slot, capacity in inv.capacities().items():
        if capacity <= 0:
            continue
        alloc_map = build_alloc_map(inv)
        if inv.slot_types[slot] is SlotTypes.BYTES:
            amount = capacity
        elif inv.allocation_mode is AllocationMode.FRACTIONAL and slot.endswith(".shares"):
            assert inv.quantum_size is not None
            amount = min(inv.quantum_size * 3, capacity)
            amount -= amount % inv.quantum_size
        else:
            amount = (
                Decimal(min(2, int(capacity)))
                if inv.slot_types[slot] is SlotTypes.COUNT
                else Decimal(1)
            )
        allocations.append(alloc_map.allocate({slot: amount}))
    return allocations


def test_declaration_is_valid(built: Built) -> None:
    inv = built.plugin.inventory
    validate_inventory(inv)
    assert inv.version
    for slot in inv.slot_types:
        SlotName(slot)


def test_declared_slots_match_the_independent_expectation(built: Built) -> None:
    inv = built.plugin.inventory
    expected = dict(built.case.expected)
    assert inv.capacities() == expected
    by_devices = {
        slot: sum((d.capacity for d in inv.devices if d.slot_name == slot), D(0))
        for slot in inv.slot_types
    }
    assert by_devices == expected
    main_slots = [
        s for s in inv.slot_types if s in (inv.key, f"{inv.key}.device", f"{inv.key}.shares")
    ]
    assert len(main_slots) == 1  # exactly one slot for the mode
    for slot in inv.slot_types:
        devices = [d for d in inv.devices if d.slot_name == slot]
        if slot not in main_slots:
            assert devices, f"{slot} declared without devices"
        if inv.slot_types[slot] is SlotTypes.UNIQUE or slot.endswith(".device"):
            assert {d.capacity for d in devices} <= {Decimal(1)}
    for device in inv.devices:
        assert device.numa_node >= 0
        assert device.capacity > 0
        assert device.capacity.is_finite()
    if inv.allocation_mode is AllocationMode.FRACTIONAL:
        assert inv.quantum_size is not None
        assert inv.quantum_size > 0
    else:
        assert inv.quantum_size is None


def test_expectations_match_the_spec_examples() -> None:
    """The independent expectation itself, against the numbers spec 03 states."""
    frac, disc = AllocationMode.FRACTIONAL, AllocationMode.DISCRETE
    assert expected_from_sample(SAMPLES / "mock-accelerator.toml", frac) == {
        "cuda.shares": D("54.00")
    }
    assert expected_from_sample(SAMPLES / "two-fgpu.toml", frac) == {"cuda.shares": D(2)}
    assert expected_from_sample(SAMPLES / "cuda-mock-mig.toml", disc) == {
        "cuda.device": D(2),
        "cuda.device:20g-mig": D(1),
        "cuda.device:10g-mig": D(2),
        "cuda.device:5g-mig": D(4),
    }
    assert _shares(80 * GIB, 132) == D("16.50")


def test_metadata_covers_every_exposed_slot(built: Built) -> None:
    inv = built.plugin.inventory
    assert set(inv.metadata) == set(inv.slot_types)
    for slot, meta in inv.metadata.items():
        assert meta.slot_name == slot
        assert meta.human_readable_name
        assert meta.display_unit
        assert meta.display_icon
        assert meta.number_format.round_length >= 0


def test_kernel_resources_are_deterministic(built: Built) -> None:
    plugin = built.plugin
    allocations = one_of_each(plugin)
    assert allocations or not plugin.inventory.devices
    for allocation in allocations:
        first = plugin.kernel_resources(allocation)
        reordered = {
            slot: dict(reversed(list(per_device.items())))
            for slot, per_device in reversed(list(allocation.items()))
        }
        assert plugin.kernel_resources(reordered) == first
        assert plugin.kernel_resources(allocation) == first
        for key, value in [*first.env.items(), *first.resource_lines.items()]:
            assert isinstance(key, str)
            assert isinstance(value, str)
            assert "=" not in key
            assert "\n" not in value
    assert plugin.kernel_resources({}).env == {}


async def test_stats_within_declared_ranges(built: Built) -> None:
    plugin = built.plugin
    inv = plugin.inventory
    device_ids = {d.device_id for d in inv.devices}
    for tick in range(6):
        if tick == 3 and isinstance(plugin, ObservesAllocations):  # then with kernels
            plugin.observe_allocations({f"k{i}": a for i, a in enumerate(one_of_each(plugin))})
        for metric in await plugin.node_stats():
            assert metric.key.startswith(f"{inv.key}_") or metric.key == inv.key
            readings = [metric.node, *metric.per_device.values()]
            assert set(metric.per_device) <= device_ids
            for reading in readings:
                assert reading.value >= 0, metric.key
                if reading.capacity is not None:
                    assert reading.value <= reading.capacity, metric.key
    # The kernels "run" as this test process; a bytes slot is allocated whole, so the
    # process's real memory is compared against the plugin's declared capacity, not
    # against an arbitrary amount.
    declared_bytes = sum(
        (c for s, c in inv.capacities().items() if inv.slot_types[s] is SlotTypes.BYTES), D(0)
    )
    kernels = {
        f"k{i}": KernelStatTarget(a, frozenset({os.getpid()}))
        for i, a in enumerate(one_of_each(plugin))
    }
    for kernel_metric in await plugin.kernel_stats(kernels):
        assert set(kernel_metric.per_kernel) == set(kernels)
        for reading in kernel_metric.per_kernel.values():
            assert reading.value >= 0, kernel_metric.key
            if reading.capacity is not None:
                assert reading.value <= reading.capacity, kernel_metric.key
            if kernel_metric.key == inv.key and declared_bytes:
                assert reading.capacity == declared_bytes
