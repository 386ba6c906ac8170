"""The agents of a session's scaling group as admission judges a request by them: the
quanta and images they report, and whether one of them could ever hold the session.

A request that no agent of the scaling group could run (its image) or hold even with
nothing else running (its resources) is refused at once instead of waiting forever;
:class:`EmptyTrialMaps` keeps the agents' reported maps parsed between creates.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from accelshare.common import ResourceSlot, SlotTypes, canonical_decimal
from accelshare.sched.fit import (
    MapLayouts,
    TrialMaps,
    fits_capacity,
    format_slot_amount,
    largest_placements,
    totals_shortfall,
)
from accelshare.sched.images import ImageRequirement, image_refusal

from ...errors import InvalidRequest
from ...models import Agent, AgentStatus
from ...scheduler.snapshot import reported_map_states

__all__ = [
    "EmptyTrialMaps",
    "GroupAgent",
    "check_some_agent_could_hold",
    "check_some_agent_has",
    "group_agents",
]

_GROUP_AGENTS = (
    sa.select(
        Agent.id,
        Agent.runtime,
        Agent.architecture,
        Agent.images,
        Agent.quanta,
        Agent.compute_plugins,
        Agent.status,
        Agent.available_slots,
        Agent.views_revision,
    )
    .where(
        Agent.scaling_group == sa.bindparam("scaling_group"), Agent.status != AgentStatus.TERMINATED
    )
    .order_by(Agent.id)
)
_AGENT_VIEWS = sa.select(Agent.id, Agent.map_views).where(
    Agent.id.in_(sa.bindparam("ids", expanding=True))
)


@dataclass(frozen=True, slots=True)
class GroupAgent:
    """What the enqueue needs of an agent of the session's scaling group."""

    id: str
    runtime: str | None
    architecture: str
    images: list[str] | None
    quanta: dict[str, Any] | None
    compute_plugins: dict[str, Any] | None
    status: AgentStatus
    available_slots: ResourceSlot
    views_revision: int


async def group_agents(db: AsyncSession, scaling_group_name: str) -> list[GroupAgent]:
    """The scaling group's agents (LOST ones included, not TERMINATED), by id: one query
    for the resource quanta and the image check."""
    rows = await db.execute(_GROUP_AGENTS, {"scaling_group": scaling_group_name})
    return [GroupAgent(*row) for row in rows]


def check_some_agent_has(
    agents: Sequence[GroupAgent], rules: ImageRequirement, scaling_group_name: str
) -> None:
    """Refuse an image that no agent of the scaling group can run (by their last
    heartbeats, LOST agents included): waiting would never end.  A group without
    agents yet is not judged (they may be starting); an agent that has the image
    but is busy leaves the session PENDING as usual."""
    reasons = []
    for agent in agents:
        refusal = image_refusal(
            rules,
            agent_runtime=agent.runtime or "process",
            agent_architecture=agent.architecture,
            agent_images=frozenset(agent.images or ()),
        )
        if refusal is None:
            return
        reasons.append(f"{agent.id} {refusal}")
    if reasons:
        shown = "; ".join(reasons[:3]) + (
            f"; and {len(reasons) - 3} more" if len(reasons) > 3 else ""
        )
        raise InvalidRequest(
            f"No agent in scaling group {scaling_group_name} can run image {rules.ref}: {shown}",
            field="image",
            expected="an image some agent of the scaling group has",
            received=rules.ref,
        )


_VIEWS_CHUNK = 8  # agents whose reported maps are read at a time (13 kB each at 8 GPUs)


async def check_some_agent_could_hold(
    db: AsyncSession,
    empty_trial_maps: EmptyTrialMaps,
    agents: Sequence[GroupAgent],
    scaling_group_name: str,
    requested: ResourceSlot,
    known: Mapping[str, SlotTypes],
    *,
    allow_fragmentation: bool,
) -> None:
    """Refuse a session that no agent of the scaling group could hold even if that agent
    were empty: the scheduler's verdict (:func:`~accelshare.sched.fit.fits_capacity`, its
    ``could_fit``) on each agent's totals and last reported maps, LOST agents included.

    Judged only while at least one agent of the group is ALIVE: a group whose agents
    are all starting, restarting or lost keeps the session queued (its why-pending says
    what it waits for).  The agents whose totals cover the request are dry-run one,
    then a few at a time until one could hold it (usually the first); every agent's
    maps are read only to word a refusal."""
    if not any(a.status is AgentStatus.ALIVE for a in agents):
        return
    empty = ResourceSlot()
    candidates = [a for a in agents if not totals_shortfall(a.available_slots, empty, requested)]
    start = 0
    while start < len(candidates):
        # the first candidate alone (it usually fits), then a few at a time
        chunk = candidates[start : start + (1 if start == 0 else _VIEWS_CHUNK)]
        start += len(chunk)
        trials = await empty_trial_maps.of(db, chunk)
        for agent in chunk:
            if fits_capacity(
                agent.available_slots,
                trials[agent.id],
                requested,
                allow_fragmentation=allow_fragmentation,
            ):
                return
    trials = await empty_trial_maps.of(db, agents)
    largest = largest_placements(
        [(a.available_slots, trials[a.id]) for a in agents],
        requested,
        allow_fragmentation=allow_fragmentation,
    )
    if largest is None:  # pragma: no cover - the loop above found none that fits
        return
    most = ", ".join(f"{s} {format_slot_amount(s, v, known.get(s))}" for s, v in largest.items())
    asked = ", ".join(
        f"{s} {format_slot_amount(s, v, known.get(s))}" for s, v in requested.items() if v > 0
    )
    alive = sum(a.status is AgentStatus.ALIVE for a in agents)
    raise InvalidRequest(
        f"No agent of scaling group {scaling_group_name} could hold this session, even with"
        f" nothing else running (judged by its {alive} alive and {len(agents) - alive}"
        f" lost agent(s)): the most one agent can give one kernel is {most}"
        f" (requested: {asked}). Ask for less, or set waitForAgents"
        " (CLI: --wait-for-agents) to keep it queued for agents yet to join.",
        field="config.resources",
        expected=f"at most what one agent of scaling group {scaling_group_name} can hold: {most}",
        received=requested.to_json(),
        error="NoAgentCouldHold",
        largest={s: canonical_decimal(v) for s, v in largest.items()},
    )


def _maps_key(agent: GroupAgent) -> tuple[Any, ...]:
    plugins = {
        key: {k: v for k, v in summary.items() if k != "status"}
        for key, summary in (agent.compute_plugins or {}).items()
        if isinstance(summary, Mapping)
    }
    return (
        agent.views_revision,
        tuple(sorted((s, canonical_decimal(v)) for s, v in agent.available_slots.items())),
        json.dumps(plugins, sort_keys=True, default=str),
    )


class EmptyTrialMaps:
    """Agents' last reported maps as :class:`TrialMaps`\\ s, for "could an empty agent
    hold this?" at enqueue (their empty layout is what :func:`fits_capacity` judges).
    Parsing them costs milliseconds per create on large agents, and they change only
    with the agent's heartbeats: kept per agent with its
    ``views_revision`` (bumped whenever its stored maps change) and its totals and
    plugin summary, so a trial is reused only for the very maps it was read from.  The
    trials share one :class:`MapLayouts`.  Owned by the session service (one per manager)."""

    def __init__(self, max_agents: int = 4096) -> None:
        self.max_agents = max_agents
        self.layouts = MapLayouts()
        self._trials: dict[str, tuple[tuple[Any, ...], TrialMaps]] = {}

    async def of(self, db: AsyncSession, agents: Sequence[GroupAgent]) -> dict[str, TrialMaps]:
        """Each agent's trial, read from the database only for agents whose maps
        changed since they were last read here."""
        found: dict[str, TrialMaps] = {}
        stale: list[tuple[GroupAgent, tuple[Any, ...]]] = []
        for agent in agents:
            key = _maps_key(agent)
            entry = self._trials.get(agent.id)
            if entry is not None and entry[0] == key:
                found[agent.id] = entry[1]
            else:
                stale.append((agent, key))
        if stale:
            views = await _agent_views(db, [a.id for a, _ in stale])
            if len(self._trials) + len(stale) > self.max_agents:
                self._trials.clear()
            for agent, key in stale:
                states = reported_map_states(views.get(agent.id))
                trial = TrialMaps(agent.id, states, self.layouts)
                self._trials[agent.id] = (key, trial)
                found[agent.id] = trial
        return found


async def _agent_views(db: AsyncSession, ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    rows = await db.execute(_AGENT_VIEWS, {"ids": list(ids)})
    return {row.id: row.map_views for row in rows}
