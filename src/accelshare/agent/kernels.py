"""The agent's kernel registry: what it knows about each kernel (pure, no I/O).

A kernel moves ``PREPARING -> RUNNING -> EXITED`` or ``PREPARING -> FAILED``::

    registry = KernelRegistry()
    record = registry.add(KernelRecord("k1", session_id="s1", image="python"))
    record.mark_running(cid="4242", at=now)
    registry.finish("k1", KernelStatus.EXITED, exit_code=0, reason="exited", at=now)
    registry.get("k1").report()      # KernelReport(status=EXITED, exit_code=0, ...)

Finished kernels stay answerable (idempotent create/destroy return their report) in a
bounded most-recent list; the agent's allocations (:mod:`.allocations`), not this registry, own what a kernel
holds.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from accelshare.common import Allocation, canonical_decimal
from accelshare.protocol import KernelReport, KernelStatus, ServicePortMapping

__all__ = ["FINISHED", "KernelRecord", "KernelRegistry", "allocations_to_wire"]

FINISHED = frozenset({KernelStatus.EXITED, KernelStatus.FAILED})


def allocations_to_wire(
    allocations: Allocation,
) -> dict[str, dict[str, str]]:
    return {
        slot: {device: canonical_decimal(amount) for device, amount in per_device.items()}
        for slot, per_device in allocations.items()
    }


@dataclass(slots=True)
class KernelRecord:
    kernel_id: str
    session_id: str = ""
    image: str = ""
    status: KernelStatus = KernelStatus.PREPARING
    requested_slots: dict[str, str] = field(default_factory=dict)
    allocations: Allocation = field(default_factory=dict)
    container_id: str | None = None
    exit_code: int | None = None
    reason: str = ""
    owner_access_key: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    created_at: float | None = None
    started_at: float | None = None
    finished_at: float | None = None
    pids: tuple[int, ...] = ()
    scratch_removed: bool = False  # destroy cleaned the scratch dir up
    service_ports: list[ServicePortMapping] = field(default_factory=list)  # app services

    @property
    def is_live(self) -> bool:
        return self.status not in FINISHED

    def mark_running(self, *, cid: str | None, pids: tuple[int, ...], at: float) -> None:
        self.status = KernelStatus.RUNNING
        self.container_id = cid
        self.pids = pids
        self.started_at = at

    def report(self) -> KernelReport:
        return KernelReport(
            kernel_id=self.kernel_id,
            session_id=self.session_id,
            status=self.status,
            image=self.image,
            allocations=allocations_to_wire(self.allocations),
            container_id=self.container_id,
            exit_code=self.exit_code,
            reason=self.reason,
            service_ports=list(self.service_ports),
        )


class KernelRegistry:
    """Live kernels plus the ``keep_finished`` most recently finished ones."""

    def __init__(self, *, keep_finished: int = 10_000) -> None:
        self._live: dict[str, KernelRecord] = {}
        self._finished: OrderedDict[str, KernelRecord] = OrderedDict()
        self._keep_finished = keep_finished

    def get(self, kernel_id: str) -> KernelRecord | None:
        return self._live.get(kernel_id) or self._finished.get(kernel_id)

    def add(self, record: KernelRecord) -> KernelRecord:
        if self.get(record.kernel_id) is not None:
            raise ValueError(f"kernel {record.kernel_id} is already registered")
        if record.is_live:
            self._live[record.kernel_id] = record
        else:
            self._remember(record)
        return record

    def finish(
        self,
        kernel_id: str,
        status: KernelStatus,
        *,
        exit_code: int | None = None,
        reason: str = "",
        at: float | None = None,
    ) -> KernelRecord | None:
        """Mark a live kernel finished; None when it is unknown or already finished."""
        if status not in FINISHED:
            raise ValueError(f"{status} is not a finished status")
        record = self._live.pop(kernel_id, None)
        if record is None:
            return None
        record.status = status
        record.exit_code = exit_code
        record.reason = reason
        record.finished_at = at
        self._remember(record)
        return record

    def forget(self, kernel_id: str) -> None:
        self._live.pop(kernel_id, None)
        self._finished.pop(kernel_id, None)

    def _remember(self, record: KernelRecord) -> None:
        self._finished[record.kernel_id] = record
        self._finished.move_to_end(record.kernel_id)
        while len(self._finished) > self._keep_finished:
            self._finished.popitem(last=False)

    def live(self) -> list[KernelRecord]:
        return list(self._live.values())

    def all(self) -> list[KernelRecord]:
        return [*self._live.values(), *self._finished.values()]

    def __len__(self) -> int:
        return len(self._live)
