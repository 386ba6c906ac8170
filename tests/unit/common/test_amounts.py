"""The strict amount parser: exact or refused by name, on the quantum grid or refused with
the nearest valid amounts (spec 01, "Parsing user input")."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from accelshare.common import (
    COUNT_QUANTUM,
    BelowOneQuantum,
    InvalidResourceSlotQuantity,
    NotMultipleOfQuantum,
    ResourceSlot,
    SlotTypes,
    SlotValueError,
    canonical_decimal,
    check_on_grid,
    grid_neighbours,
    parse_amount,
)

D = Decimal
INF = D("Infinity")
KNOWN = {"cpu": "count", "mem": "bytes", "cuda.shares": "count"}


# -- what the issue found: nothing is silently changed ------------------------------------------


def test_an_amount_off_the_grid_is_refused_with_its_neighbours() -> None:
    with pytest.raises(NotMultipleOfQuantum) as info:
        parse_amount("cuda.shares", "0.1004", quantum=D("0.01"))
    error = info.value
    assert (error.lower, error.upper, error.quantum) == (D("0.1"), D("0.11"), D("0.01"))
    assert (error.field, error.expected, error.received) == (
        "cuda.shares",
        "a multiple of 0.01",
        "0.1004",
    )
    assert str(error) == (
        "cuda.shares=0.1004 is not a multiple of the quantum 0.01"
        " (nearest valid amounts: 0.1 and 0.11)"
    )


def test_an_amount_below_one_quantum_is_refused_not_dropped() -> None:
    with pytest.raises(BelowOneQuantum) as info:
        parse_amount("cuda.shares", "0.0005", quantum=D("0.01"))
    error = info.value
    assert isinstance(error, NotMultipleOfQuantum)
    assert (error.lower, error.upper) == (D(0), D("0.01"))
    assert error.expected == "0 or a multiple of 0.01 (at least 0.01)"
    assert "below one quantum (0.01): ask for at least 0.01" in str(error)


@pytest.mark.parametrize(
    ("raw", "expected_part"),
    [
        pytest.param(True, "a decimal number", id="json-true"),
        pytest.param(False, "a decimal number", id="json-false"),
        pytest.param(None, "a decimal number", id="null"),
        pytest.param("1_0", "no '_' separators", id="underscore"),
        pytest.param("１", "ASCII digits only", id="full-width-one"),
        pytest.param("٣", "ASCII digits only", id="arabic-indic-three"),
        pytest.param("0.5\u00a0", "ASCII digits only", id="non-breaking-space"),
        pytest.param("0x10", "a decimal number", id="hex"),
        pytest.param("1/2", "a decimal number", id="fraction"),
        pytest.param("nan", "a decimal number", id="nan"),
        pytest.param("sNaN", "a decimal number", id="snan"),
        pytest.param(D("NaN"), "a decimal number", id="decimal-nan"),
        pytest.param(float("nan"), "a decimal number", id="float-nan"),
        pytest.param("", "a decimal number", id="empty"),
        pytest.param([1], "a decimal number", id="list"),
        pytest.param({"a": 1}, "a decimal number", id="object"),
    ],
)
def test_junk_is_refused_naming_field_expected_and_received(raw: Any, expected_part: str) -> None:
    with pytest.raises(SlotValueError) as info:
        parse_amount("cuda.shares", raw)
    assert info.value.field == "cuda.shares"
    assert expected_part in info.value.expected
    assert info.value.received is raw
    assert "cuda.shares" in str(info.value)


@pytest.mark.parametrize(
    ("raw", "expected_part"),
    [
        pytest.param(True, "a byte size", id="bool"),
        pytest.param("1_000m", "no '_' separators", id="underscore"),
        pytest.param("２g", "ASCII digits only", id="full-width"),
        pytest.param("2x", "a byte size", id="bad-suffix"),
        pytest.param("1.1k", "1126.4 bytes; nearest: 1126 or 1127", id="fraction-of-a-byte"),
        pytest.param("1.5", "a whole number of bytes", id="fraction-without-suffix"),
        pytest.param(D("1.5"), "a whole number of bytes", id="decimal-fraction"),
        pytest.param(D("NaN"), "a byte size", id="nan"),
    ],
)
def test_byte_junk_is_refused(raw: Any, expected_part: str) -> None:
    with pytest.raises(SlotValueError) as info:
        parse_amount("mem", raw, SlotTypes.BYTES)
    assert info.value.field == "mem"
    assert expected_part in info.value.expected


@pytest.mark.parametrize(
    ("raw", "slot_type", "expected"),
    [
        ("0.1004", "count", D("0.1004")),
        (" 2 ", "count", D(2)),
        ("+2", "count", D(2)),
        ("1e3", "count", D(1000)),
        (".5", "count", D("0.5")),
        (0.2, "count", D("0.2")),
        (3, "count", D(3)),
        (D("1.50"), "count", D("1.5")),
        ("inf", "count", INF),
        ("Infinity", "count", INF),
        ("2g", "bytes", D(2 << 30)),
        ("2 GiB", "bytes", D(2 << 30)),
        ("0.5m", "bytes", D(1 << 19)),
        ("12345 B", "bytes", D(12345)),
        ("1073741824", "bytes", D(1 << 30)),
        (1024, "bytes", D(1024)),
        ("inf", "bytes", INF),
        ("-0", "bytes", D(0)),
    ],
)
def test_accepted_exactly(raw: Any, slot_type: str, expected: Decimal) -> None:
    assert parse_amount("s", raw, slot_type) == expected


@pytest.mark.parametrize("raw", ["-1", "-0.5", -1, "-inf", "-1k"])
def test_negative_is_refused(raw: Any) -> None:
    slot_type = SlotTypes.BYTES if raw == "-1k" else SlotTypes.COUNT
    with pytest.raises(InvalidResourceSlotQuantity, match="cannot be negative"):
        parse_amount("s", raw, slot_type)


def test_the_magnitude_limit_holds_for_floats_and_texts() -> None:
    for raw in (1e308, "1e21", "1000000e"):
        kind = SlotTypes.BYTES if raw == "1000000e" else SlotTypes.COUNT
        with pytest.raises(SlotValueError, match=r"below 10\^21"):
            parse_amount("s", raw, kind)


def test_zero_and_infinity_are_on_every_grid() -> None:
    for raw in ("0", "inf"):
        parse_amount("s", raw, quantum=D("0.3"))
    check_on_grid("s", D(1), ())  # no quanta: nothing to check


def test_one_of_several_quanta_is_enough_and_the_finest_names_the_neighbours() -> None:
    check_on_grid("s", D("0.3"), {D("0.1"), D("0.25")})
    check_on_grid("s", D("0.25"), {D("0.1"), D("0.25")})
    with pytest.raises(NotMultipleOfQuantum) as info:
        check_on_grid("s", D("0.33"), {D("0.1"), D("0.25")}, "0.33")
    assert (info.value.lower, info.value.upper, info.value.quantum) == (
        D("0.3"),
        D("0.4"),
        D("0.1"),
    )
    assert info.value.received == "0.33"
    with pytest.raises(NotMultipleOfQuantum) as unnamed:
        check_on_grid("s", D("0.33"), {D("0.1")})
    assert unnamed.value.received == D("0.33")  # the amount when no raw value is given


# -- from_user_input: the grid of a request ------------------------------------------------------


def test_from_user_input_keeps_every_digit_or_refuses() -> None:
    assert ResourceSlot.from_user_input({"cuda.shares": "0.125"}, KNOWN)["cuda.shares"] == D(
        "0.125"
    )
    with pytest.raises(NotMultipleOfQuantum, match=r"quantum 0\.001"):
        ResourceSlot.from_user_input({"cuda.shares": "0.1004"}, KNOWN)
    with pytest.raises(BelowOneQuantum):
        ResourceSlot.from_user_input({"cpu": "0.0005"}, KNOWN)


def test_from_user_input_uses_the_plugins_quanta() -> None:
    quanta = {"cuda.shares": {D("0.01")}}
    with pytest.raises(NotMultipleOfQuantum, match=r"quantum 0\.01 .*0\.1 and 0\.11"):
        ResourceSlot.from_user_input({"cuda.shares": "0.1004"}, KNOWN, quanta=quanta)
    with pytest.raises(BelowOneQuantum, match="below one quantum"):
        ResourceSlot.from_user_input({"cuda.shares": "0.005"}, KNOWN, quanta=quanta)
    fine = {"cuda.shares": {D("0.0005")}}  # a plugin's quantum finer than 0.001 is honoured
    assert ResourceSlot.from_user_input({"cuda.shares": "0.0015"}, KNOWN, quanta=fine)[
        "cuda.shares"
    ] == D("0.0015")
    with pytest.raises(BelowOneQuantum):
        ResourceSlot.from_user_input({"cuda.shares": "0.0005"}, None, quanta=quanta)
    # bytes slots keep their own rule (whole bytes) whatever the quanta say
    assert ResourceSlot.from_user_input({"mem": "1g"}, KNOWN, quanta={"mem": {D(3)}})["mem"] == D(
        1 << 30
    )


# -- properties ----------------------------------------------------------------------------------

quanta = st.sampled_from([D("0.1"), D("0.01"), D("0.25"), D("0.001"), D("0.5"), D(1), D("0.05")])
amounts = st.decimals(min_value=0, max_value=10**6, allow_nan=False, allow_infinity=False, places=6)


@given(amounts)
def test_every_accepted_amount_round_trips_exactly(amount: Decimal) -> None:
    """Written as text, parsed, and written again: the same amount and the same text."""
    text = canonical_decimal(amount)
    parsed = parse_amount("s", text)
    assert parsed == amount
    assert canonical_decimal(parsed) == text
    assert parse_amount("s", format(amount, "f")) == amount  # trailing zeros too


@given(st.integers(min_value=0, max_value=10**9), quanta)
def test_every_multiple_of_the_quantum_is_accepted_as_is(units: int, quantum: Decimal) -> None:
    amount = units * quantum
    assert parse_amount("s", canonical_decimal(amount), quantum=quantum) == amount


@given(amounts, quanta)
def test_off_grid_is_refused_with_bracketing_neighbours_on_the_grid(
    amount: Decimal, quantum: Decimal
) -> None:
    if amount % quantum == 0:
        assert parse_amount("s", str(amount), quantum=quantum) == amount
        return
    with pytest.raises(NotMultipleOfQuantum) as info:
        parse_amount("s", str(amount), quantum=quantum)
    error = info.value
    assert error.lower < amount < error.upper
    assert error.lower % quantum == 0
    assert error.upper % quantum == 0
    assert error.upper - error.lower == quantum
    assert isinstance(error, BelowOneQuantum) == (amount < quantum)
    assert error.received == str(amount)


@given(amounts, quanta)
def test_grid_neighbours_bracket(amount: Decimal, quantum: Decimal) -> None:
    lower, upper = grid_neighbours(amount, quantum)
    assert lower <= amount <= upper
    assert upper - lower in (D(0), quantum)


@given(st.text(alphabet=st.characters(categories=["Nd"]), min_size=1, max_size=4))
def test_no_digit_outside_ascii_is_read_as_a_digit(digits: str) -> None:
    if digits.isascii():
        assert parse_amount("s", digits) == D(digits)
        return
    with pytest.raises(SlotValueError, match="ASCII digits only"):
        parse_amount("s", digits)


def test_count_quantum_is_three_places() -> None:
    assert D("0.001") == COUNT_QUANTUM
