"""Talking to the manager: registration/heartbeats and kernel events (httpx).

Two loops share one ``httpx.AsyncClient`` (its transport is injectable, so tests use
``httpx.MockTransport`` or an in-process ASGI app and need no network)::

    heartbeat loop   POST {endpoint}/internal/agents/heartbeat   Heartbeat -> HeartbeatAck
                     at once (= registration), then every heartbeat-interval-s;
                     ack.destroy_kernels is handed to the agent
    events loop      POST {endpoint}/internal/agents/events      KernelEventBatch -> 2xx
                     whenever the outbox has events; acknowledged events are dropped,
                     failures retried with exponential backoff (0.2 s .. 10 s)

Both carry the cluster secret (``X-Accelshare-Cluster-Secret``).  The manager may be
down: the agent keeps running and retrying, and logs one warning per outage (and one
line when the manager answers again).

Several manager replicas (``[manager] endpoint = ["http://m1:8081", "http://m2:8081"]``):
the calls go to one of them until it fails to answer (a connection error, a timeout or a
5xx), then to the next in the list — a replica that was killed is left at once, and the
agent never goes LOST while another replica answers.  A 4xx (a wrong cluster secret, an
unknown scaling group) is a refusal, not an outage: it does not move the agent on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence

import httpx

from accelshare.aio import cancel_and_wait
from accelshare.protocol import CLUSTER_SECRET_HEADER, Heartbeat, HeartbeatAck, KernelEventBatch

from .events import EventOutbox

__all__ = ["EVENTS_PATH", "HEARTBEAT_PATH", "ManagerLink"]

log = logging.getLogger(__name__)

HEARTBEAT_PATH = "/internal/agents/heartbeat"
EVENTS_PATH = "/internal/agents/events"
_JSON = {"Content-Type": "application/json"}


class ManagerLink:
    """Heartbeats and event delivery; see the module docstring."""

    def __init__(
        self,
        *,
        endpoint: str | Sequence[str],
        agent_id: str,
        secret: str | None,
        outbox: EventOutbox,
        build_heartbeat: Callable[[], Heartbeat],
        on_ack: Callable[[HeartbeatAck], Awaitable[None]],
        interval_s: float = 3.0,
        transport: httpx.AsyncBaseTransport | None = None,
        timeout_s: float = 5.0,
        batch_size: int = 500,
        min_backoff_s: float = 0.2,
        max_backoff_s: float = 10.0,
    ) -> None:
        headers = {CLUSTER_SECRET_HEADER: secret} if secret else {}
        self._client = httpx.AsyncClient(transport=transport, headers=headers, timeout=timeout_s)
        endpoints = [endpoint] if isinstance(endpoint, str) else list(endpoint)
        if not endpoints:
            raise ValueError("ManagerLink needs at least one manager endpoint")
        self._endpoints = [e.rstrip("/") for e in endpoints]
        self._current = 0
        self._last_tried = self._endpoints[0]
        self._agent_id = agent_id
        self._outbox = outbox
        self._build_heartbeat = build_heartbeat
        self._on_ack = on_ack
        self._interval_s = interval_s
        self._batch_size = batch_size
        self._min_backoff_s = min_backoff_s
        self._max_backoff_s = max_backoff_s
        self._wake = asyncio.Event()
        self._beat = asyncio.Event()  # set: the next heartbeat goes now, not after the interval
        self._stopping = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._reachable: bool | None = None  # None: not tried yet
        self._failures = 0
        self.heartbeats_sent = 0

    @property
    def reachable(self) -> bool | None:
        return self._reachable

    @property
    def _endpoint(self) -> str:
        """The manager replica the calls go to now."""
        return self._endpoints[self._current]

    def _fail_over(self) -> None:
        """The current replica did not answer: the next call goes to the next one."""
        if len(self._endpoints) > 1:
            previous = self._endpoint
            self._current = (self._current + 1) % len(self._endpoints)
            log.info("manager at %s did not answer; trying %s", previous, self._endpoint)

    async def _post(self, path: str, content: str) -> httpx.Response:
        """POST to the current replica; a transport error or a 5xx moves to the next."""
        self._last_tried = self._endpoint
        try:
            response = await self._client.post(
                self._endpoint + path, content=content, headers=_JSON
            )
        except (httpx.HTTPError, OSError):
            self._fail_over()
            raise
        if response.status_code >= 500:
            self._fail_over()
        return response

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._heartbeat_loop(), name="agent-heartbeat"),
            asyncio.create_task(self._events_loop(), name="agent-events"),
        ]

    def beat_soon(self) -> None:
        """Send the next heartbeat now (the maps changed in a way the manager must see
        before it plans again: a plan refused as a conflict)."""
        self._beat.set()

    def notify_events(self) -> None:
        """Wake the events loop (called after an event is queued)."""
        self._wake.set()

    async def stop(self, *, flush_timeout_s: float = 1.0) -> None:
        """Stop both loops; try once more to deliver pending events (bounded)."""
        self._stopping.set()
        self._wake.set()
        self._beat.set()
        await cancel_and_wait(self._tasks)
        self._tasks = []
        if len(self._outbox) and flush_timeout_s > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._send_events_once(), flush_timeout_s)
        if len(self._outbox):
            log.warning(
                "%d kernel event(s) not delivered to the manager (kept for the next agent)",
                len(self._outbox),
            )
        await self._client.aclose()

    # -- reachability logging -------------------------------------------------------------
    def _failed(self, what: str, error: str, *, refused: bool = False) -> None:
        """Count a failed call; log only the first of an outage."""
        self._failures += 1
        if self._reachable is not False:
            how = f"refused the {what}" if refused else f"unreachable ({what}"
            log.warning(
                "manager at %s %s: %s%s; the agent keeps running and retries",
                self._last_tried,
                how,
                error,
                "" if refused else ")",
            )
        self._reachable = False

    def _succeeded(self) -> None:
        if self._reachable is False:
            log.info(
                "manager at %s reachable again (after %d failed call(s))",
                self._endpoint,
                self._failures,
            )
        elif self._reachable is None:
            log.info("registered with the manager at %s", self._endpoint)
        self._reachable = True
        self._failures = 0

    # -- heartbeats -----------------------------------------------------------------------
    async def send_heartbeat(self) -> HeartbeatAck | None:
        """One heartbeat; the ack, or None when the manager did not take it."""
        try:
            payload = self._build_heartbeat().model_dump_json()
            response = await self._post(HEARTBEAT_PATH, payload)
            if response.status_code >= 300:
                self._failed(
                    "heartbeat", f"HTTP {response.status_code} {response.text[:200]}", refused=True
                )
                return None
            ack = HeartbeatAck.model_validate_json(response.content or b"{}")
        except (httpx.HTTPError, ValueError, OSError) as e:
            self._failed("heartbeat", f"{type(e).__name__}: {e}")
            return None
        self._succeeded()
        self.heartbeats_sent += 1
        return ack

    async def _heartbeat_loop(self) -> None:
        while not self._stopping.is_set():
            ack = await self.send_heartbeat()
            # another replica at once when this one did not answer (not after a refusal)
            for _ in range(len(self._endpoints) - 1):
                if ack is not None or self._last_tried == self._endpoint:
                    break
                ack = await self.send_heartbeat()
            if ack is not None and ack.destroy_kernels:
                try:
                    await self._on_ack(ack)
                except Exception:
                    log.exception("handling the heartbeat ack failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._beat.wait(), self._interval_s)
            self._beat.clear()

    # -- events ---------------------------------------------------------------------------
    async def _send_events_once(self) -> bool:
        """Send one batch; True if the manager took it (or there was nothing to send)."""
        batch = self._outbox.peek(self._batch_size)
        if not batch:
            return True
        body = KernelEventBatch(agent_id=self._agent_id, events=batch).model_dump_json()
        try:
            response = await self._post(EVENTS_PATH, body)
        except (httpx.HTTPError, OSError) as e:
            self._failed("events", f"{type(e).__name__}: {e}")
            return False
        if response.status_code >= 300:
            self._failed(
                "events", f"HTTP {response.status_code} {response.text[:200]}", refused=True
            )
            return False
        self._succeeded()
        self._outbox.ack(event.event_id for event in batch)
        return True

    async def _events_loop(self) -> None:
        backoff = self._min_backoff_s
        while not self._stopping.is_set():
            if not len(self._outbox):
                self._wake.clear()
                await self._wake.wait()
                continue
            if await self._send_events_once():
                backoff = self._min_backoff_s
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), backoff)
            backoff = min(backoff * 2, self._max_backoff_s)
