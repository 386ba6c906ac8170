"""What one scheduling pass reads: the agents, the pending sessions and the scaling
group's options, frozen by the manager in one transaction (pure, no I/O); the pass
itself is :mod:`accelshare.sched.onepass`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from accelshare.common import ResourceSlot

from .fit import MapState
from .model import AgentState, PendingSession
from .pickers import PickerName
from .predicates import DEFAULT_PREDICATES, Predicate, PredicateContext
from .selectors import DEFAULT_RESOURCE_PRIORITY, SelectorName

__all__ = ["AgentSnapshot", "SchedulerOptions", "SchedulingSnapshot"]


@dataclass(frozen=True, slots=True)
class AgentSnapshot:
    """An ALIVE, schedulable agent: totals (``state``) and per-device maps."""

    state: AgentState
    maps: tuple[MapState, ...] = ()


@dataclass(frozen=True, slots=True)
class SchedulerOptions:
    """What a scaling group configures (its profile): picker, selector, predicates."""

    picker: PickerName = PickerName.FIFO
    selector: SelectorName = SelectorName.DISPERSED
    num_retries_to_skip: int = 0
    resource_priority: tuple[str, ...] = DEFAULT_RESOURCE_PRIORITY
    predicates: tuple[Predicate, ...] = DEFAULT_PREDICATES

    @classmethod
    def from_scaling_group(
        cls,
        scheduler: str,
        opts: Mapping[str, Any] | None = None,
        store_config: Mapping[str, Any] | None = None,
    ) -> SchedulerOptions:
        """From ``scaling_groups.scheduler`` and ``scheduler_opts`` (Backend.AI's keys).

        ``store_config`` is the picker's options from the config store
        (``config/plugins/scheduler/<picker>/``, already merged over the scaling-group and
        global scopes by the caller): the defaults of ``scheduler_opts["config"]``,
        whose own keys win when both are set.

        Raises ``ValueError`` naming the option (or the store key) and the accepted values.
        """
        opts = opts or {}
        try:
            picker = PickerName(scheduler or "fifo")
        except ValueError:
            raise ValueError(
                f"scheduler {scheduler!r}: expected one of {', '.join(PickerName)}"
            ) from None
        db_config = opts.get("config") or {}
        if not isinstance(db_config, Mapping):
            db_config = {}
        from_store = {k: v for k, v in (store_config or {}).items() if k not in db_config}
        config = {**from_store, **db_config}
        raw_selector = opts.get("agent_selection_strategy") or "dispersed"
        try:
            selector = SelectorName(str(raw_selector))
        except ValueError:
            raise ValueError(
                f"agent_selection_strategy {raw_selector!r}: expected one of"
                f" {', '.join(SelectorName)}"
            ) from None
        skip = config.get("num_retries_to_skip", 0)
        if isinstance(skip, bool) or not isinstance(skip, int | str) or not str(skip).isdigit():
            where = (
                f"config/plugins/scheduler/{picker}/num_retries_to_skip"
                if "num_retries_to_skip" in from_store
                else "config.num_retries_to_skip"
            )
            raise ValueError(f"{where} {skip!r}: expected an integer >= 0")
        priority = opts.get("agent_selection_resource_priority") or DEFAULT_RESOURCE_PRIORITY
        return cls(
            picker=picker,
            selector=selector,
            num_retries_to_skip=int(skip),
            resource_priority=tuple(str(p) for p in priority),
        )


@dataclass(frozen=True, slots=True)
class SchedulingSnapshot:
    """Everything one pass reads, loaded by the manager in one transaction."""

    scaling_group: str
    now: datetime
    agents: tuple[AgentSnapshot, ...]
    pending: tuple[PendingSession, ...]
    options: SchedulerOptions = SchedulerOptions()
    predicate_context: PredicateContext | None = None  # None: no limits, nothing running
    occupancy_by_access_key: Mapping[str, ResourceSlot] = field(default_factory=dict)
    last_roundrobin_agent: str | None = None
