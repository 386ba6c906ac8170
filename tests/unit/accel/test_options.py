"""Accelerator options (pure parsing), exact device shares and their inverse."""

from __future__ import annotations

from decimal import Decimal

import pytest

from accelshare.accel.errors import PluginConfigError, UnknownOptionError
from accelshare.accel.options import (
    OPTION_NAMES,
    AcceleratorOptions,
    OptionLayer,
    RawOptions,
    allocatable_shares,
    device_shares,
    merge_option_layers,
    option_layer_order,
    parse_accelerator_options,
    share_limits,
)
from accelshare.common import AllocationMode
from accelshare.config import ConfigScopes

from .builders import GIB

MIB = 2**20


@pytest.mark.parametrize(
    ("memory", "processors", "unit_mem", "unit_proc", "shares"),
    [
        pytest.param(40 * GIB, 108, 2 * GIB, 8, "13.50", id="40G-108SM-defaults"),
        pytest.param(40 * GIB, 108, GIB, 10, "10.80", id="40G-108SM-1GiB-10"),
        pytest.param(2 * GIB, 108, 2 * GIB, 8, "1.00", id="2G-one-share"),
        pytest.param(40 * GIB, 108, 40 * GIB, 108, "1.00", id="one-gpu-one-share"),
        pytest.param(5 * GIB, 14, 2 * GIB, 8, "1.75", id="procs-limit"),
        pytest.param(10 * GIB, 100, 3 * GIB, 8, "3.33", id="truncated-not-rounded"),
        pytest.param(GIB, 108, 3 * GIB, 8, "0.33", id="below-one"),
        pytest.param(512 * MIB, 2, 1024 * GIB, 8, "0.00", id="tiny"),
    ],
)
def test_device_shares_exact(
    memory: int, processors: int, unit_mem: int, unit_proc: int, shares: str
) -> None:
    result = device_shares(memory, processors, unit_mem, unit_proc)
    assert result == Decimal(shares)
    assert str(result) == shares  # two decimal places, exact


def test_share_sum_is_exact() -> None:
    total = sum((device_shares(40 * GIB, 108, 2 * GIB, 8) for _ in range(4)), Decimal(0))
    assert total == Decimal("54")
    assert str(total) == "54.00"


@pytest.mark.parametrize(
    ("shares", "unit_mem", "unit_proc", "memory", "processors"),
    [
        ("0.6", 2 * GIB, 8, 1288490188, 4),  # 1288490188.8 floored; floor(4.8) = 4
        ("1.0", 2 * GIB, 8, 2 * GIB, 8),
        ("0.1", 2 * GIB, 8, 214748364, 4),  # floor(0.8) = 0 -> at least 4
        ("2.5", GIB, 10, int(2.5 * GIB), 25),
    ],
)
def test_share_limits(
    shares: str, unit_mem: int, unit_proc: int, memory: int, processors: int
) -> None:
    assert share_limits(Decimal(shares), unit_mem, unit_proc) == (memory, processors)


def test_defaults() -> None:
    parsed = parse_accelerator_options({})
    assert parsed == AcceleratorOptions()
    assert parsed.allocation_mode is AllocationMode.DISCRETE
    assert (parsed.unit_mem, parsed.unit_proc) == (2 * GIB, 8)
    assert parsed.quantum_size == Decimal("0.1")
    assert parsed.reserved_memory == 64 * MIB
    assert parse_accelerator_options({}, default_quantum=Decimal("0.01")).quantum_size == Decimal(
        "0.01"
    )


def test_store_strings() -> None:
    parsed = parse_accelerator_options(
        {
            "allocation_mode": "fractional",
            "unit_mem": "1073741824",
            "unit_proc": "10",
            "quantum_size": "0.05",
            "device_mask": " a, b ,,c ",
            "reserved_memory": "128m",
        }
    )
    assert parsed.allocation_mode is AllocationMode.FRACTIONAL
    assert (parsed.unit_mem, parsed.unit_proc) == (GIB, 10)
    assert parsed.quantum_size == Decimal("0.05")
    assert parsed.device_mask == ("a", "b", "c")
    assert parsed.reserved_memory == 128 * MIB
    assert parse_accelerator_options({"unit_mem": "1g", "unit_proc": 10}).unit_mem == GIB


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("allocation_mode", "shared"),
        ("allocation_mode", "FRACTIONAL-ish"),
        ("unit_mem", "256m"),
        ("unit_mem", str(512 * MIB - 1)),
        ("unit_mem", "lots"),
        ("unit_mem", "inf"),
        ("unit_proc", "1"),
        ("unit_proc", "8.5"),
        ("unit_proc", "-8"),
        ("quantum_size", "0"),
        ("quantum_size", "-0.1"),
        ("quantum_size", "abc"),
        ("quantum_size", "NaN"),
        ("quantum_size", "2"),
        ("reserved_memory", "-1"),
        ("device_mask", {"nested": "x"}),
        ("unit_proc", True),
    ],
)
def test_bad_option(key: str, value: object) -> None:
    source = "config store config/plugins/accelerator/cuda/"
    raw = RawOptions(values={key: value}, sources={key: source})
    with pytest.raises(PluginConfigError) as info:
        parse_accelerator_options(raw)
    assert info.value.key == key
    assert info.value.source == source
    assert str(info.value).startswith(f"{source}: key {key!r}: expected ")
    assert repr(value) in str(info.value)


def test_limits_at_minimums_are_accepted() -> None:
    parsed = parse_accelerator_options({"unit_mem": "512m", "unit_proc": "2", "quantum_size": "1"})
    assert (parsed.unit_mem, parsed.unit_proc, parsed.quantum_size) == (512 * MIB, 2, Decimal(1))


def test_sources_are_kept_for_later_errors() -> None:
    raw = RawOptions(values={"device_mask": "x"}, sources={"device_mask": "config store X/"})
    parsed = parse_accelerator_options(raw)
    assert parsed.source("device_mask") == "config store X/"
    assert parsed.source("unit_mem") == "config store"


@pytest.mark.parametrize(
    ("key", "hint"),
    [
        pytest.param("alocation_mode", "did you mean 'allocation_mode'? ", id="typo"),
        pytest.param("unit_memory", "did you mean 'unit_mem'? ", id="longer"),
        pytest.param("gpu_count", "", id="unrelated"),
        pytest.param("", "", id="value-at-the-prefix-itself"),
    ],
)
def test_unknown_option_is_refused_naming_scope_key_and_known_options(key: str, hint: str) -> None:
    source = "config store nodes/agents/i-1/config/plugins/accelerator/cuda/ (node scope)"
    raw = RawOptions(
        values={"unit_proc": "10", key: "fractional"},
        sources={"unit_proc": "elsewhere", key: source},
    )
    with pytest.raises(UnknownOptionError) as info:
        parse_accelerator_options(raw)
    err = info.value
    assert isinstance(err, PluginConfigError)  # stops the agent like any bad value
    shown = key or "(a value stored at the prefix itself)"
    assert (err.source, err.key, err.received) == (source, shown, "fractional")
    assert str(err) == (
        f"{source}: key {shown!r}: unknown option (set to 'fractional'); {hint}"
        "known options: allocation_mode, unit_mem, unit_proc, quantum_size, device_mask, "
        "reserved_memory"
    )
    assert err.known == OPTION_NAMES


def test_every_known_option_is_accepted() -> None:
    values = {
        "allocation_mode": "fractional",
        "unit_mem": "1g",
        "unit_proc": "10",
        "quantum_size": "0.5",
        "device_mask": "a",
        "reserved_memory": "0",
    }
    assert set(values) == set(OPTION_NAMES)
    parsed = parse_accelerator_options(values)
    assert parsed.describe() == {
        "allocation_mode": "fractional",
        "unit_mem": str(GIB),
        "unit_proc": "10",
        "quantum_size": "0.5",
        "device_mask": "a",
        "reserved_memory": "0",
    }


G, S, N = ConfigScopes.GLOBAL, ConfigScopes.SCALING_GROUP, ConfigScopes.NODE


def test_layer_order_most_specific_scope_first_own_key_first_within_a_scope() -> None:
    assert option_layer_order([G, S, N], "cuda", ("mock",)) == [
        (N, "cuda"),
        (N, "mock"),
        (S, "cuda"),
        (S, "mock"),
        (G, "cuda"),
        (G, "mock"),
    ]
    assert option_layer_order([G], "cuda", ("mock",)) == [(G, "cuda"), (G, "mock")]
    assert option_layer_order([G, N], "mock", ("mock",)) == [(N, "mock"), (G, "mock")]
    assert option_layer_order([G, S], "cuda") == [(S, "cuda"), (G, "cuda")]


def _layers(placed: dict[tuple[ConfigScopes, str], str]) -> list[OptionLayer]:
    """One value of ``unit_proc`` per (scope, prefix key), read in precedence order."""
    return [
        OptionLayer(scope, key, f"{scope.value}/{key}", {"unit_proc": placed[scope, key]})
        for scope, key in option_layer_order([G, S, N], "cuda", ("mock",))
        if (scope, key) in placed
    ]


@pytest.mark.parametrize(
    ("placed", "winner"),
    [
        pytest.param({(G, "cuda"): "10"}, "global/cuda", id="only-global-own"),
        pytest.param({(G, "mock"): "10"}, "global/mock", id="only-global-fallback"),
        pytest.param({(G, "cuda"): "10", (G, "mock"): "12"}, "global/cuda", id="own-beats-mock"),
        pytest.param(
            {(G, "cuda"): "10", (S, "cuda"): "12"}, "sgroup/cuda", id="sgroup-over-global"
        ),
        pytest.param({(S, "cuda"): "10", (N, "cuda"): "12"}, "node/cuda", id="node-over-sgroup"),
        pytest.param(
            {(G, "cuda"): "10", (N, "mock"): "12"}, "node/mock", id="node-mock-over-global-own"
        ),
        pytest.param(
            {(G, "cuda"): "10", (S, "mock"): "12"}, "sgroup/mock", id="sgroup-mock-over-global-own"
        ),
        pytest.param(
            {(S, "cuda"): "10", (S, "mock"): "12", (N, "mock"): "14"},
            "node/mock",
            id="node-mock-over-sgroup-own",
        ),
        pytest.param(
            dict.fromkeys(option_layer_order([G, S, N], "cuda", ("mock",)), "10"),
            "node/cuda",
            id="everywhere",
        ),
    ],
)
def test_precedence_table(placed: dict[tuple[ConfigScopes, str], str], winner: str) -> None:
    merged = merge_option_layers(_layers(placed))
    assert merged.sources["unit_proc"] == winner
    scope, key = winner.split("/")
    assert merged.values["unit_proc"] == placed[ConfigScopes(scope), key]


def test_merge_is_option_by_option() -> None:
    layers = [
        OptionLayer(N, "mock", "node/mock", {"unit_mem": "1g"}),
        OptionLayer(G, "cuda", "global/cuda", {"unit_mem": "4g", "allocation_mode": "fractional"}),
    ]
    merged = merge_option_layers(layers)
    assert merged.values == {"unit_mem": "1g", "allocation_mode": "fractional"}
    assert merged.sources == {"unit_mem": "node/mock", "allocation_mode": "global/cuda"}


@pytest.mark.parametrize(
    ("memory", "processors", "unit_mem", "unit_proc", "quantum", "result"),
    [
        pytest.param(2 * GIB, 108, 2 * GIB, 8, "0.1", "1.00", id="one-share"),
        pytest.param(GIB, 108, 10 * GIB, 8, "0.1", "0.10", id="exactly-one-quantum"),
        pytest.param(GIB, 108, 11 * GIB, 8, "0.1", "unit_mem", id="memory-limits"),
        pytest.param(40 * GIB, 4, 2 * GIB, 64, "0.1", "unit_proc", id="processors-limit"),
        pytest.param(GIB, 108, 200 * GIB, 8, "0.01", "unit_mem", id="zero-shares"),
        pytest.param(40 * GIB, 108, 2 * GIB, 8, "0.01", "13.50", id="sample"),
    ],
)
def test_allocatable_shares(
    memory: int, processors: int, unit_mem: int, unit_proc: int, quantum: str, result: str
) -> None:
    opts = AcceleratorOptions(
        allocation_mode=AllocationMode.FRACTIONAL,
        unit_mem=unit_mem,
        unit_proc=unit_proc,
        quantum_size=Decimal(quantum),
        sources={"unit_mem": "store A/", "unit_proc": "store B/"},
    )
    if result[0].isdigit():
        assert allocatable_shares(opts, "dev1", memory, processors) == Decimal(result)
        return
    with pytest.raises(PluginConfigError) as info:
        allocatable_shares(opts, "dev1", memory, processors)
    assert info.value.key == result
    assert info.value.source == ("store A/" if result == "unit_mem" else "store B/")
    assert info.value.received == (unit_mem if result == "unit_mem" else unit_proc)
    assert "'dev1'" in str(info.value)
    assert "device_mask" in str(info.value)
