"""Wire messages the manager stores refuse NUL and non-finite numbers, naming where."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from accelshare.protocol import KernelEventBatch

EVENT = {
    "event_id": "e1",
    "kernel_id": "k1",
    "session_id": "s1",
    "event": "started",
    "at": "2026-11-27T08:00:00+00:00",
}


def test_a_clean_batch_passes() -> None:
    batch = KernelEventBatch.model_validate({"agent_id": "i-1", "events": [EVENT]})
    assert batch.events[0].kernel_id == "k1"


@pytest.mark.parametrize(
    ("body", "named"),
    [
        pytest.param(
            {"events": [{**EVENT, "kernel_id": "k\x00"}]}, "events.0.kernel_id", id="value"
        ),
        pytest.param({"events": [{**EVENT, "x\x00": 1}]}, "events.0.x\\x00", id="key-escaped"),
        pytest.param({"events": [{**EVENT, "\r\x00": 1}]}, "events.0.\\r\\x00", id="control-key"),
        pytest.param(
            {"events": [{**EVENT, "exit_code": float("nan")}]}, "events.0.exit_code", id="nan"
        ),
    ],
)
def test_unstorable_input_names_its_place_readably(body: dict[str, Any], named: str) -> None:
    with pytest.raises(ValidationError) as info:
        KernelEventBatch.model_validate(body)
    message = str(info.value)
    assert f"{named}: expected" in message
    assert "\x00" not in message
    assert "\r" not in message


@pytest.mark.parametrize(
    ("body", "named"),
    [
        pytest.param({"events": [{**EVENT, "reason": float("inf")}]}, "events.0.reason", id="inf"),
        pytest.param(
            {"events": [{**EVENT, "nested": {"deep": ["ok", "n\x00"]}}]},
            "events.0.nested.deep.1",
            id="deep-list",
        ),
        pytest.param(
            {"events": [{**EVENT, "odd": {("tuple", "key"): "x\x00"}}]},
            "events.0.odd.('tuple', 'key')",
            id="not-json-data",  # the encoder cannot tell: the walk does
        ),
    ],
)
def test_the_encoder_shortcut_still_hands_every_problem_to_the_walk(
    body: dict[str, Any], named: str
) -> None:
    with pytest.raises(ValidationError) as info:
        KernelEventBatch.model_validate(body)
    assert f"{named}: expected" in str(info.value)


def test_text_that_only_looks_like_an_escaped_nul_is_stored() -> None:
    """A backslash followed by ``u0000`` (six characters, no NUL) encodes as ``\\\\u0000``,
    which contains the shortcut's marker: the walk then finds nothing wrong."""
    event = {**EVENT, "reason": "literally \\u0000"}
    batch = KernelEventBatch.model_validate({"agent_id": "i-1", "events": [event]})
    assert batch.events[0].reason == "literally \\u0000"
