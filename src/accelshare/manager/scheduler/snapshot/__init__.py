"""Load one scaling group's :class:`~accelshare.sched.snapshot.SchedulingSnapshot` (one transaction).

Everything the pure pass reads comes from the database in the scheduler's
transaction, so counters cannot drift (spec 05):

* ALIVE, schedulable agents of the group; their *occupied* totals recomputed from
  their resource-occupying kernels, and their per-device maps rebuilt from the last
  heartbeat's ``PluginMapView``\\ s with :func:`~accelshare.sched.fit.device_taken_amount`:
  a device counts what the manager's own kernels hold there (planned placements of
  kernels the agent has not created yet included) plus what the agent reports for
  kernels the manager has no row for (and legacy holdings);
* PENDING sessions in FIFO order, with retries and fragmentation option;
* the predicates' counters: concurrent sessions per access key, occupancy per
  keypair / user / group / domain (over every scaling group), the keypairs' policy
  limits and the user / group / domain quotas, and the dependencies' states.

What is *derived* from rows is cached between passes (:class:`SnapshotCache`, one per
scaling group, in the scheduler's process) but never what is *read*: every pass still
reads every row it uses in its transaction, JSON columns as their stored text (an
agent's held kernels as one string the database joins), and a cached parse is reused
only when that text (and every other input of the parse) is exactly the one the entry
was built from.  A changed row is a changed key: it is parsed again, whoever wrote it.
Exceptions, as exact: an agent's own parsed columns (slots, runtime, architecture,
images, heartbeat views) are read only when its ``views_revision`` moved, which a
database trigger bumps on any change of them (:mod:`accelshare.manager.models.triggers`),
whoever writes; an agent's held kernels' text only when their version moved
(PostgreSQL: a digest of the kernels' row versions; SQLite: ``agent_held_revisions``,
bumped by triggers on the kernels); a pending session's columns only when its
``sched_revision`` moved.  Entries of rows no longer read (agents gone, sessions no
longer pending) are dropped at the end of the pass.

The parts, each its own module:

* :mod:`.load`: :func:`load_snapshot`, the entry point, and :class:`LoadedSnapshot`;
* :mod:`.cache`: :class:`SnapshotCache`, the per-pass parses of stored texts, and the
  entries kept while their revision is the one just read;
* :mod:`.stored`: columns read as stored (JSON as text, values as the driver returns them);
* :mod:`.agents`: the agents' query and their :class:`~accelshare.sched.snapshot.AgentSnapshot`\\ s;
* :mod:`.held`: the agents' held kernels, read by version (PostgreSQL) or revision (SQLite);
* :mod:`.device_maps`: the agents' reported per-device views merged with the manager's
  kernels (also what the enqueue and the agent views read: :func:`reported_map_states`,
  :func:`parse_views`);
* :mod:`.pending`: the pending sessions' query;
* :mod:`.context`: the predicates' context: policy limits, quotas, dependencies, counters.
"""

from .cache import SnapshotCache
from .device_maps import map_states_from_views, parse_views, parse_views_text, reported_map_states
from .load import LoadedSnapshot, load_snapshot

__all__ = [
    "LoadedSnapshot",
    "SnapshotCache",
    "load_snapshot",
    "map_states_from_views",
    "parse_views",
    "parse_views_text",
    "reported_map_states",
]
