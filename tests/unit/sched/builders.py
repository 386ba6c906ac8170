"""Builders for scheduler test fixtures."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from accelshare.common import AllocationMode, ResourceSlot, SlotTypes
from accelshare.sched.fit import DeviceState, MapState
from accelshare.sched.model import AgentState, PendingSession
from accelshare.sched.snapshot import AgentSnapshot

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def slots(**amounts: Any) -> ResourceSlot:
    """slots(cpu=1, cuda_shares="0.5") -> {"cpu": 1, "cuda.shares": 0.5}."""
    return ResourceSlot({k.replace("_", "."): Decimal(str(v)) for k, v in amounts.items()})


def session(sid: str, *, age_s: int = 0, **kw: Any) -> PendingSession:
    """A pending session created ``age_s`` seconds after T0 (bigger = newer)."""
    kw.setdefault("access_key", "AK-" + sid)
    kw.setdefault("requested_slots", slots(cpu=1, mem=1024))
    return PendingSession(id=sid, created_at=T0 + timedelta(seconds=age_s), **kw)


def agent(aid: str, *, available: ResourceSlot, occupied: ResourceSlot | None = None) -> AgentState:
    return AgentState(id=aid, available_slots=available, occupied_slots=occupied or ResourceSlot())


# -- per-device maps ----------------------------------------------------------------------


def gpu_map(
    *free: str | float, capacity: str = "1", quantum: str = "0.1", strategy: str = "EVENLY"
) -> MapState:
    """A fractional cuda.shares map; each argument is one GPU's *allocated* amount."""
    devices = tuple(
        DeviceState(
            f"GPU{i + 1}",
            "cuda.shares",
            SlotTypes.COUNT,
            Decimal(capacity),
            Decimal(str(alloc)),
            numa_node=i % 2,
        )
        for i, alloc in enumerate(free)
    )
    return MapState(
        "cuda",
        AllocationMode.FRACTIONAL,
        devices,
        strategy=strategy,
        quantum=Decimal(quantum),
        exclusive_slot_types=("cuda.device", "cuda.shares"),
    )


def cpu_map(cores: int, used: int = 0) -> MapState:
    devices = tuple(
        DeviceState(str(i), "cpu", SlotTypes.COUNT, Decimal(1), Decimal(1 if i < used else 0))
        for i in range(cores)
    )
    return MapState("cpu", AllocationMode.DISCRETE, devices)


def mem_map(total: int, used: int = 0) -> MapState:
    return MapState(
        "mem",
        AllocationMode.DISCRETE,
        (DeviceState("root", "mem", SlotTypes.BYTES, Decimal(total), Decimal(used)),),
        strategy="FILL",
    )


def gpu_agent(aid: str, *allocated: str | float, cpus: int = 8) -> AgentSnapshot:
    """An agent with ``len(allocated)`` GPUs of 1.0 share and ``cpus`` cores."""
    gmap = gpu_map(*allocated)
    used = sum(Decimal(str(a)) for a in allocated)
    state = AgentState(
        id=aid,
        available_slots=slots(cpu=cpus, cuda_shares=len(allocated)),
        occupied_slots=slots(cuda_shares=used),
    )
    return AgentSnapshot(state, (gmap, cpu_map(cpus)))
