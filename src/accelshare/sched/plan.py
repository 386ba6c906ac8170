"""One scheduling pass over a frozen snapshot, for the manager: sessions in, a plan out
(pure, no I/O).  How a pass goes (priority bands, pickers, predicates, fit, the
no-starvation rule and why-pending reasons) is told in :mod:`accelshare.sched.onepass`.

This module is the pure core's entry point: :func:`plan_pass` (or :func:`place_pass`,
then :meth:`PlacedPass.explain`).  The vocabulary of a pass lives in
:mod:`accelshare.sched.snapshot` (what it reads), :mod:`accelshare.sched.outcome` (what
it decides) and :mod:`accelshare.sched.memo` (what it keeps for the next).
"""

from __future__ import annotations

from dataclasses import replace

from .fit import MapLayouts
from .memo import PlanMemo
from .onepass import Pass
from .outcome import SchedulingPlan
from .snapshot import SchedulingSnapshot

__all__ = [
    "PlacedPass",
    "place_pass",
    "plan_pass",
]


def plan_pass(
    snapshot: SchedulingSnapshot,
    memo: PlanMemo | None = None,
    *,
    layouts: MapLayouts | None = None,
) -> SchedulingPlan:
    """Run one pass (see :mod:`accelshare.sched.onepass`) and return the plan; the
    snapshot is untouched.  ``memo`` (the scaling group's, kept by the caller between
    passes) saves working out again the reasons of agents that did not change;
    ``layouts`` (or the memo's) keeps the device layouts' empty maps and verdicts.  The
    plan is the same with or without either.  The same as
    ``place_pass(snapshot, memo).explain()``."""
    return place_pass(snapshot, memo, layouts=layouts).explain()


class PlacedPass:
    """A pass whose placements are decided (:func:`place_pass`): :attr:`placements` is
    the plan without its failures; :meth:`explain` works out why every other session
    stays pending and returns the whole plan (the same as :func:`plan_pass`'s).

    On a full cluster the explanations are most of a pass (a :class:`Failure` for each
    pending session), and nothing of the placements depends on them: the manager
    applies and binds the placements first, then explains (the reasons are those as of
    the end of the placements either way).  Until :meth:`explain` runs, the memo holds
    the previous pass's reasons and orders, which stay exact."""

    __slots__ = ("_plan", "_run", "placements")

    def __init__(self, run: Pass) -> None:
        self._run = run
        self._plan: SchedulingPlan | None = None
        self.placements = SchedulingPlan(
            run.snapshot.scaling_group, tuple(run.assignments), (), run.last_roundrobin
        )

    def explain(self) -> SchedulingPlan:
        """The whole plan (worked out once; later calls return it again)."""
        if self._plan is None:
            self._plan = replace(self.placements, failures=self._run.explain())
        return self._plan


def place_pass(
    snapshot: SchedulingSnapshot,
    memo: PlanMemo | None = None,
    *,
    layouts: MapLayouts | None = None,
) -> PlacedPass:
    """The placements of one pass (see :func:`plan_pass` and :class:`PlacedPass`).
    ``layouts``: kept across passes by a caller without a memo (else the memo's)."""
    run = Pass(snapshot, memo, layouts)
    run.run()
    return PlacedPass(run)
