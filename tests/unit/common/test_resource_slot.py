from decimal import Decimal, InvalidOperation

import pytest
from hypothesis import given
from hypothesis import strategies as st

from accelshare.common import (
    DefaultForUnspecified,
    InvalidResourceSlotQuantity,
    ResourceSlot,
    SlotTypes,
    SlotValueError,
    UnknownResourceSlotType,
    canonical_decimal,
    normalize_amount,
)
from accelshare.common.resource_slot import MAX_AMOUNT_EXPONENT

D = Decimal
INF = Decimal("Infinity")
KNOWN = {"cpu": "count", "mem": "bytes", "cuda.shares": "count"}


def rs(**kw: object) -> ResourceSlot:
    return ResourceSlot({k.replace("_", "."): D(str(v)) for k, v in kw.items()})


# -- arithmetic and comparison -------------------------------------------------------------


def test_missing_keys_are_zero_in_arithmetic() -> None:
    a = ResourceSlot({"cpu": D(2)})
    b = ResourceSlot({"mem": D(5)})
    assert a + b == ResourceSlot({"cpu": D(2), "mem": D(5)})
    assert a - b == ResourceSlot({"cpu": D(2), "mem": D(-5)})
    assert -a == ResourceSlot({"cpu": D(-2)})


def test_operations_never_mutate_operands() -> None:
    a = ResourceSlot({"cpu": D(2)})
    b = ResourceSlot({"cpu": D(1), "mem": D(3)})
    _ = a + b, a - b, -a, a <= b, a.eq_contains(b)
    assert dict(a) == {"cpu": D(2)}
    assert dict(b) == {"cpu": D(1), "mem": D(3)}
    with pytest.raises(AttributeError, match="immutable"):
        a._data = {}  # type: ignore[misc]
    with pytest.raises(TypeError):
        a["cpu"] = D(3)  # type: ignore[index]


def test_infinity_behaves_as_decimal_infinity() -> None:
    assert (ResourceSlot({"a": INF}) - ResourceSlot({"a": D(3)}))["a"] == INF
    assert ResourceSlot({"a": D(5)}) <= ResourceSlot({"a": INF})


@pytest.mark.parametrize(
    ("a", "b", "equal"),
    [
        ({"a": 1}, {"a": 1, "b": 0}, True),
        ({"a": 1}, {"a": 1, "b": 1}, False),
        ({}, {"x": 0}, True),
        ({"a": "1.0"}, {"a": "1"}, True),
    ],
)
def test_equality_with_missing_as_zero(a: dict[str, str], b: dict[str, str], equal: bool) -> None:
    ra, rb = ResourceSlot(a), ResourceSlot(b)
    assert (ra == rb) is equal
    assert (ra != rb) is not equal
    if equal:
        assert hash(ra) == hash(rb)


def test_compare_with_plain_mapping_and_other_types() -> None:
    assert ResourceSlot({"a": D(1)}) == {"a": D(1)}
    assert ResourceSlot({"a": D(1)}) <= {"a": D(2)}
    assert (ResourceSlot({"a": D(1)}) == 3) is False
    assert ResourceSlot({"a": D(1)}) != "x"
    with pytest.raises(TypeError):
        ResourceSlot({"a": D(1)}) + 3  # type: ignore[operator]
    with pytest.raises(TypeError):
        ResourceSlot({"a": D(1)}) - 3  # type: ignore[operator]
    for op in ("__le__", "__lt__", "__ge__", "__gt__"):
        assert getattr(ResourceSlot(), op)(3) is NotImplemented


@pytest.mark.parametrize(
    ("a", "b", "le", "lt", "ge", "gt"),
    [
        pytest.param(
            {"a": 4, "b": 100}, {"a": 3, "b": 200}, False, False, False, False, id="incomparable"
        ),
        pytest.param(
            {"a": 3, "b": 100}, {"a": 3, "b": 200}, True, True, False, False, id="smaller"
        ),
        pytest.param({"a": 3}, {"a": 3, "b": 0}, True, False, True, False, id="equal-missing-zero"),
        pytest.param({"a": 3, "b": 1}, {"a": 3}, False, False, True, True, id="extra-key-bigger"),
        pytest.param(
            {"cuda.shares": 0}, {"cpu": 1}, True, True, False, False, id="zero-accel-fits-cpu-agent"
        ),
    ],
)
def test_partial_order(
    a: dict[str, int], b: dict[str, int], le: bool, lt: bool, ge: bool, gt: bool
) -> None:
    ra, rb = ResourceSlot(a), ResourceSlot(b)
    assert (ra <= rb, ra < rb, ra >= rb, ra > rb) == (le, lt, ge, gt)


@pytest.mark.parametrize(
    ("a", "b", "contains", "contained"),
    [
        ({"a": 1, "b": 2}, {"a": 1}, True, False),
        ({"a": 1, "b": 0}, {"a": 1}, True, True),
        ({"a": 1}, {"a": 1, "c": 0}, True, True),
        ({"a": 1}, {"a": 1, "c": 5}, False, True),
        ({"a": 1}, {"a": 2}, False, False),
    ],
)
def test_eq_contains_and_contained(
    a: dict[str, int], b: dict[str, int], contains: bool, contained: bool
) -> None:
    assert ResourceSlot(a).eq_contains(b) is contains
    assert ResourceSlot(a).eq_contained(b) is contained


def test_helpers() -> None:
    slot = ResourceSlot({"a": D(1), "b": D(0)})
    assert dict(slot.nonzero()) == {"a": D(1)}
    assert dict(slot.filter_keys({"a", "z"})) == {"a": D(1), "z": D(0)}
    assert slot.get_amount("missing") == 0
    assert len(slot) == 2
    assert repr(ResourceSlot({"a": D("1.50")})) == "ResourceSlot({'a': 1.5})"


def test_constructor_rejects_nan_and_junk() -> None:
    with pytest.raises(SlotValueError, match="'a'"):
        ResourceSlot({"a": D("NaN")})
    with pytest.raises(SlotValueError, match="'a'"):
        ResourceSlot({"a": "junk"})
    assert ResourceSlot({"a": 3, "b": "1.5"}) == {"a": D(3), "b": D("1.5")}
    # computed and stored amounts (not user input: that is parse_amount's)
    for junk in (True, None, [1]):
        with pytest.raises(SlotValueError, match="'a'"):
            ResourceSlot({"a": junk})  # type: ignore[dict-item]
    assert ResourceSlot({"a": 0.1}) == {"a": D("0.1")}  # type: ignore[dict-item]


# -- from_user_input ---------------------------------------------------------------------------


def test_from_user_input_example() -> None:
    slot = ResourceSlot.from_user_input({"cpu": "1", "mem": "2g", "cuda.shares": "0.2"}, KNOWN)
    assert dict(slot) == {"cpu": D(1), "mem": D(2147483648), "cuda.shares": D("0.2")}


def test_from_user_input_drops_zero_and_fills_missing_known() -> None:
    slot = ResourceSlot.from_user_input({"cpu": 2, "tpu.device": 0}, KNOWN)
    assert dict(slot) == {"cpu": D(2), "mem": D(0), "cuda.shares": D(0)}
    assert "tpu.device" not in slot


@pytest.mark.parametrize(
    ("values", "error", "match"),
    [
        pytest.param({"x": 1}, UnknownResourceSlotType, "Unknown slot type: 'x'", id="unknown"),
        pytest.param({"x": "junk"}, UnknownResourceSlotType, "'x'", id="unknown-junk"),
        pytest.param({"shmem": "1g"}, UnknownResourceSlotType, "resource_opts", id="shmem-hint"),
        pytest.param(
            {"cpu": "-1"}, InvalidResourceSlotQuantity, "cannot be negative", id="negative"
        ),
        pytest.param({"mem": "-2g"}, InvalidResourceSlotQuantity, "'mem'", id="negative-bytes"),
        pytest.param({"cpu": "nan"}, SlotValueError, "Cannot convert the slot 'cpu'", id="nan"),
        pytest.param({"cpu": "abc"}, SlotValueError, "got 'abc'", id="junk"),
        pytest.param({"cpu": True}, SlotValueError, "'cpu'", id="bool"),
        pytest.param({"cpu": None}, SlotValueError, "'cpu'", id="none"),
        pytest.param({"cpu": [1]}, SlotValueError, "'cpu'", id="list"),
        pytest.param({"mem": "2x"}, SlotValueError, "byte size", id="bad-size"),
        pytest.param(
            {"mem": D("1.5")}, SlotValueError, "whole number of bytes", id="fractional-bytes"
        ),
        pytest.param({"cpu": "-inf"}, InvalidResourceSlotQuantity, "'cpu'", id="negative-infinity"),
    ],
)
def test_from_user_input_errors(
    values: dict[str, object], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        ResourceSlot.from_user_input(values, KNOWN)


def test_unknown_error_lists_known_slots() -> None:
    with pytest.raises(UnknownResourceSlotType) as info:
        ResourceSlot.from_user_input({"x": 1}, KNOWN)
    assert info.value.slot == "x"
    assert "cuda.shares" in info.value.expected


def test_from_user_input_without_known_types_guesses() -> None:
    slot = ResourceSlot.from_user_input({"cpu": "1.5", "cuda.mem": "1g", "x": 0}, None)
    assert dict(slot) == {"cpu": D("1.5"), "cuda.mem": D(2**30)}


@pytest.mark.parametrize(
    ("raw", "slot_type", "expected"),
    [
        (0.2, "count", D("0.2")),
        (3, "count", D(3)),
        ("inf", "count", INF),
        (" 2 ", "count", D(2)),
        (2048, "bytes", D(2048)),
        ("inf", "bytes", INF),
        (D("Infinity"), "bytes", INF),
        ("1", "unique", D(1)),
    ],
)
def test_normalize_amount(raw: object, slot_type: str, expected: Decimal) -> None:
    assert normalize_amount("s", raw, slot_type) == expected


# -- the magnitude limit (MAX_AMOUNT_EXPONENT) ----------------------------------------------------
# Beyond the decimal context's 28 digits ``quantize`` raised InvalidOperation (a 500 from
# the API); finite amounts of 10^21 and more are refused by name instead.

LIMIT = 10**MAX_AMOUNT_EXPONENT


@pytest.mark.parametrize(
    ("raw", "slot_type", "expected"),
    [
        pytest.param(LIMIT - 1, "count", D(LIMIT - 1), id="count-just-below"),
        pytest.param(str(LIMIT - 1), "count", D(LIMIT - 1), id="count-text-just-below"),
        pytest.param("9.99e20", "count", D("999000000000000000000.000"), id="count-exponent"),
        pytest.param(LIMIT - 1, "bytes", D(LIMIT - 1), id="bytes-just-below"),
        pytest.param("867e", "bytes", D(867 * 2**60), id="bytes-867-eib"),
        pytest.param("inf", "count", INF, id="infinity-is-not-finite"),
    ],
)
def test_amounts_below_the_limit_are_kept(raw: object, slot_type: str, expected: Decimal) -> None:
    assert MAX_AMOUNT_EXPONENT == 21
    assert normalize_amount("s", raw, slot_type) == expected


@pytest.mark.parametrize(
    ("raw", "slot_type"),
    [
        pytest.param(LIMIT, "count", id="count-int-at-limit"),
        pytest.param("1e21", "count", id="count-text-at-limit"),
        pytest.param(D("1E+21"), "count", id="count-decimal-at-limit"),
        pytest.param(1e308, "count", id="count-huge-float"),
        pytest.param("9" * 40, "count", id="count-40-digits"),
        pytest.param("-1e21", "count", id="count-huge-negative"),
        pytest.param(LIMIT, "bytes", id="bytes-int-at-limit"),
        pytest.param(10**30, "bytes", id="bytes-10-to-30"),
        pytest.param("868e", "bytes", id="bytes-868-eib"),
        pytest.param("1000000e", "bytes", id="bytes-text-huge"),
        pytest.param(LIMIT, "unique", id="unique-at-limit"),
    ],
)
def test_amounts_at_or_above_the_limit_are_refused_by_name(raw: object, slot_type: str) -> None:
    with pytest.raises(SlotValueError, match=r"Cannot convert the slot 's'") as info:
        normalize_amount("s", raw, slot_type)
    assert not isinstance(info.value, InvalidResourceSlotQuantity)
    assert info.value.field == "s"
    assert info.value.expected == "an amount below 10^21"
    assert info.value.received == raw
    assert "expected an amount below 10^21" in str(info.value)


def test_from_user_input_refuses_a_huge_amount() -> None:
    with pytest.raises(SlotValueError, match=r"'mem'.*below 10\^21"):
        ResourceSlot.from_user_input({"cpu": 1, "mem": "1000000e"}, KNOWN)
    assert ResourceSlot.from_user_input({"mem": "867e"}, KNOWN)["mem"] == D(867 * 2**60)


# -- serialisation ------------------------------------------------------------------------------


def test_to_json_is_fixed_point() -> None:
    slot = ResourceSlot({"a": D("2E+1"), "b": D("1.500"), "c": INF, "d": D("0.000")})
    assert slot.to_json() == {"a": "20", "b": "1.5", "c": "Infinity", "d": "0"}
    assert ResourceSlot.from_json(slot.to_json()) == slot


def test_from_json_errors() -> None:
    with pytest.raises(SlotValueError, match="'cpu'"):
        ResourceSlot.from_json({"cpu": "NaN"})
    with pytest.raises(SlotValueError, match="JSON object"):
        ResourceSlot.from_json(["cpu"])  # type: ignore[arg-type]


def test_to_humanized() -> None:
    slot = ResourceSlot({"mem": D(2**31), "cpu": D("1.50"), "x": INF, "y": -INF, "shmem": D(0)})
    assert slot.to_humanized({"mem": SlotTypes.BYTES, "cpu": "count"}) == {
        "mem": "2g",
        "cpu": "1.5",
        "x": "inf",
        "y": "-inf",
        "shmem": "0",
    }


def test_canonical_decimal() -> None:
    assert canonical_decimal(D("1E+3")) == "1000"
    assert canonical_decimal(-INF) == "-Infinity"
    assert canonical_decimal(D("0.10")) == "0.1"


@pytest.mark.parametrize("zero", ["0", "-0", "0.000", "-0.0", "0E+5"])
def test_canonical_decimal_one_text_for_zero(zero: str) -> None:
    # equal amounts, one stored text (the ResourceSlotJSON bind memo relies on it)
    assert canonical_decimal(D(zero)) == "0"


@given(st.decimals(allow_nan=False, min_value=-(10**15), max_value=10**15, places=6))
def test_canonical_decimal_is_one_text_per_amount(amount: Decimal) -> None:
    text = canonical_decimal(amount)
    assert D(text) == amount  # exact
    for same in (amount.normalize(), amount.quantize(D("0.0000001")), amount * 1, amount + 0):
        assert canonical_decimal(same) == text


@pytest.mark.parametrize(
    ("default", "expected_gpu"),
    [(DefaultForUnspecified.UNLIMITED, INF), ("LIMITED", D(0))],
)
def test_from_policy(default: object, expected_gpu: Decimal) -> None:
    policy = {
        "total_resource_slots": {"cpu": "4", "mem": "8g", "unknown.slot": "3", "x": None},
        "default_for_unspecified": default,
    }
    quota = ResourceSlot.from_policy(policy, KNOWN)
    assert dict(quota) == {"cpu": D(4), "mem": D(8 * 2**30), "cuda.shares": expected_gpu}


def test_from_policy_infinity_strings_and_defaults() -> None:
    quota = ResourceSlot.from_policy({"total_resource_slots": {"cpu": "Infinity"}}, KNOWN)
    assert dict(quota) == {"cpu": INF, "mem": D(0), "cuda.shares": D(0)}


# -- properties -------------------------------------------------------------------------------

KEYS = st.sampled_from(["cpu", "mem", "cuda.shares", "cuda.device", "rocm.device"])
AMOUNTS = st.decimals(
    min_value=-(10**6), max_value=10**6, places=3, allow_nan=False, allow_infinity=False
)
SLOTS = st.dictionaries(KEYS, AMOUNTS, max_size=5).map(ResourceSlot)


@given(SLOTS, SLOTS)
def test_add_then_subtract_is_identity(a: ResourceSlot, b: ResourceSlot) -> None:
    assert (a + b) - b == a
    assert a + b == b + a


@given(SLOTS, SLOTS)
def test_order_is_antisymmetric_and_consistent(a: ResourceSlot, b: ResourceSlot) -> None:
    assert (a <= b <= a) == (a == b)
    assert (a < b) == (a <= b and a != b)
    assert (a >= b) == (b <= a)
    assert (a > b) == (b < a)
    if a == b:
        assert hash(a) == hash(b)


@given(SLOTS)
def test_json_round_trip(a: ResourceSlot) -> None:
    encoded = a.to_json()
    assert all("E" not in v for v in encoded.values())
    assert dict(ResourceSlot.from_json(encoded)) == dict(a)


@given(SLOTS, SLOTS)
def test_no_operation_mutates(a: ResourceSlot, b: ResourceSlot) -> None:
    before_a, before_b = dict(a), dict(b)
    _ = a + b, a - b, -a, a <= b, a < b, a == b, a.eq_contains(b), a.eq_contained(b)
    assert dict(a) == before_a
    assert dict(b) == before_b


def test_mapping_protocol_matches_the_underlying_amounts() -> None:
    slot = ResourceSlot({"cpu": "2", "mem": 1024, "cuda.shares": "0.5"})
    assert list(slot) == ["cpu", "mem", "cuda.shares"]
    assert list(slot.keys()) == ["cpu", "mem", "cuda.shares"]
    assert list(slot.values()) == [Decimal(2), Decimal(1024), Decimal("0.5")]
    assert dict(slot.items()) == {"cpu": 2, "mem": 1024, "cuda.shares": Decimal("0.5")}
    assert "mem" in slot
    assert "rocm.device" not in slot
    assert 3 not in slot
    assert slot.get("cpu") == 2
    assert slot.get("tpu") is None
    assert slot.get("tpu", 7) == 7
    # The views are read-only: nothing reached through them can change the slot.
    with pytest.raises(TypeError):
        slot.items().mapping["cpu"] = Decimal(9)  # type: ignore[index]
    assert slot["cpu"] == 2


def test_arithmetic_results_are_checked_like_constructed_ones() -> None:
    total = ResourceSlot({"cpu": "4", "mem": "Infinity"})
    used = ResourceSlot({"cpu": "1.5", "cuda.shares": "0.2"})
    assert total - used == ResourceSlot({"cpu": "2.5", "mem": "Infinity", "cuda.shares": "-0.2"})
    assert (total - used).nonzero() == total - used
    assert -used == ResourceSlot({"cpu": "-1.5", "cuda.shares": "-0.2"})
    # Infinity minus Infinity would be NaN: the operation is refused, never stored.
    with pytest.raises(InvalidOperation):
        _ = total - ResourceSlot({"mem": "Infinity"})


@given(st.lists(st.tuples(SLOTS, st.integers(min_value=0, max_value=5)), max_size=6))
def test_sum_of_equals_repeated_addition(terms: list[tuple[ResourceSlot, int]]) -> None:
    expected = ResourceSlot()
    for slot, count in terms:
        for _ in range(count):
            expected = expected + slot
    total = ResourceSlot.sum_of(terms)
    assert total == expected
    # every key seen is present (zero-count terms add zeros), in first-seen order
    assert list(total) == list(dict.fromkeys(k for slot, _ in terms for k in slot))


def test_sum_of_examples_and_bad_counts() -> None:
    assert ResourceSlot.sum_of([]) == ResourceSlot()
    assert dict(ResourceSlot.sum_of([(rs(cpu=1, mem=1024), 3), (rs(cpu="0.5"), 1)])) == {
        "cpu": D("3.5"),
        "mem": D(3072),
    }
    # an unlimited amount: zero times is zero (not NaN), n times is unlimited
    assert dict(ResourceSlot.sum_of([(rs(cpu=INF), 0)])) == {"cpu": 0}
    assert dict(ResourceSlot.sum_of([(rs(cpu=INF), 2)])) == {"cpu": INF}
    for bad in (-1, 1.5, True, "2"):
        with pytest.raises(ValueError, match=r"count: expected an integer >= 0, got"):
            ResourceSlot.sum_of([(rs(cpu=1), bad)])  # type: ignore[list-item]
