"""``mock-accelerator.toml``: schema and validation (spec 03-mock-accelerator.md).

:func:`parse_mock_config` is pure (a mapping in, a :class:`MockConfig` out);
:func:`load_mock_config` reads the file.  Every problem raises
:class:`~accelshare.accel.errors.PluginConfigError` naming the file, the key, what was
expected and what was received::

    two-fgpu.toml: key 'devices[1].numa_node': expected an integer >= 0, received -1

Unknown extra keys are allowed everywhere.  Which ``formats.<subtype>`` tables are
required depends on the allocation mode, which comes from the config store; the plugin
checks that with :meth:`MockConfig.require_format`.

accelshare extensions (optional, top level)::

    stats_smoothing = "none"          # "none" (independent samples, as Backend.AI),
                                      # "ema" or "random-walk"
    stats_smoothing_factor = 0.3      # EMA weight of a new sample / the walk's pull and
                                      # step; the most a reading moves per tick (x range)
    stats_seed = 42                   # reproducible stats

The readings themselves follow what is allocated on each device
(:mod:`accelshare.accel.stats`); the file declares no ranges of its own.
"""

from __future__ import annotations

import fnmatch
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

from accelshare.common import BinarySize, CommonValueError, InvalidSlotName, SlotName

from ..errors import MISSING, PluginConfigError, PluginUnavailable
from ..types import NumberFormat, SlotMetadata

__all__ = [
    "DEVICE_PLUGIN_NAMES",
    "SMOOTHING_KINDS",
    "MockConfig",
    "MockDeviceSpec",
    "load_mock_config",
    "mig_profile",
    "parse_mock_config",
]

DEVICE_PLUGIN_NAMES = ("CUDADevice", "MockDevice")
SMOOTHING_KINDS = ("none", "ema", "random-walk")
_KEY_PATTERN = re.compile(r"^[a-z][a-z0-9_-]*$")
_INTRINSIC_KEYS = frozenset({"cpu", "mem"})


@dataclass(frozen=True, slots=True)
class MockDeviceSpec:
    """One ``[[devices]]`` entry, validated, with its derived identity."""

    index: int  # position in the file: MIG ids and hardware locations use it
    device_id: str  # mother_uuid, or MIG-<mother_uuid>/<index>/0 for a MIG slice
    mother_uuid: str
    model_name: str
    numa_node: int
    subproc_count: int
    memory_bytes: int
    is_mig: bool

    @property
    def hw_location(self) -> str:
        return f"0000:99:{self.index:02d}.0"


@dataclass(frozen=True, slots=True)
class MockConfig:
    source: str  # the file, for error messages
    slot_name: str  # the plugin key
    device_plugin_name: str
    attributes: Mapping[str, Any]
    formats: Mapping[str, SlotMetadata]  # subtype ("device", "shares", "*-mig"...) -> format
    devices: tuple[MockDeviceSpec, ...]
    stats_smoothing: str = "none"
    stats_smoothing_factor: Decimal = Decimal("0.3")
    stats_seed: int | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def is_cuda(self) -> bool:
        return self.slot_name == "cuda"

    def require_format(self, subtype: str, slot_name: str, reason: str) -> SlotMetadata:
        """The format for ``slot_name``: ``formats.<subtype>`` or a matching pattern.

        MIG slots look up their exact minor (``10g-mig``) first, then patterns such as
        ``"*-mig"``.  Missing: a :class:`PluginConfigError` saying why it is needed.
        """
        found = self.formats.get(subtype)
        if found is None:
            for pattern, candidate in self.formats.items():
                if any(c in pattern for c in "*?[") and fnmatch.fnmatchcase(subtype, pattern):
                    found = candidate
                    break
        if found is None:
            wanted = '"*-mig"' if subtype.endswith("-mig") else subtype
            raise PluginConfigError(
                self.source, f"formats.{wanted}", f"a table of UI metadata ({reason})", MISSING
            )
        return SlotMetadata(
            slot_name=slot_name,
            human_readable_name=found.human_readable_name,
            description=found.description,
            display_unit=found.display_unit,
            display_icon=found.display_icon,
            number_format=found.number_format,
        )


def mig_profile(model_name: str) -> str:
    """``MIG-10g`` -> ``10g``; ``MIG-1g.5gb`` -> ``1g.5gb`` (after the first ``-``)."""
    return model_name.split("-", 1)[1]


class _Reader:
    """Small typed accessors that raise PluginConfigError with the full key path."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, key: str, expected: str, received: Any) -> PluginConfigError:
        return PluginConfigError(self.source, key, expected, received)

    def get(self, table: Mapping[str, Any], name: str, path: str, expected: str) -> Any:
        if name not in table:
            raise self.fail(path, expected, MISSING)
        return table[name]

    def string(self, table: Mapping[str, Any], name: str, path: str) -> str:
        value = self.get(table, name, path, "a string")
        if not isinstance(value, str):
            raise self.fail(path, "a string", value)
        return value

    def integer(self, table: Mapping[str, Any], name: str, path: str, minimum: int) -> int:
        expected = f"an integer >= {minimum}"
        value = self.get(table, name, path, expected)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self.fail(path, expected, value)
        return value

    def boolean(self, table: Mapping[str, Any], name: str, path: str) -> bool:
        value = self.get(table, name, path, "true or false")
        if not isinstance(value, bool):
            raise self.fail(path, "true or false", value)
        return value

    def table(self, table: Mapping[str, Any], name: str, path: str) -> Mapping[str, Any]:
        value = self.get(table, name, path, "a table")
        if not isinstance(value, Mapping):
            raise self.fail(path, "a table", value)
        return value

    def size(self, table: Mapping[str, Any], name: str, path: str) -> int:
        expected = "a positive binary size such as '40G' (40 GiB) or a number of bytes"
        value = self.get(table, name, path, expected)
        if isinstance(value, bool) or not isinstance(value, str | int):
            raise self.fail(path, expected, value)
        try:
            size = int(BinarySize.finite_from_str(value))
        except CommonValueError:
            raise self.fail(path, expected, value) from None
        if size <= 0:
            raise self.fail(path, expected, value)
        return size


def _parse_format(reader: _Reader, table: Any, path: str) -> SlotMetadata:
    if not isinstance(table, Mapping):
        raise reader.fail(path, "a table of UI metadata", table)
    number_format = reader.table(table, "number_format", f"{path}.number_format")
    return SlotMetadata(
        slot_name="",  # filled in per slot by require_format
        human_readable_name=reader.string(
            table, "human_readable_name", f"{path}.human_readable_name"
        ),
        description=reader.string(table, "description", f"{path}.description"),
        display_unit=reader.string(table, "display_unit", f"{path}.display_unit"),
        display_icon=reader.string(table, "display_icon", f"{path}.display_icon"),
        number_format=NumberFormat(
            binary=reader.boolean(number_format, "binary", f"{path}.number_format.binary"),
            round_length=reader.integer(
                number_format, "round_length", f"{path}.number_format.round_length", 0
            ),
        ),
    )


def _parse_device(reader: _Reader, entry: Any, index: int, *, is_cuda: bool) -> MockDeviceSpec:
    path = f"devices[{index}]"
    if not isinstance(entry, Mapping):
        raise reader.fail(path, "a table", entry)
    mother_uuid = reader.string(entry, "mother_uuid", f"{path}.mother_uuid")
    if not mother_uuid.strip() or "," in mother_uuid:
        raise reader.fail(f"{path}.mother_uuid", "a non-empty id without commas", mother_uuid)
    model_name = reader.string(entry, "model_name", f"{path}.model_name")
    numa_node = reader.integer(entry, "numa_node", f"{path}.numa_node", 0)
    subproc_count = reader.integer(entry, "subproc_count", f"{path}.subproc_count", 1)
    memory_bytes = reader.size(entry, "memory_size", f"{path}.memory_size")
    is_mig = False
    if is_cuda:
        is_mig = reader.boolean(entry, "is_mig_device", f"{path}.is_mig_device")
    elif "is_mig_device" in entry:
        value = entry["is_mig_device"]
        if value is not False:
            raise reader.fail(
                f"{path}.is_mig_device",
                "false (MIG slices exist only with slot_name = 'cuda')",
                value,
            )
    device_id = mother_uuid
    if is_mig:
        expected = "'MIG-<profile>' such as 'MIG-10g' or 'MIG-1g.5gb' for a MIG slice"
        if "-" not in model_name or not mig_profile(model_name):
            raise reader.fail(f"{path}.model_name", expected, model_name)
        try:
            SlotName(f"cuda.device:{mig_profile(model_name)}-mig")
        except InvalidSlotName:
            raise reader.fail(f"{path}.model_name", expected, model_name) from None
        device_id = f"MIG-{mother_uuid}/{index}/0"
    return MockDeviceSpec(
        index=index,
        device_id=device_id,
        mother_uuid=mother_uuid,
        model_name=model_name,
        numa_node=numa_node,
        subproc_count=subproc_count,
        memory_bytes=memory_bytes,
        is_mig=is_mig,
    )


def _check_identities(reader: _Reader, devices: list[MockDeviceSpec]) -> None:
    seen: dict[str, int] = {}
    for device in devices:
        if device.device_id in seen:
            raise reader.fail(
                f"devices[{device.index}].mother_uuid",
                f"a device id not used before (devices[{seen[device.device_id]}] "
                f"already has {device.device_id!r})",
                device.mother_uuid,
            )
        seen[device.device_id] = device.index
    whole = {d.mother_uuid: d.index for d in devices if not d.is_mig}
    for device in devices:
        if device.is_mig and device.mother_uuid in whole:
            raise reader.fail(
                f"devices[{device.index}].mother_uuid",
                f"the id of a GPU split into MIG slices, not of a full device "
                f"(devices[{whole[device.mother_uuid]}] is that GPU unsplit)",
                device.mother_uuid,
            )


def _parse_stats_options(
    reader: _Reader, data: Mapping[str, Any]
) -> tuple[str, Decimal, int | None]:
    smoothing = "none"
    if "stats_smoothing" in data:
        smoothing = reader.string(data, "stats_smoothing", "stats_smoothing")
        if smoothing not in SMOOTHING_KINDS:
            raise reader.fail(
                "stats_smoothing", " or ".join(repr(k) for k in SMOOTHING_KINDS), smoothing
            )
    factor = Decimal("0.3")
    if "stats_smoothing_factor" in data:
        raw = data["stats_smoothing_factor"]
        expected = "a number > 0 and <= 1"
        if isinstance(raw, bool) or not isinstance(raw, int | float) or not 0 < raw <= 1:
            raise reader.fail("stats_smoothing_factor", expected, raw)
        factor = Decimal(str(raw))
    seed = None
    if "stats_seed" in data:
        seed = reader.integer(data, "stats_seed", "stats_seed", 0)
    return smoothing, factor, seed


def parse_mock_config(data: Mapping[str, Any], *, source: str) -> MockConfig:
    """Validate a parsed ``mock-accelerator.toml`` (pure)."""
    reader = _Reader(source)
    slot_name = reader.string(data, "slot_name", "slot_name")
    if not _KEY_PATTERN.match(slot_name) or slot_name in _INTRINSIC_KEYS:
        raise reader.fail(
            "slot_name",
            "a device key such as 'cuda', 'rocm' or 'tpu' (lower case; not 'cpu' or 'mem')",
            slot_name,
        )
    device_plugin_name = reader.string(data, "device_plugin_name", "device_plugin_name")
    if device_plugin_name not in DEVICE_PLUGIN_NAMES:
        raise reader.fail(
            "device_plugin_name",
            " or ".join(repr(n) for n in DEVICE_PLUGIN_NAMES),
            device_plugin_name,
        )
    attributes = dict(reader.table(data, "attributes", "attributes"))
    formats: dict[str, SlotMetadata] = {}
    if "formats" in data:
        raw_formats = reader.table(data, "formats", "formats")
        for subtype, table in raw_formats.items():
            formats[subtype] = _parse_format(reader, table, f"formats.{subtype}")
    raw_devices = reader.get(data, "devices", "devices", "an array of device tables")
    if not isinstance(raw_devices, list):
        raise reader.fail("devices", "an array of device tables ([[devices]])", raw_devices)
    if not raw_devices:
        # A mock plugin without devices would load with 0 capacity: refuse, the operator
        # meant something else (to drop the plugin, leave it out of
        # allowed-compute-plugins; to hide devices, use device_mask).
        raise reader.fail(
            "devices", "at least one [[devices]] table (a mock plugin needs devices)", raw_devices
        )
    is_cuda = slot_name == "cuda"
    devices = [
        _parse_device(reader, entry, index, is_cuda=is_cuda)
        for index, entry in enumerate(raw_devices)
    ]
    _check_identities(reader, devices)
    smoothing, factor, seed = _parse_stats_options(reader, data)
    known = {"slot_name", "device_plugin_name", "attributes", "formats", "devices"}
    known |= {"stats_smoothing", "stats_smoothing_factor", "stats_seed"}
    return MockConfig(
        source=source,
        slot_name=slot_name,
        device_plugin_name=device_plugin_name,
        attributes=attributes,
        formats=formats,
        devices=tuple(devices),
        stats_smoothing=smoothing,
        stats_smoothing_factor=factor,
        stats_seed=seed,
        extra={k: v for k, v in data.items() if k not in known},
    )


def load_mock_config(path: Path) -> MockConfig:
    """Read and validate ``path``; a missing file is :class:`PluginUnavailable`."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PluginUnavailable(
            f"mock: no mock accelerator configuration at {path} (place mock-accelerator.toml "
            "next to agent.toml or set [agent] mock-accelerator-config)"
        ) from None
    except OSError as e:
        raise PluginConfigError(str(path), "(file)", "a readable file", str(e)) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise PluginConfigError(str(path), "(file)", "valid TOML", str(e)) from None
    return parse_mock_config(data, source=str(path))
