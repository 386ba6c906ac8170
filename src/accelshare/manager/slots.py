"""Known slot types: the union of every slot any agent ever reported (spec 01).

Stored in the config store as ``config/resource_slots/<slot> = <type>`` (never
removed), plus the intrinsic ``cpu: count`` and ``mem: bytes``.  Whoever parses
resources reads the set once (:meth:`KnownSlots.load`) and passes it down as an
argument, so that it stays the same for a whole request or scheduling round even if a
heartbeat adds a slot meanwhile::

    known = await known_slots.load()          # once per request / round
    resolve_resources(raw, known=known, ...)  # every parser below gets it explicitly

The scheduling round (:meth:`Scheduler.run_once
<accelshare.manager.scheduler.loop.Scheduler.run_once>`) reads it once for all its
scaling groups; the admin service reads one per call.  :meth:`SessionService.create
<accelshare.manager.services.sessions.SessionService.create>` takes the caller's set or
:meth:`KnownSlots.cached`'s: the set only grows, so the one this process last read
(or grew itself) serves every request whose slots it names; a request naming a slot
outside it reads the store again, once, so a slot another manager added is accepted
without a restart, and a slot still unknown after that read is refused.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from types import MappingProxyType

from accelshare.common import INTRINSIC_SLOTS, SlotTypes
from accelshare.config import ConfigStore

__all__ = ["RESOURCE_SLOTS_PREFIX", "KnownSlots"]

log = logging.getLogger(__name__)

RESOURCE_SLOTS_PREFIX = "config/resource_slots"

_INTRINSIC: Mapping[str, SlotTypes] = MappingProxyType(dict(INTRINSIC_SLOTS))


class KnownSlots:
    """Reads and grows the known set in the config store (shared by every manager)."""

    def __init__(self, store: ConfigStore) -> None:
        self.store = store
        self._stored: dict[str, SlotTypes] = {}  # what this process knows is in the store
        self._lock = asyncio.Lock()
        # the last set read or grown by this process (replaced, never changed: callers
        # keep the snapshot they got)
        self._snapshot: Mapping[str, SlotTypes] | None = None

    async def cached(self, wanted: Iterable[str] = ()) -> Mapping[str, SlotTypes]:
        """The set this process last read or grew; :meth:`load` when it has read none
        yet or when it lacks a slot of ``wanted`` (a request's slots)."""
        snapshot = self._snapshot
        if snapshot is None or any(slot not in snapshot for slot in wanted):
            return await self.load()
        return snapshot

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
        snapshot = MappingProxyType(types)
        self._snapshot = snapshot
        return snapshot

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
                self._snapshot = MappingProxyType({**current, **missing})
                log.info("new slot types: %s", ", ".join(f"{s}={t}" for s, t in missing.items()))
            return sorted(missing)
