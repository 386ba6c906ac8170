"""The placement algorithms, on whole *units* (1 for discrete maps, one quantum for
fractional maps), so that every split adds up exactly and runs on fast ``int``\\ s.

Every function is pure: it gets the free units per device (``spare``) and the
amount still needed, and returns how many units to take from which device.  The
callers (the maps) check the totals first, convert units back to ``Decimal`` and
own the allocated amounts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = [
    "best_fit",
    "fill",
    "fits_unfragmented",
    "is_unfragmented_split",
    "largest_unfragmented",
    "pack_unfragmented",
    "split_over_windows",
    "spread_evenly",
]


def fill(order: Sequence[str], spare: Mapping[str, int], need: int) -> dict[str, int]:
    """FILL: walk ``order`` taking ``min(still needed, spare)`` from each device.

    The caller has checked that the total spare covers ``need``.

    >>> fill(["a", "b"], {"a": 10, "b": 8}, 12)
    {'a': 10, 'b': 2}
    """
    taken: dict[str, int] = {}
    for device in order:  # once satisfied, ``need`` is 0 and the rest take nothing
        amount = min(need, spare[device])
        if amount > 0:
            taken[device] = amount
            need -= amount
    return taken


def spread_evenly(order: Sequence[str], spare: Mapping[str, int], need: int) -> dict[str, int]:
    """Discrete EVENLY: integer spreading in rounds over the devices with spare > 0.

    Each round every candidate gets ``need // n`` and the first ``need % n`` one more,
    each capped by its spare; repeat until nothing is needed.  The caller has checked
    that the total spare covers ``need``, so every round makes progress.

    Three devices of 10, all free, then 7 -> 3 + 2 + 2; afterwards 23 -> 7 + 8 + 8
    (the order is most free first: the two devices with 8 free come first):

    >>> spread_evenly(["d0", "d1", "d2"], {"d0": 10, "d1": 10, "d2": 10}, 7)
    {'d0': 3, 'd1': 2, 'd2': 2}
    >>> spread_evenly(["d1", "d2", "d0"], {"d0": 7, "d1": 8, "d2": 8}, 23)
    {'d1': 8, 'd2': 8, 'd0': 7}
    """
    # The first round, when it is the only one: at least ``need`` devices have spare, so
    # each of the first ``need`` of them gets one unit (a few cores out of 64, mostly).
    first: dict[str, int] = {}
    for device in order:
        if spare[device] > 0:
            first[device] = 1
            if len(first) == need:
                return first
    taken = dict.fromkeys(order, 0)
    while need > 0:
        candidates = [d for d in order if spare[d] - taken[d] > 0]
        base, extra = divmod(need, len(candidates))
        for index, device in enumerate(candidates):
            amount = min(base + (1 if index < extra else 0), spare[device] - taken[device])
            taken[device] += amount
            need -= amount
    return {device: amount for device, amount in taken.items() if amount}


def best_fit(ordered: Sequence[str], spare: Mapping[str, int], need: int) -> str | None:
    """The device with the *least* spare that still holds ``need`` whole, or None.

    ``ordered`` is most free first; scanning from the least-free end means that among
    equal spares the device that sorts last wins (this keeps big holes for big requests).

    >>> best_fit(["a0", "a1", "a2"], {"a0": 30, "a1": 20, "a2": 10}, 15)
    'a1'
    """
    if not ordered or spare[ordered[0]] < need:
        return None
    # Always found: the most-free device (ordered[0]) holds it, so no default is needed.
    return next(device for device in reversed(ordered) if spare[device] >= need)


def _split_window(spares: Sequence[int], start: int, width: int, need: int) -> tuple[int, int, int]:
    """Split ``need`` exactly over ``spares[start:start + width]`` (most free first).

    Devices whose spare is below (still needed)/(devices left) are filled completely,
    least free first; the remaining k devices get ``need // k`` each and the leftover
    units go one each to the most free.  Returns ``(k, base, extra)``: the amounts are
    ``[base + 1] * extra + [base] * (k - extra)`` followed by the filled devices' spares.
    Spares [10, 8, 1], need 12 -> (2, 5, 1), that is [6, 5, 1].

    Each device filled has less than the average still needed, and filling it raises
    that average, so filled devices never get more than ``base`` (and none is filled
    when ``base`` is 0): :func:`_score` relies on this.
    """
    k = width
    while k > 1 and spares[start + k - 1] * k < need:
        need -= spares[start + k - 1]
        k -= 1
    base, extra = divmod(need, k)
    return k, base, extra


def _score(
    spares: Sequence[int], start: int, width: int, split: tuple[int, int, int], min_units: int
) -> tuple[int, int, int]:
    """(evenness, -devices used, -fragments) of a split: higher is better.

    Evenness is minus the sum of differences between consecutive sorted amounts of the
    devices used, that is min - max.  A fragment is a used device left with a spare that
    is non-zero but below ``min_units`` (EVENLY would ignore it afterwards).  Computed
    from ``(k, base, extra)`` without building the amounts.
    """
    k, base, extra = split
    filled = width - k
    top = base + 1 if extra else base
    # The smallest amount: the least-free filled device, else base (or 1 when base is 0).
    low = spares[start + width - 1] if filled else (base or 1)
    used = (k if base else extra) + filled
    fragments = 0
    if min_units > 1:  # with whole units, 0 < left < 1 cannot happen
        for index in range(k):
            amount = base + 1 if index < extra else base
            if amount and 0 < spares[start + index] - amount < min_units:
                fragments += 1
    return (low - top, -used, -fragments)


def _amounts(
    spares: Sequence[int], start: int, width: int, split: tuple[int, int, int]
) -> list[int]:
    k, base, extra = split
    window = [base + 1] * extra + [base] * (k - extra) + list(spares[start + k : start + width])
    return [0] * start + window + [0] * (len(spares) - start - width)


def split_over_windows(spares: Sequence[int], need: int, min_units: int) -> list[int]:
    """Fractional EVENLY multi-device split; returns the amounts aligned with ``spares``.

    ``spares`` is most free first, no single device holds ``need`` and the total covers
    it.  Let n be the fewest most-free devices that cover ``need``; for each window size
    w = n .. len, slide a window from the most-free end while its spare covers ``need``,
    split each window with :func:`_split_window` and keep the best score (ties go to the
    window found last); a size stops sliding once evenness gets worse than its first
    window.  Two GPUs with 10 and 8 quanta free, need 12 -> [6, 6].

    Once a perfectly even split is found, wider windows cannot win (they use at least
    ``min(w, need)`` devices, and each device used gets at least one unit), so the
    search stops there; the result is the same as scanning every size.
    """
    total, n = 0, 0
    while total < need:
        total += spares[n]
        n += 1
    best = (0, 0, (0, 0, 0))  # start, width, split
    best_score: tuple[int, int, int] | None = None
    for width in range(n, len(spares) + 1):
        if best_score and best_score[0] == 0 and min(width, need) > -best_score[1]:
            break
        window_total = sum(spares[:width])
        first_evenness = None
        for start in range(len(spares) - width + 1):
            if start:
                window_total += spares[start + width - 1] - spares[start - 1]
            if window_total < need:
                break
            split = _split_window(spares, start, width, need)
            score = _score(spares, start, width, split, min_units)
            if first_evenness is None:
                first_evenness = score[0]
            elif score[0] < first_evenness:
                break
            if best_score is None or score >= best_score:
                best, best_score = (start, width, split), score
    return _amounts(spares, *best)


def fits_unfragmented(spares: Sequence[int], capacity: int, need: int) -> bool:
    """The anti-fragmentation guard: can ``need`` be placed without fragmenting?

    With C = ``capacity`` (homogeneous devices assumed) and R = ``need``: if R <= C it
    must fit on a single device; otherwise some n in ceil(R/C) .. len(spares) must admit
    an even split D = R // n with ``extra = R - D*n`` devices taking D + 1: at least
    ``extra`` devices with spare >= D + 1 and at least n with spare >= D.

    >>> fits_unfragmented([6, 6], 10, 12)     # 0.6 + 0.6 of two 1.0 GPUs, quantum 0.1
    True
    >>> fits_unfragmented([6, 6], 10, 8)      # 0.8 must fit on one GPU
    False
    """
    if need <= capacity:
        return any(s >= need for s in spares)
    for count in range(-(-need // capacity), len(spares) + 1):
        base, extra = divmod(need, count)
        if (
            sum(1 for s in spares if s >= base + 1) >= extra
            and sum(1 for s in spares if s >= base) >= count
        ):
            return True
    return False


def is_unfragmented_split(amounts: Sequence[int], capacity: int, need: int) -> bool:
    """Whether a placement of ``need`` as ``amounts`` (one per device) is one the guard
    of :func:`fits_unfragmented` allows: R <= C on a single device; otherwise n >=
    ceil(R/C) devices taking D = R // n or D + 1 each.

    >>> is_unfragmented_split([6, 6], 10, 12)
    True
    >>> is_unfragmented_split([9, 3], 10, 12)
    False
    >>> is_unfragmented_split([4, 4], 10, 8)
    False
    """
    parts = [a for a in amounts if a]
    if sum(parts) != need or not parts:
        return False
    if need <= capacity:
        return len(parts) == 1
    base = need // len(parts)
    return len(parts) >= -(-need // capacity) and all(a in (base, base + 1) for a in parts)


def largest_unfragmented(spares: Sequence[int], capacity: int) -> tuple[int, int]:
    """The largest amounts :func:`fits_unfragmented` accepts: (at most C, above C).

    At or below C it is the largest spare (capped at C).  Above C the accepted amounts
    are closed downwards, and the best for n devices is n * s_n + min(n - 1, #devices
    with spare >= s_n + 1), s_n being the n-th largest spare (0 when none is above C).

    >>> largest_unfragmented([6, 6], 10)
    (6, 12)
    """
    ordered = sorted(spares, reverse=True)
    single = min(capacity, ordered[0]) if ordered else 0
    above = 0
    for count in range(2, len(ordered) + 1):
        base = ordered[count - 1]
        candidate = count * base + min(count - 1, sum(1 for s in ordered if s >= base + 1))
        if candidate > capacity:
            above = max(above, candidate)
    return single, above


def pack_unfragmented(spares: Sequence[int], capacity: int, need: int) -> list[int] | None:
    """The packing placement of a request the guard of :func:`fits_unfragmented` admits:
    amounts aligned with ``spares`` (most free first), or None when these devices admit
    no such shape.

    Among the guard's shapes it keeps the free share in holes as large as possible: it
    maximises the *hole score*, the sum of the squared spares left (in units), so that
    a whole free device counts for more than the same share in pieces.

    * R <= C goes whole on the device with the least spare that holds it (best fit:
      the score loses 2Rs - R^2, least for the smallest s).
    * A larger R is tried on each n >= ceil(R/C) that admits the even split D = R // n
      (``extra`` = R - D*n devices taking D + 1): the D + 1 parts on the tightest
      devices that hold them, the D parts on the devices with exactly D spare (filled)
      and then on the next tightest.  The n with the best score wins, the fewest
      devices on a tie.

    Among equal spares the device that comes last in ``spares`` is taken first.

    >>> pack_unfragmented([10, 10, 8, 8, 7], 10, 15)   # 8 + 7 fill an 8 and the 7
    [0, 0, 0, 8, 7]
    >>> pack_unfragmented([10, 4, 4], 10, 13)          # 7 + 6 does not fit: 5 + 4 + 4
    [5, 4, 4]
    >>> pack_unfragmented([10, 3, 3], 10, 13)          # the guard refuses
    >>> pack_unfragmented([10, 9, 5], 10, 9)
    [0, 9, 0]
    """
    count = len(spares)
    if need <= capacity:
        for i in range(count - 1, -1, -1):
            if spares[i] >= need:
                amounts = [0] * count
                amounts[i] = need
                return amounts
        return None
    best: list[int] | None = None
    best_score = -1
    for n in range(-(-need // capacity), count + 1):
        base, extra = divmod(need, n)
        # Devices [0, larger) can take D + 1, [larger, fitting) exactly D (most free first).
        larger = fitting = 0
        while fitting < count and spares[fitting] >= base:
            if spares[fitting] > base:
                larger += 1
            fitting += 1
        if larger < extra or fitting < n:
            continue
        amounts = [0] * count
        # Tightest first: the D + 1 parts on the last ``extra`` of the larger devices;
        # the D parts on the exact fits, then on the larger devices just before those.
        for i in range(larger - extra, larger):
            amounts[i] = base + 1
        low = n - extra
        for i in range(fitting - 1, -1, -1):
            if low == 0:
                break
            if not amounts[i]:
                amounts[i] = base
                low -= 1
        score = sum((s - a) * (s - a) for s, a in zip(spares, amounts, strict=True))
        if score > best_score:
            best, best_score = amounts, score
    return best
