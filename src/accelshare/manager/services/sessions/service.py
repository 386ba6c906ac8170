"""The session service: the one object the API and the rest of the manager call for
sessions.  It holds the parts (:mod:`.reads`, :mod:`.admission`, :mod:`.lifecycle`,
:mod:`.reach`) and hands each call to the part that does it."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from typing import Any

from accelshare.common import SlotTypes
from accelshare.sched.lifecycle import SessionStatus

from ...agent_client import AgentClient
from ...clock import Clock
from ...db import Database
from ...hub import ChangeHub
from ...maintenance import Maintenance
from ...slots import KnownSlots
from ...status_watch import StatusWatch
from ..actor import Actor
from .admission import CreateResult, SessionAdmission
from .group_agents import EmptyTrialMaps
from .lifecycle import SessionLifecycle
from .reach import ProxyTarget, SessionReach
from .reads import WAIT_POLL_S, SessionReads
from .spec import SessionRequest

__all__ = ["SessionService"]


class SessionService:
    """Sessions: create, look up, list, change, destroy, reach; their logs, why they
    wait, their status events."""

    def __init__(
        self,
        *,
        db: Database,
        client: AgentClient,
        hub: ChangeHub,
        clock: Clock,
        trigger: Callable[[], None],
        passes: Callable[[], int],  # a mark for wait_for_pass (Scheduler.next_pass_mark)
        wait_for_pass: Callable[[int, float, str], Any],
        known_slots: KnownSlots,
        default_scaling_group: str = "default",
    ) -> None:
        self.db = db
        self.client = client
        self.hub = hub
        # one status query per change for every create waiting for RUNNING
        self.status_watch = StatusWatch(db, hub, poll_s=WAIT_POLL_S)
        # agents' reported maps as trials, for "could an empty agent hold this?"
        self.empty_trial_maps = EmptyTrialMaps()
        self.reads = SessionReads(db=db, client=client, hub=hub)
        self.admission = SessionAdmission(
            reads=self.reads,
            db=db,
            hub=hub,
            clock=clock,
            trigger=trigger,
            passes=passes,
            wait_for_pass=wait_for_pass,
            known_slots=known_slots,
            status_watch=self.status_watch,
            empty_trial_maps=self.empty_trial_maps,
            default_scaling_group=default_scaling_group,
        )
        self.lifecycle = SessionLifecycle(
            reads=self.reads, db=db, client=client, hub=hub, clock=clock, trigger=trigger
        )
        self.reach = SessionReach(reads=self.reads, db=db)

    @property
    def maintenance(self) -> Maintenance | None:
        """Set by the manager: a frozen manager refuses new sessions."""
        return self.admission.maintenance

    @maintenance.setter
    def maintenance(self, value: Maintenance | None) -> None:
        self.admission.maintenance = value

    # -- reads (SessionReads) ----------------------------------------------------------------
    async def resolve(
        self, caller: Actor, ref: str, owner_access_key: str | None = None
    ) -> uuid.UUID:
        return await self.reads.resolve(caller, ref, owner_access_key)

    async def get(
        self, caller: Actor, ref: str, owner_access_key: str | None = None
    ) -> dict[str, Any]:
        return await self.reads.get(caller, ref, owner_access_key)

    async def list_sessions(
        self,
        caller: Actor,
        *,
        statuses: Iterable[SessionStatus] | None = None,
        access_key: str | None = None,
        limit: int = 100,
        offset: int = 0,
        newest_first: bool = False,
        filter: str | None = None,
        order: str | None = None,
    ) -> dict[str, Any]:
        return await self.reads.list_sessions(
            caller,
            statuses=statuses,
            access_key=access_key,
            limit=limit,
            offset=offset,
            newest_first=newest_first,
            filter=filter,
            order=order,
        )

    async def status_history(
        self, caller: Actor, ref: str, owner_access_key: str | None = None
    ) -> dict[str, str]:
        return await self.reads.status_history(caller, ref, owner_access_key)

    async def logs(self, caller: Actor, ref: str, owner_access_key: str | None = None) -> str:
        return await self.reads.logs(caller, ref, owner_access_key)

    async def why(
        self, caller: Actor, ref: str, owner_access_key: str | None = None
    ) -> dict[str, Any]:
        return await self.reads.why(caller, ref, owner_access_key)

    async def events(
        self,
        caller: Actor,
        ref: str,
        owner_access_key: str | None = None,
        *,
        keepalive_s: float = 15.0,
    ) -> AsyncIterator[dict[str, Any]]:
        return await self.reads.events(caller, ref, owner_access_key, keepalive_s=keepalive_s)

    # -- admission (SessionAdmission) --------------------------------------------------------
    async def create(
        self,
        caller: Actor,
        body: SessionRequest,
        *,
        known: Mapping[str, SlotTypes] | None = None,
    ) -> CreateResult:
        return await self.admission.create(caller, body, known=known)

    # -- lifecycle (SessionLifecycle) --------------------------------------------------------
    async def destroy(
        self, caller: Actor, ref: str, *, forced: bool = False, owner_access_key: str | None = None
    ) -> dict[str, Any]:
        return await self.lifecycle.destroy(
            caller, ref, forced=forced, owner_access_key=owner_access_key
        )

    async def rename(
        self, caller: Actor, ref: str, new_name: str, owner_access_key: str | None = None
    ) -> dict[str, Any]:
        return await self.lifecycle.rename(caller, ref, new_name, owner_access_key)

    async def modify(
        self,
        caller: Actor,
        ref: str,
        *,
        name: str | None = None,
        priority: int | None = None,
    ) -> dict[str, Any]:
        return await self.lifecycle.modify(caller, ref, name=name, priority=priority)

    async def restart(
        self, caller: Actor, ref: str, owner_access_key: str | None = None
    ) -> dict[str, Any]:
        return await self.lifecycle.restart(caller, ref, owner_access_key)

    # -- reach (SessionReach) ----------------------------------------------------------------
    async def proxy_target(self, caller: Actor, ref: str) -> ProxyTarget:
        return await self.reach.proxy_target(caller, ref)
