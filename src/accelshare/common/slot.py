"""Slot names and slot types.

A slot name is ``<device>[.<major>[:<minor>]]``::

    SlotName("cuda.device:10g-mig").device_name == "cuda"
    SlotName("cuda.device:10g-mig").major_type == "device"
    SlotName("cuda.device:10g-mig").minor_type == "10g-mig"

``SlotName`` is a ``str`` subclass, so it can be used anywhere a plain string slot
name is expected (dict keys, JSON) and compares equal to the plain string.
"""

from __future__ import annotations

import enum
import re

from .errors import InvalidSlotName

__all__ = ["ACCELERATOR_MAJOR_TYPES", "INTRINSIC_SLOTS", "SlotName", "SlotTypes"]

ACCELERATOR_MAJOR_TYPES = frozenset({"device", "devices", "share", "shares"})

_SLOT_NAME = re.compile(
    r"^(?P<device>[a-z][a-z0-9_-]*)"
    r"(?:\.(?P<major>[a-z][a-z0-9_-]*)(?::(?P<minor>[A-Za-z0-9][A-Za-z0-9._-]*))?)?$"
)


class SlotTypes(enum.StrEnum):
    """How a slot's amounts are counted."""

    COUNT = "count"  # a number (cores, fractional shares, whole devices)
    BYTES = "bytes"  # memory; user input is parsed as a binary size
    UNIQUE = "unique"  # a device that can only be taken whole: the amount is exactly 1
    UNIFIED = "unified"  # unified memory/devices, counted like COUNT


class SlotName(str):
    """A parsed slot name.  Invalid names raise :class:`InvalidSlotName`."""

    __slots__ = ("device_name", "major_type", "minor_type")

    device_name: str
    major_type: str
    minor_type: str

    def __new__(cls, value: str) -> SlotName:
        if isinstance(value, SlotName):
            return value
        if not isinstance(value, str):
            raise InvalidSlotName(value)
        match = _SLOT_NAME.match(value)
        if match is None:
            raise InvalidSlotName(value)
        self = super().__new__(cls, value)
        self.device_name = match["device"]
        self.major_type = match["major"] or ""
        self.minor_type = match["minor"] or ""
        return self

    @property
    def is_accelerator(self) -> bool:
        """True for ``<dev>.device``, ``<dev>.shares`` and friends (not cpu/mem)."""
        return self.major_type in ACCELERATOR_MAJOR_TYPES

    def __repr__(self) -> str:
        return f"SlotName({str(self)!r})"


INTRINSIC_SLOTS: dict[str, SlotTypes] = {"cpu": SlotTypes.COUNT, "mem": SlotTypes.BYTES}
