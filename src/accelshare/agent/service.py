"""The agent: plugins + allocations + runtime + kernel registry + manager link.

This module is the orchestration (I/O); the state it drives lives in pure modules:
:mod:`.allocations` (who holds what), :mod:`.kernels` (kernel records), :mod:`.events`
(events until acknowledged), :mod:`.requests` and :mod:`.launch` (request -> spec).
A kernel's paths are their own modules, sharing :class:`~.service_parts.AgentParts`:
:mod:`.service_create` (admission, start), :mod:`.service_exits` (exits),
:mod:`.service_destroy` (destroys, the manager's heartbeat acks),
:mod:`.service_recovery` (restart recovery); :mod:`.service_runtime` builds the runtime.

Lifecycle::

    service = AgentService(config, store=store, secret=secret)
    await service.start()     # lock the scratch root, load plugins, build maps, restart
                              # recovery, watch live kernels
    service.start_reporting() # register, heartbeats, events (once the RPC listens)
    await service.create_kernel(CreateKernelRequest(...))   # -> KernelReport (RUNNING/FAILED;
                              # PREPARING with start-in-background: events follow)
    await service.destroy_kernel("k1")                      # -> KernelReport (EXITED)
    await service.stop()      # kernels keep running; a new agent re-adopts them;
                              # undelivered events are saved for the next agent
                              # (stop(end_kernels=True): destroy them first)

Contracts:

* ``create_kernel`` is idempotent by kernel id; allocation is all or nothing, under one
  lock over every map, and follows the manager's plan when the request has one
  (:mod:`.service_create`).
* A kernel's allocation is freed exactly once, when it has exited (destroyed or ended
  by itself), by whichever of destroy and the kernel's watcher gets there first
  (:mod:`.service_exits`).
* ``destroy_kernel`` is idempotent; an unknown id answers EXITED with reason
  ``not-found``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Mapping
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx

from accelshare.accel import (
    ComputePlugin,
    LoadedPlugins,
    PluginContext,
    PluginEntry,
    ReportsStatus,
    build_alloc_map,
    load_compute_plugins,
)
from accelshare.aio import cancel_and_wait
from accelshare.bus import RedisBus
from accelshare.config.agent_file import AgentConfig
from accelshare.config.store import ConfigStore
from accelshare.protocol import (
    AllocMapView,
    CreateKernelRequest,
    ExecuteRequest,
    ExecuteResult,
    Heartbeat,
    KernelList,
    KernelReport,
    KernelStats,
    KernelStatus,
    NodeStats,
)

from .allocations import AgentAllocations, DeviceDetails
from .bus_link import AgentBusLink
from .events import EventOutbox
from .kernel_files import KernelFolder, read_mounts
from .kernels import KernelRegistry
from .manager_link import ManagerLink
from .metrics import AgentMetrics, StateSample
from .ports import HostPortPool
from .runs import ExecUnsupported, RunNotFound, Runs
from .runtime import ImageSource, KernelNotFound, KernelRuntime, KernelRuntimeError
from .runtime.execs import ExecSource
from .scratch import ScratchDir, is_valid_kernel_id
from .service_create import KernelCreates
from .service_destroy import KernelDestroys
from .service_exits import KernelExits
from .service_parts import AgentParts
from .service_recovery import recover
from .service_runtime import make_runtime
from .state_files import AgentLock, save_pending_events
from .stats import StatsCollector, build_heartbeat

__all__ = ["AgentService", "resolve_scratch_root"]

log = logging.getLogger(__name__)


def resolve_scratch_root(config: AgentConfig) -> Path:
    """``[container] scratch-root``, relative paths from agent.toml's folder."""
    return config.scratch_root_path()


class AgentService:
    """One agent.  See the module docstring for the lifecycle and contracts."""

    def __init__(
        self,
        config: AgentConfig,
        *,
        store: ConfigStore | None,
        secret: str | None,
        transport: httpx.AsyncBaseTransport | None = None,
        runtime: KernelRuntime | None = None,
        plugin_entries: list[PluginEntry] | None = None,
        report_to_manager: bool = True,
        host_root: Path = Path("/"),
        bus: RedisBus | None = None,
        bus_interval_s: float = 5.0,
    ) -> None:
        self.config = config
        self.agent_id = config.agent.id
        self.scratch_root = resolve_scratch_root(config)
        self._store = store
        self._secret = secret
        self._transport = transport
        self._runtime_override = runtime
        self._plugin_entries = plugin_entries
        self._report_to_manager = report_to_manager
        self._host_root = host_root
        self._lock_file = AgentLock(self.scratch_root)
        self._loaded: LoadedPlugins | None = None
        self._stats: StatsCollector | None = None
        self._bus = bus  # the Redis bus (None: stats by RPC, events over HTTP only)
        self._bus_interval_s = bus_interval_s
        self.registry = KernelRegistry()
        self.ports = HostPortPool(config.container.port_range)
        self.outbox = EventOutbox()
        self.metrics = AgentMetrics(self._sample)
        self._parts = AgentParts(
            config,
            registry=self.registry,
            ports=self.ports,
            outbox=self.outbox,
            metrics=self.metrics,
        )
        self._exits = KernelExits(self._parts)
        self._creates = KernelCreates(
            self._parts, self._exits, host_cpus=frozenset(os.sched_getaffinity(0))
        )
        self._destroys = KernelDestroys(self._parts, self._exits)
        self.started_at: float | None = None
        self.images: list[str] = []  # what heartbeats report (refresh_images)
        self._images_task: asyncio.Task[None] | None = None
        self._images_failing = False

    # -- accessors ------------------------------------------------------------------------
    @property
    def allocations(self) -> AgentAllocations:
        return self._parts.allocations

    @property
    def runtime(self) -> KernelRuntime:
        return self._parts.runtime

    @property
    def plugins(self) -> Mapping[str, ComputePlugin]:
        return self._parts.plugins

    @property
    def link(self) -> ManagerLink | None:
        return self._parts.link

    @property
    def bus_link(self) -> AgentBusLink | None:
        """The Redis bus link, once reporting (None: no bus)."""
        return self._parts.bus_link

    def _sample(self) -> StateSample:
        allocations = self._parts.started_allocations
        return StateSample(
            kernels_running=len(self.registry),
            slots=allocations.totals() if allocations is not None else {},
            legacy_kernels=len({h.kernel_id for h in allocations.legacy_holdings()})
            if allocations
            else 0,
            events_pending=len(self.outbox),
        )

    # -- start / stop ---------------------------------------------------------------------
    async def start(self) -> None:
        t0 = time.perf_counter()
        self.scratch_root.mkdir(parents=True, exist_ok=True)
        self._lock_file.acquire()
        try:
            await self._start()
        except BaseException:
            await self._close_resources()
            raise
        self.started_at = time.time()
        log.info(
            "agent %s started in %.0f ms: %d kernel(s) running, plugins %s",
            self.agent_id,
            (time.perf_counter() - t0) * 1000,
            len(self.registry),
            ", ".join(self.plugins),
        )

    async def _start(self) -> None:
        ctx = PluginContext(self.config, self._store, self._host_root, manage_services=True)
        self._loaded = await load_compute_plugins(ctx, entries=self._plugin_entries)
        maps = {key: build_alloc_map(p.inventory) for key, p in self._loaded.plugins.items()}
        details = {
            (key, device.device_id): DeviceDetails(model_name=device.model_name)
            for key, plugin in self._loaded.plugins.items()
            for device in plugin.inventory.devices
        }
        parts = self._parts
        parts.started_plugins = self._loaded.plugins
        parts.started_allocations = AgentAllocations(maps, details)
        self._stats = StatsCollector(self._loaded.plugins, self.agent_id)
        if self._runtime_override is not None:
            parts.started_runtime = self._runtime_override
        else:
            parts.started_runtime, parts.unsandboxed = await make_runtime(
                self.config, self.scratch_root
            )
        await self.refresh_images()
        await recover(parts, self._exits, self.scratch_root)

    def start_reporting(self) -> None:
        """Register with the manager and start heartbeats and event delivery.

        Called once the RPC listens (the manager may call back as soon as it hears from
        the agent); a no-op for an agent built with ``report_to_manager=False``.
        """
        parts = self._parts
        if self._report_to_manager and parts.link is None:
            parts.link = ManagerLink(
                endpoint=self.config.manager.endpoints,
                agent_id=self.agent_id,
                secret=self._secret,
                outbox=self.outbox,
                build_heartbeat=self.heartbeat,
                on_ack=self._destroys.on_heartbeat_ack,
                interval_s=self.config.agent.heartbeat_interval_s,
                transport=self._transport,
            )
            parts.link.start()
            if len(self.outbox):
                parts.link.notify_events()
            if self._images_task is None and isinstance(parts.started_runtime, ImageSource):
                self._images_task = asyncio.create_task(self._images_loop(), name="images")
        if self._report_to_manager and self._bus is not None and parts.bus_link is None:
            parts.bus_link = AgentBusLink(
                self._bus,
                agent_id=self.agent_id,
                collect=self.collect_stats,
                interval_s=self._bus_interval_s,
            )
            parts.bus_link.start()

    # -- images (heartbeat) ---------------------------------------------------------------
    async def refresh_images(self) -> None:
        """Re-read the images kernels may name (docker: the engine's repo tags; process:
        the environments).  On failure the last list is kept and a warning logged once
        per outage."""
        source = self._parts.started_runtime
        if not isinstance(source, ImageSource):
            return
        try:
            images = await source.list_images()
        except KernelRuntimeError as e:
            if not self._images_failing:
                log.warning("images: %s; the heartbeat keeps the last list", e)
            self._images_failing = True
            return
        if self._images_failing:
            log.info("images: listed again (%d)", len(images))
        self._images_failing = False
        if images != self.images:
            log.debug("images: %s", images)
            self.images = images

    async def _images_loop(self) -> None:
        """Every heartbeat interval (at least 1 s), so that an image pulled or removed on
        the engine shows in the next heartbeats."""
        interval_s = max(1.0, self.config.agent.heartbeat_interval_s)
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.refresh_images()
            except Exception:  # never let a bug end the loop silently
                log.exception("images: refresh failed")

    async def stop(self, *, end_kernels: bool = False) -> None:
        """Stop serving; kernels keep running (the next agent re-adopts them).

        ``end_kernels`` (``accelshare dev up``, through ``server agent
        --end-kernels-on-exit``) destroys every live kernel first, after the manager
        link has stopped: their exits are saved with the undelivered events and
        reported by the next agent, so the manager learns of them then, not while it
        could still place sessions here.
        """
        parts = self._parts
        starting = self._creates.starting
        if starting:  # let kernels being started finish (their events are kept)
            await asyncio.wait(set(starting), timeout=self.config.container.stop_grace_s + 10)
        if parts.link is not None:
            await parts.link.stop()
            parts.link = None
        if parts.bus_link is not None:
            await parts.bus_link.stop()
            parts.bus_link = None
        elif self._bus is not None:
            await self._bus.close()
        if end_kernels:
            await self._end_kernels()
        tasks: list[asyncio.Task[Any]] = [*self._exits.tasks(), *self._destroys.background]
        if self._images_task is not None:
            tasks.append(self._images_task)
            self._images_task = None
        await cancel_and_wait(tasks)
        self._exits.clear()
        self._destroys.background.clear()
        if len(self.outbox):
            with contextlib.suppress(OSError):
                await asyncio.to_thread(save_pending_events, self.scratch_root, self.outbox)
        await self._close_resources()
        log.info("agent %s stopped; %d kernel(s) left running", self.agent_id, len(self.registry))

    async def _end_kernels(self) -> None:
        live = [record.kernel_id for record in self.registry.live()]
        if live:
            log.info("agent %s: ending %d kernel(s) before it stops", self.agent_id, len(live))
        results = await asyncio.gather(
            *(self.destroy_kernel(kernel_id) for kernel_id in live), return_exceptions=True
        )
        for kernel_id, result in zip(live, results, strict=True):
            if isinstance(result, BaseException):
                log.warning("kernel %s: could not end it: %s", kernel_id, result)

    async def _close_resources(self) -> None:
        parts = self._parts
        if parts.runs is not None:
            await parts.runs.close()
        if parts.started_runtime is not None and self._runtime_override is None:
            with contextlib.suppress(Exception):
                await parts.started_runtime.close()
        if self._loaded is not None:
            await self._loaded.close()
        self._lock_file.release()

    # -- kernels --------------------------------------------------------------------------
    async def create_kernel(
        self, request: CreateKernelRequest, *, background: bool | None = None
    ) -> KernelReport:
        """Allocate and start a kernel; its report.

        ``background`` (default: ``[container] start-in-background``): answer once the
        allocation is made (a PREPARING report with the allocations) and start the
        kernel in a task; its ``started`` / ``failed`` event tells the manager how the
        start went (the manager's binder takes a PREPARING report as "accepted": the
        session goes to CREATING, the event moves it on).  The kernel's lock is held
        until the start is over, so a destroy or a repeated create waits for it.
        Otherwise the answer waits for the start (RUNNING or FAILED)."""
        return await self._creates.create(request, background=background)

    async def destroy_kernel(self, kernel_id: str) -> KernelReport:
        return await self._destroys.destroy(kernel_id)

    def kernel_ended(self, kernel_id: str) -> bool:
        """Is the kernel being destroyed, or over?  (A terminal whose shell ended tells
        the session's end from a shell that exited by itself.)"""
        return self._destroys.ended(kernel_id)

    # -- execute --------------------------------------------------------------------------
    async def execute(self, kernel_id: str, request: ExecuteRequest) -> ExecuteResult:
        """One step of a run in a live kernel (:mod:`.runs`): ``KernelNotFound`` unless it
        runs, ``ExecUnsupported`` for a runtime that cannot run commands in kernels,
        ``RunNotFound``, ``RunConflict``."""
        if self.kernel_ended(kernel_id):
            raise KernelNotFound(kernel_id)
        parts = self._parts
        if parts.runs is None:
            runtime = self.runtime
            if not isinstance(runtime, ExecSource) or not hasattr(runtime, "interpreter_argv"):
                raise ExecUnsupported(f"the {runtime.name} runtime cannot run code in kernels")
            parts.runs = Runs(runtime)
        return await parts.runs.step(kernel_id, request)

    async def cancel_run(self, kernel_id: str, run_id: str) -> None:
        if self._parts.runs is None:
            raise RunNotFound(kernel_id, run_id)
        await self._parts.runs.cancel(kernel_id, run_id)

    # -- files (session upload / download / ls) -------------------------------------------
    async def kernel_folder(self, kernel_id: str) -> KernelFolder:
        """The working folder of a RUNNING kernel (:mod:`.kernel_files`); ``KernelNotFound``
        for an unknown kernel or one not running."""
        record = self.registry.get(kernel_id)
        if (
            record is None
            or record.status is not KernelStatus.RUNNING
            or self.kernel_ended(kernel_id)
            or not is_valid_kernel_id(kernel_id)
        ):
            raise KernelNotFound(kernel_id)
        scratch = ScratchDir(self.runtime.scratch_root, kernel_id)
        try:
            text = await asyncio.to_thread(scratch.read_resource_txt)
        except OSError:
            text = ""
        return KernelFolder(scratch.work_dir, read_mounts(text), kernel_owner(self.runtime))

    # -- queries --------------------------------------------------------------------------
    def list_kernels(self) -> KernelList:
        return KernelList(kernels=[record.report() for record in self.registry.all()])

    async def kernel_logs(self, kernel_id: str, *, tail_bytes: int | None = None) -> str:
        return await self.runtime.get_logs(kernel_id, tail_bytes=tail_bytes)

    def alloc_map_view(self) -> AllocMapView:
        return self.allocations.view(self.agent_id)

    def alloc_map_json(self) -> bytes:
        """The full view as JSON: cached until the allocations change, then re-assembled from
        per-device fragments (only the devices the change touched are serialised)."""
        return self.allocations.view_json(self.agent_id)

    def compat_alloc_map(self) -> dict[str, str]:
        return self.allocations.compat_view()

    async def node_stats(self) -> NodeStats:
        """One tick; the plugins that simulate their load (mock) are told what every
        kernel holds, recorded legacy holdings included."""
        assert self._stats is not None
        allocations = self.allocations
        return await self._stats.node_stats(
            {kernel_id: allocations.recorded(kernel_id) for kernel_id in allocations.kernel_ids()}
        )

    async def kernel_stats(self) -> KernelStats:
        assert self._stats is not None
        live = self.registry.live()
        return await self._stats.kernel_stats(
            {r.kernel_id: (self.allocations.held_by_plugin(r.kernel_id), r.pids) for r in live}
        )

    async def collect_stats(self) -> tuple[NodeStats, KernelStats]:
        """One stats tick for the bus: node and per-kernel stats."""
        return await self.node_stats(), await self.kernel_stats()

    def heartbeat(self) -> Heartbeat:
        return build_heartbeat(
            self.config,
            {key: p.inventory for key, p in self.plugins.items()},
            self.alloc_map_view(),
            [r.report() for r in self.registry.live()],
            images=self.images,
            plugin_status={
                key: p.status() for key, p in self.plugins.items() if isinstance(p, ReportsStatus)
            },
        )

    def health(self) -> dict[str, Any]:
        link = self._parts.link
        return {
            "status": "ok",
            "agent_id": self.agent_id,
            "kernels": len(self.registry),
            "manager_reachable": link.reachable if link is not None else None,
            "events_pending": len(self.outbox),
            "uptime_s": round(time.time() - self.started_at, 3) if self.started_at else 0,
        }

    def requested_total(self) -> dict[str, Decimal]:
        """Sum of what live kernels hold, per slot (for checks: nothing double-counted)."""
        total: dict[str, Decimal] = {}
        for record in self.registry.live():
            for slot, per_device in record.allocations.items():
                total[slot] = total.get(slot, Decimal(0)) + sum(per_device.values(), Decimal(0))
        return total


def kernel_owner(runtime: KernelRuntime) -> tuple[int, int] | None:
    """The uid/gid the runtime's kernels run as, for what the agent writes into their
    folders (None: they run as the agent itself, nothing to give over)."""
    sandbox = getattr(runtime, "sandbox", None)
    if sandbox is not None and hasattr(sandbox, "effective_ids"):
        uid, gid = sandbox.effective_ids()
        return int(uid), int(gid)
    config = getattr(runtime, "config", None)
    if runtime.name == "docker" and config is not None:
        return int(config.kernel_uid), int(config.kernel_gid)
    return None
