"""What the agent's create request carries for a session's kernel, and what its answer records."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import sqlalchemy as sa

from accelshare.common import canonical_decimal
from accelshare.protocol import CreateKernelRequest, KernelMount, KernelReport
from accelshare.sched.model import SessionType

from ...models import Agent, Session
from ..apply import BindJob

__all__ = ["allocations_json", "kernel_request", "pulls"]


def kernel_request(job: BindJob, row: Session | sa.Row[Any]) -> CreateKernelRequest:
    """The agent's create request for ``row``'s kernel.

    The request carries ``job``'s plan (the per-device placement of the pass) when
    it places every requested slot; a plan the pass made for part of the slots only
    (an agent that reports no devices for some) is left out and the agent places the
    request itself.

    A batch session's ``startupCommand`` goes as ``startup_command``, whole: the agent's
    runtime runs it with ``/bin/sh -c`` in the kernel, as Backend.AI does (in its working
    folder, with its environment; the environment's interpreter first on PATH).  The
    manager adds no interpreter of its own.  An interactive session's startup command
    is only recorded, as the ``startup_command`` label.
    """
    opts = row.resource_opts or {}
    startup: str | None = None
    labels = {"session_name": row.name, "session_type": row.session_type.value}
    if row.startup_command:
        if row.session_type is SessionType.BATCH:
            startup = row.startup_command
        else:
            labels["startup_command"] = row.startup_command
    requested = row.requested_slots.nonzero().to_json()  # exact decimals, never "2g"
    return CreateKernelRequest(
        kernel_id=str(job.kernel_id),
        session_id=str(row.id),
        image=row.image,
        requested_slots=requested,
        planned_allocations=_plan_of(job, requested),
        startup_command=startup,
        environ=dict(row.environ or {}),
        allow_fractional_resource_fragmentation=bool(
            opts.get("allow_fractional_resource_fragmentation", True)
        ),
        owner_access_key=row.access_key,
        labels=labels,
        mounts=[KernelMount.model_validate(m) for m in row.vfolder_mounts or ()],
    )


def _plan_of(job: BindJob, requested: dict[str, str]) -> dict[str, dict[str, str]] | None:
    """The plan to send: ``job.plan`` when it places every requested slot, else None."""
    plan = job.plan
    if not plan or any(slot not in plan for slot in requested):
        return None
    return {slot: dict(per_device) for slot, per_device in plan.items()}


def allocations_json(report: KernelReport) -> dict[str, dict[str, str]]:
    return {
        slot: {d: canonical_decimal(Decimal(v)) for d, v in per.items()}
        for slot, per in report.allocations.items()
    }


def pulls(agent: Agent | sa.Row[Any], image: str) -> bool:
    """Whether creating a kernel of ``image`` on ``agent`` starts with a pull: a docker
    agent whose last heartbeat did not list the image (its engine's repo tags)."""
    return agent.runtime == "docker" and image not in (agent.images or ())
