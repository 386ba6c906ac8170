"""Priority bands and the order inside each (pure, no I/O): a pass tries the bands
highest priority first (:func:`priority_bands`), and inside a band the scaling group's
picker orders the sessions (:class:`BandOrders`); a fifo or lifo band the same as the
previous pass's keeps its order through the :class:`~accelshare.sched.memo.PlanMemo`."""

from __future__ import annotations

import operator
from collections.abc import Iterable, Iterator
from datetime import datetime

from accelshare.common import ResourceSlot

from .memo import BandOrder, PlanMemo
from .model import PendingSession
from .pickers import PickerName, pick
from .snapshot import SchedulerOptions

__all__ = ["BandOrders", "priority_bands"]


def priority_bands(pending: Iterable[PendingSession]) -> list[list[PendingSession]]:
    """The sessions by priority, highest first (each band in the order given)."""
    bands: dict[int, list[PendingSession]] = {}
    for session in pending:
        bands.setdefault(session.priority, []).append(session)
    return [bands[priority] for priority in sorted(bands, reverse=True)]


def _age_key(session: PendingSession) -> tuple[datetime, str]:
    return (session.created_at, session.id)


class BandOrders:
    """The picker's order of each band of one pass."""

    __slots__ = ("drf_occupancy", "memo", "options", "orders", "total_capacity")

    def __init__(
        self,
        options: SchedulerOptions,
        memo: PlanMemo | None,
        drf_occupancy: dict[str, ResourceSlot],
        total_capacity: ResourceSlot,
    ) -> None:
        self.options = options
        self.memo = memo
        self.drf_occupancy = drf_occupancy  # the pass's, kept up to date by its placements
        self.total_capacity = total_capacity  # only drf reads it
        self.orders: dict[int, BandOrder] = {}  # the memo's, for the next pass

    def sequence(self, band: list[PendingSession]) -> Iterator[PendingSession]:
        """The picker's order for a band, one session at a time.

        fifo/lifo orders do not change while the pass runs, so they are sorted once
        (the same order repeated :func:`~accelshare.sched.pickers.pick` calls give);
        drf re-picks after every placement because the shares move.
        """
        options = self.options
        if options.picker is PickerName.DRF:
            remaining = list(band)
            while remaining:
                chosen = pick(
                    PickerName.DRF,
                    remaining,
                    occupancy_by_access_key=self.drf_occupancy,
                    total_capacity=self.total_capacity,
                )
                assert chosen is not None
                remaining.remove(chosen)
                yield chosen
            return
        how = (options.picker, options.num_retries_to_skip)
        memo = self.memo
        if memo is not None and band:
            known = memo.orders.get(band[0].priority)
            if (
                known is not None
                and known[0] == how
                and len(known[1]) == len(band)
                and all(map(operator.is_, known[1], band))
            ):
                self.orders[band[0].priority] = known
                yield from known[2]
                return
        ordered = sorted(band, key=_age_key, reverse=options.picker is PickerName.LIFO)
        skip = options.num_retries_to_skip
        if options.picker is PickerName.FIFO and skip > 0:
            fresh = [s for s in ordered if s.retries < skip]
            stale = [s for s in ordered if s.retries >= skip]
            ordered = fresh + stale
        if memo is not None and band:
            self.orders[band[0].priority] = (how, band, ordered)
        yield from ordered

    def placed(self, session: PendingSession) -> None:
        """Account a placement in the DRF shares (only drf reads them)."""
        if self.options.picker is PickerName.DRF:
            key = session.access_key
            self.drf_occupancy[key] = self.drf_occupancy.get(key, ResourceSlot()) + (
                session.requested_slots
            )
