"""The agent's own small files on disk (besides what the runtimes write).

::

    <scratch-root>/.accelshare-agent/lock          flock: one agent per scratch root
    <scratch-root>/.accelshare-agent/devices.json  every (slot, device) -> capacity seen,
                                                   to judge renamed slots after a restart
    <scratch-root>/.accelshare-agent/events.json   kernel events not yet delivered when the
                                                   agent stopped cleanly (read and removed
                                                   by the next agent)
    <scratch-root>/<kernel_id>/state/agent.json    session id, image, owner, labels,
                                                   created_at, app ports of the kernel
                                                   (:attr:`KernelSpec.agent_meta`)

The kernel's meta file is written by the runtime as it prepares the kernel's scratch dir
(:attr:`~accelshare.agent.runtime.base.KernelSpec.agent_meta`): the docker runtime writes
``state/agent.json``, the process runtime keeps it as ``agent`` in ``state/launch.json``
(one file less per start); :func:`read_kernel_meta` reads either.

The folder name starts with a dot, which no kernel id may (so runtimes never take it for a
kernel).  Everything is written atomically; unreadable files read as empty.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from accelshare.alloc import AbstractAllocMap
from accelshare.common import canonical_decimal
from accelshare.protocol import KernelEvent

from .events import EventOutbox
from .scratch import atomic_write_text, read_json

__all__ = [
    "AGENT_DIR",
    "AgentLock",
    "AgentLockError",
    "load_pending_events",
    "read_device_history",
    "read_kernel_meta",
    "save_pending_events",
    "write_device_history",
]

log = logging.getLogger(__name__)

AGENT_DIR = ".accelshare-agent"
KERNEL_META = "agent.json"


class AgentLockError(RuntimeError):
    pass


class AgentLock:
    """An exclusive ``flock`` on the scratch root (released by the OS if the agent dies)."""

    def __init__(self, scratch_root: Path) -> None:
        self.path = Path(scratch_root).absolute() / AGENT_DIR / "lock"
        self._fd: int | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = ""
            with contextlib.suppress(OSError):
                holder = os.pread(fd, 64, 0).decode(errors="replace").strip()
            os.close(fd)
            raise AgentLockError(
                f"another agent (pid {holder or '?'}) already uses the scratch root "
                f"{self.path.parent.parent}"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def _history_path(scratch_root: Path) -> Path:
    return Path(scratch_root).absolute() / AGENT_DIR / "devices.json"


def read_device_history(scratch_root: Path) -> dict[str, dict[str, Decimal]]:
    """slot -> device -> the last capacity seen (empty when there is no history)."""
    data = read_json(_history_path(scratch_root)) or {}
    slots = data.get("slots")
    history: dict[str, dict[str, Decimal]] = {}
    if not isinstance(slots, dict):
        return history
    for slot, per_device in slots.items():
        if not isinstance(per_device, dict):
            continue
        for device, text in per_device.items():
            with contextlib.suppress(InvalidOperation, TypeError, ValueError):
                history.setdefault(str(slot), {})[str(device)] = Decimal(str(text))
    return history


def write_device_history(
    scratch_root: Path,
    maps: Mapping[str, AbstractAllocMap],
    previous: Mapping[str, Mapping[str, Decimal]],
) -> None:
    """Merge the current maps' (slot, device, capacity) into the history and save it."""
    merged: dict[str, dict[str, str]] = {
        slot: {d: canonical_decimal(a) for d, a in per.items()} for slot, per in previous.items()
    }
    for alloc_map in maps.values():
        for device, info in alloc_map.device_slots.items():
            merged.setdefault(info.slot_name, {})[device] = canonical_decimal(info.amount)
    path = _history_path(scratch_root)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps({"slots": merged}, indent=1, sort_keys=True) + "\n")


def read_kernel_meta(scratch_dir: Path | None) -> dict[str, Any]:
    """The agent's record of the kernel: ``state/agent.json``, else the ``agent`` object of
    ``state/launch.json`` (the process runtime's); {} when neither has one."""
    if scratch_dir is None:
        return {}
    state = scratch_dir / "state"
    meta = read_json(state / KERNEL_META)
    if meta is None:
        embedded = (read_json(state / "launch.json") or {}).get("agent")
        meta = embedded if isinstance(embedded, dict) else None
    return meta or {}


def _events_path(scratch_root: Path) -> Path:
    return Path(scratch_root).absolute() / AGENT_DIR / "events.json"


def save_pending_events(scratch_root: Path, outbox: EventOutbox) -> None:
    events = [json.loads(e.model_dump_json()) for e in outbox.peek(len(outbox))]
    path = _events_path(scratch_root)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps({"events": events}) + "\n")


def load_pending_events(scratch_root: Path) -> list[KernelEvent]:
    """The events a previous agent could not deliver; the file is removed once read."""
    path = _events_path(scratch_root)
    data = read_json(path)
    if data is None and path.exists():
        log.warning("%s: unreadable or not a JSON object; its events are dropped", path)
    path.unlink(missing_ok=True)
    items = (data or {}).get("events") or []
    if not isinstance(items, list):  # a damaged file must not stop the agent's start
        log.warning("%s: 'events' is not a list (%s); dropped", path, type(items).__name__)
        return []
    events = []
    for index, item in enumerate(items):
        try:
            events.append(KernelEvent.model_validate(item))
        except (ValidationError, TypeError) as e:
            log.warning("%s: events[%d] dropped: %s", path, index, str(e).splitlines()[0])
    return events
