"""The CLI's ``-r`` and the SDK's ``resources`` read amounts with the core's strict parser:
a boolean, ``1_0``, full-width digits or junk are refused before anything is sent."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from accelshare.client.cli.args import ArgumentError, parse_resources
from accelshare.client.sessions import request_amounts
from accelshare.common import SlotValueError


@pytest.mark.parametrize(
    ("option", "message"),
    [
        pytest.param("cuda.shares=1_0", "-r cuda.shares=1_0: expected", id="underscore"),
        pytest.param("cpu=１", "ASCII digits only", id="full-width"),
        pytest.param("cpu=true", "a decimal number", id="word"),
        pytest.param("mem=1_000m", "no '_' separators", id="bytes-underscore"),
        pytest.param("mem=1.1k", "a whole number of bytes", id="fraction-of-a-byte"),
    ],
)
def test_cli_refuses_what_the_parser_refuses(option: str, message: str) -> None:
    with pytest.raises(ArgumentError, match=message):
        parse_resources([option])


def test_cli_keeps_amounts_as_written() -> None:
    parsed = parse_resources(["cuda.shares=0.1004", "mem=256", "cpu=2"])
    assert parsed == {"cuda.shares": "0.1004", "mem": "256m", "cpu": "2"}
    assert parse_resources(["mem=2g", "cuda.shares=inf"]) == {"mem": "2g", "cuda.shares": "inf"}


@pytest.mark.parametrize(
    ("resources", "field"),
    [
        pytest.param({"cpu": True}, "cpu", id="bool"),
        pytest.param({"cuda.shares": "1_0"}, "cuda.shares", id="underscore"),
        pytest.param({"cuda.shares": "０.5"}, "cuda.shares", id="full-width"),
        pytest.param({"mem": [1]}, "mem", id="list"),
    ],
)
def test_sdk_refuses_before_sending(resources: dict[str, Any], field: str) -> None:
    with pytest.raises(SlotValueError) as info:
        request_amounts(resources)
    assert info.value.field == field


def test_sdk_sends_exact_text() -> None:
    sent = request_amounts({"cpu": 2, "mem": "1g", "cuda.shares": Decimal("0.1004"), "x": 0.25})
    assert sent == {"cpu": 2, "mem": "1g", "cuda.shares": "0.1004", "x": "0.25"}
    # the sign is the server's to judge (its problem names the field)
    assert request_amounts({"cpu": -1, "y": Decimal("-0.5"), "z": -0.5}) == {
        "cpu": -1,
        "y": "-0.5",
        "z": "-0.5",
    }
