from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from accelshare.common import (
    BinarySize,
    InvalidBinarySize,
    InvalidResourceSlotQuantity,
    NegativeBinarySize,
    ResourceSlot,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("1 byte", 1, id="one-byte"),
        pytest.param("12345 B", 12345, id="bytes-with-B"),
        pytest.param("2 KiBytes", 2048, id="kibytes"),
        pytest.param("0.5m", 524288, id="half-mebi"),
        pytest.param("1.1k", 1126, id="fraction-floors"),
        pytest.param("40G", 40 * 2**30, id="upper-G"),
        pytest.param("1_024", 1024, id="underscore"),
        pytest.param("  3 mib ", 3 * 2**20, id="spaces-mib"),
        pytest.param("7", 7, id="plain-int"),
        pytest.param("2tb", 2 * 2**40, id="tb"),
        pytest.param("1p", 2**50, id="peta"),
        pytest.param("1e", 2**60, id="exa"),
        pytest.param("5 bytes", 5, id="bytes-word"),
        pytest.param("4 ibytes", 4, id="ibytes-without-scale"),
        pytest.param("+2k", 2048, id="explicit-plus"),
        pytest.param("-0", 0, id="minus-zero-is-zero"),
        pytest.param("-0.0k", 0, id="minus-zero-scaled"),
    ],
)
def test_parse(text: str, expected: int) -> None:
    value = BinarySize.from_str(text)
    assert isinstance(value, BinarySize)
    assert value == expected


@pytest.mark.parametrize("text", ["inf", "Infinity", "INFINITE"])
def test_parse_infinity(text: str) -> None:
    assert BinarySize.from_str(text) == Decimal("Infinity")
    with pytest.raises(InvalidBinarySize, match="infinity is not allowed"):
        BinarySize.finite_from_str(text)


@pytest.mark.parametrize(
    ("value", "match"),
    [
        pytest.param("1.1", "fraction needs a scale", id="fraction-without-suffix"),
        pytest.param("1.5 bytes", "fraction needs a scale", id="fractional-bytes"),
        pytest.param("abc", "Invalid binary size 'abc'", id="junk"),
        pytest.param("k", "Invalid binary size", id="suffix-only"),
        pytest.param("1x", "Invalid binary size", id="unknown-suffix"),
        pytest.param("", "Invalid binary size", id="empty"),
        pytest.param(True, "boolean", id="bool"),
        pytest.param(1.5, "unsupported type float", id="float"),
        pytest.param(Decimal("1.5"), "not a whole number", id="decimal-fraction"),
        pytest.param(Decimal("-Infinity"), "not a whole number", id="negative-infinity"),
    ],
)
def test_parse_errors_name_the_value(value: object, match: str) -> None:
    with pytest.raises(InvalidBinarySize, match=match) as info:
        BinarySize.from_str(value)
    assert info.value.received == value
    assert "byte size" in info.value.expected


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("-1k", id="text-scaled"),
        pytest.param("-1", id="text-plain"),
        pytest.param(" -2 GiB ", id="text-spaced"),
        pytest.param("-0.0001k", id="text-tiny-fraction"),
        pytest.param(-1, id="int"),
        pytest.param(BinarySize(-5), id="binary-size"),
        pytest.param(Decimal(-1024), id="decimal"),
    ],
)
def test_parse_refuses_negative_sizes(value: object) -> None:
    with pytest.raises(NegativeBinarySize, match="cannot be negative") as info:
        BinarySize.from_str(value)
    assert isinstance(info.value, InvalidBinarySize)  # callers catching the base still work
    assert info.value.field == "size"
    assert info.value.received == value
    assert str(info.value) == (
        f"Invalid binary size {value!r} (a byte size cannot be negative):"
        " expected a byte size such as 1024, '512m', '2 GiB' or '1.5g'"
    )
    with pytest.raises(NegativeBinarySize):
        BinarySize.finite_from_str(value)


def test_negative_byte_slot_is_a_negative_quantity() -> None:
    # Spec 01: negative finite amounts raise InvalidResourceSlotQuantity, bytes included.
    with pytest.raises(InvalidResourceSlotQuantity, match="'mem' cannot be negative: got '-1k'"):
        ResourceSlot.from_user_input({"mem": "-1k"}, {"mem": "bytes"})


def test_parse_passthrough_types() -> None:
    size = BinarySize(5)
    assert BinarySize.from_str(size) is size
    assert BinarySize.from_str(10) == 10
    assert BinarySize.from_str(Decimal(2048)) == 2048
    assert BinarySize.from_str(Decimal("Infinity")) == Decimal("Infinity")
    assert BinarySize.finite_from_str("2k") == 2048


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0, "0 bytes"),
        (1, "1 byte"),
        (2, "2 bytes"),
        (1024, "1 KiB"),
        (105933, "103.45 KiB"),
        (1000 * 2**20, "1000 MiB"),
        (3 * 2**29, "1.5 GiB"),
        (1280, "1.25 KiB"),
        (1126, "1.09 KiB"),  # 1.0996: truncated, not rounded
        (1127, "1.1 KiB"),  # 1.1006 -> 1.10 -> trailing zero stripped
        (1023 * 2**20 + 2**20 - 1, "1023.99 MiB"),
        (5 * 2**40, "5 TiB"),
        (-1536, "-1.5 KiB"),
        (-(2**20 - 1), "-1023.99 KiB"),
    ],
)
def test_str(value: int, text: str) -> None:
    assert str(BinarySize(value)) == text


@pytest.mark.parametrize(
    ("value", "spec", "text"),
    [
        (930, "s", "930"),
        (1024, "s", "1k"),
        (524288, "s", "512k"),
        (2**30, "s", "1g"),
        (3 * 2**29, "s", "1.5g"),
        (0, "s", "0"),
        (524288, "m", "0.5m"),
        (1000 * 2**20, "m", "1000m"),
        (2**30, "G", "1g"),
        (524288, " ", "524288"),
        (1, "", "1 byte"),
    ],
)
def test_format(value: int, spec: str, text: str) -> None:
    assert format(BinarySize(value), spec) == text


@pytest.mark.parametrize("spec", ["x", "ss", "d", "b"])
def test_format_rejects_other_specs(spec: str) -> None:
    with pytest.raises(ValueError, match="Unsupported format spec"):
        format(BinarySize(1), spec)


def test_repr() -> None:
    assert repr(BinarySize(3)) == "BinarySize(3)"


@given(st.integers(min_value=0, max_value=2**70))
def test_short_form_round_trips(value: int) -> None:
    text = format(BinarySize(value), "s")
    assert BinarySize.from_str(text) == value
