"""Python's cyclic garbage collector, tuned for the manager's long-lived process.

The manager keeps large, long-lived heaps: the scheduler's snapshot caches (a parsed
agent and pending session per row), SQLAlchemy's and pydantic's structures, the
application itself — about a million container objects at 1,000 agents and 10,000
pending sessions.  With CPython's default thresholds (700, 10, 10) a full (generation 2)
collection runs each time that heap has grown by a quarter, and every one scans all of
it, for hundreds of milliseconds at that size, several in a row while a burst of
sessions is placed, with the event loop (API, binds, heartbeats) frozen meanwhile; they
find almost nothing to free (the manager's data is freed by reference counting).

:func:`tune_gc`, called once the application is built:

* ``gc.freeze()``: what exists then (modules, classes, the app, the ORM's mappers) moves
  to the permanent generation and is never scanned again (it lives as long as the
  process);
* thresholds :data:`GC_THRESHOLDS`: a young collection every 20,000 net allocations
  instead of 700 (each still scans only the young objects), so full collections come
  about 30 times less often.  Cycles are still collected, later: the young generation
  holds at most ~20,000 objects of garbage in cycles (a few MiB).

Measured in ``bench/sched_bench.py`` (1,000 agents, 10,000 pending, SQLite): 651 → 896-1,062
placements/s, one full collection during the run instead of four to six
(docs/performance.md).  100,000 gave no full collection at all but let the manager's RSS
climb for longer: the short soak test (25 s) read the ramp as a 35-42 MiB/min leak; at
20,000 both the short and the 240 s soak (2 MiB/min bound) pass.
"""

from __future__ import annotations

import gc

__all__ = ["GC_THRESHOLDS", "tune_gc"]

GC_THRESHOLDS = (20_000, 10, 10)


def tune_gc() -> None:
    """Freeze what exists now and raise the thresholds (process-wide; idempotent)."""
    gc.collect()  # free what start-up left in cycles before freezing the rest
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
