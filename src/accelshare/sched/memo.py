"""What one scheduling pass keeps for the next (:class:`PlanMemo`), and the keys it keeps
it by: a session's *shape* (:func:`shape_key`) and a band's order (pure, no I/O)."""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal

from .fit import MapLayouts
from .images import ImageRequirement
from .model import PendingSession
from .pickers import PickerName
from .snapshot import AgentSnapshot

__all__ = ["BandOrder", "PlanMemo", "ShapeKey", "memo_number", "shape_key"]

ShapeKey = tuple[tuple[tuple[str, Decimal], ...], bool, str | None, ImageRequirement | None]
"""What a session's fit depends on besides the cluster (:func:`shape_key`)."""

BandOrder = tuple[tuple[PickerName, int], list[PendingSession], list[PendingSession]]
"""A band's order: ``((picker, num_retries_to_skip), the band as given, its order)``."""


def shape_key(session: PendingSession) -> ShapeKey:
    """What a session's fit depends on besides the cluster: its request, its
    fragmentation option, its designated agent and its catalogue image (sessions of one
    shape fit alike)."""
    return (
        tuple(sorted(session.requested_slots.items())),
        session.allow_fragmentation,
        session.designated_agent,
        session.image,
    )


def memo_number(memo: PlanMemo, session: PendingSession) -> int | None:
    """The shape number the memo kept for this very session object (None: not kept)."""
    known = memo.shape_ids.get(id(session))
    return known[1] if known is not None and known[0] is session else None


@dataclass(slots=True)
class PlanMemo:
    """What one pass keeps for the next (owned by the caller, one per scaling group;
    only :func:`~accelshare.sched.plan.plan_pass` reads and writes it): shown agents'
    reasons and pending sessions' shape keys.  The plan is the same with or without it.

    *Reasons.* A shown agent's reason for a shape is a function of the agent's snapshot and the
    shape alone when the pass placed nothing on it and no waiting session protects
    anything there; on a full cluster most shown agents stay so pass after pass (a
    release changes one agent), and working their reasons out again would be most of a
    release pass.  An entry is used only for the *same* :class:`AgentSnapshot` object
    (the manager's snapshot cache hands an unchanged agent's object again; an equal
    but new one is explained anew): the entry holds the object, so its id cannot be
    reused.  Entries a pass did not use are dropped.

    *Shape keys.* Working out a session's shape key (its sorted request, options and
    image) and hashing it is a large part of a pass over many pending sessions; the
    snapshot cache hands an unchanged session's object again, so the key is kept per
    session object (by identity, holding the object) as a small int, interned while
    some session uses it.

    *Orders.* A fifo or lifo band of the very same session objects, in the same order,
    as the previous pass's is ordered as it was (without sorting it again).

    *Layouts.* The device layouts' empty maps and empty-map verdicts
    (:class:`~accelshare.sched.fit.MapLayouts`); the caller may give every scaling
    group's memo the same one."""

    entries: dict[tuple[ShapeKey, str], tuple[AgentSnapshot, str]] = field(default_factory=dict)
    hits: int = 0
    shape_ids: dict[int, tuple[PendingSession, int]] = field(default_factory=dict)
    shape_keys: dict[ShapeKey, int] = field(default_factory=dict)
    next_shape: int = 0
    orders: dict[int, BandOrder] = field(default_factory=dict)  # per priority
    layouts: MapLayouts = field(default_factory=MapLayouts)
