"""The Redis event/stat bus (redis-py asyncio), shared by the manager and the agents.

Keys, all under ``accelshare:<namespace>:`` (:meth:`RedisSettings.key`)::

    stats:<agent_id>    string   the agent's latest StatsReport (JSON), expires after stats-ttl-s
    stats-updates       channel  an agent id each time its stats were replaced
    events              stream   {"batch": KernelEventBatch JSON}, capped (MAXLEN ~ events-maxlen)
                                 read by the consumer group "managers" (each entry once per
                                 group, acknowledged with XACK after it was applied)
    changes             channel  a manager instance id: "sessions or agents changed here"

Every Redis failure (refused, reset, timeout, a restarted server without our consumer
group) surfaces as :class:`BusUnavailable` naming the address; callers keep running
and retry.  redis-py reconnects by itself on the next command, and the consumer group
is re-created when a restarted Redis lost it (``NOGROUP``).

Kernel events on Redis are the *fast* path: the agents still deliver every event over
their acknowledged HTTP call to the manager, which ignores an event id it already
applied — so a Redis restart (this bus keeps nothing on disk) loses no event.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any

import redis.asyncio as aioredis
from pydantic import ValidationError
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError, ResponseError

from accelshare.protocol import KernelEventBatch, StatsReport

from .settings import RedisSettings

__all__ = ["EVENTS_GROUP", "BusUnavailable", "RedisBus"]

log = logging.getLogger(__name__)

EVENTS_GROUP = "managers"
_BLOCK_S = 1.0


class BusUnavailable(RuntimeError):
    """Redis could not be reached or refused the command."""

    def __init__(self, addr: str, what: str, error: BaseException | str) -> None:
        detail = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
        super().__init__(f"Redis at {addr} unavailable ({what}): {detail}")
        self.addr = addr


class RedisBus:
    """One connection pool for commands and one for blocking reads (see module doc)."""

    def __init__(self, settings: RedisSettings, *, client_name: str = "accelshare") -> None:
        self.settings = settings
        common: dict[str, Any] = {
            "host": settings.host,
            "port": settings.port,
            "db": settings.db,
            "password": settings.password.get_secret_value() if settings.password else None,
            "socket_connect_timeout": settings.timeout_s,
            "client_name": client_name,
            # our loops retry with their own pauses; redis-py's default (3 retries with
            # up to seconds of backoff per command) would turn an outage into long hangs
            "retry": Retry(NoBackoff(), 0),
            "retry_on_error": [],
        }
        self._redis = aioredis.Redis(socket_timeout=settings.timeout_s, **common)
        # XREADGROUP BLOCK and SUBSCRIBE wait longer than a command may take
        self._blocking = aioredis.Redis(socket_timeout=settings.timeout_s + _BLOCK_S, **common)
        self._stream = settings.key("events")
        self._group_ready = False

    @property
    def addr(self) -> str:
        return self.settings.addr

    def _unavailable(self, what: str, error: BaseException | str) -> BusUnavailable:
        return BusUnavailable(self.settings.addr, what, error)

    async def close(self) -> None:
        for client in (self._redis, self._blocking):
            with contextlib.suppress(RedisError, OSError):  # closing a dead connection
                await client.aclose()

    async def ping(self) -> None:
        try:
            await self._redis.ping()
        except (RedisError, OSError) as e:
            raise self._unavailable("ping", e) from None

    # -- stats ------------------------------------------------------------------------
    async def publish_stats(self, report: StatsReport) -> None:
        body = report.model_dump_json()
        try:
            pipe = self._redis.pipeline(transaction=False)
            pipe.set(
                self.settings.key("stats", report.agent_id),
                body,
                px=int(self.settings.stats_ttl_s * 1000),
            )
            pipe.publish(self.settings.key("stats-updates"), report.agent_id)
            await pipe.execute()
        except (RedisError, OSError) as e:
            raise self._unavailable("publishing stats", e) from None

    async def read_stats(self, agent_ids: Sequence[str]) -> dict[str, StatsReport | None]:
        """The latest report of each agent (None: none, expired, or unreadable)."""
        if not agent_ids:
            return {}
        keys = [self.settings.key("stats", agent_id) for agent_id in agent_ids]
        try:
            values = await self._redis.mget(keys)
        except (RedisError, OSError) as e:
            raise self._unavailable("reading stats", e) from None
        result: dict[str, StatsReport | None] = {}
        for agent_id, raw in zip(agent_ids, values, strict=True):
            report = None
            if raw is not None:
                try:
                    report = StatsReport.model_validate_json(raw)
                except ValidationError as e:
                    log.warning("unreadable stats of agent %s on Redis: %s", agent_id, e)
            result[agent_id] = report
        return result

    # -- kernel events ----------------------------------------------------------------
    async def publish_events(self, batch: KernelEventBatch) -> None:
        try:
            await self._redis.xadd(
                self._stream,
                {"batch": batch.model_dump_json()},
                maxlen=self.settings.events_maxlen,
                approximate=True,
            )
        except (RedisError, OSError) as e:
            raise self._unavailable("publishing events", e) from None

    async def _ensure_group(self) -> None:
        """Create the consumer group at the stream's end (new entries only)."""
        try:
            await self._redis.xgroup_create(self._stream, EVENTS_GROUP, id="$", mkstream=True)
        except ResponseError as e:
            if "BUSYGROUP" not in str(e):
                raise self._unavailable("creating the consumer group", e) from None
        except (RedisError, OSError) as e:
            raise self._unavailable("creating the consumer group", e) from None
        self._group_ready = True

    async def read_events(
        self, consumer: str, *, count: int = 100, block_s: float = _BLOCK_S
    ) -> list[tuple[str, KernelEventBatch]]:
        """New entries for ``consumer`` of the group (waits up to ``block_s``)."""
        if not self._group_ready:
            await self._ensure_group()
        try:
            answer: Any = await self._blocking.xreadgroup(
                EVENTS_GROUP,
                consumer,
                {self._stream: ">"},
                count=count,
                block=max(1, int(block_s * 1000)),
            )
        except ResponseError as e:
            if "NOGROUP" in str(e):  # Redis restarted without our group: make it again
                self._group_ready = False
                return []
            raise self._unavailable("reading events", e) from None
        except (RedisError, OSError) as e:
            self._group_ready = False  # a restarted server may have lost it
            raise self._unavailable("reading events", e) from None
        entries: list[tuple[str, KernelEventBatch]] = []
        for _stream, items in answer or []:
            for entry_id, fields in items:
                eid = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
                raw = fields.get(b"batch") or fields.get("batch")
                try:
                    entries.append((eid, KernelEventBatch.model_validate_json(raw or b"")))
                except ValidationError as e:
                    log.warning("unreadable event entry %s on Redis dropped: %s", eid, e)
                    await self.ack_events([eid])
        return entries

    async def ack_events(self, entry_ids: Sequence[str]) -> None:
        if not entry_ids:
            return
        try:
            await self._redis.xack(self._stream, EVENTS_GROUP, *entry_ids)
        except (RedisError, OSError) as e:
            raise self._unavailable("acknowledging events", e) from None

    # -- change notices between manager replicas --------------------------------------
    async def publish_change(self, origin: str) -> None:
        try:
            await self._redis.publish(self.settings.key("changes"), origin)
        except (RedisError, OSError) as e:
            raise self._unavailable("publishing a change", e) from None

    async def changes(self) -> AsyncIterator[str]:
        """The origins of change notices as they come; raises BusUnavailable when the
        connection breaks (subscribe again after a pause)."""
        pubsub = self._blocking.pubsub(ignore_subscribe_messages=True)
        try:
            await pubsub.subscribe(self.settings.key("changes"))
            while True:
                message = await pubsub.get_message(timeout=_BLOCK_S)
                if message is None or message.get("type") != "message":
                    continue
                data = message.get("data")
                yield data.decode() if isinstance(data, bytes) else str(data)
        except (RedisError, OSError) as e:
            raise self._unavailable("listening for changes", e) from None
        finally:
            with contextlib.suppress(RedisError, OSError):
                await pubsub.aclose()  # type: ignore[no-untyped-call]
