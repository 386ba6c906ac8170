"""Known slot types: the union of every slot any agent ever reported (spec 01).

Stored in the config store as ``config/resource_slots/<slot> = <type>`` (never
removed), plus the intrinsic ``cpu: count`` and ``mem: bytes``.  The set is read once
per API request / scheduling pass and held in :data:`KNOWN_SLOT_TYPES` (a
``ContextVar``) so it stays consistent for that whole request even if a heartbeat
adds a slot meanwhile::

    async with known_slots.hold() as types:   # read once (or the set already held)
        ... current_known_slots() ...         # the same mapping everywhere below

    types = await known_slots.load()          # or, for a pass: read, then hold
    with use_known_slots(types):
        ...

Whoever parses resources holds the set: the session routes and the scheduling pass
hold it for the whole request / round, and :meth:`SessionService.create
<accelshare.manager.sessions.SessionService.create>` holds one itself when its caller
did not, so an enqueue never parses against a set read mid-way (nor against the
intrinsic slots alone).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from contextvars import ContextVar
from types import MappingProxyType

from accelshare.common import INTRINSIC_SLOTS, SlotTypes
from accelshare.config import ConfigStore

__all__ = [
    "KNOWN_SLOT_TYPES",
    "RESOURCE_SLOTS_PREFIX",
    "KnownSlots",
    "current_known_slots",
    "held_known_slots",
    "use_known_slots",
]

log = logging.getLogger(__name__)

RESOURCE_SLOTS_PREFIX = "config/resource_slots"

KNOWN_SLOT_TYPES: ContextVar[Mapping[str, SlotTypes]] = ContextVar("accelshare_known_slot_types")

_INTRINSIC: Mapping[str, SlotTypes] = MappingProxyType(dict(INTRINSIC_SLOTS))


def current_known_slots() -> Mapping[str, SlotTypes]:
    """The set held for this request / pass (only the intrinsic slots when none is held)."""
    return KNOWN_SLOT_TYPES.get(_INTRINSIC)


def held_known_slots() -> Mapping[str, SlotTypes] | None:
    """The set held for this request / pass, or ``None`` when none is held."""
    return KNOWN_SLOT_TYPES.get(None)


@contextmanager
def use_known_slots(types: Mapping[str, SlotTypes]) -> Iterator[Mapping[str, SlotTypes]]:
    token = KNOWN_SLOT_TYPES.set(types)
    try:
        yield types
    finally:
        KNOWN_SLOT_TYPES.reset(token)


class KnownSlots:
    """Reads and grows the known set in the config store (shared by every manager)."""

    def __init__(self, store: ConfigStore) -> None:
        self.store = store
        self._stored: dict[str, SlotTypes] = {}  # what this process knows is in the store
        self._lock = asyncio.Lock()

    @asynccontextmanager
    async def hold(self) -> AsyncIterator[Mapping[str, SlotTypes]]:
        """Hold the set for the block: the one already held by an enclosing request or
        pass (read once per request), else a fresh :meth:`load`, released on exit."""
        held = held_known_slots()
        if held is not None:
            yield held
            return
        with use_known_slots(await self.load()) as types:
            yield types

    async def load(self) -> Mapping[str, SlotTypes]:
        """A fresh, immutable copy: intrinsic slots first, then the stored ones."""
        tree = await self.store.get_prefix(RESOURCE_SLOTS_PREFIX)
        types: dict[str, SlotTypes] = dict(_INTRINSIC)
        for slot, value in tree.items():
            raw = value.get("", "") if isinstance(value, dict) else value
            try:
                types.setdefault(slot, SlotTypes(str(raw)))
            except ValueError:
                log.warning(
                    "config store: %s/%s = %r is not a slot type (expected one of %s); ignored",
                    RESOURCE_SLOTS_PREFIX,
                    slot,
                    raw,
                    ", ".join(SlotTypes),
                )
        self._stored.update({k: v for k, v in types.items() if k not in _INTRINSIC})
        return MappingProxyType(types)

    async def add(self, reported: Mapping[str, SlotTypes]) -> list[str]:
        """Record slots not known yet (a heartbeat's); returns the newly added names.

        Existing entries are never changed or removed (an agent that stops reporting a
        slot does not make it unknown: sessions may still hold it).
        """
        new = {
            slot: SlotTypes(t)
            for slot, t in reported.items()
            if slot not in _INTRINSIC and slot not in self._stored
        }
        if not new:
            return []
        async with self._lock:
            current = await self.load()
            missing = {slot: t for slot, t in new.items() if slot not in current}
            if missing:
                await self.store.put_prefix(
                    RESOURCE_SLOTS_PREFIX, {slot: t.value for slot, t in missing.items()}
                )
                self._stored.update(missing)
                log.info("new slot types: %s", ", ".join(f"{s}={t}" for s, t in missing.items()))
            return sorted(missing)
