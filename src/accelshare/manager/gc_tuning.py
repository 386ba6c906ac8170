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

In ``bench/sched_bench.py`` (1,000 agents, 10,000 pending) the fill then sees one full
collection instead of four to six (its figures: docs/performance.md, *Scheduler scale*).
The young threshold is a compromise: a much larger one (100,000) avoids full collections
altogether but lets the manager's RSS climb for longer before garbage in cycles is freed,
which the soak tests' memory bounds read as a leak; 20,000 keeps within them.
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
