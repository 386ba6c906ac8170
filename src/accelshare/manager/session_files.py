"""A running session's working folder: the manager's side of ``session upload``,
``session download`` and ``session ls``.

Each call goes to the agent of the session's main kernel (the files routes of
:mod:`accelshare.protocol.files`), for the session's owner or a superadmin (the rule of
its terminal and execute API: :meth:`SessionService.proxy_target`), while the session is
RUNNING: a session that is not yet (PENDING, PREPARING...) or not any more (TERMINATED,
CANCELLED...) is a 409 naming its status.  Paths are as the client gives them: relative
to ``/home/work`` or absolute under it.  The agent's refusals come back with the same
meaning: 400 a refused path (``..``, NUL...), 404 no such file, 409 a folder where a file
is expected, a symlink leading out, a read-only mount, 413 a file over the agent's
``[container] file-upload-max-bytes``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from accelshare.protocol import FileList, FileUploadResult
from accelshare.protocol.files import from_kernel_path

from .agent_client import AgentClient, AgentRPCError
from .errors import Conflict, InvalidRequest, ManagerError, NotFound, TooLarge, Unavailable
from .services.actor import Actor
from .services.sessions import ProxyTarget, SessionService

__all__ = ["SessionFiles", "kernel_relative_path"]


def kernel_relative_path(path: str, *, field: str = "path") -> str:
    """``path`` (relative to /home/work, or absolute under it) relative to the working
    folder; ``InvalidRequest`` naming the field and the value for one that is refused."""
    try:
        return from_kernel_path(path)
    except ValueError as e:
        raise InvalidRequest(
            str(e).removeprefix("path: "),
            field=field,
            expected="a path in /home/work without '..' or control characters",
            received=path,
        ) from None


class SessionFiles:
    def __init__(self, sessions: SessionService, client: AgentClient) -> None:
        self.sessions = sessions
        self.client = client

    async def target(self, caller: Actor, ref: str) -> ProxyTarget:
        """The session's main kernel; ended sessions are 409 here (not 404): the client
        named a session that exists, in a status where its files are gone."""
        try:
            return await self.sessions.proxy_target(caller, ref)
        except NotFound as e:
            if e.field == "session" and e.expected == "a running session":
                raise Conflict(
                    f"Session {ref!r} is {e.received}: its files can be moved only while it is"
                    " RUNNING",
                    field="session",
                    expected="RUNNING",
                    received=e.received,
                ) from None
            raise
        except Conflict as e:
            raise Conflict(
                f"Session {ref!r} is {e.received}: its files can be moved only while it is RUNNING",
                field="session",
                expected="RUNNING",
                received=e.received,
            ) from None

    async def upload(
        self, target: ProxyTarget, ref: str, path: str, content: AsyncIterator[bytes]
    ) -> FileUploadResult:
        rel = kernel_relative_path(path, field="filename")
        if not rel:
            raise InvalidRequest("an upload needs a file name", field="filename", received=path)
        try:
            return await self.client.put_kernel_file(
                target.agent_url, target.kernel_id, rel, content
            )
        except AgentRPCError as e:
            raise _error(e, ref, path, field="filename") from None

    async def list(self, caller: Actor, ref: str, path: str) -> FileList:
        target = await self.target(caller, ref)
        rel = kernel_relative_path(path)
        try:
            return await self.client.list_kernel_files(target.agent_url, target.kernel_id, rel)
        except AgentRPCError as e:
            raise _error(e, ref, path) from None

    @asynccontextmanager
    async def download(
        self, target: ProxyTarget, ref: str, path: str
    ) -> AsyncIterator[AsyncIterator[bytes]]:
        """The tar of one file or folder, streamed from the agent (errors before the first
        byte)."""
        rel = kernel_relative_path(path, field="files")
        try:
            async with self.client.kernel_files_tar(
                target.agent_url, target.kernel_id, rel
            ) as response:
                yield response.aiter_raw()
        except AgentRPCError as e:
            raise _error(e, ref, path, field="files") from None


def _error(e: AgentRPCError, ref: str, path: str, *, field: str = "path") -> ManagerError:
    detail = str(e).split(": ", 1)[-1] if e.is_refusal else str(e)
    if e.status_code == 400:
        return InvalidRequest(detail, field=field, received=path)
    if e.status_code == 404:
        if "not running" in detail:
            return NotFound(f"Session {ref!r} is not running on its agent any more: {detail}")
        return NotFound(
            f"{path!r}: no such file or folder in session {ref!r}", field=field, received=path
        )
    if e.status_code == 409:
        return Conflict(f"{path!r}: {detail}", field=field, received=path)
    if e.status_code == 413:
        return TooLarge(f"{path!r}: {detail}", field=field, received=path)
    return Unavailable(f"The agent of session {ref!r} could not do it: {detail}")
