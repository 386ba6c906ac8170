"""Hollow agents: in-process fake agents that speak the real wire protocol (like kubemark).

A :class:`HollowAgent` keeps **real** allocation maps, built from the real plugins'
inventories (the mock accelerator from a ``mock-accelerator.toml`` — by default the
two-GPU demo of ``configs/accelerator/two-fgpu.toml`` — plus the intrinsic cpu and mem
plugins) with :func:`accelshare.accel.build_alloc_map`, and serves the agent RPC of
:mod:`accelshare.protocol` as an ASGI app: kernels are "created" instantly by taking
the manager's plan on the maps, checked as a real agent checks it (a plan that no
longer fits is refused as a conflict), or by allocating when no plan comes, and
destroyed by freeing.  It heartbeats and sends kernel
events to a manager through any ``httpx.AsyncClient``.

Used by the manager's component tests and by the scheduler's scale benchmark::

    cluster = HollowCluster(secret)                      # an httpx transport for the manager
    agent = cluster.add(HollowAgent(HollowSpec("i-node01"), cluster_secret=secret))
    app = await create_manager_app(config, agent_transport=cluster.transport, ...)
    agent.manager = httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://m")
    await agent.heartbeat()

or served on a loopback port with :func:`serve_on_loopback` for a manager running in
another process.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any, Literal

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from accelshare.accel import PluginInventory, build_alloc_map
from accelshare.accel.cpu import CpuCore, CPUPlugin
from accelshare.accel.mem import MemoryPlugin
from accelshare.accel.mock import MockPlugin, load_mock_config, parse_mock_config
from accelshare.accel.options import AcceleratorOptions
from accelshare.alloc import (
    AbstractAllocMap,
    AllocationByMap,
    FractionAllocMap,
    PlanConflict,
    ResourceError,
    allocate_kernel,
    allocate_planned_kernel,
    free_kernel,
)
from accelshare.common import INTRINSIC_SLOTS, AllocationMode, SlotName, canonical_decimal
from accelshare.protocol import (
    CLUSTER_SECRET_HEADER,
    AllocMapView,
    CreateKernelBatch,
    CreateKernelRequest,
    DeviceView,
    Heartbeat,
    HeartbeatAck,
    KernelEvent,
    KernelEventBatch,
    KernelEventType,
    KernelList,
    KernelReport,
    KernelReports,
    KernelStatus,
    PluginMapView,
    SlotCapacity,
)

__all__ = [
    "TWO_FGPU",
    "CreateTally",
    "HollowAgent",
    "HollowCluster",
    "HollowSpec",
    "serve_on_loopback",
]

GIB = 2**30

TWO_FGPU: Mapping[str, Any] = {
    "slot_name": "cuda",
    "device_plugin_name": "CUDADevice",
    "attributes": {"nvidia_driver": "450.00.00", "cuda_runtime": "11.0"},
    "formats": {
        "device": {
            "human_readable_name": "GPU",
            "description": "CUDA-capable GPU",
            "display_unit": "GPU",
            "display_icon": "gpu1",
            "number_format": {"binary": False, "round_length": 0},
        },
        "shares": {
            "human_readable_name": "GPU",
            "description": "CUDA-capable GPU (fractional)",
            "display_unit": "fGPU",
            "display_icon": "gpu1",
            "number_format": {"binary": False, "round_length": 2},
        },
    },
    "devices": [
        {
            "mother_uuid": f"c59395cd-ac91-4cd3-a1b0-3d2568aa2d0{i}",
            "model_name": "CUDA GPU",
            "numa_node": i - 1,
            "subproc_count": 108,
            "memory_size": "2G",
            "is_mig_device": False,
        }
        for i in (1, 2)
    ],
}
"""``configs/accelerator/two-fgpu.toml`` as data: 2 GPUs of 2 GiB = 1.0 share each."""


@dataclass(frozen=True, slots=True)
class HollowSpec:
    """What a hollow agent has: a mock accelerator, cores and memory."""

    agent_id: str
    scaling_group: str = "default"
    mock_config: Path | Mapping[str, Any] | None = None  # None: TWO_FGPU
    allocation_mode: Literal["fractional", "discrete"] = "fractional"
    quantum: Decimal | None = None  # None: the mock plugin's default (0.1)
    cpus: int = 8
    mem_bytes: int = 16 * GIB

    def inventories(self) -> dict[str, PluginInventory]:
        mode = AllocationMode(self.allocation_mode)
        config = (
            load_mock_config(self.mock_config)
            if isinstance(self.mock_config, Path)
            else parse_mock_config(self.mock_config or TWO_FGPU, source="hollow agent")
        )
        options = AcceleratorOptions(
            allocation_mode=mode, quantum_size=self.quantum or Decimal("0.1")
        )
        mock = MockPlugin(config, options)
        cores = [CpuCore(i, i % 2) for i in range(self.cpus)]
        plugins: dict[str, PluginInventory] = {mock.inventory.key: mock.inventory}
        plugins["cpu"] = CPUPlugin(cores).inventory
        plugins["mem"] = MemoryPlugin(self.mem_bytes).inventory
        return plugins


@dataclass(slots=True)
class _Kernel:
    request: CreateKernelRequest
    allocation: AllocationByMap
    status: KernelStatus
    created_at: datetime
    logs: str = ""

    def report(self, *, exit_code: int | None = None, reason: str = "") -> KernelReport:
        flat: dict[str, dict[str, str]] = {}
        for per_slot in self.allocation.values():
            for slot, per_device in per_slot.items():
                flat[slot] = {d: canonical_decimal(v) for d, v in per_device.items()}
        return KernelReport(
            kernel_id=self.request.kernel_id,
            session_id=self.request.session_id,
            status=self.status,
            image=self.request.image,
            allocations=flat,
            container_id=f"hollow-{self.request.kernel_id[:8]}",
            exit_code=exit_code,
            reason=reason,
        )


def _problem(status: int, detail: str, **extra: Any) -> JSONResponse:
    body = {"type": "/problems/agent-error", "title": "Agent error", "status": status}
    return JSONResponse({**body, "detail": detail, **extra}, status_code=status)


@dataclass(slots=True)
class CreateTally:
    """Kernels created by every agent that shares it (a benchmark's progress in O(1),
    instead of a sum over 1,000 agents every few milliseconds on the same event loop)."""

    count: int = 0


class HollowAgent:
    """See the module docstring.  Not thread-safe; one event loop."""

    def __init__(
        self,
        spec: HollowSpec,
        *,
        cluster_secret: str,
        manager: httpx.AsyncClient | None = None,
        rpc_url: str | None = None,
        start_running: bool = True,
        send_events: bool = True,
        tally: CreateTally | None = None,
    ) -> None:
        self.spec = spec
        self.tally = tally
        self.agent_id = spec.agent_id
        self.cluster_secret = cluster_secret
        self.manager = manager
        self.rpc_url = rpc_url or f"http://{spec.agent_id}.hollow"
        self.start_running = start_running  # False: kernels stay PREPARING until start_kernel()
        self.send_events = send_events
        self.inventories = spec.inventories()
        self.maps: dict[str, AbstractAllocMap] = {
            key: build_alloc_map(inv) for key, inv in self.inventories.items()
        }
        self.kernels: dict[str, _Kernel] = {}
        self.refuse_creates: str | None = None  # a reason: every create is refused with it
        # A destroyed kernel's exit: its code (a real agent's kernel killed by SIGTERM
        # exits 143), and whether its event reaches the manager before the destroy's
        # answer does (as a real agent's often does) instead of in the background.
        self.destroy_exit_code = 0
        self.destroy_event_first = False
        self.images: list[str] = []  # what its heartbeat reports (process environments)
        self.plugin_status: dict[str, dict[str, str]] = {}  # what its plugins say of themselves
        self.runtime = "process"  # or "docker": what its heartbeat says it runs
        self.created = 0
        self.conflicts = 0  # plans refused as no longer fitting
        self.batch_route = True  # False: POST /v1/kernels/batch is a 404 (an older agent)
        self.batch_creates = 0  # batch requests received
        self.destroy_requests: list[str] = []
        self.create_requests: list[CreateKernelRequest] = []  # every create, as received
        self.acks: list[HeartbeatAck] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._lock = asyncio.Lock()
        self.app = self._build_app()

    # -- state --------------------------------------------------------------------------------
    def alloc_map_view(self) -> AllocMapView:
        return AllocMapView(agent_id=self.agent_id, maps=self._views())

    def _views(self) -> dict[str, PluginMapView]:
        held: dict[str, dict[str, Decimal]] = {}  # device -> kernel -> amount
        for kid, kernel in self.kernels.items():
            for per_slot in kernel.allocation.values():
                for per_device in per_slot.values():
                    for device, amount in per_device.items():
                        held.setdefault(device, {})[kid] = amount
        views: dict[str, PluginMapView] = {}
        for key, inv in self.inventories.items():
            alloc_map = self.maps[key]
            allocations = alloc_map.allocations
            devices = [
                DeviceView(
                    device_id=d.device_id,
                    slot_name=d.slot_name,
                    slot_type=inv.slot_types[d.slot_name],
                    capacity=canonical_decimal(d.capacity),
                    allocated=canonical_decimal(allocations[d.slot_name][d.device_id]),
                    numa_node=d.numa_node,
                    model_name=d.model_name,
                    kernels={k: canonical_decimal(v) for k, v in held.get(d.device_id, {}).items()},
                )
                for d in inv.devices
            ]
            quantum = (
                canonical_decimal(alloc_map.quantum_size)
                if isinstance(alloc_map, FractionAllocMap)
                else None
            )
            views[key] = PluginMapView(
                key=key,
                kind=inv.allocation_mode.value,
                strategy=inv.strategy,
                quantum=quantum,
                exclusive_slot_types=sorted(inv.exclusive_slot_types),
                devices=devices,
            )
        return views

    def compat_alloc_map(self) -> dict[str, str]:
        """``{device: "0.80"}``: allocated amount of every accelerator device."""
        result: dict[str, Decimal] = {}
        for inv in self.inventories.values():
            allocations = self.maps[inv.key].allocations
            for d in inv.devices:
                if d.slot_name in INTRINSIC_SLOTS or not SlotName(d.slot_name).is_accelerator:
                    continue
                result[d.device_id] = (
                    result.get(d.device_id, Decimal(0)) + (allocations[d.slot_name][d.device_id])
                )
        return {d: str(v.quantize(Decimal("0.01"))) for d, v in result.items()}

    def heartbeat_message(self) -> Heartbeat:
        slots: dict[str, SlotCapacity] = {}
        metadata: dict[str, dict[str, object]] = {}
        for inv in self.inventories.values():
            for slot, total in inv.capacities().items():
                slots[slot] = SlotCapacity(
                    type=inv.slot_types[slot], capacity=canonical_decimal(total)
                )
            for slot, meta in inv.metadata.items():
                metadata[slot] = meta.to_json()
        return Heartbeat(
            agent_id=self.agent_id,
            rpc_url=self.rpc_url,
            scaling_group=self.spec.scaling_group,
            version="hollow",
            slots=slots,
            alloc_maps=self._views(),
            slot_metadata=metadata,
            kernels=[k.report() for k in self.kernels.values()],
            images=list(self.images),
            runtime=self.runtime,
            sent_at=datetime.now(UTC),
            plugin_status=self.plugin_status,
        )

    # -- talking to the manager ---------------------------------------------------------------
    def _headers(self) -> dict[str, str]:
        return {CLUSTER_SECRET_HEADER: self.cluster_secret, "Content-Type": "application/json"}

    async def heartbeat(self) -> HeartbeatAck:
        """Send one heartbeat; destroy what the ack names."""
        assert self.manager is not None, "give the hollow agent a manager client first"
        async with self._lock:
            message = self.heartbeat_message()
        response = await self.manager.post(
            "/internal/agents/heartbeat", content=message.model_dump_json(), headers=self._headers()
        )
        response.raise_for_status()
        ack = HeartbeatAck.model_validate_json(response.content)
        self.acks.append(ack)
        for kernel_id in ack.destroy_kernels:
            async with self._lock:
                self._drop(kernel_id)
        return ack

    async def send(self, *events: KernelEvent) -> None:
        assert self.manager is not None
        batch = KernelEventBatch(agent_id=self.agent_id, events=list(events))
        response = await self.manager.post(
            "/internal/agents/events", content=batch.model_dump_json(), headers=self._headers()
        )
        response.raise_for_status()

    def _event(self, kernel: _Kernel, kind: KernelEventType, **kw: Any) -> KernelEvent:
        return KernelEvent(
            event_id=uuid.uuid4().hex,
            kernel_id=kernel.request.kernel_id,
            session_id=kernel.request.session_id,
            event=kind,
            at=datetime.now(UTC),
            **kw,
        )

    def _emit(self, event: KernelEvent) -> None:
        if not self.send_events or self.manager is None:
            return
        task = asyncio.create_task(self._send_quietly(event))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send_quietly(self, event: KernelEvent) -> None:
        # A real agent retries; a hollow one drops the event when the manager is gone
        # (its client closed) — the next heartbeat carries the same news.
        with contextlib.suppress(httpx.HTTPError, RuntimeError):
            await self.send(event)

    async def settle(self) -> None:
        """Wait until the events sent in the background have been delivered."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def start_kernel(self, kernel_id: str) -> None:
        """For ``start_running=False``: the kernel starts now (and says so)."""
        kernel = self.kernels[kernel_id]
        kernel.status = KernelStatus.RUNNING
        await self.send(self._event(kernel, KernelEventType.STARTED))

    async def exit_kernel(self, kernel_id: str, exit_code: int = 0) -> None:
        """The kernel ends by itself: free it and tell the manager."""
        async with self._lock:
            kernel = self._drop(kernel_id)
        if kernel is not None:
            await self.send(self._event(kernel, KernelEventType.EXITED, exit_code=exit_code))

    def _drop(self, kernel_id: str) -> _Kernel | None:
        kernel = self.kernels.pop(kernel_id, None)
        if kernel is not None:
            free_kernel(self.maps, kernel.allocation)
            kernel.status = KernelStatus.EXITED
        return kernel

    # -- the agent RPC ------------------------------------------------------------------------
    def _build_app(self) -> FastAPI:
        """The RPC app: the module's endpoint functions (shared by every hollow agent:
        FastAPI caches per endpoint function, and a benchmark runs 1,000 agents) behind
        a plain ASGI secret check (``BaseHTTPMiddleware`` runs each request in a task
        group of its own)."""
        app = FastAPI(title=f"hollow agent {self.agent_id}")
        app.state.hollow = self
        for path, method, endpoint in _ROUTES:  # not include_router: its routes are
            app.add_api_route(path, endpoint, methods=[method])  # worked out on first use
        app.add_middleware(_SecretCheck, secret=self.cluster_secret)
        return app

    async def _create(self, body: CreateKernelRequest) -> Any:
        if self.refuse_creates is not None:
            async with self._lock:
                existing = self.kernels.get(body.kernel_id)
            if existing is None:
                return _problem(409, self.refuse_creates)
        report = await self._create_report(body)
        if report.status is KernelStatus.FAILED and not report.conflict:
            # a single create refuses with 412 (a conflict is a report, as on a real agent)
            error, _, detail = report.reason.partition(": ")
            return _problem(412, detail, error=error)
        return report.model_dump(mode="json")

    async def _create_report(self, body: CreateKernelRequest) -> KernelReport:
        """Create (idempotent by kernel id); a FAILED report when it does not fit."""
        self.create_requests.append(body)
        async with self._lock:
            existing = self.kernels.get(body.kernel_id)
            if existing is not None:  # idempotent by kernel id
                return existing.report()
            request = {slot: Decimal(amount) for slot, amount in body.requested_slots.items()}
            fragmentation = body.allow_fractional_resource_fragmentation
            try:
                if body.planned_allocations is not None:  # the manager's plan, taken as is
                    plan = {
                        slot: {device: Decimal(amount) for device, amount in per.items()}
                        for slot, per in body.planned_allocations.items()
                    }
                    allocation = allocate_planned_kernel(
                        self.maps,
                        request,
                        plan,
                        allow_resource_fragmentation=fragmentation,
                        context_tag=body.kernel_id,
                    )
                else:
                    allocation = allocate_kernel(
                        self.maps,
                        request,
                        allow_resource_fragmentation=fragmentation,
                        context_tag=body.kernel_id,
                    )
            except ResourceError as e:
                self.conflicts += isinstance(e, PlanConflict)
                return KernelReport(
                    kernel_id=body.kernel_id,
                    session_id=body.session_id,
                    status=KernelStatus.FAILED,
                    image=body.image,
                    reason=f"{type(e).__name__}: {e}",
                    conflict=isinstance(e, PlanConflict),
                )
            status = KernelStatus.RUNNING if self.start_running else KernelStatus.PREPARING
            kernel = _Kernel(
                body,
                allocation,
                status,
                datetime.now(UTC),
                logs=f"hollow kernel {body.kernel_id} of session {body.session_id}\n",
            )
            self.kernels[body.kernel_id] = kernel
            self.created += 1
            if self.tally is not None:
                self.tally.count += 1
        if status is KernelStatus.RUNNING:
            self._emit(self._event(kernel, KernelEventType.STARTED))
        return kernel.report()


def _agent(request: Request) -> HollowAgent:
    agent: HollowAgent = request.app.state.hollow
    return agent


async def _create_one(request: Request, body: CreateKernelRequest) -> Any:
    return await _agent(request)._create(body)


async def _create_batch(request: Request) -> Any:
    agent = _agent(request)
    agent.batch_creates += 1
    if not agent.batch_route:
        return _problem(404, "not found")
    bodies = CreateKernelBatch.validate_json(await request.body())
    if agent.refuse_creates is not None:
        return _problem(409, agent.refuse_creates)
    reports = [await agent._create_report(body) for body in bodies]
    return Response(KernelReports.dump_json(reports), media_type="application/json")


async def _destroy(request: Request, kernel_id: str) -> Any:
    agent = _agent(request)
    agent.destroy_requests.append(kernel_id)
    async with agent._lock:
        kernel = agent._drop(kernel_id)
    if kernel is None:
        return KernelReport(kernel_id=kernel_id, status=KernelStatus.EXITED).model_dump(mode="json")
    code = agent.destroy_exit_code
    event = agent._event(kernel, KernelEventType.EXITED, exit_code=code, reason="destroyed")
    if agent.destroy_event_first:
        await agent.send(event)
    else:
        agent._emit(event)
    return kernel.report(exit_code=code).model_dump(mode="json")


async def _list_kernels(request: Request) -> Any:
    reports = [k.report() for k in _agent(request).kernels.values()]
    return KernelList(kernels=reports).model_dump(mode="json")


async def _logs(request: Request, kernel_id: str) -> Any:
    kernel = _agent(request).kernels.get(kernel_id)
    if kernel is None:
        return _problem(404, f"no kernel {kernel_id}")
    return PlainTextResponse(kernel.logs)


async def _alloc_map(request: Request, form: str = "full") -> Any:
    agent = _agent(request)
    if form == "compat":
        return agent.compat_alloc_map()
    return agent.alloc_map_view().model_dump(mode="json")


async def _health(request: Request) -> Any:
    return {"status": "ok", "agent_id": _agent(request).agent_id}


_ROUTES: list[tuple[str, str, Callable[..., Awaitable[Any]]]] = [
    ("/v1/kernels", "POST", _create_one),
    ("/v1/kernels/batch", "POST", _create_batch),
    ("/v1/kernels/{kernel_id}", "DELETE", _destroy),
    ("/v1/kernels", "GET", _list_kernels),
    ("/v1/kernels/{kernel_id}/logs", "GET", _logs),
    ("/v1/alloc-map", "GET", _alloc_map),
    ("/v1/health", "GET", _health),
]


class _SecretCheck:
    """Every path but ``/metrics`` needs the cluster secret header (plain ASGI)."""

    def __init__(self, app: ASGIApp, secret: str) -> None:
        self.app = app
        self.secret = secret.encode()
        self.header = CLUSTER_SECRET_HEADER.lower().encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] != "/metrics":
            given = next((v for k, v in scope["headers"] if k == self.header), None)
            if given != self.secret:
                await _problem(401, "missing or wrong cluster secret")(scope, receive, send)
                return
        await self.app(scope, receive, send)


class HollowCluster:
    """An httpx transport that routes requests to hollow agents by host name.

    Give ``cluster.transport`` to the manager (``agent_transport=``); agents added with
    :meth:`add` answer at their ``rpc_url`` (``http://<agent id>.hollow``).
    """

    def __init__(self) -> None:
        self.agents: dict[str, HollowAgent] = {}
        self._transports: dict[str, httpx.ASGITransport] = {}
        self.transport = _RoutingTransport(self)

    def add(self, agent: HollowAgent) -> HollowAgent:
        host = httpx.URL(agent.rpc_url).host
        self.agents[host] = agent
        self._transports[host] = httpx.ASGITransport(app=agent.app)
        return agent

    def remove(self, agent: HollowAgent) -> None:
        host = httpx.URL(agent.rpc_url).host
        self.agents.pop(host, None)
        self._transports.pop(host, None)

    def transport_for(self, host: str) -> httpx.ASGITransport | None:
        return self._transports.get(host)


class _RoutingTransport(httpx.AsyncBaseTransport):
    def __init__(self, cluster: HollowCluster) -> None:
        self.cluster = cluster

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        transport = self.cluster.transport_for(request.url.host)
        if transport is None:
            raise httpx.ConnectError(f"no hollow agent at {request.url.host}", request=request)
        return await transport.handle_async_request(request)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.asynccontextmanager
async def serve_on_loopback(agent: HollowAgent, port: int | None = None) -> AsyncIterator[str]:
    """Serve the agent's RPC with uvicorn on 127.0.0.1 (for a manager in another process);
    sets and yields its ``rpc_url``."""
    import uvicorn

    port = port or _free_port()
    config = uvicorn.Config(
        agent.app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.01)
    agent.rpc_url = f"http://127.0.0.1:{port}"
    try:
        yield agent.rpc_url
    finally:
        server.should_exit = True
        await task
