"""``accelshare agent info``'s "who holds the devices" rows (pure rendering)."""

from __future__ import annotations

from decimal import Decimal

import pytest
from rich.console import Console

from accelshare.client.cli.render import device_share_percent, holders_table
from accelshare.common import SlotTypes
from accelshare.protocol import DeviceView, PluginMapView

GPU = "c59395cd-ac91-4cd3-a1b0-3d2568aa2d01"


def text(table: object) -> list[list[str]]:
    console = Console(width=200, record=True)
    console.print(table)
    return [line.split() for line in console.export_text().splitlines()[1:] if line.strip()]


@pytest.mark.parametrize(
    ("amount", "capacity", "percent"),
    [("0.25", "1", "25"), ("0.5", "13.50", "4"), ("2.7", "13.5", "20"), ("1", "1", "100"),
     ("0.1", "0", "0")],
)  # fmt: skip
def test_device_share_percent(amount: str, capacity: str, percent: str) -> None:
    assert device_share_percent(Decimal(amount), Decimal(capacity)) == Decimal(percent)


def test_one_row_per_holder_with_session_names_and_ids_for_the_unnamed() -> None:
    maps = {
        "cpu": PluginMapView(
            key="cpu", kind="discrete", strategy="EVENLY",
            devices=[DeviceView(device_id="0", slot_name="cpu", slot_type=SlotTypes.COUNT,
                                capacity="1", allocated="1", kernels={"k1": "1"})],
        ),
        "cuda": PluginMapView(
            key="cuda", kind="fractional", strategy="EVENLY", quantum="0.1",
            devices=[DeviceView(device_id=GPU, slot_name="cuda.shares", slot_type=SlotTypes.COUNT,
                                capacity="1", allocated="0.75",
                                kernels={"k1": "0.25", "hidden-1": "0.5"})],
        ),
    }  # fmt: skip
    rows = text(holders_table(maps, {"k1": "train"}, full_ids=True))
    assert rows == [
        [GPU, "cuda.shares", "hidden-1", "0.50", "/", "1.00", "50", "%"],
        [GPU, "cuda.shares", "train", "(kernel", "k1)", "0.25", "/", "1.00", "25", "%"],
    ]
    assert holders_table(maps, {}, plugins=["rocm"]) is None  # nothing held there
