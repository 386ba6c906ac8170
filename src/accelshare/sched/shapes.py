"""Sessions of one *shape* fit alike (pure, no I/O): what one pass knows about each shape
(:class:`Shape`: the agents that refused it, whether it failed, where it could fit when
empty) and the book of a pass's shapes (:class:`ShapeBook`), numbered through the
previous pass's :class:`~accelshare.sched.memo.PlanMemo` where there is one."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from decimal import Decimal

from accelshare.common import SlotName

from .capacity import Capacity, RankSignature
from .images import ImageRequirement, image_refusal
from .memo import PlanMemo, ShapeKey, memo_number, shape_key
from .model import AgentState, PendingSession

__all__ = ["Fit", "Shape", "ShapeBook", "is_accelerator"]


@functools.lru_cache(maxsize=1024)
def is_accelerator(slot: str) -> bool:
    return SlotName(slot).is_accelerator


@dataclass(slots=True)
class Shape:
    """What a pass knows about one shape (:func:`~accelshare.sched.memo.shape_key`): sessions of one shape fit alike.

    Within a pass capacities only shrink, and whether an agent can hold a shape only
    gets less likely as they do (totals, the held-for rule and the per-device dry run
    are all monotone, see :meth:`~accelshare.sched.fit.TrialMaps.refusal`), so an
    agent that refused a shape (``dead``) refuses it for the rest of the pass, and a
    shape that found no agent (``failed``) finds none for the rest of the pass: later
    sessions of that shape fail in O(1) (like Kubernetes' equivalence cache, but exact).
    """

    key: ShapeKey
    request: tuple[tuple[str, Decimal], ...]  # positive amounts, in the request's order
    items: tuple[tuple[str, Decimal], ...]  # every amount (what a commit adds)
    signature: RankSignature
    pool: tuple[int, ...] | None  # None: every agent (no designated agent, no image)
    dead: set[int] = field(default_factory=set)
    failed: Fit | None = None
    could_fit: bool | None = None  # some agent of the pool could hold it when empty
    usable: frozenset[str] | None = None  # the agents of the pool that could
    # refusing fragmentation: the accelerator slots it asks for (the agent choice packs)
    packs: tuple[str, ...] = ()


@dataclass(slots=True)
class Fit:
    """A shape's failed fit: whether a waiting higher-priority session held it back and
    whether some agent could hold it when empty; the per-agent reasons are worked out
    when the pass ends (:mod:`accelshare.sched.reasons`)."""

    reasons: list[str]
    # None: the shape's (:meth:`~accelshare.sched.emptyfit.EmptyFit.fit_could_fit`),
    # worked out only when read: a band that protects nothing reads it in the
    # explanations, after the binds went out
    could_fit: bool | None
    deferred_by: int | None
    refused: int = 1  # how many agents refused (the reasons list at most MAX_AGENT_REASONS)
    shape: Shape | None = None
    deferral_key: tuple[int, int] = (0, 0)  # (blockers, commits on protected agents)


class ShapeBook:
    """The shapes of one pass, by shape key (or by the memo's shape number: the memo
    keeps each session object's number, so an unchanged session's key is not worked
    out again)."""

    __slots__ = ("_by_key", "capacity", "memo", "numbered", "session_shapes", "states")

    def __init__(
        self, capacity: Capacity, states: dict[str, AgentState], memo: PlanMemo | None
    ) -> None:
        self.capacity = capacity
        self.states = states  # read for image facts only (placements do not change them)
        self.memo = memo
        self._by_key: dict[ShapeKey, Shape] = {}
        # the memo's shape number -> shape, and per session object its number (for the
        # next memo); the pass reads and writes them on its O(1) path (Pass.try_session)
        self.numbered: dict[int, Shape] = {}
        self.session_shapes: dict[int, tuple[PendingSession, int]] = {}

    def of(self, session: PendingSession) -> Shape:
        """The session's shape (made on its first session in the pass)."""
        memo = self.memo
        if memo is None:
            key = shape_key(session)
            shape = self._by_key.get(key)
            if shape is not None:
                return shape
            return self._new(session, key)
        number = memo_number(memo, session)
        if number is None:
            key = shape_key(session)
            found = memo.shape_keys.get(key)
            if found is None:
                found = memo.shape_keys[key] = memo.next_shape
                memo.next_shape += 1
            number = found
        self.session_shapes[id(session)] = (session, number)
        shape = self.numbered.get(number)
        if shape is None:
            shape = self.numbered[number] = self._new(session, shape_key(session))
        return shape

    def _new(self, session: PendingSession, key: ShapeKey) -> Shape:
        items = tuple(session.requested_slots.items())
        request = tuple((s, v) for s, v in items if v > 0)
        signature = self.capacity.signature([s for s, _ in request])
        pool: tuple[int, ...] | None = None  # every agent
        if session.designated_agent is not None:
            pool = (self.capacity.index[session.designated_agent],)
        if session.image is not None:  # only agents that can run the image (sched.images)
            image = session.image
            pool = tuple(
                i
                for i in (range(len(self.capacity.ids)) if pool is None else pool)
                if self._can_run(image, self.capacity.ids[i])
            )
        shape = self._by_key[key] = Shape(key, request, items, signature, pool)
        if not session.allow_fragmentation and session.designated_agent is None:
            shape.packs = tuple(s for s, _ in request if is_accelerator(s))
        return shape

    def _can_run(self, image: ImageRequirement, agent_id: str) -> bool:
        agent = self.states[agent_id]
        refusal = image_refusal(
            image,
            agent_runtime=agent.runtime,
            agent_architecture=agent.architecture,
            agent_images=agent.images,
        )
        return refusal is None

    def keep(self) -> None:
        """After the pass: the memo keeps the shape keys of this pass's sessions only."""
        memo = self.memo
        if memo is None:
            return
        memo.shape_ids = self.session_shapes
        used = {number for _, number in self.session_shapes.values()}
        memo.shape_keys = {key: n for key, n in memo.shape_keys.items() if n in used}
