"""The control plane of one manager process: its parts and their background tasks.

    manager = Manager(db=db, store=store, options=ManagerOptions(cluster_secret=...))
    await manager.start()      # resume binds left by a previous process, start the
                               # scheduler loop and the LOST sweep
    ...                        # the API calls manager.sessions / .registry / .scheduler
    await manager.stop()       # stop the loops, let binds in flight finish (bounded)

Everything that reads the time uses the injected ``clock``; everything that calls an
agent goes through one :class:`~accelshare.manager.agent_client.AgentClient`, whose
transport is injectable (hollow agents in tests).  With a Redis bus (``bus=``), kernel
events also arrive through it, live stats are read from it, and change notices reach the
other manager replicas (:mod:`.bus_link`).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import httpx
import sqlalchemy as sa

from accelshare.aio import cancel_and_wait
from accelshare.bus import BusUnavailable, RedisBus
from accelshare.config import ConfigStore
from accelshare.protocol import KernelEvent

from .agent_client import AgentClient, AgentRPCError
from .agents import compat_from_views, format_compat, full_from_views, views_of
from .bai_events import BackendAIEvents
from .bus_link import ManagerBusLink
from .clock import Clock, utcnow
from .db import Database
from .enums import AgentStatus
from .errors import NotFound
from .execute import ExecuteService
from .hub import ChangeHub
from .images import ImageService
from .key_usage import KeyUsageRecorder
from .list_specs import AGENTS
from .maintenance import Maintenance
from .metrics import ManagerMetrics
from .models import Agent, Session
from .querylang.compile_sql import apply_filter_and_order
from .registry import AgentRegistry
from .scheduler import Binder, Scheduler
from .services.admin import AdminService
from .services.admin_views import AdminViews
from .services.directory import Directory
from .services.folders import FolderService
from .services.holders import KernelHolders
from .services.scaling_group_access import ScalingGroupAccess
from .services.sessions import SessionService
from .session_files import SessionFiles
from .slots import KnownSlots
from .storage_client import StorageProxies

__all__ = ["Manager", "ManagerOptions", "StatsUnavailable"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ManagerOptions:
    cluster_secret: str
    agent_timeout_s: float = 30.0
    schedule_interval_s: float = 2.0
    sweep_interval_s: float = 5.0
    agent_rpc_timeout_s: float = 30.0
    stale_bind_timeout_s: float | None = None  # None: agent_rpc_timeout_s + 30
    default_scaling_group: str = "default"
    trash_max_age_s: float | None = 30 * 86400.0  # None: the trash is purged by hand only


class StatsUnavailable(RuntimeError):
    """An agent's live stats cannot be had right now (the message says why)."""


class Manager:
    def __init__(
        self,
        *,
        db: Database,
        store: ConfigStore,
        options: ManagerOptions,
        clock: Clock = utcnow,
        agent_transport: httpx.AsyncBaseTransport | None = None,
        storage_transport: httpx.AsyncBaseTransport | None = None,
        bus: RedisBus | None = None,
    ) -> None:
        self.db = db
        self.store = store
        self.options = options
        self.clock = clock
        self.hub = ChangeHub()
        self.metrics = ManagerMetrics()
        self.known_slots = KnownSlots(store)
        self.images = ImageService(db)
        self.client = AgentClient(
            options.cluster_secret,
            transport=agent_transport,
            timeout_s=options.agent_rpc_timeout_s,
        )
        self.binder = Binder(
            db=db,
            client=self.client,
            hub=self.hub,
            metrics=self.metrics,
            clock=clock,
            on_release=self.trigger,
        )
        self.scheduler = Scheduler(
            db=db,
            store=store,
            known_slots=self.known_slots,
            binder=self.binder,
            hub=self.hub,
            metrics=self.metrics,
            clock=clock,
            interval_s=options.schedule_interval_s,
        )
        self.registry = AgentRegistry(
            db=db,
            known_slots=self.known_slots,
            hub=self.hub,
            clock=clock,
            agent_timeout_s=options.agent_timeout_s,
            on_change=self.trigger,
            on_event_applied=self._event_applied,
        )
        self.sessions = SessionService(
            db=db,
            client=self.client,
            hub=self.hub,
            clock=clock,
            trigger=self.trigger,
            passes=self.scheduler.next_pass_mark,
            wait_for_pass=self.scheduler.wait_for_pass,
            known_slots=self.known_slots,
            default_scaling_group=options.default_scaling_group,
        )
        self.maintenance = Maintenance(
            store=store, db=db, scheduler=self.scheduler, sessions=self.sessions
        )
        self.sessions.maintenance = self.maintenance
        self.execute = ExecuteService(self.sessions, self.client)
        self.session_files = SessionFiles(self.sessions, self.client)
        self.bai_events = BackendAIEvents(db, self.hub, self.sessions)
        self.admin = AdminService(db=db, known_slots=self.known_slots, trigger=self.trigger)
        self.directory = Directory(db)
        self.admin_views = AdminViews(db=db, known_slots=self.known_slots)
        self.scaling_group_access = ScalingGroupAccess(db)
        self.holders = KernelHolders(db)
        self.storage = StorageProxies(store, transport=storage_transport)
        self.folders = FolderService(
            db=db,
            proxies=self.storage,
            clock=clock,
            trash_max_age=timedelta(seconds=options.trash_max_age_s)
            if options.trash_max_age_s
            else None,
        )
        self.key_usage = KeyUsageRecorder(db, clock=clock)  # keypairs.last_used_at
        self._sweeper: asyncio.Task[None] | None = None
        self.bus_link: ManagerBusLink | None = None
        if bus is not None:
            self.bus_link = ManagerBusLink(
                bus,
                hub=self.hub,
                apply_events=lambda batch: self.registry.apply_events(batch, path="redis"),
                on_received=self.metrics.bus_events.inc,
            )

    def _event_applied(self, event: KernelEvent, path: str) -> None:
        age_s = (self.clock() - event.at).total_seconds()
        self.metrics.event_delivery.labels(path).observe(max(0.0, age_s))

    @property
    def cluster_secret(self) -> str:
        return self.options.cluster_secret

    def trigger(self) -> None:
        """Ask for a scheduling pass soon (coalesced)."""
        self.scheduler.trigger()

    async def start(self, *, background: bool = True) -> None:
        await self.scheduler.resume()
        if self.bus_link is not None:
            try:
                await self.bus_link.bus.ping()
            except BusUnavailable as e:  # not fatal: the loops retry, HTTP still works
                log.warning("%s; starting anyway (events still arrive over HTTP)", e)
            self.bus_link.start()
        if background:
            self.scheduler.start()
            self._sweeper = asyncio.create_task(self._sweep_forever(), name="accelshare-sweep")
        self.trigger()

    async def stop(self, *, drain_s: float = 5.0) -> None:
        if self._sweeper is not None:
            await cancel_and_wait([self._sweeper])
            self._sweeper = None
        await self.scheduler.stop(drain_s=drain_s)
        await self.sessions.status_watch.close()
        if self.bus_link is not None:
            await self.bus_link.stop()
        await self.client.close()
        await self.storage.close()
        await self.key_usage.close()

    async def _sweep_forever(self) -> None:
        # longer than any bind in flight can take (one create RPC per session, bounded)
        stale_bind = timedelta(
            seconds=self.options.stale_bind_timeout_s or self.options.agent_rpc_timeout_s + 30
        )
        while True:
            await asyncio.sleep(self.options.sweep_interval_s)
            try:
                await self.registry.sweep()
                await self.scheduler.rescue_stale_binds(stale_bind)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("agent sweep failed")
            try:
                purged = await self.folders.purge_old_trash()
                if purged:
                    log.info("purged %d folders from the trash: %s", len(purged), purged)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("trash purge failed")

    # -- agents, for the API ------------------------------------------------------------------
    async def get_agent(self, agent_id: str) -> Agent:
        async with self.db.begin() as db:
            agent = await db.get(Agent, agent_id)
        if agent is None:
            raise NotFound(f"No agent {agent_id!r}", field="agent_id", received=agent_id)
        return agent

    async def list_agents(
        self,
        *,
        status: AgentStatus | None = None,
        scaling_group: str | None = None,
        filter: str | None = None,
        order: str | None = None,
    ) -> list[Agent]:
        """The agents, by id unless ``order`` says otherwise; ``filter`` / ``order`` are
        Backend.AI's expressions over :data:`~.list_specs.AGENTS`."""
        query = apply_filter_and_order(sa.select(Agent), filter, order, AGENTS)
        if status is not None:
            query = query.where(Agent.status == status)
        if scaling_group is not None:
            query = query.where(Agent.scaling_group == scaling_group)
        async with self.db.begin() as db:
            return list((await db.execute(query)).scalars())

    async def alloc_map(self, agent: Agent, *, compat: bool) -> dict[str, Any]:
        """The agent's live allocation map (full, or compat ``{device: "0.80"}``).

        Falls back to the last heartbeat's view when the agent cannot be reached; the
        answer carries ``source`` (``agent`` or ``heartbeat``) and ``error``.
        """
        try:
            live = await self.client.alloc_map(agent.address, compat=compat)
        except AgentRPCError as e:
            views = views_of(agent)
            log.info("alloc map of %s from its last heartbeat: %s", agent.id, e)
            if compat:
                return {
                    "alloc_map": format_compat(compat_from_views(views)),
                    "source": "heartbeat",
                    "error": str(e),
                }
            return {**full_from_views(agent.id, views), "source": "heartbeat", "error": str(e)}
        if compat:
            inner = live.get("alloc_map", live)
            return {
                "alloc_map": format_compat(inner if isinstance(inner, dict) else {}),
                "source": "agent",
            }
        return {**live, "source": "agent"}

    async def node_stats(self, agent: Agent) -> dict[str, Any]:
        """The agent's live device stats (:class:`~accelshare.protocol.NodeStats` as
        JSON plus ``source``): its latest report on the Redis bus when there is one
        (with ``seq``, ``missed``, ``gapS`` — ticks lost to an outage — and ``ageS``),
        else asked of the agent.  Raises :class:`StatsUnavailable`."""
        if self.bus_link is None:
            try:
                return {**await self.client.node_stats(agent.address), "source": "agent"}
            except AgentRPCError as e:
                raise StatsUnavailable(f"Agent {agent.id} does not answer: {e}") from None
        try:
            report = (await self.bus_link.stats([agent.id]))[agent.id]
        except BusUnavailable as e:
            raise StatsUnavailable(str(e)) from None
        if report is None:
            raise StatsUnavailable(
                f"No stats from agent {agent.id} on Redis in the last"
                f" {self.bus_link.bus.settings.stats_ttl_s:g} s"
            )
        return {
            **report.node.model_dump(mode="json"),
            "source": "redis",
            "seq": report.seq,
            "missed": report.missed,
            "gapS": report.gap_s,
            "ageS": round(max(0.0, (self.clock() - report.at).total_seconds()), 3),
        }

    async def count_sessions_by_status(self) -> dict[str, int]:
        async with self.db.begin() as db:
            rows = await db.execute(
                sa.select(Session.status, sa.func.count()).group_by(Session.status)
            )
            return {status.value: count for status, count in rows}

    async def count_agents_by_status(self) -> dict[str, int]:
        async with self.db.begin() as db:
            rows = await db.execute(sa.select(Agent.status, sa.func.count()).group_by(Agent.status))
            return {status.value: count for status, count in rows}
