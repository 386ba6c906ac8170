"""``resource.txt``: the per-kernel record of what a kernel asked for and what it holds.

Pure (no I/O): :func:`render_resource_txt` turns a :class:`ResourceTxt` into text and
:func:`parse_resource_txt` reads it back; the scratch-dir module writes the file.
After an agent restart these files are the source of truth for every allocation map.

The format (spec 04), one ``KEY=VALUE`` per line, in this order::

    SCRATCH_SIZE=0m
    MOUNTS=/data/a:/home/work/a:ro,/data/b:/home/work/b:rw
    SLOTS={"cpu":"2","mem":"2147483648","cuda.shares":"1.2"}
    UNIFIED_DEVICES=[]
    CPU_SHARES=0:1,1:1
    MEM_SHARES=root:2g
    CUDA.SHARES_SHARES=c59395cd-ac91-4cd3-a1b0-3d2568aa2d01:0.6,c59395cd-ac91-4cd3-a1b0-3d2568aa2d02:0.6
    CUDA_GLOBAL_DEVICE_IDS=0:c59395cd-ac91-4cd3-a1b0-3d2568aa2d01,1:c59395cd-ac91-4cd3-a1b0-3d2568aa2d02
    CID=4242

* ``<SLOT UPPER>_SHARES`` lines: one per allocated slot, ``<device>:<amount>`` pairs;
  amounts of ``bytes`` slots in short binary form (``2g``), others as plain decimals.
* Lines after the ``_SHARES`` lines are the plugins' extra lines, kept in order.
* ``CID=`` is added once the kernel has started (:func:`with_container_id`), exactly once.

Reading rules (documented so that garbage never crashes the agent):

* Blank lines, lines without ``=`` and lines starting with ``#`` are skipped.
* ``KEY`` and ``VALUE`` are stripped of surrounding whitespace.
* A ``_SHARES`` key names the slot (lower-cased, suffix removed; matched
  case-insensitively against the known slot names so ``cuda.device:1G-mig`` survives).
* Amounts of ``bytes`` slots parse as binary sizes; ``count``/``unique``/``unified``
  slots as decimals; a slot the reader does not know (the plugin set changed) is read
  as a decimal, else as a binary size, so its recorded allocation is kept.
* A malformed value of a known key (``SLOTS``, ``MOUNTS``, ``*_SHARES``...), a
  negative/non-finite amount or a duplicated key raises :class:`ResourceTxtError` naming
  the file and the line.  A repeated ``CID`` line (files written by Backend.AI may have
  one) is not an error: the last one wins.
* Any other key is a plugin extra line and is kept verbatim.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation

from accelshare.common import (
    Allocation,
    BinarySize,
    CommonValueError,
    InvalidSlotName,
    ResourceSlot,
    SlotName,
    SlotTypes,
    canonical_decimal,
)

__all__ = [
    "RESERVED_KEYS",
    "SHARES_SUFFIX",
    "MountEntry",
    "ResourceTxt",
    "ResourceTxtError",
    "parse_resource_txt",
    "render_resource_txt",
    "with_container_id",
]

SHARES_SUFFIX = "_SHARES"
RESERVED_KEYS = frozenset({"SCRATCH_SIZE", "MOUNTS", "SLOTS", "UNIFIED_DEVICES", "CID"})
_MIB = 1024 * 1024
_FORBIDDEN_IN_VALUE = ("\n", "\r")


class ResourceTxtError(ValueError):
    """A ``resource.txt`` line that cannot be read; names the file, line number and line."""

    def __init__(self, source: str, line_no: int, line: str, reason: str) -> None:
        shown = line if len(line) <= 200 else line[:200] + "..."
        super().__init__(f"{source}, line {line_no}: {reason} (line: {shown!r})")
        self.source = source
        self.line_no = line_no
        self.line = line
        self.reason = reason


@dataclass(frozen=True, slots=True)
class MountEntry:
    """One ``MOUNTS`` item: ``source:target:perm`` (perm is ``ro`` or ``rw``)."""

    source: str
    target: str
    perm: str = "ro"


@dataclass(frozen=True, slots=True)
class ResourceTxt:
    """The content of one kernel's ``resource.txt``.

    ``allocations`` is ``{slot: {device_id: amount}}`` as the allocation maps return it;
    ``extra_lines`` are the plugins' ``(KEY, VALUE)`` lines in order; ``container_id``
    is the ``CID`` (container id or process id), None before the kernel has started.
    """

    slots: ResourceSlot = field(default_factory=ResourceSlot)
    allocations: Allocation = field(default_factory=dict)
    scratch_size_bytes: int = 0
    mounts: tuple[MountEntry, ...] = ()
    unified_devices: tuple[tuple[str, str], ...] = ()
    extra_lines: tuple[tuple[str, str], ...] = ()
    container_id: str | None = None

    def allocations_by_plugin(self) -> dict[str, dict[str, dict[str, Decimal]]]:
        """``{plugin key: {slot: {device: amount}}}`` (the plugin key is the part before ``.``).

        ``CUDA.SHARES_SHARES=...`` and ``CUDA.DEVICE_SHARES=...`` both land under ``cuda``.
        """
        grouped: dict[str, dict[str, dict[str, Decimal]]] = {}
        for slot, per_device in self.allocations.items():
            plugin_key = slot.split(".", 1)[0]
            grouped.setdefault(plugin_key, {})[slot] = dict(per_device)
        return grouped

    def extra(self, key: str) -> str | None:
        """The value of the last extra line named ``key``, None if absent."""
        found = None
        for extra_key, value in self.extra_lines:
            if extra_key == key:
                found = value
        return found


# -- writing ------------------------------------------------------------------------------


def _slot_type_of(slot: str, slot_types: Mapping[str, SlotTypes | str]) -> SlotTypes:
    if slot in slot_types:
        return SlotTypes(slot_types[slot])
    return SlotTypes.BYTES if "mem" in slot else SlotTypes.COUNT


def _check_text(what: str, text: str, forbidden: tuple[str, ...] = ()) -> None:
    for bad in (*_FORBIDDEN_IN_VALUE, *forbidden):
        if bad in text:
            raise ValueError(f"resource.txt: {what} {text!r} must not contain {bad!r}")


def _format_amount(slot: str, amount: Decimal, slot_type: SlotTypes) -> str:
    if not amount.is_finite() or amount < 0:
        raise ValueError(f"resource.txt: amount of {slot!r} must be finite and >= 0: {amount}")
    if slot_type is SlotTypes.BYTES:
        if amount != amount.to_integral_value():
            raise ValueError(f"resource.txt: {slot!r} is a bytes slot, got {amount}")
        return format(BinarySize(int(amount)), "s")
    return canonical_decimal(amount)


def _shares_line(
    slot: str, per_device: Mapping[str, Decimal], slot_types: Mapping[str, SlotTypes | str]
) -> str:
    SlotName(slot)  # raises InvalidSlotName for a slot that could not be read back
    slot_type = _slot_type_of(slot, slot_types)
    pieces = []
    for device_id, amount in per_device.items():
        if not device_id:
            raise ValueError(f"resource.txt: empty device id in slot {slot!r}")
        _check_text("device id", device_id, (",",))
        pieces.append(f"{device_id}:{_format_amount(slot, Decimal(amount), slot_type)}")
    return f"{slot.upper()}{SHARES_SUFFIX}={','.join(pieces)}"


def render_resource_txt(content: ResourceTxt, slot_types: Mapping[str, SlotTypes | str]) -> str:
    """The file text for ``content`` (ends with a newline).

    ``slot_types`` decides how amounts are written (bytes slots in short binary form);
    slots missing from it are guessed like :meth:`ResourceSlot.from_user_input` does.
    Slots with no device are not written.  Raises ``ValueError`` for content that could
    not be read back unchanged (a ``,`` in a device id, a newline in a value, an extra
    line using a reserved key...).
    """
    if content.scratch_size_bytes < 0:
        raise ValueError("resource.txt: scratch size cannot be negative")
    mounts = []
    for mount in content.mounts:
        _check_text("mount source", mount.source, (",",))
        _check_text("mount target", mount.target, (",", ":"))
        _check_text("mount perm", mount.perm, (",", ":"))
        mounts.append(f"{mount.source}:{mount.target}:{mount.perm}")
    lines = [
        f"SCRATCH_SIZE={BinarySize(content.scratch_size_bytes):m}",
        f"MOUNTS={','.join(mounts)}",
        "SLOTS=" + json.dumps(content.slots.to_json(), separators=(",", ":")),
        "UNIFIED_DEVICES="
        + json.dumps([list(pair) for pair in content.unified_devices], separators=(",", ":")),
    ]
    for slot, per_device in content.allocations.items():
        if per_device:
            lines.append(_shares_line(slot, per_device, slot_types))
    for key, value in content.extra_lines:
        if not key or key != key.strip() or "=" in key or key.startswith("#"):
            raise ValueError(f"resource.txt: invalid extra key {key!r}")
        if key in RESERVED_KEYS or key.endswith(SHARES_SUFFIX):
            raise ValueError(f"resource.txt: extra key {key!r} is reserved")
        _check_text("extra line", key + value)
        if value != value.strip():
            raise ValueError(f"resource.txt: extra value {value!r} has surrounding spaces")
        lines.append(f"{key}={value}")
    text = "\n".join(lines) + "\n"
    if content.container_id is not None:
        text = with_container_id(text, content.container_id)
    return text


def with_container_id(text: str, container_id: str) -> str:
    """``text`` with exactly one ``CID=<container_id>`` line.

    Idempotent: an existing identical line leaves the text unchanged (so a restarted
    agent never duplicates it); a different existing ``CID`` line is replaced in place
    (and any further ``CID`` lines dropped); otherwise the line is appended.
    """
    container_id = container_id.strip()
    if not container_id:
        raise ValueError("resource.txt: empty container id")
    _check_text("container id", container_id)
    new_line = f"CID={container_id}"
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    cid_indexes = [i for i, line in enumerate(lines) if _key_of(line) == "CID"]
    if not cid_indexes:
        lines.append(new_line)
    else:
        if len(cid_indexes) == 1 and lines[cid_indexes[0]].strip() == new_line:
            return text if text.endswith("\n") else text + "\n"
        lines[cid_indexes[0]] = new_line
        for index in reversed(cid_indexes[1:]):
            del lines[index]
    return "\n".join(lines) + "\n"


def _key_of(line: str) -> str | None:
    stripped = line.strip()
    if not stripped or stripped.startswith("#") or "=" not in stripped:
        return None
    return stripped.split("=", 1)[0].strip()


# -- reading ------------------------------------------------------------------------------


class _Reader:
    """Parses one file; keeps the source name and line for error messages."""

    def __init__(self, source: str, slot_types: Mapping[str, SlotTypes | str]) -> None:
        self.source = source
        self.slot_types = slot_types
        self._lower_slots = {str(slot).lower(): str(slot) for slot in slot_types}
        self.line_no = 0
        self.line = ""

    def fail(self, reason: str) -> ResourceTxtError:
        return ResourceTxtError(self.source, self.line_no, self.line, reason)

    def scratch_size(self, value: str) -> int:
        try:
            size = BinarySize.finite_from_str(value)
        except CommonValueError as e:
            raise self.fail(f"SCRATCH_SIZE is not a size such as '0m' ({e})") from None
        if size < 0:
            raise self.fail("SCRATCH_SIZE cannot be negative")
        return int(size)

    def mounts(self, value: str) -> tuple[MountEntry, ...]:
        if not value:
            return ()
        entries = []
        for item in value.split(","):
            parts = item.rsplit(":", 2)
            if len(parts) != 3 or not all(parts):
                raise self.fail(f"MOUNTS item {item!r} is not 'source:target:perm'")
            entries.append(MountEntry(parts[0], parts[1], parts[2]))
        return tuple(entries)

    def slots(self, value: str) -> ResourceSlot:
        if not value:
            return ResourceSlot()
        try:
            data = json.loads(value)
        except (ValueError, RecursionError) as e:
            raise self.fail(f"SLOTS is not valid JSON ({e})") from None
        if not isinstance(data, dict):
            raise self.fail("SLOTS must be a JSON object of slot -> amount string")
        try:
            slots = ResourceSlot.from_json(data)
        except CommonValueError as e:
            raise self.fail(f"SLOTS has an invalid amount ({e})") from None
        if any(not amount.is_finite() or amount < 0 for amount in slots.values()):
            raise self.fail("SLOTS amounts must be finite and >= 0")
        return slots

    def unified_devices(self, value: str) -> tuple[tuple[str, str], ...]:
        if not value:
            return ()
        try:
            data = json.loads(value)
        except (ValueError, RecursionError) as e:
            raise self.fail(f"UNIFIED_DEVICES is not valid JSON ({e})") from None
        if not isinstance(data, list) or not all(
            isinstance(pair, list) and len(pair) == 2 and all(isinstance(x, str) for x in pair)
            for pair in data
        ):
            raise self.fail("UNIFIED_DEVICES must be a JSON list of [device_name, slot_name]")
        return tuple((pair[0], pair[1]) for pair in data)

    def slot_name(self, key: str) -> str:
        lowered = key[: -len(SHARES_SUFFIX)].lower()
        slot = self._lower_slots.get(lowered, lowered)
        try:
            SlotName(slot)
        except InvalidSlotName:
            raise self.fail(f"{key} does not name a slot") from None
        return slot

    def amount(self, slot: str, text: str) -> Decimal:
        slot_type = self.slot_types.get(slot)
        number: Decimal | None = None
        if slot_type is None or SlotTypes(slot_type) is not SlotTypes.BYTES:
            try:
                number = Decimal(text)
            except (InvalidOperation, ValueError):
                number = None
        if number is None and (slot_type is None or SlotTypes(slot_type) is SlotTypes.BYTES):
            try:
                number = Decimal(int(BinarySize.finite_from_str(text)))
            except CommonValueError:
                number = None
        if number is None:
            kind = "a binary size such as '2g'" if slot_type == SlotTypes.BYTES else "a decimal"
            raise self.fail(f"amount {text!r} of slot {slot!r} is not {kind}")
        if not number.is_finite() or number < 0:
            raise self.fail(f"amount {text!r} of slot {slot!r} must be finite and >= 0")
        return number

    def shares(self, slot: str, value: str) -> dict[str, Decimal]:
        per_device: dict[str, Decimal] = {}
        if not value:
            return per_device
        for item in value.split(","):
            device_id, sep, amount = item.rpartition(":")
            device_id = device_id.strip()
            if not sep or not device_id:
                raise self.fail(f"allocation item {item!r} is not '<device>:<amount>'")
            if device_id in per_device:
                raise self.fail(f"device {device_id!r} appears twice in slot {slot!r}")
            per_device[device_id] = self.amount(slot, amount.strip())
        return per_device


def parse_resource_txt(
    text: str,
    slot_types: Mapping[str, SlotTypes | str],
    *,
    source: str = "resource.txt",
) -> ResourceTxt:
    """Read a ``resource.txt`` back (see the module docstring for the rules).

    ``slot_types`` are the agent's known slot types (``{slot: type}``) and decide how
    amounts are parsed; ``source`` names the file in error messages.  Raises only
    :class:`ResourceTxtError`.
    """
    reader = _Reader(source, slot_types)
    seen: set[str] = set()
    scratch_size_bytes = 0
    mounts: tuple[MountEntry, ...] = ()
    slots = ResourceSlot()
    unified: tuple[tuple[str, str], ...] = ()
    allocations: Allocation = {}
    allocated_slots: set[str] = set()
    extra: list[tuple[str, str]] = []
    container_id: str | None = None
    for reader.line_no, raw_line in enumerate(text.split("\n"), start=1):
        reader.line = raw_line.rstrip("\r")
        stripped = reader.line.strip()
        if not stripped or stripped.startswith("#") or "=" not in stripped:
            continue
        key, value = (part.strip() for part in stripped.split("=", 1))
        if key == "CID":
            container_id = value or None
            continue
        if key in seen and (key in RESERVED_KEYS or key.endswith(SHARES_SUFFIX)):
            raise reader.fail(f"duplicate key {key}")
        seen.add(key)
        if key == "SCRATCH_SIZE":
            scratch_size_bytes = reader.scratch_size(value)
        elif key == "MOUNTS":
            mounts = reader.mounts(value)
        elif key == "SLOTS":
            slots = reader.slots(value)
        elif key == "UNIFIED_DEVICES":
            unified = reader.unified_devices(value)
        elif key.endswith(SHARES_SUFFIX) and len(key) > len(SHARES_SUFFIX):
            slot = reader.slot_name(key)
            if slot in allocated_slots:
                raise reader.fail(f"slot {slot!r} is allocated on two lines")
            allocated_slots.add(slot)
            per_device = reader.shares(slot, value)
            if per_device:
                allocations[slot] = per_device
        elif key:
            extra.append((key, value))
    return ResourceTxt(
        slots=slots,
        allocations=allocations,
        scratch_size_bytes=scratch_size_bytes,
        mounts=mounts,
        unified_devices=unified,
        extra_lines=tuple(extra),
        container_id=container_id,
    )
