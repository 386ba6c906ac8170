"""How the admin GraphQL maps accelshare's data onto Backend.AI's fields: agents' live
stats, images' registries and operation flag, and the settings accelshare refuses."""

from __future__ import annotations

import doctest

import pytest

from accelshare.api import gql, gql_admin
from accelshare.api.gql import image_registry, is_operation_image, live_stat
from accelshare.api.gql_admin import (
    common,
    domains,
    images,
    quota_scopes,
    resource_policies,
    scaling_groups,
    users,
)
from accelshare.api.gql_admin.common import not_kept
from accelshare.api.gql_admin.users import _user_status
from accelshare.manager.enums import UserStatus


def test_doctests() -> None:
    for module in (
        gql,
        gql_admin,
        common,
        domains,
        images,
        quota_scopes,
        resource_policies,
        scaling_groups,
        users,
    ):
        assert doctest.testmod(module).failed == 0


def test_live_stat_in_backendais_shape() -> None:
    live = live_stat(
        [
            {"name": "cpu_util", "device_id": None, "value": "30", "capacity": "400", "unit": "percent"},
            {"name": "cpu_util", "device_id": "0", "value": "20", "capacity": "100", "unit": "percent"},
            {"name": "cuda_mem", "device_id": None, "value": "1024", "capacity": None, "unit": "bytes"},
            {"name": "cuda_util", "device_id": "gpu1", "value": "55.5", "unit": "percent"},
        ]
    )  # fmt: skip
    assert live["node"]["cpu_util"] == {
        "current": "30",
        "capacity": "400",
        "pct": "7.50",
        "unit_hint": "percent",
        "stats.max": None,
    }
    assert live["devices"]["cpu_util"]["0"]["pct"] == "20.00"
    assert live["node"]["cuda_mem"]["pct"] is None  # no capacity, not a percentage
    assert live["devices"]["cuda_mem"] == {}  # the client looks node metrics up here
    assert live["devices"]["cuda_util"]["gpu1"]["pct"] == "55.50"
    assert "cuda_util" not in live["node"]


@pytest.mark.parametrize(
    ("runtime", "name", "registry"),
    [
        ("docker", "python", "docker.io"),
        ("docker", "lablup/python", "docker.io"),
        ("docker", "localhost/lab/py", "localhost"),
        ("docker", "reg:5000/lab/py", "reg:5000"),
        ("docker", "cr.backend.ai/stable/python", "cr.backend.ai"),
        ("process", "cr.backend.ai/stable/python", None),
    ],
)
def test_image_registry(runtime: str, name: str, registry: str | None) -> None:
    assert image_registry({"runtime": runtime, "name": name}) == registry


def test_operation_images_by_label() -> None:
    assert is_operation_image({"labels": {"ai.backend.features": "batch operation uid-match"}})
    assert not is_operation_image({"labels": {"ai.backend.features": "operational"}})
    assert not is_operation_image({"labels": {}})


def test_settings_not_kept_are_refused_with_the_field_and_value() -> None:
    not_kept("totp_activated", None, False)
    not_kept("totp_activated", False, False)
    with pytest.raises(ValueError, match=r"totp_activated: .*does not keep.*received True"):
        not_kept("totp_activated", True, False)


def test_user_status_filter() -> None:
    assert _user_status(None) is None
    assert _user_status("ACTIVE") is UserStatus.ACTIVE
    assert _user_status("before-verification") is False  # Backend.AI's: matches nothing
    with pytest.raises(ValueError, match=r"status: expected one of .*received 'gone'"):
        _user_status("gone")
