"""Error classes: hierarchy, structured fields, messages, pickling; module doctests."""

from __future__ import annotations

import doctest
import importlib
import pickle
from decimal import Decimal

import pytest

from accelshare.alloc import (
    AllocMapConfigError,
    FractionalResourceFragmented,
    InsufficientResource,
    InvalidResourceArgument,
    InvalidResourceCombination,
    NotMultipleOfQuantum,
    ResourceError,
    UnsupportedResource,
)
from accelshare.alloc.errors import format_amount

D = Decimal

ERRORS: dict[str, ResourceError] = {
    "insufficient": InsufficientResource(
        "cuda.shares", D("1.5"), D("1.2"), {"GPU1": D("0.40"), "GPU2": D("0.8")}, context_tag="k"
    ),
    "fragmented": FractionalResourceFragmented(
        "cuda.shares", D("0.5"), D("0.8"), {"GPU1": D("0.4"), "GPU2": D("0.4")}
    ),
    "invalid": InvalidResourceArgument(
        "bad", slot="cpu", requested=D("1.5"), expected="a whole number", device="c0"
    ),
    "quantum": NotMultipleOfQuantum(
        "cuda.shares", D("0.15"), D("0.1"), lower=D("0.1"), upper=D("0.2")
    ),
    "combination": InvalidResourceCombination(
        ["cuda.device", "cuda.shares"], ["cuda.device", "cuda.shares"]
    ),
    "unsupported": UnsupportedResource("tpu.device"),
    "config": AllocMapConfigError("bad quantum", field="quantum_size", received=D(0)),
}


@pytest.mark.parametrize("error", ERRORS.values(), ids=ERRORS.keys())
def test_every_error_is_a_resource_error_value_error(error: ResourceError) -> None:
    assert isinstance(error, ResourceError)
    assert isinstance(error, ValueError)
    assert str(error).startswith(type(error).__name__ + ": ")


@pytest.mark.parametrize("error", ERRORS.values(), ids=ERRORS.keys())
def test_errors_survive_pickling_with_their_fields(error: ResourceError) -> None:
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error)
    assert str(copy) == str(error)
    assert copy.__dict__ == error.__dict__


def test_messages_and_fields() -> None:
    insufficient = ERRORS["insufficient"]
    assert str(insufficient) == (
        "InsufficientResource: cannot allocate 1.5 of cuda.shares: 1.2 free"
        " (GPU1 0.4, GPU2 0.8) [context: k]"
    )
    assert insufficient.context_tag == "k"
    assert str(ERRORS["unsupported"]) == (
        "UnsupportedResource: no devices for slot 'tpu.device'; slots available here: none"
    )
    config = ERRORS["config"]
    assert isinstance(config, AllocMapConfigError)
    assert (config.field, config.received) == ("quantum_size", D(0))
    assert ERRORS["combination"].slot == "cuda.device"


@pytest.mark.parametrize(
    ("value", "text"),
    [(D("0.40"), "0.4"), (D("1E+1"), "10"), (3, "3"), (D("NaN"), "Decimal('NaN')"), (0.5, "0.5")],
)
def test_format_amount(value: object, text: str) -> None:
    assert format_amount(value) == text


MODULES = ["amounts", "strategies", "discrete", "fraction", "affinity"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    module = importlib.import_module(f"accelshare.alloc.{name}")
    result = doctest.testmod(module)
    # A listed module without a single ``>>>`` example would pass vacuously.
    assert result.attempted > 0, f"accelshare.alloc.{name} has no doctest examples"
    assert result.failed == 0


def test_base_error_and_repr() -> None:
    assert str(ResourceError()) == "ResourceError: "
    assert repr(ResourceError("boom", slot="cpu")) == "ResourceError('boom')"
    error = ERRORS["insufficient"]
    assert error.args == ("cuda.shares", D("1.5"), D("1.2"), {"GPU1": D("0.40"), "GPU2": D("0.8")})
    assert error.detail.startswith("cannot allocate 1.5 of cuda.shares")
