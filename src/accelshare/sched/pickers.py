"""Pickers: which pending session a scheduling pass tries next.

Each picker takes the candidates (already restricted to one priority band) and
returns the one to try.  They never see agents.

* ``fifo`` — the oldest.  With ``num_retries_to_skip = N > 0`` sessions that already
  failed N or more times are skipped, so one unplaceable session at the head does not
  block the queue; if every candidate is skipped the oldest is tried anyway.
* ``lifo`` — the newest.
* ``drf`` — dominant resource fairness: the access key with the smallest dominant
  share among existing sessions (share = max over slots of occupied / capacity), then
  that key's oldest pending session.

Example (drf): capacity {cpu: 10, cuda.shares: 4}; alice occupies {cpu: 1, cuda.shares: 2}
(dominant share 0.5), bob occupies {cpu: 4} (0.4) → bob's oldest pending session goes next.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from decimal import Decimal

from accelshare.common import ResourceSlot

from .model import PendingSession

__all__ = ["PickerName", "dominant_share", "pick"]


class PickerName(enum.StrEnum):
    FIFO = "fifo"
    LIFO = "lifo"
    DRF = "drf"


def _age_key(session: PendingSession) -> tuple[object, str]:
    # created_at first; the id breaks ties so the order never depends on input order.
    return (session.created_at, session.id)


def dominant_share(occupied: ResourceSlot, capacity: ResourceSlot) -> Decimal:
    """max over slots of occupied / capacity (slots with no capacity are ignored)."""
    shares = [
        occupied.get_amount(slot) / total
        for slot, total in capacity.items()
        if total > 0 and total.is_finite()
    ]
    return max(shares, default=Decimal(0))


def pick(
    picker: PickerName | str,
    candidates: Sequence[PendingSession],
    *,
    num_retries_to_skip: int = 0,
    occupancy_by_access_key: Mapping[str, ResourceSlot] | None = None,
    total_capacity: ResourceSlot | None = None,
) -> PendingSession | None:
    """Return the session to try next, or None when there is none."""
    if not candidates:
        return None
    name = PickerName(picker)
    if name is PickerName.LIFO:
        return max(candidates, key=_age_key)
    if name is PickerName.DRF:
        return _pick_drf(candidates, occupancy_by_access_key or {}, total_capacity)
    ordered = sorted(candidates, key=_age_key)
    if num_retries_to_skip > 0:
        for session in ordered:
            if session.retries < num_retries_to_skip:
                return session
    return ordered[0]


def _pick_drf(
    candidates: Sequence[PendingSession],
    occupancy: Mapping[str, ResourceSlot],
    capacity: ResourceSlot | None,
) -> PendingSession:
    total = capacity or ResourceSlot()
    empty = ResourceSlot()

    def key(session: PendingSession) -> tuple[Decimal, object, str]:
        share = dominant_share(occupancy.get(session.access_key, empty), total)
        return (share, session.created_at, session.id)

    return min(candidates, key=key)
