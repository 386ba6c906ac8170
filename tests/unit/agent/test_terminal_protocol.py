"""The terminal WebSocket's control messages: parsed and checked, errors name the field."""

from __future__ import annotations

import re

import pytest

from accelshare.agent.runtime.terminal import check_size
from accelshare.agent.terminal_ws import parse_control


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            '{"type": "resize", "cols": 120, "rows": 40}',
            {"type": "resize", "cols": 120, "rows": 40},
        ),
        ('{"type": "data", "data": "ls\\r"}', {"type": "data", "data": "ls\r"}),
    ],
    ids=["resize", "data"],
)
def test_valid_control_messages(text: str, expected: dict[str, object]) -> None:
    assert parse_control(text) == expected


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("nope", "message: expected a JSON object such as"),
        ("[1]", "message: expected a JSON object, received '[1]'"),
        ('{"type": "paste"}', "type: expected 'resize' or 'data', received 'paste'"),
        (
            '{"type": "resize", "cols": "80", "rows": 24}',
            "cols: expected an integer, received '80'",
        ),
        (
            '{"type": "resize", "cols": 80, "rows": true}',
            "rows: expected an integer, received True",
        ),
        ('{"type": "resize", "cols": 0, "rows": 24}', "cols: expected 1..1000, received 0"),
        ('{"type": "resize", "cols": 80, "rows": 5000}', "rows: expected 1..1000, received 5000"),
        ('{"type": "data", "data": 3}', "data: expected a string, received 3"),
    ],
    ids=["not-json", "not-object", "type", "cols-str", "rows-bool", "cols-0", "rows-big", "data"],
)
def test_bad_control_messages_name_the_field(text: str, error: str) -> None:
    with pytest.raises(ValueError, match="^" + re.escape(error)):
        parse_control(text)


def test_sizes_in_range() -> None:
    check_size(1, 1000)
    with pytest.raises(ValueError, match=re.escape("cols: expected 1..1000, received 1001")):
        check_size(1001, 24)
