"""validate_inventory and the JSON description of inventories."""

from __future__ import annotations

import dataclasses
import datetime
from decimal import Decimal

import pytest

from accelshare.accel import PluginLoadError, describe_plugins, validate_inventory
from accelshare.accel.types import Device, NumberFormat, SlotMetadata
from accelshare.common import AllocationMode, SlotTypes

from .builders import FRACTIONAL, U, mock_plugin

INV = mock_plugin("two-fgpu.toml").inventory


def meta(slot: str) -> SlotMetadata:
    return SlotMetadata(slot, "x", "x", "x", "x", NumberFormat(binary=False, round_length=0))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"slot_types": {"cuda.Device!": SlotTypes.COUNT}}, "invalid slot"),
        ({"slot_types": {"rocm.device": SlotTypes.COUNT}}, "outside its prefix"),
        (
            {"devices": (*INV.devices, dataclasses.replace(INV.devices[0]))},
            "reports the device id",
        ),
        (
            {"devices": (Device("d", "cuda.shares", Decimal(1), "m", 0, 0, 1),)},
            "which the plugin does not declare",
        ),
        ({"metadata": {}}, "no UI metadata for the slot"),
        ({"allocation_mode": AllocationMode.FRACTIONAL}, "needs a quantum"),
    ],
)
def test_invalid_declarations(change: dict[str, object], message: str) -> None:
    bad = dataclasses.replace(INV, **change)  # type: ignore[arg-type]
    with pytest.raises(PluginLoadError, match=message):
        validate_inventory(bad)


def test_describe_plugins_is_json_ready() -> None:
    inv = mock_plugin("two-fgpu.toml", FRACTIONAL).inventory
    inv = dataclasses.replace(
        inv,
        extra_info={**inv.extra_info, "built": datetime.date(2024, 1, 2), "tags": ("a", 1)},
    )
    doc = describe_plugins({"cuda": inv}, origins={"cuda": "mock"}, skipped={"x": "why"})
    cuda = doc["plugins"]["cuda"]
    assert cuda["entry_point"] == "mock"
    assert cuda["slots"] == {"cuda.shares": {"type": "count", "capacity": "2.00"}}
    assert cuda["devices"][1]["device_id"] == f"{U}2"
    assert cuda["devices"][1]["shares"] == "1.00"
    assert cuda["extra_info"]["built"] == "2024-01-02"
    assert cuda["extra_info"]["tags"] == ["a", 1]
    assert doc["skipped"] == {"x": "why"}
    assert meta("a").to_json()["slot_name"] == "a"
