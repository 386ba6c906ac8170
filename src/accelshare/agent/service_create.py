"""Creating kernels: admission (the kernel registered, its resources allocated, its app
services given host ports) and the start through the runtime.

* ``create`` is idempotent by kernel id (the existing kernel's report is returned,
  whatever its state); concurrent calls with one id wait for each other.
* Allocation happens under one asyncio lock over every involved map, all or nothing;
  a runtime failure frees it again.  A request with the manager's plan
  (``planned_allocations``) gets exactly that placement, checked against the maps
  (:meth:`AgentAllocations.allocate_planned`); one without a plan is placed by the maps'
  strategies.  A plan that no longer fits is answered as a conflict (FAILED,
  ``conflict: true``): the kernel is forgotten at once (no event, nothing recorded) and
  a heartbeat goes out soon, so that the manager re-plans on the agent's current maps.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal

from accelshare.alloc import AllocationByMap, PlanConflict, ResourceError
from accelshare.protocol import CreateKernelRequest, KernelEventType, KernelReport, KernelStatus

from .kernels import KernelRecord
from .launch import build_kernel_spec
from .ports import SERVICE_PORT_ENV_PREFIX, PortRangeExhausted, declared_services
from .requests import KernelRequestError, parse_plan, parse_requested_slots
from .runtime import KernelRuntimeError
from .scratch import is_valid_kernel_id
from .service_exits import KernelExits
from .service_parts import AgentParts

__all__ = ["KernelCreates"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class _Admitted:
    """A kernel registered and allocated, not started yet."""

    record: KernelRecord
    requested: Mapping[str, Decimal]
    allocation: AllocationByMap
    request: CreateKernelRequest  # with the app services' host ports in its environ
    published: tuple[tuple[int, int], ...]  # docker bridge: (container port, host port)


class KernelCreates:
    """Admits and starts kernels; keeps the starts running in the background."""

    def __init__(self, parts: AgentParts, exits: KernelExits, *, host_cpus: frozenset[int]) -> None:
        self._parts = parts
        self._exits = exits
        self._host_cpus = host_cpus
        self.starting: set[asyncio.Task[None]] = set()  # kernels starting in the background

    async def create(
        self, request: CreateKernelRequest, *, background: bool | None = None
    ) -> KernelReport:
        """Allocate and start a kernel; its report (RUNNING or FAILED), or with
        ``background`` (default: ``[container] start-in-background``) PREPARING once
        allocated, the start going on in a task that holds the kernel's lock (see
        :meth:`.service.AgentService.create_kernel`)."""
        if background is None:
            background = self._parts.config.container.start_in_background
        lock = self._parts.kernel_lock(request.kernel_id)
        await lock.acquire()
        handed_over = False
        try:
            existing = self._parts.registry.get(request.kernel_id)
            if existing is not None:
                log.info("kernel %s: create repeated, %s", request.kernel_id, existing.status)
                return existing.report()
            t0 = time.perf_counter()
            admitted = await self._admit(request)
            if isinstance(admitted, KernelReport):
                result = "conflict" if admitted.conflict else admitted.status.value.lower()
                self._parts.metrics.creates.labels(result=result).inc()
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
            self.starting.add(task)
            task.add_done_callback(self.starting.discard)
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
            self._parts.metrics.create_seconds.observe(time.perf_counter() - t0)
        self._parts.metrics.creates.labels(result=report.status.value.lower()).inc()
        return report

    async def _admit(self, request: CreateKernelRequest) -> _Admitted | KernelReport:
        """Register the kernel and allocate its resources: ``(record, requested,
        allocation)``, or the FAILED report when the request is invalid or does not fit."""
        kernel_id = request.kernel_id
        record = self._parts.registry.add(
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
        allocations = self._parts.allocations
        try:
            if not is_valid_kernel_id(kernel_id):
                raise KernelRequestError(
                    f"invalid kernel id {kernel_id!r}: letters, digits, '_', '.', '-' "
                    "(at most 128, starting with a letter or digit)"
                )
            if self._parts.unsandboxed is not None:
                self._check_single_user(record)
            planned = request.planned_allocations
            requested = parse_requested_slots(
                request.requested_slots,
                allocations.slot_types,
                kernel_id=kernel_id,
                exact=planned is not None,
            )
            plan = parse_plan(planned) if planned is not None else None
            async with self._parts.alloc_lock:
                if plan is not None:
                    allocation = allocations.allocate_planned(
                        kernel_id,
                        requested,
                        plan,
                        allow_fragmentation=request.allow_fractional_resource_fragmentation,
                    )
                else:
                    allocation = allocations.allocate(
                        kernel_id,
                        requested,
                        allocation_order=self._parts.config.agent.allocation_order,
                        affinity_policy=self._parts.config.agent.affinity_policy,
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
            async with self._parts.alloc_lock:
                allocations.release(kernel_id)
            return self._fail(record, str(e))
        record.allocations = allocations.recorded(kernel_id)
        log.info("kernel %s: allocated %s", kernel_id, record.report().allocations)
        return _Admitted(record, requested, allocation, request, published)

    def _check_single_user(self, record: KernelRecord) -> None:
        """An unsandboxed agent holds one user's kernels at a time (they could read and
        signal each other's): refuse another user's while any is live."""
        others = {
            r.owner_access_key
            for r in self._parts.registry.live()
            if r.kernel_id != record.kernel_id and r.owner_access_key != record.owner_access_key
        }
        if others:
            raise KernelRequestError(
                "this agent runs sessions unsandboxed and single-user"
                f" ({self._parts.unsandboxed}); it holds another user's sessions now"
            )

    async def _launch(self, request: CreateKernelRequest, admitted: _Admitted) -> KernelReport:
        """Start an admitted kernel through the runtime: RUNNING (watched), or FAILED
        with its allocation freed."""
        kernel_id = request.kernel_id
        record, requested, allocation = admitted.record, admitted.requested, admitted.allocation
        request, published = admitted.request, admitted.published
        allocations = self._parts.allocations
        try:
            spec, _ = build_kernel_spec(
                request,
                requested,
                allocation,
                self._parts.plugins,
                allocations.slot_types,
                host_cpus=self._host_cpus,
            )
            # The runtime keeps the agent's record with the kernel's state files, written
            # as it prepares the scratch dir: a restarted agent finds it with the kernel.
            meta = {
                "session_id": request.session_id,
                "image": request.image,
                "owner_access_key": request.owner_access_key,
                "labels": dict(request.labels),
                "created_at": record.created_at,
                "service_ports": [m.model_dump(mode="json") for m in record.service_ports],
            }
            spec = dataclasses.replace(spec, published_ports=published, agent_meta=meta)
            info = await self._parts.runtime.create_kernel(spec)
        except Exception as e:  # the runtime's errors, and any bug: never leak the allocation
            if not isinstance(e, KernelRuntimeError | ValueError | OSError):
                log.exception("kernel %s: unexpected error while starting", kernel_id)
            async with self._parts.alloc_lock:
                allocations.release(kernel_id)
                self._parts.ports.release(kernel_id)
            await self._cleanup_failed(kernel_id)
            return self._fail(record, f"{type(e).__name__}: {e}")
        record.mark_running(cid=info.cid, pids=info.pids, at=time.time())
        log.info("kernel %s: running (%s %s)", kernel_id, info.runtime, info.cid)
        self._parts.emit(record, KernelEventType.STARTED)
        self._exits.watch(kernel_id)
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
        network = self._parts.config.container.docker_network
        if self._parts.runtime.name == "docker":
            on_host = network == "host"
            if network == "none" or network.startswith("container:"):
                return request, ()
        else:
            on_host = not getattr(self._parts.runtime, "publishes_ports", False)
        async with self._parts.alloc_lock:
            mapped = self._parts.ports.allocate(record.kernel_id, services)
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
        self._parts.registry.forget(record.kernel_id)
        if self._parts.link is not None:
            self._parts.link.beat_soon()
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
        self._parts.registry.finish(
            record.kernel_id, KernelStatus.FAILED, reason=reason, at=time.time()
        )
        self._parts.emit(record, KernelEventType.FAILED)
        return record.report()

    async def _cleanup_failed(self, kernel_id: str) -> None:
        if self._parts.config.container.keep_scratch or not is_valid_kernel_id(kernel_id):
            return
        with contextlib.suppress(KernelRuntimeError, OSError):
            await self._parts.runtime.cleanup_kernel(kernel_id)
