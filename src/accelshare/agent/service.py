"""The agent: plugins + allocation ledger + runtime + kernel registry + manager link.

This module is the orchestration (I/O); the state it drives lives in pure modules:
:mod:`.ledger` (who holds what), :mod:`.kernels` (kernel records), :mod:`.events`
(events until acknowledged), :mod:`.requests` and :mod:`.launch` (request -> spec).

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

* ``create_kernel`` is idempotent by kernel id (the existing kernel's report is returned,
  whatever its state); concurrent calls with one id wait for each other.
* Allocation happens under one asyncio lock over every involved map, all or nothing;
  a runtime failure frees it again.  A request with the manager's plan
  (``planned_allocations``) gets exactly that placement, checked against the maps
  (:meth:`AllocLedger.allocate_planned`); one without a plan is placed by the maps'
  strategies.  A plan that no longer fits is answered as a conflict (FAILED,
  ``conflict: true``): the kernel is forgotten at once (no event, nothing recorded) and
  a heartbeat goes out soon, so that the manager re-plans on the agent's current maps.  A kernel's allocation is freed exactly once, when
  it has exited (destroyed or ended by itself), by whichever of destroy and the
  kernel's watcher gets there first.
* ``destroy_kernel`` is idempotent; an unknown id answers EXITED with reason
  ``not-found``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
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
from accelshare.alloc import KernelAllocation, PlanConflict, ResourceError
from accelshare.bus import RedisBus
from accelshare.config.agent_file import AgentConfig, AgentConfigError
from accelshare.config.store import ConfigStore
from accelshare.protocol import (
    AllocMapView,
    CreateKernelRequest,
    ExecuteRequest,
    ExecuteResult,
    Heartbeat,
    HeartbeatAck,
    KernelEventType,
    KernelList,
    KernelReport,
    KernelStats,
    KernelStatus,
    NodeStats,
    ServicePortMapping,
)

from .bus_link import AgentBusLink
from .events import EventOutbox
from .kernels import KernelRecord, KernelRegistry
from .launch import build_kernel_spec
from .ledger import AllocLedger, DeviceDetails
from .manager_link import ManagerLink
from .metrics import AgentMetrics, StateSample
from .ports import (
    SERVICE_PORT_ENV_PREFIX,
    HostPortPool,
    PortRangeExhausted,
    declared_services,
    mappings_from_json,
    ports_in_environ,
    proxy_address,
)
from .recovery import discover_kernels
from .requests import KernelRequestError, parse_plan, parse_requested_slots
from .runs import ExecUnsupported, RunNotFound, Runs
from .runtime import (
    EnvironmentConfigError,
    ImageSource,
    KernelInfo,
    KernelNotFound,
    KernelRuntime,
    KernelRuntimeError,
    ProcessEnvironment,
    ProcessRuntime,
    ProcessRuntimeConfig,
    RuntimeUnavailable,
    default_environments,
)
from .runtime.execs import ExecSource
from .runtime.sandbox import SandboxConfig, hidden_defaults, write_syscall_filter
from .runtime.sandbox import probe as probe_sandbox
from .scratch import is_valid_kernel_id
from .state_files import (
    AgentLock,
    load_pending_events,
    read_device_history,
    read_kernel_meta,
    save_pending_events,
    write_device_history,
    write_kernel_meta,
)
from .stats import StatsCollector, build_heartbeat, rpc_url_of

__all__ = ["AgentService", "resolve_scratch_root"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class _Admitted:
    """A kernel registered and allocated, not started yet."""

    record: KernelRecord
    requested: Mapping[str, Decimal]
    allocation: KernelAllocation
    request: CreateKernelRequest  # with the app services' host ports in its environ
    published: tuple[tuple[int, int], ...]  # docker bridge: (container port, host port)


def resolve_scratch_root(config: AgentConfig) -> Path:
    """``[container] scratch-root``, relative paths from agent.toml's folder."""
    return config.scratch_root_path()


def _now() -> datetime:
    return datetime.now(UTC)


def _environments(config: AgentConfig) -> dict[str, ProcessEnvironment]:
    environments = default_environments()
    source = str(config.source_path or "agent.toml")
    for name, table in config.container.environments.items():
        try:
            environments[name] = ProcessEnvironment.from_config(name, table)
        except EnvironmentConfigError as e:
            raise AgentConfigError(
                source, f"container.environments.{name}.{e.key}", e.expected, e.received
            ) from None
    return environments


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
        self._alloc_lock = asyncio.Lock()
        self._kernel_locks: weakref.WeakValueDictionary[str, asyncio.Lock] = (
            weakref.WeakValueDictionary()
        )
        self._watchers: dict[str, asyncio.Task[None]] = {}
        self._background: set[asyncio.Task[Any]] = set()
        self._starts: set[asyncio.Task[None]] = set()  # kernels starting in the background
        self._destroying: set[str] = set()
        self._ending: set[str] = set()  # kernels being destroyed (their terminals say so)
        self._loaded: LoadedPlugins | None = None
        self._ledger: AllocLedger | None = None
        self._runtime: KernelRuntime | None = None
        self._runs: Runs | None = None  # the execute API's runs, made on first use
        # Why sessions are not sandboxed (process runtime): then one user's at a time.
        self._unsandboxed: str | None = None
        self._stats: StatsCollector | None = None
        self._link: ManagerLink | None = None
        self._bus = bus  # the Redis bus (None: stats by RPC, events over HTTP only)
        self._bus_interval_s = bus_interval_s
        self.bus_link: AgentBusLink | None = None
        self._host_cpus = frozenset(os.sched_getaffinity(0))
        self.registry = KernelRegistry()
        self.ports = HostPortPool(config.container.port_range)
        self.outbox = EventOutbox()
        self.metrics = AgentMetrics(self._sample)
        self.started_at: float | None = None
        self.images: list[str] = []  # what heartbeats report (refresh_images)
        self._images_task: asyncio.Task[None] | None = None
        self._images_failing = False

    # -- accessors ------------------------------------------------------------------------
    @property
    def ledger(self) -> AllocLedger:
        if self._ledger is None:
            raise RuntimeError("the agent is not started")
        return self._ledger

    @property
    def runtime(self) -> KernelRuntime:
        if self._runtime is None:
            raise RuntimeError("the agent is not started")
        return self._runtime

    @property
    def plugins(self) -> Mapping[str, ComputePlugin]:
        if self._loaded is None:
            raise RuntimeError("the agent is not started")
        return self._loaded.plugins

    @property
    def link(self) -> ManagerLink | None:
        return self._link

    def _sample(self) -> StateSample:
        ledger = self._ledger
        return StateSample(
            kernels_running=len(self.registry),
            slots=ledger.totals() if ledger is not None else {},
            legacy_kernels=len({h.kernel_id for h in ledger.legacy_holdings()}) if ledger else 0,
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
        self._ledger = AllocLedger(maps, details)
        self._stats = StatsCollector(self._loaded.plugins, self.agent_id)
        self._runtime = self._runtime_override or await self._make_runtime()
        await self.refresh_images()
        await self._recover()

    def start_reporting(self) -> None:
        """Register with the manager and start heartbeats and event delivery.

        Called once the RPC listens (the manager may call back as soon as it hears from
        the agent); a no-op for an agent built with ``report_to_manager=False``.
        """
        if self._report_to_manager and self._link is None:
            self._link = ManagerLink(
                endpoint=self.config.manager.endpoints,
                agent_id=self.agent_id,
                secret=self._secret,
                outbox=self.outbox,
                build_heartbeat=self.heartbeat,
                on_ack=self._on_heartbeat_ack,
                interval_s=self.config.agent.heartbeat_interval_s,
                transport=self._transport,
            )
            self._link.start()
            if len(self.outbox):
                self._link.notify_events()
            if self._images_task is None and isinstance(self._runtime, ImageSource):
                self._images_task = asyncio.create_task(self._images_loop(), name="images")
        if self._report_to_manager and self._bus is not None and self.bus_link is None:
            self.bus_link = AgentBusLink(
                self._bus,
                agent_id=self.agent_id,
                collect=self.collect_stats,
                interval_s=self._bus_interval_s,
            )
            self.bus_link.start()

    # -- images (heartbeat) ---------------------------------------------------------------
    async def refresh_images(self) -> None:
        """Re-read the images kernels may name (docker: the engine's repo tags; process:
        the environments).  On failure the last list is kept and a warning logged once
        per outage."""
        source = self._runtime
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

    async def _make_runtime(self) -> KernelRuntime:
        container = self.config.container
        if container.runtime == "docker":
            from .runtime.docker import DockerRuntime, DockerRuntimeConfig

            try:
                publish_host = await asyncio.to_thread(proxy_address, rpc_url_of(self.config))
            except ValueError as e:
                raise RuntimeUnavailable(f"docker runtime: {e}") from e
            return await DockerRuntime.connect(
                DockerRuntimeConfig(
                    scratch_root=self.scratch_root,
                    docker_url=container.docker_url,
                    agent_id=self.agent_id,
                    stop_grace_s=container.stop_grace_s,
                    network_mode=container.docker_network,
                    pull_timeout_s=container.docker_pull_timeout_s,
                    kernel_uid=container.kernel_uid,
                    kernel_gid=container.kernel_gid,
                    publish_host=publish_host,
                )
            )
        sandbox = await self._sandbox()
        publish_host = "127.0.0.1"
        if sandbox is not None:
            try:
                publish_host = await asyncio.to_thread(proxy_address, rpc_url_of(self.config))
            except ValueError as e:
                raise RuntimeUnavailable(f"process runtime (sandboxed): {e}") from e
        return ProcessRuntime(
            ProcessRuntimeConfig(
                scratch_root=self.scratch_root,
                environments=_environments(self.config),
                use_cgroups=container.use_cgroups,
                cgroup_parent=container.cgroup_parent,
                rlimit_memory=container.rlimit_memory,
                sandbox=sandbox,
                publish_host=publish_host,
                stop_grace_s=container.stop_grace_s,
                prespawn_launchers=container.prespawn_launchers,
                fork_server=container.launcher_fork_server,
            )
        )

    async def _sandbox(self) -> SandboxConfig | None:
        """The process runtime's sandbox (``[container] sandbox``), or None: then the
        agent says loudly that sessions are not isolated and holds one user's only."""
        container = self.config.container
        if container.sandbox == "off":
            why = "[container] sandbox = 'off'"
        else:
            hidden = [self.config.source_path, self.config.agent.cluster_secret_file]
            syscall_filter = None
            problem = None
            if container.sandbox_syscall_filter:
                syscall_filter = self.scratch_root / ".sandbox" / "seccomp.bpf"
                try:
                    await asyncio.to_thread(write_syscall_filter, syscall_filter)
                except OSError as e:
                    if container.sandbox == "required":
                        problem = f"[container] sandbox-syscall-filter: {e}"
                    else:  # a sandbox without the filter beats none at all
                        log.warning(
                            "SANDBOXES HAVE NO SYSCALL FILTER: %s (set [container]"
                            " sandbox-syscall-filter = false to silence this)",
                            e,
                        )
                        syscall_filter = None
            config = SandboxConfig(
                uid=container.kernel_uid,
                gid=container.kernel_gid,
                network=container.sandbox_network,
                ro_paths=tuple(container.sandbox_ro_paths),
                hidden=hidden_defaults(p for p in hidden if p is not None),
                syscall_filter=syscall_filter,
            )
            if problem is None:
                problem = await asyncio.to_thread(probe_sandbox, config)
            if problem is None:
                uid, gid = config.effective_ids()
                log.info(
                    "sessions are sandboxed (bubblewrap): uid %d, gid %d, network %s,"
                    " syscall filter %s%s",
                    uid,
                    gid,
                    config.network,
                    "on" if syscall_filter else "off",
                    ""
                    if os.geteuid() == 0
                    else " (the agent is not root: kernels run as"
                    " its own user, in a user namespace)",
                )
                return config
            if container.sandbox == "required":
                raise RuntimeUnavailable(f"[container] sandbox = 'required', but {problem}")
            why = problem
        self._unsandboxed = why
        log.warning(
            "SESSIONS ARE NOT SANDBOXED: %s. Kernels run as the agent's user (uid %d) and see"
            " the host's files and network; this agent accepts one user's sessions at a"
            " time. Install bubblewrap (apt-get install bubblewrap) and run the agent as"
            " root to isolate sessions (docs/agent-runtimes.md).",
            why,
            os.geteuid(),
        )
        return None

    async def stop(self, *, end_kernels: bool = False) -> None:
        """Stop serving; kernels keep running (the next agent re-adopts them).

        ``end_kernels`` (``accelshare dev up``, through ``server agent
        --end-kernels-on-exit``) destroys every live kernel first, after the manager
        link has stopped: their exits are saved with the undelivered events and
        reported by the next agent, so the manager learns of them then, not while it
        could still place sessions here.
        """
        if self._starts:  # let kernels being started finish (their events are kept)
            await asyncio.wait(set(self._starts), timeout=self.config.container.stop_grace_s + 10)
        if self._link is not None:
            await self._link.stop()
            self._link = None
        if self.bus_link is not None:
            await self.bus_link.stop()
            self.bus_link = None
        elif self._bus is not None:
            await self._bus.close()
        if end_kernels:
            await self._end_kernels()
        tasks = [*self._watchers.values(), *self._background]
        if self._images_task is not None:
            tasks.append(self._images_task)
            self._images_task = None
        await cancel_and_wait(tasks)
        self._watchers.clear()
        self._background.clear()
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
        if self._runs is not None:
            await self._runs.close()
        if self._runtime is not None and self._runtime_override is None:
            with contextlib.suppress(Exception):
                await self._runtime.close()
        if self._loaded is not None:
            await self._loaded.close()
        self._lock_file.release()

    # -- restart recovery -----------------------------------------------------------------
    async def _recover(self) -> None:
        ledger, runtime = self.ledger, self.runtime
        for event in await asyncio.to_thread(load_pending_events, self.scratch_root):
            self.outbox.requeue(event)  # undelivered at the last clean stop
        report = await discover_kernels(runtime, ledger.slot_types)
        history = await asyncio.to_thread(read_device_history, self.scratch_root)
        async with self._alloc_lock:
            restored = ledger.restore(
                [(k.kernel_id, k.allocations) for k in report.live], old_capacities=history
            )
        await asyncio.to_thread(write_device_history, self.scratch_root, ledger.maps, history)
        for message in restored.messages:
            log.warning("restart recovery: %s", message)
        metas = await asyncio.to_thread(
            lambda: {
                info.kernel_id: read_kernel_meta(info.scratch_dir)
                for info in [
                    *(k.info for k in report.live),
                    *report.exited,
                    *(u.info for u in report.unrecoverable),
                ]
            }
        )
        for kernel in report.live:
            meta = metas.get(kernel.kernel_id, {})
            record = self._record_from_meta(kernel.kernel_id, meta, KernelStatus.RUNNING)
            record.allocations = ledger.recorded(kernel.kernel_id)
            record.requested_slots = dict(kernel.resources.slots.to_json())
            record.mark_running(cid=kernel.info.cid, pids=kernel.info.pids, at=time.time())
            self._reserve_recovered_ports(kernel.kernel_id, record.service_ports)
            self.registry.add(record)
            self._watch(kernel.kernel_id)
        for info in report.exited:
            record = self._record_from_meta(
                info.kernel_id, metas.get(info.kernel_id, {}), KernelStatus.EXITED
            )
            record.container_id = info.cid
            self._apply_exit(record, info)
            self.registry.add(record)
            self._emit(record, KernelEventType.EXITED)
        for bad in report.unrecoverable:
            # Its allocation is unknown, but its app ports must stay its own: from its
            # meta file where its scratch dir is left, else (an orphan) from what its
            # processes were told to listen on.
            meta = metas.get(bad.info.kernel_id, {})
            record = self._record_from_meta(bad.info.kernel_id, meta, KernelStatus.RUNNING)
            record.reason = f"allocation unknown: {bad.reason}"
            record.mark_running(cid=bad.info.cid, pids=bad.info.pids, at=time.time())
            ports = [m.host_port for m in record.service_ports]
            if not ports:
                ports = await asyncio.to_thread(
                    ports_in_environ, bad.info.pids, self.ports.port_range
                )
            self._reserve_recovered_ports(bad.info.kernel_id, record.service_ports, ports)
            self.registry.add(record)
            self._watch(bad.info.kernel_id)
        log.info(
            "restart recovery: %d kernel(s) re-adopted (%d with legacy holdings), %d exited "
            "while the agent was away, %d with an unknown allocation",
            len(report.live),
            len(restored.legacy),
            len(report.exited),
            len(report.unrecoverable),
        )

    def _reserve_recovered_ports(
        self,
        kernel_id: str,
        mapped: Sequence[ServicePortMapping],
        ports: Sequence[int] | None = None,
    ) -> None:
        """Hold a re-adopted kernel's host ports, so no new kernel is given one."""
        held = [m.host_port for m in mapped] if ports is None else list(ports)
        clashes = self.ports.reserve(kernel_id, held)
        if held:
            log.info("restart recovery: kernel %s keeps host port(s) %s", kernel_id, held)
        if clashes:
            log.warning(
                "restart recovery: kernel %s: host port(s) %s also held by another kernel",
                kernel_id,
                clashes,
            )

    @staticmethod
    def _record_from_meta(
        kernel_id: str, meta: Mapping[str, Any], status: KernelStatus
    ) -> KernelRecord:
        def text(key: str) -> str:
            value = meta.get(key)
            return value if isinstance(value, str) else ""

        labels = meta.get("labels")
        created = meta.get("created_at")
        return KernelRecord(
            kernel_id,
            session_id=text("session_id"),
            image=text("image"),
            status=status,
            owner_access_key=text("owner_access_key"),
            labels={str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {},
            created_at=float(created) if isinstance(created, int | float) else None,
            service_ports=mappings_from_json(meta.get("service_ports")),
        )

    # -- create ---------------------------------------------------------------------------
    def _kernel_lock(self, kernel_id: str) -> asyncio.Lock:
        lock = self._kernel_locks.get(kernel_id)
        if lock is None:
            lock = self._kernel_locks[kernel_id] = asyncio.Lock()
        return lock

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
        if background is None:
            background = self.config.container.start_in_background
        lock = self._kernel_lock(request.kernel_id)
        await lock.acquire()
        handed_over = False
        try:
            existing = self.registry.get(request.kernel_id)
            if existing is not None:
                log.info("kernel %s: create repeated, %s", request.kernel_id, existing.status)
                return existing.report()
            t0 = time.perf_counter()
            admitted = await self._admit(request)
            if isinstance(admitted, KernelReport):
                result = "conflict" if admitted.conflict else admitted.status.value.lower()
                self.metrics.creates.labels(result=result).inc()
                return admitted
            if not background:
                return await self._launch_timed(request, admitted, t0)
            # The task owns the lock from here (released when the start is over), so
            # nothing else about this kernel runs between this answer and the start.
            task = asyncio.create_task(
                self._start_in_background(lock, request, admitted, t0),
                name=f"start-{request.kernel_id}",
            )
            handed_over = True
            self._starts.add(task)
            task.add_done_callback(self._starts.discard)
            return admitted.record.report()
        finally:
            if not handed_over:
                lock.release()

    async def _start_in_background(
        self,
        lock: asyncio.Lock,
        request: CreateKernelRequest,
        admitted: _Admitted,
        t0: float,
    ) -> None:
        try:
            await self._launch_timed(request, admitted, t0)
        except Exception:  # _launch turns runtime errors into FAILED: a bug
            log.exception("kernel %s: starting in the background failed", request.kernel_id)
        finally:
            lock.release()

    async def _launch_timed(
        self, request: CreateKernelRequest, admitted: _Admitted, t0: float
    ) -> KernelReport:
        report = await self._launch(request, admitted)
        if report.status is KernelStatus.RUNNING:
            self.metrics.create_seconds.observe(time.perf_counter() - t0)
        self.metrics.creates.labels(result=report.status.value.lower()).inc()
        return report

    async def _admit(self, request: CreateKernelRequest) -> _Admitted | KernelReport:
        """Register the kernel and allocate its resources: ``(record, requested,
        allocation)``, or the FAILED report when the request is invalid or does not fit."""
        kernel_id = request.kernel_id
        record = self.registry.add(
            KernelRecord(
                kernel_id,
                session_id=request.session_id,
                image=request.image,
                requested_slots=dict(request.requested_slots),
                owner_access_key=request.owner_access_key,
                labels=dict(request.labels),
                created_at=time.time(),
            )
        )
        ledger = self.ledger
        try:
            if not is_valid_kernel_id(kernel_id):
                raise KernelRequestError(
                    f"invalid kernel id {kernel_id!r}: letters, digits, '_', '.', '-' "
                    "(at most 128, starting with a letter or digit)"
                )
            if self._unsandboxed is not None:
                self._check_single_user(record)
            planned = request.planned_allocations
            requested = parse_requested_slots(
                request.requested_slots,
                ledger.slot_types,
                kernel_id=kernel_id,
                exact=planned is not None,
            )
            plan = parse_plan(planned) if planned is not None else None
            async with self._alloc_lock:
                if plan is not None:
                    allocation = ledger.allocate_planned(
                        kernel_id,
                        requested,
                        plan,
                        allow_fragmentation=request.allow_fractional_resource_fragmentation,
                    )
                else:
                    allocation = ledger.allocate(
                        kernel_id,
                        requested,
                        allocation_order=self.config.agent.allocation_order,
                        affinity_policy=self.config.agent.affinity_policy,
                        allow_fragmentation=request.allow_fractional_resource_fragmentation,
                    )
        except PlanConflict as e:
            return self._conflict(record, str(e))
        except (ResourceError, KernelRequestError) as e:
            return self._fail(record, str(e))
        # Host ports before the answer: a create answered early (start-in-background)
        # reports them too, and the manager keeps them from that report.
        try:
            request, published = await self._service_ports(record, request)
        except PortRangeExhausted as e:
            async with self._alloc_lock:
                ledger.release(kernel_id)
            return self._fail(record, str(e))
        record.allocations = ledger.recorded(kernel_id)
        log.info("kernel %s: allocated %s", kernel_id, record.report().allocations)
        return _Admitted(record, requested, allocation, request, published)

    def _check_single_user(self, record: KernelRecord) -> None:
        """An unsandboxed agent holds one user's kernels at a time (they could read and
        signal each other's): refuse another user's while any is live."""
        others = {
            r.owner_access_key
            for r in self.registry.live()
            if r.kernel_id != record.kernel_id and r.owner_access_key != record.owner_access_key
        }
        if others:
            raise KernelRequestError(
                "this agent runs sessions unsandboxed and single-user"
                f" ({self._unsandboxed}); it holds another user's sessions now"
            )

    async def _launch(self, request: CreateKernelRequest, admitted: _Admitted) -> KernelReport:
        """Start an admitted kernel through the runtime: RUNNING (watched), or FAILED
        with its allocation freed."""
        kernel_id = request.kernel_id
        record, requested, allocation = admitted.record, admitted.requested, admitted.allocation
        request, published = admitted.request, admitted.published
        ledger = self.ledger
        try:
            spec, _ = build_kernel_spec(
                request,
                requested,
                allocation,
                self.plugins,
                ledger.slot_types,
                host_cpus=self._host_cpus,
            )
            if published:
                spec = dataclasses.replace(spec, published_ports=published)
            info = await self.runtime.create_kernel(spec)
        except Exception as e:  # the runtime's errors, and any bug: never leak the allocation
            if not isinstance(e, KernelRuntimeError | ValueError | OSError):
                log.exception("kernel %s: unexpected error while starting", kernel_id)
            async with self._alloc_lock:
                ledger.release(kernel_id)
                self.ports.release(kernel_id)
            await self._cleanup_failed(kernel_id)
            return self._fail(record, f"{type(e).__name__}: {e}")
        if info.scratch_dir is not None:
            meta = {
                "session_id": request.session_id,
                "image": request.image,
                "owner_access_key": request.owner_access_key,
                "labels": dict(request.labels),
                "created_at": record.created_at,
                "service_ports": [m.model_dump(mode="json") for m in record.service_ports],
            }
            with contextlib.suppress(OSError):
                await asyncio.to_thread(write_kernel_meta, info.scratch_dir, meta)
        record.mark_running(cid=info.cid, pids=info.pids, at=time.time())
        log.info("kernel %s: running (%s %s)", kernel_id, info.runtime, info.cid)
        self._emit(record, KernelEventType.STARTED)
        self._watch(kernel_id)
        return record.report()

    async def _service_ports(
        self, record: KernelRecord, request: CreateKernelRequest
    ) -> tuple[CreateKernelRequest, tuple[tuple[int, int], ...]]:
        """Give each declared app service a host port (``[container] port-range``).

        On the host's network (an unsandboxed process kernel, docker ``host``) the kernel
        listens on the host port itself: its ``BACKENDAI_SERVICE_PORT_<NAME>`` becomes that
        port.  With a network of its own (docker bridge, a sandboxed process kernel) the
        kernel keeps its declared port and the runtime publishes it on the host port (the
        returned pairs: docker publishes, the process runtime relays into the sandbox).  A container without a
        network of its own to publish from (``none``, ``container:NAME``) gets none."""
        services = declared_services(request.environ)
        if not services:
            return request, ()
        network = self.config.container.docker_network
        if self.runtime.name == "docker":
            on_host = network == "host"
            if network == "none" or network.startswith("container:"):
                return request, ()
        else:
            on_host = not getattr(self.runtime, "publishes_ports", False)
        async with self._alloc_lock:
            mapped = self.ports.allocate(record.kernel_id, services)
        record.service_ports = mapped
        log.info(
            "kernel %s: app service host ports %s",
            record.kernel_id,
            ", ".join(f"{m.name} {m.container_port}->{m.host_port}" for m in mapped),
        )
        if not on_host:
            return request, tuple((m.container_port, m.host_port) for m in mapped)
        environ = dict(request.environ)
        for m in mapped:
            environ[SERVICE_PORT_ENV_PREFIX + m.name.upper()] = str(m.host_port)
        return request.model_copy(update={"environ": environ}), ()

    def _conflict(self, record: KernelRecord, reason: str) -> KernelReport:
        """The manager's plan no longer fits: forget the kernel (it never was), no event;
        a heartbeat soon tells the manager the maps as they are."""
        log.info("kernel %s: the plan no longer fits: %s", record.kernel_id, reason)
        self.registry.forget(record.kernel_id)
        if self._link is not None:
            self._link.beat_soon()
        return KernelReport(
            kernel_id=record.kernel_id,
            session_id=record.session_id,
            status=KernelStatus.FAILED,
            image=record.image,
            reason=reason,
            conflict=True,
        )

    def _fail(self, record: KernelRecord, reason: str) -> KernelReport:
        log.warning("kernel %s: failed: %s", record.kernel_id, reason)
        record.allocations = {}
        record.service_ports = []
        self.registry.finish(record.kernel_id, KernelStatus.FAILED, reason=reason, at=time.time())
        self._emit(record, KernelEventType.FAILED)
        return record.report()

    async def _cleanup_failed(self, kernel_id: str) -> None:
        if self.config.container.keep_scratch or not is_valid_kernel_id(kernel_id):
            return
        with contextlib.suppress(KernelRuntimeError, OSError):
            await self.runtime.cleanup_kernel(kernel_id)

    # -- exits ----------------------------------------------------------------------------
    def _watch(self, kernel_id: str) -> None:
        task = asyncio.create_task(self._watch_exit(kernel_id), name=f"watch-{kernel_id}")
        self._watchers[kernel_id] = task

    async def _watch_exit(self, kernel_id: str) -> None:
        """Await the kernel's exit, then free its allocation and report it (once)."""
        delay = 0.5
        while True:
            try:
                info: KernelInfo | None = await self.runtime.wait_exit(kernel_id)
                break
            except KernelNotFound:
                info = None
                break
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("kernel %s: watching for its exit failed; retrying", kernel_id)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)
        self._watchers.pop(kernel_id, None)
        await self._finalize(kernel_id, info)

    @staticmethod
    def _apply_exit(record: KernelRecord, info: KernelInfo | None) -> None:
        exit_ = info.exit if info is not None else None
        if exit_ is None:
            record.exit_code, record.reason = None, "lost"
            return
        reason = exit_.reason.value
        if exit_.oom_killed and "oom" not in reason:
            reason += " (out of memory)"
        if exit_.error:
            reason += f": {exit_.error}"
        record.exit_code, record.reason = exit_.exit_code, reason
        record.finished_at = exit_.finished_at

    async def _finalize(self, kernel_id: str, info: KernelInfo | None) -> None:
        record = self.registry.get(kernel_id)
        if record is None or not record.is_live:
            return
        self._apply_exit(record, info)
        # Finished first (synchronously): a concurrent finalize now returns above.
        self.registry.finish(
            kernel_id,
            KernelStatus.EXITED,
            exit_code=record.exit_code,
            reason=record.reason,
            at=record.finished_at or time.time(),
        )
        async with self._alloc_lock:
            freed = self.ledger.release(kernel_id)
            self.ports.release(kernel_id)
        log.info(
            "kernel %s: exited (%s, exit code %s)%s",
            kernel_id,
            record.reason,
            record.exit_code,
            ", allocation freed" if freed else "",
        )
        self._emit(record, KernelEventType.EXITED)

    def _emit(self, record: KernelRecord, event: KernelEventType) -> None:
        queued = self.outbox.emit(
            record.kernel_id,
            record.session_id,
            event,
            at=_now(),
            exit_code=record.exit_code if event is KernelEventType.EXITED else None,
            reason=record.reason,
            service_ports=record.service_ports if event is KernelEventType.STARTED else (),
        )
        if self._link is not None:
            self._link.notify_events()
        if queued is not None and self.bus_link is not None:
            self.bus_link.publish_event(queued)  # the fast path; HTTP stays the durable one

    # -- destroy --------------------------------------------------------------------------
    async def destroy_kernel(self, kernel_id: str) -> KernelReport:
        async with self._kernel_lock(kernel_id):
            record = self.registry.get(kernel_id)
            if record is None:
                await self._cleanup_unknown(kernel_id)
                return KernelReport(
                    kernel_id=kernel_id, status=KernelStatus.EXITED, reason="not-found"
                )
            if record.is_live:
                log.info("kernel %s: destroying", kernel_id)
                self._ending.add(kernel_id)
                try:
                    try:
                        info: KernelInfo | None = await self.runtime.destroy_kernel(
                            kernel_id, grace_s=self.config.container.stop_grace_s
                        )
                    except KernelNotFound:
                        info = None
                    watcher = self._watchers.pop(kernel_id, None)
                    if watcher is not None:
                        watcher.cancel()
                    if self._runs is not None:
                        await self._runs.end_kernel(kernel_id)
                    await self._finalize(kernel_id, info)
                finally:
                    self._ending.discard(kernel_id)
            if (
                record.status is KernelStatus.EXITED
                and not record.scratch_removed
                and not self.config.container.keep_scratch
            ):
                try:
                    await self.runtime.cleanup_kernel(kernel_id)
                    record.scratch_removed = True
                except KernelNotFound:
                    record.scratch_removed = True
                except KernelRuntimeError as e:
                    log.warning("kernel %s: cleanup failed: %s", kernel_id, e)
            return record.report()

    # -- execute --------------------------------------------------------------------------
    async def execute(self, kernel_id: str, request: ExecuteRequest) -> ExecuteResult:
        """One step of a run in a live kernel (:mod:`.runs`): ``KernelNotFound`` unless it
        runs, ``ExecUnsupported`` for a runtime that cannot run commands in kernels,
        ``RunNotFound``, ``RunConflict``."""
        if self.kernel_ended(kernel_id):
            raise KernelNotFound(kernel_id)
        if self._runs is None:
            runtime = self.runtime
            if not isinstance(runtime, ExecSource) or not hasattr(runtime, "interpreter_argv"):
                raise ExecUnsupported(f"the {runtime.name} runtime cannot run code in kernels")
            self._runs = Runs(runtime)
        return await self._runs.step(kernel_id, request)

    async def cancel_run(self, kernel_id: str, run_id: str) -> None:
        if self._runs is None:
            raise RunNotFound(kernel_id, run_id)
        await self._runs.cancel(kernel_id, run_id)

    def kernel_ended(self, kernel_id: str) -> bool:
        """Is the kernel being destroyed, or over?  (A terminal whose shell ended tells
        the session's end from a shell that exited by itself.)"""
        record = self.registry.get(kernel_id)
        return kernel_id in self._ending or record is None or not record.is_live

    async def _cleanup_unknown(self, kernel_id: str) -> None:
        """A destroy for a kernel this agent does not track: remove leftovers, if any."""
        if self.config.container.keep_scratch or not is_valid_kernel_id(kernel_id):
            return
        with contextlib.suppress(KernelRuntimeError, OSError):
            await self.runtime.cleanup_kernel(kernel_id)

    async def _on_heartbeat_ack(self, ack: HeartbeatAck) -> None:
        """Destroy what the manager considers gone: live kernels, and exited ones whose
        scratch dir is still here.  Kernels this agent does not know are ignored."""
        for kernel_id in ack.destroy_kernels:
            record = self.registry.get(kernel_id)
            if (
                record is None
                or kernel_id in self._destroying
                or record.status is KernelStatus.FAILED
                or (not record.is_live and record.scratch_removed)
            ):
                continue
            self._destroying.add(kernel_id)
            task = asyncio.create_task(self.destroy_kernel(kernel_id), name=f"destroy-{kernel_id}")
            self._background.add(task)

            def done(task: asyncio.Task[KernelReport], kernel_id: str = kernel_id) -> None:
                self._background.discard(task)
                self._destroying.discard(kernel_id)

            task.add_done_callback(done)

    # -- queries --------------------------------------------------------------------------
    def list_kernels(self) -> KernelList:
        return KernelList(kernels=[record.report() for record in self.registry.all()])

    async def kernel_logs(self, kernel_id: str, *, tail_bytes: int | None = None) -> str:
        return await self.runtime.get_logs(kernel_id, tail_bytes=tail_bytes)

    def alloc_map_view(self) -> AllocMapView:
        return self.ledger.view(self.agent_id)

    def alloc_map_json(self) -> bytes:
        """The full view as JSON: cached until the ledger changes, then re-assembled from
        per-device fragments (only the devices the change touched are serialised)."""
        return self.ledger.view_json(self.agent_id)

    def compat_alloc_map(self) -> dict[str, str]:
        return self.ledger.compat_view()

    async def node_stats(self) -> NodeStats:
        """One tick; the plugins that simulate their load (mock) are told what every
        kernel holds, recorded legacy holdings included."""
        assert self._stats is not None
        ledger = self.ledger
        return await self._stats.node_stats(
            {kernel_id: ledger.recorded(kernel_id) for kernel_id in ledger.kernel_ids()}
        )

    async def kernel_stats(self) -> KernelStats:
        assert self._stats is not None
        live = self.registry.live()
        return await self._stats.kernel_stats(
            {r.kernel_id: (self.ledger.held_by_plugin(r.kernel_id), r.pids) for r in live}
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
        link = self._link
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
