"""mock-accelerator.toml: schema, identities, and every bad-configuration case."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from accelshare.accel.errors import PluginConfigError, PluginUnavailable
from accelshare.accel.mock import MockPlugin, load_mock_config, mig_slot_name, parse_mock_config

from .builders import DISCRETE, FRACTIONAL, GIB, SAMPLE_NAMES, SAMPLES, U, options

SOURCE = "test.toml"
FORMAT = {
    "human_readable_name": "GPU",
    "description": "CUDA-capable GPU",
    "display_unit": "GPU",
    "display_icon": "gpu1",
    "number_format": {"binary": False, "round_length": 0},
}


def base(**overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "slot_name": "cuda",
        "device_plugin_name": "CUDADevice",
        "attributes": {"nvidia_driver": "450.00.00"},
        "formats": {"device": dict(FORMAT), "shares": dict(FORMAT)},
        "devices": [
            {
                "mother_uuid": f"{U}{i}",
                "model_name": "CUDA GPU",
                "numa_node": 0,
                "subproc_count": 108,
                "memory_size": "40G",
                "is_mig_device": False,
            }
            for i in (1, 2)
        ],
    }
    data.update(overrides)
    return data


def with_device(change: dict[str, Any], index: int = 0, drop: str | None = None) -> dict[str, Any]:
    data = base()
    data["devices"][index].update(change)
    if drop:
        del data["devices"][index][drop]
    return data


def dropped(key: str) -> dict[str, Any]:
    data = base()
    del data[key]
    return data


def test_sample_files_parse() -> None:
    for name in SAMPLE_NAMES:
        config = load_mock_config(SAMPLES / name)
        assert config.source == str(SAMPLES / name)
        assert config.devices


def test_device_identity_and_hardware_location() -> None:
    config = load_mock_config(SAMPLES / "cuda-mock-mig.toml")
    ids = [d.device_id for d in config.devices]
    assert ids[:2] == [f"{U}1", f"{U}2"]
    assert ids[2:5] == [f"MIG-{U}3/2/0", f"MIG-{U}3/3/0", f"MIG-{U}3/4/0"]
    assert ids[5:] == [f"MIG-{U}4/{i}/0" for i in range(5, 9)]
    assert [d.hw_location for d in config.devices][:3] == [
        "0000:99:00.0",
        "0000:99:01.0",
        "0000:99:02.0",
    ]
    assert config.devices[0].memory_bytes == 40 * GIB


@pytest.mark.parametrize(
    ("model", "slot"),
    [
        ("MIG-10g", "cuda.device:10g-mig"),
        ("MIG-1g.5gb", "cuda.device:1g.5gb-mig"),
        ("MIG-3g.20gb", "cuda.device:3g.20gb-mig"),
    ],
)
def test_mig_slot_name(model: str, slot: str) -> None:
    assert mig_slot_name(model) == slot


def test_unknown_extra_keys_are_allowed() -> None:
    data = base(color="blue", extra_table={"a": 1})
    data["devices"][0]["vendor_note"] = "hi"
    data["formats"]["device"]["tooltip"] = "x"
    config = parse_mock_config(data, source=SOURCE)
    assert config.extra == {"color": "blue", "extra_table": {"a": 1}}


def test_integer_memory_size_is_bytes() -> None:
    config = parse_mock_config(with_device({"memory_size": 2 * GIB}), source=SOURCE)
    assert config.devices[0].memory_bytes == 2 * GIB


BAD_CASES = [
    pytest.param(
        dropped("slot_name"), "slot_name", "nothing (the key is missing)", id="missing-slot_name"
    ),
    pytest.param(
        dropped("devices"), "devices", "nothing (the key is missing)", id="missing-devices"
    ),
    pytest.param(dropped("attributes"), "attributes", "nothing", id="missing-attributes"),
    pytest.param(
        dropped("device_plugin_name"),
        "device_plugin_name",
        "nothing",
        id="missing-device_plugin_name",
    ),
    pytest.param(base(slot_name=3), "slot_name", "3", id="wrong-type-slot_name"),
    pytest.param(base(slot_name="CUDA"), "slot_name", "'CUDA'", id="bad-key"),
    pytest.param(base(slot_name="cpu"), "slot_name", "'cpu'", id="intrinsic-key"),
    pytest.param(base(device_plugin_name="ROCm"), "device_plugin_name", "'ROCm'", id="plugin-name"),
    pytest.param(base(attributes="x"), "attributes", "'x'", id="wrong-type-attributes"),
    pytest.param(base(devices={"a": 1}), "devices", "{'a': 1}", id="devices-not-array"),
    pytest.param(base(devices=[]), "devices", "[]", id="devices-empty"),
    pytest.param(
        with_device({}, drop="mother_uuid"), "devices[0].mother_uuid", "nothing", id="missing-uuid"
    ),
    pytest.param(
        with_device({}, 1, drop="memory_size"),
        "devices[1].memory_size",
        "nothing",
        id="missing-mem",
    ),
    pytest.param(
        with_device({"numa_node": "0"}), "devices[0].numa_node", "'0'", id="wrong-type-numa"
    ),
    pytest.param(with_device({"numa_node": -1}), "devices[0].numa_node", "-1", id="negative-numa"),
    pytest.param(
        with_device({"numa_node": True}), "devices[0].numa_node", "True", id="bool-is-not-int"
    ),
    pytest.param(
        with_device({"subproc_count": 0}), "devices[0].subproc_count", "0", id="zero-subproc"
    ),
    pytest.param(
        with_device({"memory_size": "-1G"}, 1),
        "devices[1].memory_size",
        "'-1G'",
        id="negative-size",
    ),
    pytest.param(
        with_device({"memory_size": -5}), "devices[0].memory_size", "-5", id="negative-int-size"
    ),
    pytest.param(
        with_device({"memory_size": "lots"}), "devices[0].memory_size", "'lots'", id="junk-size"
    ),
    pytest.param(
        with_device({"memory_size": 1.5}), "devices[0].memory_size", "1.5", id="float-size"
    ),
    pytest.param(
        with_device({}, drop="is_mig_device"),
        "devices[0].is_mig_device",
        "nothing",
        id="cuda-mig-flag",
    ),
    pytest.param(
        with_device({"is_mig_device": "no"}), "devices[0].is_mig_device", "'no'", id="mig-flag-type"
    ),
    pytest.param(
        with_device({"is_mig_device": True, "model_name": "A100"}),
        "devices[0].model_name",
        "'A100'",
        id="mig-without-profile",
    ),
    pytest.param(
        with_device({"mother_uuid": f"{U}1"}, 1),
        "devices[1].mother_uuid",
        repr(f"{U}1"),
        id="dup-id",
    ),
    pytest.param(
        with_device({"is_mig_device": True, "model_name": "MIG-10g", "mother_uuid": f"{U}1"}, 1),
        "devices[1].mother_uuid",
        repr(f"{U}1"),
        id="mig-of-a-full-gpu",
    ),
    pytest.param(
        base(formats={"device": {**FORMAT, "display_unit": 1}}),
        "formats.device.display_unit",
        "1",
        id="format-field-type",
    ),
    pytest.param(
        base(formats={"device": {k: v for k, v in FORMAT.items() if k != "number_format"}}),
        "formats.device.number_format",
        "nothing",
        id="format-missing-number_format",
    ),
    pytest.param(
        base(
            formats={"device": {**FORMAT, "number_format": {"binary": False, "round_length": -1}}}
        ),
        "formats.device.number_format.round_length",
        "-1",
        id="format-negative-round_length",
    ),
    pytest.param(base(stats_smoothing="kalman"), "stats_smoothing", "'kalman'", id="smoothing"),
    pytest.param(base(stats_seed=-1), "stats_seed", "-1", id="seed"),
    pytest.param(base(stats_smoothing_factor=2), "stats_smoothing_factor", "2", id="factor"),
]


@pytest.mark.parametrize(("data", "key", "received"), BAD_CASES)
def test_bad_config_names_file_key_expected_received(
    data: dict[str, Any], key: str, received: str
) -> None:
    with pytest.raises(PluginConfigError) as info:
        parse_mock_config(copy.deepcopy(data), source=SOURCE)
    err = info.value
    assert err.source == SOURCE
    assert err.key == key
    message = str(err)
    assert message.startswith(f"{SOURCE}: key {key!r}: expected ")
    assert f"received {received}" in message
    assert err.expected


def test_rocm_devices_cannot_be_mig() -> None:
    data = base(slot_name="rocm", device_plugin_name="MockDevice")
    data["devices"][0]["is_mig_device"] = True
    with pytest.raises(PluginConfigError, match=r"devices\[0\]\.is_mig_device"):
        parse_mock_config(data, source=SOURCE)
    data["devices"][0]["is_mig_device"] = False
    assert parse_mock_config(data, source=SOURCE).devices[0].is_mig is False


def test_missing_formats_shares_in_fractional_mode() -> None:
    data = base()
    del data["formats"]["shares"]
    config = parse_mock_config(data, source=SOURCE)
    MockPlugin(config, options(DISCRETE))  # fine: discrete uses formats.device
    with pytest.raises(PluginConfigError) as info:
        MockPlugin(config, options(FRACTIONAL))
    assert info.value.key == "formats.shares"
    assert "allocation_mode = 'fractional'" in str(info.value)
    assert str(info.value).startswith(f"{SOURCE}: key 'formats.shares'")


def test_missing_formats_device_in_discrete_mode() -> None:
    data = base(formats={"shares": dict(FORMAT)})
    with pytest.raises(PluginConfigError, match=r"formats\.device"):
        MockPlugin(parse_mock_config(data, source=SOURCE), options(DISCRETE))


def test_missing_mig_format() -> None:
    data = with_device({"is_mig_device": True, "model_name": "MIG-10g", "mother_uuid": "x"})
    with pytest.raises(PluginConfigError, match=r"formats\.\"\*-mig\""):
        MockPlugin(parse_mock_config(data, source=SOURCE), options(DISCRETE))
    data["formats"]["10g-mig"] = dict(FORMAT, display_unit="MIG")  # an exact profile format
    plugin = MockPlugin(parse_mock_config(data, source=SOURCE), options(DISCRETE))
    assert plugin.inventory.metadata["cuda.device:10g-mig"].display_unit == "MIG"


def test_missing_file_is_unavailable(tmp_path: Path) -> None:
    with pytest.raises(PluginUnavailable, match=r"mock-accelerator\.toml"):
        load_mock_config(tmp_path / "mock-accelerator.toml")


def test_invalid_toml_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("slot_name = \n")
    with pytest.raises(PluginConfigError) as info:
        load_mock_config(path)
    assert info.value.source == str(path)
    assert "valid TOML" in str(info.value)
