"""Held amounts on the wire (``HeldAmount``: capacities, allocations, per-kernel holds
in heartbeats and map views): checked per text and remembered when accepted; a refused
text is refused every time, with the field, the expected and the received value."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from accelshare.protocol import DeviceView


def device(**amounts: Any) -> dict[str, Any]:
    fields = {"capacity": "1", "allocated": "0", "kernels": {}}
    fields.update(amounts)
    return {"device_id": "GPU0", "slot_name": "cuda.shares", "slot_type": "count", **fields}


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("allocated", "-1"),
        ("allocated", "NaN"),
        ("capacity", "Infinity"),
        ("capacity", "1e21"),
        ("allocated", "lots"),
        ("kernels", {"k1": "-0.5"}),
    ],
)
def test_a_refused_amount_is_refused_every_time(field: str, value: Any) -> None:
    for _ in range(3):  # the accepted texts are remembered; refusals are not
        with pytest.raises(ValidationError) as caught:
            DeviceView.model_validate(device(**{field: value}))
        (error,) = caught.value.errors()
        assert error["loc"][0] == field
        assert "a decimal string >= 0 and below 10^21" in error["msg"]
        received = value if isinstance(value, str) else value["k1"]
        assert error["ctx"]["received"] == repr(received)


def test_an_accepted_amount_is_kept_as_sent() -> None:
    for _ in range(3):
        view = DeviceView.model_validate(
            device(capacity="1.50", allocated="0.0", kernels={"k": "1E-1"})
        )
        assert (view.capacity, view.allocated, view.kernels) == ("1.50", "0.0", {"k": "1E-1"})
