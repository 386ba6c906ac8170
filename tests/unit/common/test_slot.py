import pytest

from accelshare.common import InvalidSlotName, SlotName, SlotTypes


@pytest.mark.parametrize(
    ("name", "device", "major", "minor", "is_accelerator"),
    [
        ("cpu", "cpu", "", "", False),
        ("mem", "mem", "", "", False),
        ("cuda.device", "cuda", "device", "", True),
        ("cuda.shares", "cuda", "shares", "", True),
        ("cuda.device:10g-mig", "cuda", "device", "10g-mig", True),
        ("cuda.device:1g.5gb-mig", "cuda", "device", "1g.5gb-mig", True),
        ("rocm.devices", "rocm", "devices", "", True),
        ("tpu.share", "tpu", "share", "", True),
        ("cuda.mem", "cuda", "mem", "", False),
    ],
)
def test_parse(name: str, device: str, major: str, minor: str, is_accelerator: bool) -> None:
    slot = SlotName(name)
    assert (slot.device_name, slot.major_type, slot.minor_type) == (device, major, minor)
    assert slot.is_accelerator is is_accelerator
    assert slot == name
    assert {name: 1}[slot] == 1
    assert repr(slot) == f"SlotName({name!r})"
    assert SlotName(slot) is slot


@pytest.mark.parametrize("bad", ["", "CPU", "cuda.", ".shares", "cuda.shares:", "a b", "cuda:x"])
def test_invalid(bad: str) -> None:
    with pytest.raises(InvalidSlotName, match="Invalid slot name") as info:
        SlotName(bad)
    assert info.value.received == bad


def test_not_a_string() -> None:
    with pytest.raises(InvalidSlotName):
        SlotName(3)  # type: ignore[arg-type]


def test_slot_types() -> None:
    assert [SlotTypes(v) for v in ("count", "bytes", "unique", "unified")] == list(SlotTypes)
    with pytest.raises(ValueError, match="'foo' is not a valid SlotTypes"):
        SlotTypes("foo")
