"""Parsing a kernel's requested slots: unknown zero dropped, unknown non-zero refused,
cpu and mem required."""

from __future__ import annotations

from decimal import Decimal

import pytest

from accelshare.agent.requests import KernelRequestError, parse_requested_slots
from accelshare.alloc import UnsupportedResource
from accelshare.common import SlotTypes

KNOWN = {"cpu": SlotTypes.COUNT, "mem": SlotTypes.BYTES, "cuda.shares": SlotTypes.COUNT}


@pytest.mark.parametrize(
    ("requested", "expected"),
    [
        pytest.param(
            {"cpu": "1", "mem": "1073741824", "cuda.shares": "0.5"},
            {"cpu": Decimal(1), "mem": Decimal(1 << 30), "cuda.shares": Decimal("0.5")},
            id="all-known",
        ),
        pytest.param(
            {"cpu": "2", "mem": "2g"},
            {"cpu": Decimal(2), "mem": Decimal(2 << 30)},
            id="binary-size-for-bytes",
        ),
        pytest.param(
            {"cpu": "1", "mem": "1g", "rocm.device": "0", "cuda.shares": "0"},
            {"cpu": Decimal(1), "mem": Decimal(1 << 30)},
            id="zeros-dropped-known-or-not",
        ),
    ],
)
def test_accepted(requested: dict[str, str], expected: dict[str, Decimal]) -> None:
    assert parse_requested_slots(requested, KNOWN) == expected


def test_unknown_non_zero_is_unsupported() -> None:
    with pytest.raises(UnsupportedResource, match=r"UnsupportedResource: .*'rocm\.device'"):
        parse_requested_slots({"cpu": "1", "mem": "1g", "rocm.device": "1"}, KNOWN, kernel_id="k")


@pytest.mark.parametrize(
    ("requested", "message"),
    [
        pytest.param({"mem": "1g"}, "cpu must be requested", id="cpu-missing"),
        pytest.param({"cpu": "1", "mem": "0"}, "mem must be requested", id="mem-zero"),
        pytest.param({}, "cpu and mem", id="both-missing"),
        pytest.param({"cpu": "-1", "mem": "1g"}, "cannot be negative", id="negative"),
        pytest.param({"cpu": "1", "mem": "-1g"}, "cannot be negative", id="negative-size"),
        pytest.param({"cpu": "one", "mem": "1g"}, "not a finite number", id="junk"),
        pytest.param({"cpu": "NaN", "mem": "1g"}, "not a finite number", id="nan"),
        pytest.param({"cpu": "1", "mem": "inf"}, "not a finite number", id="infinite"),
    ],
)
def test_refused(requested: dict[str, str], message: str) -> None:
    with pytest.raises(KernelRequestError, match=message) as info:
        parse_requested_slots(requested, KNOWN)
    assert str(info.value).startswith("KernelRequestError: ")


@pytest.mark.parametrize(
    ("text", "expected_part"),
    [
        pytest.param("1_0", "no '_' separators", id="underscore"),
        pytest.param("１", "ASCII digits only", id="full-width"),
        pytest.param("0x1", "a decimal number", id="hex"),
    ],
)
def test_amounts_are_read_strictly(text: str, expected_part: str) -> None:
    with pytest.raises(KernelRequestError, match="not a finite number") as info:
        parse_requested_slots({"cpu": text, "mem": "1g"}, KNOWN)
    assert expected_part in str(info.value)


def test_amounts_keep_every_digit() -> None:
    parsed = parse_requested_slots({"cpu": "1", "mem": "1g", "cuda.shares": "0.1004"}, KNOWN)
    assert parsed["cuda.shares"] == Decimal("0.1004")  # the map checks its grid, not this


def test_an_unknown_slot_is_read_as_a_count_or_a_size() -> None:
    with pytest.raises(UnsupportedResource, match=r"rocm\.mem"):
        parse_requested_slots({"cpu": "1", "mem": "1g", "rocm.mem": "2g"}, KNOWN)
    with pytest.raises(KernelRequestError, match=r"'rocm\.x' is not a finite number"):
        parse_requested_slots({"cpu": "1", "mem": "1g", "rocm.x": "1_0"}, KNOWN)
