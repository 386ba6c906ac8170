"""Request validation at enqueue (pure part): known slots, defaults, quanta, whole units."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from pydantic import ValidationError

from accelshare.api.problems import InvalidAPIParameters
from accelshare.api.schemas.sessions import CreateSessionBody
from accelshare.common import ResourceSlot, SlotTypes
from accelshare.manager.agents import format_compat, gpu_alloc_map_string
from accelshare.manager.errors import InvalidRequest
from accelshare.manager.scheduler.loop import advisory_key
from accelshare.manager.services.sessions.spec import (
    STARTS_AT_FORMS,
    parse_starts_at,
    resolve_resources,
    session_name_problem,
)

KNOWN = {
    "cpu": SlotTypes.COUNT,
    "mem": SlotTypes.BYTES,
    "cuda.shares": SlotTypes.COUNT,
    "cuda.device:10g-mig": SlotTypes.UNIQUE,
}
DEFAULTS = ResourceSlot({"cpu": 1, "mem": 1 << 30})
QUANTA = {"cuda.shares": {Decimal("0.1")}}


def resolve(raw: dict[str, Any]) -> ResourceSlot:
    return resolve_resources(raw, known=KNOWN, defaults=DEFAULTS, quanta=QUANTA, discrete={"cpu"})


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        pytest.param({}, {"cpu": 1, "mem": 1 << 30}, id="defaults"),
        pytest.param(
            {"cpu": 2, "mem": "2g", "cuda.shares": "0.2"},
            {"cpu": 2, "mem": 2 << 30, "cuda.shares": Decimal("0.2")},
            id="given",
        ),
        pytest.param(
            {"cuda.shares": 0, "foo": 0}, {"cpu": 1, "mem": 1 << 30}, id="zero-unknown-is-fine"
        ),
        pytest.param(
            {"cuda.device:10g-mig": 1},
            {"cpu": 1, "mem": 1 << 30, "cuda.device:10g-mig": 1},
            id="unique",
        ),
    ],
)
def test_accepted(raw: dict[str, Any], expected: dict[str, Any]) -> None:
    assert resolve(raw) == ResourceSlot(expected)


@pytest.mark.parametrize(
    ("raw", "field", "message"),
    [
        pytest.param(
            {"tpu.device": 1},
            "config.resources.tpu.device",
            "Unknown requested resource slot: tpu.device",
            id="unknown",
        ),
        pytest.param(
            {"shmem": "1g"}, "config.resources.shmem", "shmem is a resource option", id="shmem-hint"
        ),
        pytest.param(
            {"cuda.shares": "0.25"},
            "config.resources.cuda.shares",
            "cuda.shares=0.25 is not a multiple of the quantum 0.1 (nearest valid amounts: 0.2 and 0.3)",
            id="quantum",
        ),
        pytest.param(
            {"cpu": "2.5"},
            "config.resources.cpu",
            "cpu=2.5 must be a whole number (nearest whole amounts: 2 and 3)",
            id="whole",
        ),
        pytest.param({"cpu": 0}, "config.resources.cpu", "cpu must be positive", id="cpu-zero"),
        pytest.param({"mem": 0}, "config.resources.mem", "mem must be positive", id="mem-zero"),
        pytest.param(
            {"cuda.device:10g-mig": 2},
            "config.resources.cuda.device:10g-mig",
            "request exactly 1",
            id="unique-two",
        ),
        pytest.param({"cpu": "inf"}, "config.resources.cpu", "finite", id="infinite"),
        pytest.param({"cpu": "many"}, "config.resources.cpu", "Invalid amount for cpu", id="junk"),
    ],
)
def test_refused_with_field_and_value(raw: dict[str, Any], field: str, message: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        resolve(raw)
    assert info.value.field == field
    assert message in info.value.detail


def test_body_accepts_backend_ai_spellings() -> None:
    body = CreateSessionBody.model_validate(
        {
            "image": "python:3.11",
            "clientSessionToken": "mine",
            "config": {"scaling_group": "gpu", "resourceOpts": {"shmem": "1g"}},
            "startsAt": "2026-01-01T00:00:00",
            "enqueue_only": True,
            "unknown": "ignored",
        }
    )
    assert (body.name, body.config.scaling_group, body.enqueue_only) == ("mine", "gpu", True)
    assert body.config.resource_opts == {"shmem": "1g"}
    starts_at = body.to_request().starts_at
    assert isinstance(starts_at, datetime)
    assert starts_at == datetime(2026, 1, 1, tzinfo=UTC)  # no zone: UTC


@pytest.mark.parametrize(
    ("text", "delay"),
    [
        ("20s", timedelta(seconds=20)),
        ("10sec", timedelta(seconds=10)),
        ("5m", timedelta(minutes=5)),
        ("30min", timedelta(minutes=30)),
        ("1h", timedelta(hours=1)),
        ("2hours 15min", timedelta(minutes=135)),
        ("2d", timedelta(days=2)),
        ("1d1hr", timedelta(days=1, hours=1)),
        ("300", timedelta(seconds=300)),
        ("1.5h", timedelta(minutes=90)),
        ("-1day", timedelta(days=-1)),
    ],
)
def test_starts_at_takes_backend_ais_delays(text: str, delay: timedelta) -> None:
    assert parse_starts_at(text) == delay


@pytest.mark.parametrize("text", ["", "soon", "5 m", "1m1h", "1h1h", "20x", "99999d", "1e3"])
def test_starts_at_refuses_other_text(text: str) -> None:
    with pytest.raises(ValueError, match=r"not a time or a delay|a delay of at most"):
        parse_starts_at(text)
    body = CreateSessionBody.model_validate({"image": "x", "startsAt": text})
    with pytest.raises(InvalidAPIParameters) as info:
        body.to_request()
    assert info.value.extra["field"] == "startsAt"
    assert info.value.extra["expected"] == STARTS_AT_FORMS
    assert info.value.extra["received"] == text


def test_session_names_follow_one_rule() -> None:
    assert session_name_problem("train.v2_final-1") is None
    assert session_name_problem("x" * 64) is None
    for bad in ("", "x" * 65, "-x", "a b", "00000000-0000-0000-0000-000000000000"):
        assert session_name_problem(bad) is not None, bad


@pytest.mark.parametrize(
    ("payload", "loc"),
    [
        ({"image": "x", "name": "00000000-0000-0000-0000-000000000000"}, "name"),
        ({"image": "x", "name": "bad name"}, "name"),
        ({"image": "x", "cluster_size": 2}, "cluster_size"),
        ({"image": "x", "priority": -1}, "priority"),
        ({"image": "x", "type": "service"}, "type"),
        ({"image": "x", "name": "mine\n"}, "name"),  # "$" would let a final line feed in
        ({"image": "x", "name": "mi\x00ne"}, "name"),
        ({"image": "x", "startupCommand": "echo\x00hi"}, "startupCommand"),
        ({"image": "x", "startupCommand": "echo \x1b[2J"}, "startupCommand"),
        ({"image": "x", "config": {"environ": {"A": "1\x00"}}}, "config"),
        ({"image": "x", "config": {"environ": {"A\x00": "1"}}}, "config"),
        ({"image": "x", "config": {"environ": {"A-B": "1"}}}, "config"),
        ({"image": "x", "config": {"environ": {"CUDA_VISIBLE_DEVICES": "0"}}}, "config"),
    ],
)
def test_body_refusals(payload: dict[str, Any], loc: str) -> None:
    with pytest.raises(ValidationError) as info:
        CreateSessionBody.model_validate(payload)
    assert info.value.errors()[0]["loc"][0] == loc


def test_gpu_alloc_map_shape() -> None:
    raw = {"a-2d01": "0.6", "a-2d02": Decimal("0.8"), "a-2d03": "0"}
    assert format_compat(raw) == {"a-2d02": "0.80", "a-2d01": "0.60", "a-2d03": "0.00"}
    assert gpu_alloc_map_string({"x": "1"}) == '{"x": "1.00"}'


def test_advisory_key_is_stable_and_signed_64_bit() -> None:
    assert advisory_key("default") == advisory_key("default")
    assert advisory_key("default") != advisory_key("gpu")
    assert -(2**63) <= advisory_key("default") < 2**63


@pytest.mark.parametrize(
    "name",
    [
        "CUDA_VISIBLE_DEVICES",
        "NVIDIA_VISIBLE_DEVICES",
        "CUDA_MPS_PIPE_DIRECTORY",
        "BACKENDAI_MOCK_CUDA_DEVICES",
        "ACCELSHARE_RESOURCE_TXT",
    ],
)
def test_the_agents_variables_are_refused_naming_the_variable(name: str) -> None:
    with pytest.raises(ValidationError) as info:
        CreateSessionBody.model_validate({"image": "x", "config": {"environ": {name: "GPU-1"}}})
    error = info.value.errors()[0]
    assert error["loc"] == ("config", "environ")
    assert f"config.environ.{name}: {name} is set by the agent" in error["msg"]


def test_startup_commands_and_values_keep_tabs_and_line_breaks() -> None:
    body = CreateSessionBody.model_validate(
        {
            "image": "x",
            "startupCommand": "set -e\n\techo a\r\n",
            "config": {"environ": {"CERT": "line1\nline2", "BACKENDAI_SERVICE_PORT_WEB": "80"}},
        }
    )
    assert body.startup_command == "set -e\n\techo a\r\n"
    assert body.config.environ["CERT"] == "line1\nline2"


# -- amounts exactly as written (no silent rounding) ----------------------------------------------

FINE = {"cuda.shares": {Decimal("0.01")}}


def resolve_fine(raw: dict[str, Any]) -> ResourceSlot:
    return resolve_resources(raw, known=KNOWN, defaults=DEFAULTS, quanta=FINE, discrete={"cpu"})


def test_an_amount_is_kept_to_the_last_digit() -> None:
    assert resolve_fine({"cuda.shares": "0.13"})["cuda.shares"] == Decimal("0.13")
    assert resolve_fine({"cuda.shares": Decimal("0.10")})["cuda.shares"] == Decimal("0.1")


def test_off_the_grid_is_refused_with_the_nearest_valid_amounts() -> None:
    with pytest.raises(InvalidRequest) as info:
        resolve_fine({"cuda.shares": "0.1004"})
    error = info.value
    assert error.field == "config.resources.cuda.shares"
    assert error.expected == "a multiple of 0.01"
    assert error.received == "0.1004"
    assert error.extra == {
        "error": "NotMultipleOfQuantum",
        "quantum": "0.01",
        "nearest": ["0.1", "0.11"],
    }
    assert "nearest valid amounts: 0.1 and 0.11" in error.detail


def test_below_one_quantum_is_refused_not_turned_into_no_gpu() -> None:
    with pytest.raises(InvalidRequest) as info:
        resolve_fine({"cuda.shares": "0.0005"})
    assert info.value.extra["error"] == "BelowOneQuantum"
    assert info.value.extra["nearest"] == ["0", "0.01"]
    assert "below one quantum (0.01)" in info.value.detail


def test_without_a_reported_quantum_the_count_grid_applies() -> None:
    with pytest.raises(InvalidRequest, match=r"quantum 0\.001"):
        resolve_resources(
            {"cuda.shares": "0.1004"}, known=KNOWN, defaults=DEFAULTS, quanta={}, discrete=set()
        )


@pytest.mark.parametrize(
    ("value", "expected_part"),
    [
        pytest.param(True, "a decimal number", id="json-true"),
        pytest.param("1_0", "no '_' separators", id="underscore"),
        pytest.param("１", "ASCII digits only", id="full-width"),
    ],
)
def test_booleans_underscores_and_non_ascii_digits_are_refused(
    value: object, expected_part: str
) -> None:
    body = CreateSessionBody.model_validate({"image": "x", "config": {"resources": {"cpu": value}}})
    assert body.config.resources["cpu"] is value  # the body keeps it as sent (no coercion)
    with pytest.raises(InvalidRequest) as info:
        resolve(dict(body.config.resources))
    assert info.value.field == "config.resources.cpu"
    assert expected_part in (info.value.expected or "")
    assert info.value.received is value
