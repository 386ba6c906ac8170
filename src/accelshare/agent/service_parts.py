"""What the agent's kernel paths share (:class:`AgentParts`).

:class:`~.service.AgentService` composes the paths a kernel takes, each its own module:
:mod:`.service_create` (admission and start), :mod:`.service_exits` (watching for exits,
freeing allocations), :mod:`.service_destroy` (destroys, the manager's heartbeat acks)
and :mod:`.service_recovery` (restart recovery); :mod:`.service_runtime` builds the
runtime.  They meet here: the kernel registry, the maps, the host ports, the event
outbox and the one lock over every map.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Mapping
from datetime import UTC, datetime

from accelshare.accel import ComputePlugin
from accelshare.config.agent_file import AgentConfig
from accelshare.protocol import KernelEventType

from .allocations import AgentAllocations
from .bus_link import AgentBusLink
from .events import EventOutbox
from .kernels import KernelRecord, KernelRegistry
from .manager_link import ManagerLink
from .metrics import AgentMetrics
from .ports import HostPortPool
from .runs import Runs
from .runtime import KernelRuntime

__all__ = ["AgentParts"]


class AgentParts:
    """The state the kernel paths share, and the events they emit.

    The allocations, runtime and plugins are set once the agent has started (reading them
    before raises ``RuntimeError``); the manager link and the bus link once it reports;
    the execute API's runs on first use.
    """

    def __init__(
        self,
        config: AgentConfig,
        *,
        registry: KernelRegistry,
        ports: HostPortPool,
        outbox: EventOutbox,
        metrics: AgentMetrics,
    ) -> None:
        self.config = config
        self.registry = registry
        self.ports = ports
        self.outbox = outbox
        self.metrics = metrics
        # Allocation happens under one lock over every involved map, all or nothing.
        self.alloc_lock = asyncio.Lock()
        self._kernel_locks: weakref.WeakValueDictionary[str, asyncio.Lock] = (
            weakref.WeakValueDictionary()
        )
        self.started_allocations: AgentAllocations | None = None
        self.started_runtime: KernelRuntime | None = None
        self.started_plugins: Mapping[str, ComputePlugin] | None = None
        self.runs: Runs | None = None  # the execute API's runs, made on first use
        # Why sessions are not sandboxed (process runtime): then one user's at a time.
        self.unsandboxed: str | None = None
        self.link: ManagerLink | None = None
        self.bus_link: AgentBusLink | None = None

    @property
    def allocations(self) -> AgentAllocations:
        if self.started_allocations is None:
            raise RuntimeError("the agent is not started")
        return self.started_allocations

    @property
    def runtime(self) -> KernelRuntime:
        if self.started_runtime is None:
            raise RuntimeError("the agent is not started")
        return self.started_runtime

    @property
    def plugins(self) -> Mapping[str, ComputePlugin]:
        if self.started_plugins is None:
            raise RuntimeError("the agent is not started")
        return self.started_plugins

    def kernel_lock(self, kernel_id: str) -> asyncio.Lock:
        """The kernel's lock: its create, start and destroy wait for each other."""
        lock = self._kernel_locks.get(kernel_id)
        if lock is None:
            lock = self._kernel_locks[kernel_id] = asyncio.Lock()
        return lock

    def emit(self, record: KernelRecord, event: KernelEventType) -> None:
        """Queue the kernel's event for the manager and wake the links."""
        queued = self.outbox.emit(
            record.kernel_id,
            record.session_id,
            event,
            at=datetime.now(UTC),
            exit_code=record.exit_code if event is KernelEventType.EXITED else None,
            reason=record.reason,
            service_ports=record.service_ports if event is KernelEventType.STARTED else (),
        )
        if self.link is not None:
            self.link.notify_events()
        if queued is not None and self.bus_link is not None:
            self.bus_link.publish_event(queued)  # the fast path; HTTP stays the durable one
