"""The manager's status: ``running``, or ``frozen`` for maintenance (Backend.AI's
``admin manager status / freeze / unfreeze``, ``GET/PUT /manager/status``).

Frozen:

* the scheduler places nothing: PENDING sessions stay PENDING, their ``status_info``
  says :data:`FROZEN_REASON`; sessions already placed keep running and can be used and
  destroyed;
* new sessions are refused with a 503 ``server-frozen`` problem, as Backend.AI refuses
  them (nothing is queued behind the maintenance);
* so are GraphQL mutations and the REST routes that change what the manager records
  (folders, users, keypairs, policies, scaling groups, images, a session's name): the
  API checks :meth:`Maintenance.refuse_if_frozen` first (``accelshare.api.deps.UNFROZEN``
  and the GraphQL route; the list is in docs/manager.md);
* with ``force_kill``, every live session is destroyed (forced) as the freeze begins.

The status lives in the config store at :data:`MANAGER_STATUS_KEY` (etcd, or the
embedded store's file): every manager replica reads the same value, and it survives a
restart — a frozen cluster stays frozen until someone unfreezes it.
"""

from __future__ import annotations

import enum
import logging
from typing import Any

import sqlalchemy as sa

from accelshare.config import ConfigStore
from accelshare.sched.lifecycle import (
    FINAL_STATUSES,
    RESOURCE_OCCUPYING_STATUSES,
)

from .db import Database
from .errors import InvalidRequest, ManagerError, Unavailable
from .models import Session

__all__ = [
    "FROZEN_REASON",
    "MANAGER_STATUS_KEY",
    "Frozen",
    "Maintenance",
    "ManagerStatus",
    "read_manager_status",
]

log = logging.getLogger(__name__)

MANAGER_STATUS_KEY = "manager/status"
FROZEN_REASON = "manager frozen for maintenance"


class ManagerStatus(enum.StrEnum):
    RUNNING = "running"
    FROZEN = "frozen"


async def read_manager_status(store: ConfigStore) -> ManagerStatus:
    """What the store says; absent or unknown text reads as running (logged)."""
    raw = await store.get(MANAGER_STATUS_KEY)
    if raw is None:
        return ManagerStatus.RUNNING
    try:
        return ManagerStatus(raw)
    except ValueError:
        log.warning("%s holds %r, not running or frozen: read as running", MANAGER_STATUS_KEY, raw)
        return ManagerStatus.RUNNING


class Frozen(Unavailable):
    """A 503 with Backend.AI's ``server-frozen`` problem type."""

    slug = "server-frozen"


class Maintenance:
    """Reads and changes the manager status (the API checks the caller's role)."""

    def __init__(self, *, store: ConfigStore, db: Database, scheduler: Any, sessions: Any) -> None:
        self.store = store
        self.db = db
        self.scheduler = scheduler  # .scheduler.loop.Scheduler
        self.sessions = sessions  # ..sessions.SessionService

    async def status(self) -> ManagerStatus:
        return await read_manager_status(self.store)

    async def active_sessions(self) -> int:
        """Sessions holding resources (Backend.AI's count: what ``freeze --wait`` waits
        to drain)."""
        async with self.db.begin() as db:
            count = await db.scalar(
                sa.select(sa.func.count())
                .select_from(Session)
                .where(Session.status.in_(sorted(RESOURCE_OCCUPYING_STATUSES)))
            )
        return int(count or 0)

    async def refuse_if_frozen(self) -> None:
        if await self.status() is ManagerStatus.FROZEN:
            raise Frozen(
                "The server is frozen due to maintenance. Please try again later.",
                field="manager status",
                expected="running",
                received="frozen",
            )

    async def set_status(self, caller: Any, status: str, *, force_kill: bool = False) -> None:
        try:
            wanted = ManagerStatus(status)
        except ValueError:
            raise InvalidRequest(
                f"Unknown manager status {status!r}",
                field="status",
                expected="running or frozen",
                received=status,
            ) from None
        if wanted is ManagerStatus.RUNNING and force_kill:
            raise InvalidRequest(
                "force_kill goes with freezing",
                field="force_kill",
                expected="false when unfreezing",
                received=force_kill,
            )
        await self.store.put(MANAGER_STATUS_KEY, wanted.value)
        log.warning("manager status set to %s by %s", wanted.value, caller.email)
        if wanted is ManagerStatus.FROZEN:
            await self.scheduler.hold_for_maintenance(FROZEN_REASON)
            if force_kill:
                await self._kill_all(caller)
        else:
            self.scheduler.release_maintenance()

    async def _kill_all(self, caller: Any) -> None:
        async with self.db.begin() as db:
            ids = list(
                (
                    await db.scalars(
                        sa.select(Session.id).where(Session.status.not_in(sorted(FINAL_STATUSES)))
                    )
                ).all()
            )
        for session_id in ids:
            try:
                await self.sessions.destroy(caller, str(session_id), forced=True)
            except ManagerError as e:  # ended meanwhile, or an agent away: logged, go on
                log.warning("freeze --force-kill: session %s: %s", session_id, e)
        log.warning("freeze --force-kill: destroyed %d session(s)", len(ids))
