"""Live views for the web console (and any client): server-sent event streams.

| route | auth | stream |
|---|---|---|
| ``GET /events/sessions`` | any | ``event: sessions`` / ``data: {items, total, at}``: the sessions the caller may see (``GET /sessions``'s items), sent at once and again whenever the list changes; ``?status=`` as for ``GET /sessions`` |
| ``GET /events/agents`` | admin | ``event: agents`` / ``data: {items: [{agent, allocMap, stats}], kernels, at}``: each agent with its live allocation map and device stats, and who holds each kernel; sent at once and on every change or poll |

How it works: a stream re-reads the database (and, for agents, asks each agent for its
live map and stats) after each :class:`~accelshare.manager.hub.ChangeHub` wake-up and
at least every ``poll_s`` (the fallback that also sees changes made by another manager
replica), and sends an event only when the answer differs from the last one sent.
Streams asking the same question (the same caller's visibility and parameters) share
one read per wake-up (:class:`SharedSnapshots`), and at most ``max_concurrent_reads``
reads of all streams run at once, so that streams never hold more than that many of
the database pool's connections: requests and agent heartbeats keep the rest (150 streams
each running its own query after every change once took the whole pool; docs/reliability.md).
Each stream holds a slot of ``[api.connections] max-event-streams-per-user``
(:mod:`.conn_limits`): 429 beyond it; the slot is given back when the stream ends.  A
``: keepalive`` comment goes out after ``keepalive_s`` of silence so that proxies keep
the connection open.  Every ``recheck_s`` the caller's keypair and user are read again:
a deactivated key or user gets ``event: error`` (``{reason, detail}``) and the stream
ends — the same rule as for a request ("deactivating either takes effect at once").

Visibility is the REST API's: a user's stream carries only its own sessions, an admin's
those of its domain, a superadmin's all (the same query as ``GET /sessions``).  On the
agents stream an admin sees the holders of its own domain's kernels; every other kernel
is ``hidden-N`` with the holder ``{"hidden": true}`` (:func:`~accelshare.api.agents.hide_other_domains`).

Tests shorten the intervals with ``app.state.stream_settings = StreamSettings(...)``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from accelshare.manager.agents import AgentRecord, agent_json
from accelshare.manager.enums import AgentStatus, UserStatus
from accelshare.manager.runtime import Manager, StatsUnavailable
from accelshare.sched.lifecycle import SessionStatus

from .agents import hide_other_domains
from .auth import AdminIdentity, Authenticator, CurrentIdentity, Identity
from .conn_limits import ConnectionKind, ConnectionLimits, Lease
from .deps import ManagerDep
from .problems import InvalidAPIParameters

__all__ = ["SharedSnapshots", "StreamSettings", "close_streams", "parse_statuses", "router"]

router = APIRouter(prefix="/events", tags=["events"])


@dataclass(frozen=True, slots=True)
class StreamSettings:
    poll_s: float = 2.0  # re-read at least this often (other replicas, agent stats)
    keepalive_s: float = 15.0
    recheck_s: float = 30.0  # re-read the caller's keypair and user this often
    max_concurrent_reads: int = 4  # database reads of all streams together


Snapshot = dict[str, Any]


@dataclass(slots=True)
class _Read:
    version: int  # the hub's version when the read started
    started: float  # time.monotonic()
    result: asyncio.Future[Snapshot]


@dataclass
class SharedSnapshots:
    """One database read per question and wake-up, shared by the streams asking it.

    :meth:`get` answers with a read of ``key`` that started after the hub's latest
    publish and less than ``max_age_s`` ago, running a new one (through a semaphore of
    ``max_concurrent`` reads) otherwise.  A stream cancelled while it waits does not
    cancel the read the others wait for.
    """

    max_concurrent: int = 4
    reads: int = 0  # reads run (tests and docs/reliability.md's figures)
    _entries: dict[Hashable, _Read] = field(default_factory=dict)
    _gate: asyncio.Semaphore | None = None
    _last_sweep: float = 0.0

    async def get(
        self,
        key: Hashable,
        version: int,
        max_age_s: float,
        read: Callable[[], Awaitable[Snapshot]],
    ) -> Snapshot:
        now = time.monotonic()
        self._sweep(now, max_age_s)
        entry = self._entries.get(key)
        if entry is None or entry.version != version or now - entry.started >= max_age_s:
            future = asyncio.ensure_future(self._read(read))
            future.add_done_callback(_retrieve)
            entry = _Read(version, now, future)
            self._entries[key] = entry
        return await asyncio.shield(entry.result)

    async def _read(self, read: Callable[[], Awaitable[Snapshot]]) -> Snapshot:
        if self._gate is None:
            self._gate = asyncio.Semaphore(self.max_concurrent)
        async with self._gate:
            self.reads += 1
            return await read()

    def _sweep(self, now: float, max_age_s: float) -> None:
        """Forget finished reads too old to be shared (questions no stream asks now)."""
        if now - self._last_sweep < max(max_age_s, 1.0):
            return
        self._last_sweep = now
        for key, entry in list(self._entries.items()):
            if entry.result.done() and now - entry.started >= max_age_s:
                del self._entries[key]


def _retrieve(future: asyncio.Future[Snapshot]) -> None:
    """Mark a failed read's error as seen (its waiters got it; none may be left)."""
    if not future.cancelled():
        future.exception()


def close_streams(app: Any) -> None:
    """End every open stream of ``app`` soon: the server is stopping.

    uvicorn's graceful shutdown waits for responses in flight, and an endless stream
    never finishes by itself, so the daemon calls this when it is told to stop (from its
    signal handler: the wake-up is scheduled with ``call_soon_threadsafe``).
    """
    state = getattr(app, "state", None)
    if state is None:
        return
    state.streams_closing = True
    manager = getattr(state, "manager", None)
    if not isinstance(manager, Manager):
        return
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return
    loop.call_soon_threadsafe(manager.hub.publish)


def _closing(request: Request) -> bool:
    return bool(getattr(request.app.state, "streams_closing", False))


def _settings(request: Request) -> StreamSettings:
    settings = getattr(request.app.state, "stream_settings", None)
    return settings if isinstance(settings, StreamSettings) else StreamSettings()


def _shared(request: Request, settings: StreamSettings) -> SharedSnapshots:
    shared = getattr(request.app.state, "stream_snapshots", None)
    if not isinstance(shared, SharedSnapshots):
        shared = SharedSnapshots(max_concurrent=settings.max_concurrent_reads)
        request.app.state.stream_snapshots = shared
    return shared


class LeasedStream(StreamingResponse):
    """A stream holding a connection slot, given back however the response ends (also
    when the client left before its body started, so the generator never ran)."""

    def __init__(self, content: AsyncIterator[bytes], lease: Lease, **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self.lease = lease

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.lease.release()


def parse_statuses(status: str | None) -> list[SessionStatus] | None:
    """``GET /sessions``'s ``status``: comma-separated, ``all``, or None (live ones)."""
    if status is None or not status.strip():
        return None
    if status.strip().lower() == "all":
        return list(SessionStatus)
    found: list[SessionStatus] = []
    for raw in status.split(","):
        try:
            found.append(SessionStatus(raw.strip().upper()))
        except ValueError:
            raise InvalidAPIParameters(
                f"Unknown session status {raw.strip()!r}",
                field="status",
                expected="comma-separated of " + ", ".join(SessionStatus) + ", or all",
                received=status,
            ) from None
    return found


def _sse(event: str, data: Any) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def _now() -> str:
    return datetime.now(UTC).isoformat()


async def _still_allowed(authenticator: Authenticator, identity: Identity) -> str | None:
    """None while the caller's key and user are active; else the reason to stop."""
    cred = await authenticator.store.get_credential(identity.access_key)
    if cred is None or cred.user_id != identity.user_id:
        return "unknown-access-key"
    if not cred.is_key_active:
        return "inactive-access-key"
    if cred.user_status is not UserStatus.ACTIVE:
        return "inactive-user"
    if identity.login_generation is not None and identity.login_generation != cred.login_generation:
        return "session-ended"  # a login cookie ended by logout, password change...
    return None


def _event_stream(
    request: Request,
    identity: Identity,
    manager: Manager,
    event: str,
    key: Hashable,
    snapshot: Callable[[], Awaitable[Snapshot]],
) -> StreamingResponse:
    """Send ``snapshot()`` as ``event`` now and whenever it changes (see the module doc);
    ``key``: the question ``snapshot`` answers (streams with equal keys share reads)."""
    settings = _settings(request)
    authenticator: Authenticator = request.app.state.authenticator
    limits: ConnectionLimits = request.app.state.connection_limits
    shared = _shared(request, settings)
    lease = limits.acquire(ConnectionKind.EVENT_STREAM, str(identity.user_id))
    max_age_s = settings.poll_s / 2

    async def stream() -> AsyncIterator[bytes]:
        last: str | None = None
        last_sent = time.monotonic()
        last_check = time.monotonic()
        yield f"retry: {int(settings.poll_s * 1000)}\n\n".encode()
        while not _closing(request):
            body = await shared.get((event, key), manager.hub.version, max_age_s, snapshot)
            fingerprint = json.dumps(body, sort_keys=True, default=str)
            if fingerprint != last:
                last = fingerprint
                last_sent = time.monotonic()
                yield _sse(event, {**body, "at": _now()})
            elif time.monotonic() - last_sent >= settings.keepalive_s:
                last_sent = time.monotonic()
                yield b": keepalive\n\n"
            if time.monotonic() - last_check >= settings.recheck_s:
                last_check = time.monotonic()
                reason = await _still_allowed(authenticator, identity)
                if reason is not None:
                    yield _sse("error", {"reason": reason, "detail": "Log in again"})
                    return
            await manager.hub.wait(settings.poll_s)
            await asyncio.sleep(0)  # let a burst of publishes settle into one re-read

    return LeasedStream(
        stream(),
        lease,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


@router.get("/sessions", response_class=StreamingResponse)
async def session_stream(
    request: Request,
    identity: CurrentIdentity,
    manager: ManagerDep,
    status: Annotated[
        str | None, Query(description="comma-separated statuses, or 'all' (default: live ones)")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 500,
) -> StreamingResponse:
    """The caller's visible sessions, now and on every change."""
    statuses = parse_statuses(status)

    async def snapshot() -> dict[str, Any]:
        listed = await manager.sessions.list_sessions(identity, statuses=statuses, limit=limit)
        return {"items": listed["items"], "total": listed["total"]}

    key = (
        identity.user_id,
        identity.access_key,
        identity.role,
        identity.domain_name,
        status,
        limit,
    )
    return _event_stream(request, identity, manager, "sessions", key, snapshot)


async def _stats_of(
    manager: Manager, agent: AgentRecord
) -> tuple[dict[str, Any] | None, str | None]:
    try:
        return await manager.node_stats(agent), None
    except StatsUnavailable as e:
        return None, str(e)


async def agent_view(manager: Manager, agent: AgentRecord) -> dict[str, Any]:
    """An agent with its live allocation map (the last heartbeat's when the agent does
    not answer) and its device stats (None, with ``statsError``, when it does not)."""
    view: dict[str, Any] = {"agent": agent_json(agent), "allocMap": None, "stats": None}
    if agent.status is not AgentStatus.ALIVE:
        return view
    alloc_map, (stats, error) = await asyncio.gather(
        manager.alloc_map(agent, compat=False), _stats_of(manager, agent)
    )
    view["allocMap"] = alloc_map
    view["stats"] = stats
    if error is not None:
        view["statsError"] = error
    return view


@router.get("/agents", response_class=StreamingResponse)
async def agent_stream(
    request: Request,
    identity: AdminIdentity,
    manager: ManagerDep,
    scaling_group: str | None = None,
) -> StreamingResponse:
    """Every agent with its live allocation map and stats, now and on every change."""

    async def snapshot() -> dict[str, Any]:
        agents = await manager.list_agents(scaling_group=scaling_group)
        views = await asyncio.gather(*(agent_view(manager, a) for a in agents))
        kernels = await manager.holders.live()
        if not identity.is_superadmin:  # other domains' sessions stay anonymous
            maps, kernels = hide_other_domains(
                identity.domain_name, (v["allocMap"] for v in views), kernels
            )
            views = [{**v, "allocMap": m} for v, m in zip(views, maps, strict=True)]
        return {"items": list(views), "kernels": kernels}

    key = (identity.is_superadmin, identity.domain_name, scaling_group)
    return _event_stream(request, identity, manager, "agents", key, snapshot)
