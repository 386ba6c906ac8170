"""Code execution in a session: the manager's side of Backend.AI's execute API.

A step of a run (:mod:`accelshare.protocol.execute`) is relayed to the agent of the
session's kernel (``POST /v1/kernels/{id}/execute``, agent/runs.py), for the session's
owner or a superadmin, while the session is RUNNING: the same rule as its terminal
(:meth:`SessionService.proxy_target`).  The agent's refusals come back as the
manager's errors, with the field they are about: an unknown run id is a 404 naming
``runId``, a run id in use or too many runs a 409, a batch without its command a 409
naming ``options.exec``.
"""

from __future__ import annotations

import logging

from accelshare.protocol import ExecuteRequest, ExecuteResult

from .agent_client import AgentClient, AgentRPCError
from .errors import Conflict, InvalidRequest, ManagerError, NotFound, Unavailable
from .services.actor import Actor
from .services.sessions import ProxyTarget, SessionService

__all__ = ["ExecuteService", "ExecutionNotSupported"]

log = logging.getLogger(__name__)


class ExecutionNotSupported(ManagerError):
    """The agent's runtime cannot run code in its kernels."""

    status = 501


class ExecuteService:
    def __init__(self, sessions: SessionService, client: AgentClient) -> None:
        self.sessions = sessions
        self.client = client

    async def target(self, caller: Actor, ref: str) -> ProxyTarget:
        """The session's kernel, once for a whole run (the WebSocket's)."""
        return await self.sessions.proxy_target(caller, ref)

    async def step(
        self, caller: Actor, ref: str, request: ExecuteRequest, target: ProxyTarget | None = None
    ) -> ExecuteResult:
        if target is None:
            target = await self.target(caller, ref)
        try:
            return await self.client.execute(target.agent_url, target.kernel_id, request)
        except AgentRPCError as e:
            raise _error(e, ref, request) from None

    async def cancel(self, target: ProxyTarget, run_id: str) -> None:
        """Kill a run whose client went away (nothing to do when it is over already)."""
        try:
            await self.client.cancel_run(target.agent_url, target.kernel_id, run_id)
        except AgentRPCError as e:
            if e.status_code != 404:
                log.warning("run %s of kernel %s: not cancelled: %s", run_id, target.kernel_id, e)


def _error(e: AgentRPCError, ref: str, request: ExecuteRequest) -> ManagerError:
    detail = str(e).split(": ", 1)[-1] if e.is_refusal else str(e)
    if e.status_code == 404:
        if "run" in detail and request.mode in ("continue", "input"):
            return NotFound(
                f"Session {ref!r} has no run {request.runId!r} (never started, or finished)",
                field="runId",
                expected="the runId of a run still going",
                received=request.runId,
            )
        return NotFound(f"Session {ref!r} is not running on its agent any more: {detail}")
    if e.status_code == 409:
        field = "options" if request.mode == "batch" and "options." in detail else "runId"
        return Conflict(detail, field=field, received=request.runId)
    if e.status_code == 400:
        return InvalidRequest(detail)
    if e.status_code == 501:
        return ExecutionNotSupported(detail)
    return Unavailable(f"The agent of session {ref!r} did not run the code: {detail}")
