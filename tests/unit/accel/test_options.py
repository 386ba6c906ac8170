"""Accelerator options (pure parsing), exact device shares and their inverse."""

from __future__ import annotations

from decimal import Decimal

import pytest

from accelshare.accel.errors import PluginConfigError
from accelshare.accel.options import (
    AcceleratorOptions,
    RawOptions,
    device_shares,
    parse_accelerator_options,
    share_limits,
)
from accelshare.accel.types import AllocationMode

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
            "unknown_option": "ignored",
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
