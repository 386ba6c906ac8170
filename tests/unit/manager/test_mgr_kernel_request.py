"""What the manager asks an agent to run for a session (no database, no agent)."""

from __future__ import annotations

import uuid

from accelshare.common import ResourceSlot
from accelshare.manager.models import Session
from accelshare.manager.scheduler.apply import BindJob
from accelshare.manager.scheduler.binding import kernel_request
from accelshare.sched.model import SessionType


def session(image: str, startup: str | None, kind: SessionType) -> Session:
    return Session(
        id=uuid.uuid4(),
        name="s1",
        session_type=kind,
        access_key="AKIATEST",
        image=image,
        requested_slots=ResourceSlot({"cpu": "1", "mem": "268435456", "cuda.shares": "0"}),
        resource_opts={},
        environ={"K": "V"},
        startup_command=startup,
    )


def job(row: Session) -> BindJob:
    return BindJob(row.id, uuid.uuid4(), "i-node01")


def test_batch_startup_command_goes_whole_with_no_interpreter_of_the_managers() -> None:
    for image, startup in (("python", "-c 'print(42)'"), ("shell", "echo hello; exit 3")):
        row = session(image, startup, SessionType.BATCH)
        request = kernel_request(job(row), row)
        assert request.image == image
        assert request.startup_command == startup  # the agent's environment makes the argv
        assert request.command is None
        assert request.requested_slots == {"cpu": "1", "mem": "268435456"}
        assert request.environ == {"K": "V"}
        assert request.labels == {"session_name": "s1", "session_type": "batch"}


def test_interactive_startup_command_is_only_a_label() -> None:
    row = session("python", "python serve.py", SessionType.INTERACTIVE)
    request = kernel_request(job(row), row)
    assert request.startup_command is None  # no command: it stays up
    assert request.command is None
    assert request.labels["startup_command"] == "python serve.py"


def test_the_request_carries_the_plan_when_it_places_every_requested_slot() -> None:
    row = session("python", None, SessionType.INTERACTIVE)
    plan = {"cpu": {"3": "1"}, "mem": {"root": "268435456"}}
    request = kernel_request(BindJob(row.id, uuid.uuid4(), "i-node01", plan), row)
    assert request.planned_allocations == plan
    assert request.requested_slots == {"cpu": "1", "mem": "268435456"}  # exact decimals
    # a plan of part of the slots (an agent reporting no devices for mem): the agent places
    partial = kernel_request(BindJob(row.id, uuid.uuid4(), "i-node01", {"cpu": {"3": "1"}}), row)
    assert partial.planned_allocations is None
    assert kernel_request(job(row), row).planned_allocations is None  # no plan at all
