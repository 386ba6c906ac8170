"""The manager's side of scheduling: snapshot, plan application, binding, the loop.

Decisions are made by the pure :mod:`accelshare.sched`; this package does the I/O
around them (see :mod:`.loop` for the lock and the triggers).
"""

from .apply import AppliedPlan, BindJob, apply_plan
from .binding import Binder
from .loop import PassResult, Scheduler, advisory_key
from .snapshot import LoadedSnapshot, load_snapshot

__all__ = [
    "AppliedPlan",
    "BindJob",
    "Binder",
    "LoadedSnapshot",
    "PassResult",
    "Scheduler",
    "advisory_key",
    "apply_plan",
    "load_snapshot",
]
