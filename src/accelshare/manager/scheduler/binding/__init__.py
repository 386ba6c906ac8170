"""Binding: create each SCHEDULED session's kernel on its agent, outside the scheduling lock.

The create request carries the plan: the per-device placement the pass chose (the
kernel row's ``allocation``) with the requested slots as exact decimals, and the
agent takes exactly that placement after checking it against its maps (an agent that
ignores the field, an older one, places the request itself; its answer is recorded).
So the order in which creates reach an agent does not matter: binds run concurrently,
to one agent as to many.  Every RPC goes to the agent's *current* address
(``agents.address``, updated by each heartbeat), read when the RPC is made, so a bind
resumed after an agent moved reaches it.  Per session::

    SCHEDULED -> PREPARING            (before the RPC; PULLING instead when the agent is
                                       a docker agent whose engine lacks the image:
                                       the create RPC pulls it first, docs/images.md)
    POST <agent>/v1/kernels/batch     (the batch's CreateKernelRequests, one KernelReport
                                       each; idempotent by kernel_id.  An agent without
                                       the route answers 404/405: POST <agent>/v1/kernels
                                       per kernel from then on)
      conflict (the plan no longer    -> PENDING, its kernel row deleted and the agent's
      fits the agent's maps)             occupancy recomputed: a later pass plans it again
                                         (the agent heartbeats at once with its maps)
      refused / unreachable / FAILED  -> CANCELLED with the reason, resources released
      accepted                        -> PREPARED -> CREATING (the agent's per-device
                                         allocation recorded: the plan, or what an older
                                         agent chose)
      report RUNNING (or the agent's "started" event, whichever comes first) -> RUNNING

Binds go in batches of up to :data:`BIND_BATCH` sessions of one agent, each batch a
task of its own (several batches of one agent run at once): one step moves the whole
batch to PREPARING, one batched create RPC follows (the agent creates the kernels
concurrently), and one step records every accepted kernel (per session the
transitions are exactly the ones above).  The two database
steps are *group-committed across agents*: the batches of every agent that reach a
step while the previous transaction of that step runs are handled together in the
next one, with multi-row Core statements, no ORM objects (one ``SELECT ... FOR
UPDATE`` of the sessions, one of their kernels, one of the agents; one executemany
UPDATE of the kernels' reported columns, and :func:`change_status_many`: one
multi-row INSERT of the history rows, one executemany UPDATE of the sessions, one of
their kernels).  A kernel reported EXITED already (its session ends and releases its
resources) is recorded through the ORM path of :func:`change_status` instead.  So a
pass that placed thousands of sessions on a thousand agents costs a few dozen
transactions, not thousands, while the RPCs of up to :data:`MAX_CONCURRENT_AGENTS`
batches are in flight at once.  Should a grouped transaction fail, each batch is bound again session by
session (a transaction each), so one bad row cannot hold the others back.

A session destroyed while its bind was in flight gets its kernel destroyed right
after.  Binding is also how a restarted manager resumes: sessions it finds between
SCHEDULED and CREATING are bound again (the agent answers an existing kernel_id with
its current report).

The parts: :mod:`.binder` (the :class:`Binder`, its batches and steps),
:mod:`.requests` (the create request a kernel's bind sends, and the allocation its
answer records), :mod:`.rows` (what a grouped step reads and writes) and
:mod:`.group_commit` (one step's call for many concurrent callers).
"""

from .binder import BIND_BATCH, BINDABLE, MAX_CONCURRENT_AGENTS, Binder
from .requests import allocations_json, kernel_request

__all__ = [
    "BINDABLE",
    "BIND_BATCH",
    "MAX_CONCURRENT_AGENTS",
    "Binder",
    "allocations_json",
    "kernel_request",
]
