"""When each keypair was last used (``keypairs.last_used_at``, Backend.AI's ``last_used``).

The authentication path calls :meth:`KeyUsageRecorder.note` for every authenticated
request.  ``note`` never waits and never raises: it only remembers the key and time,
and a background task writes them, so a slow or failing database costs a request
nothing.  Each keypair is written at most once per ``interval_s`` (60 s by default):
a client making a thousand requests a minute causes one ``UPDATE`` a minute, and
``last_used`` is accurate to that interval.

A failed write is logged and forgotten (the next request after the interval writes
again); at shutdown :meth:`close` writes what is pending.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from datetime import datetime
from typing import cast

import sqlalchemy as sa

from .clock import Clock, utcnow
from .db import Database
from .models import Keypair

__all__ = ["DEFAULT_INTERVAL_S", "KeyUsageRecorder"]

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 60.0
_MAX_TRACKED = 100_000  # keys remembered for the throttle before old ones are dropped

_KEYPAIRS = cast(sa.Table, Keypair.__table__)
_UPDATE = (
    sa.update(_KEYPAIRS)
    .where(_KEYPAIRS.c.access_key == sa.bindparam("key"))
    .values(last_used_at=sa.bindparam("at"))
)


class KeyUsageRecorder:
    def __init__(
        self,
        db: Database,
        *,
        interval_s: float = DEFAULT_INTERVAL_S,
        clock: Clock = utcnow,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if not interval_s >= 0:
            raise ValueError(f"interval_s: expected a number >= 0, received {interval_s!r}")
        self.db = db
        self.interval_s = interval_s
        self.clock = clock
        self.monotonic = monotonic
        self._noted: dict[str, float] = {}  # key -> monotonic time of its last note
        self._pending: dict[str, datetime] = {}
        self._writer: asyncio.Task[None] | None = None
        self.writes = 0  # UPDATE statements run (a test and a metric can read it)
        self.failures = 0

    def note(self, access_key: str) -> None:
        """The key was just used.  Returns at once; never raises."""
        try:
            now = self.monotonic()
            last = self._noted.get(access_key, -math.inf)
            if now - last < self.interval_s:
                return
            if len(self._noted) >= _MAX_TRACKED:
                self._forget_old(now)
            self._noted[access_key] = now
            self._pending[access_key] = self.clock()
            if self._writer is None or self._writer.done():
                self._writer = asyncio.get_running_loop().create_task(
                    self._write(), name="accelshare-key-usage"
                )
        except Exception:  # never fail the request that is being authenticated
            log.exception("key usage: cannot note the use of a key")

    def _forget_old(self, now: float) -> None:
        self._noted = {k: t for k, t in self._noted.items() if now - t < self.interval_s}
        if len(self._noted) >= _MAX_TRACKED:  # all recent: keep the newest half
            newest = sorted(self._noted.items(), key=lambda kv: kv[1])[_MAX_TRACKED // 2 :]
            self._noted = dict(newest)

    async def _write(self) -> None:
        while self._pending:
            batch, self._pending = self._pending, {}
            try:
                async with self.db.connect(write=True) as conn:
                    await conn.execute(_UPDATE, [{"key": k, "at": at} for k, at in batch.items()])
                self.writes += len(batch)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                self.failures += len(batch)
                for key in batch:  # let the next use try again
                    self._noted.pop(key, None)
                log.warning("key usage: cannot record last_used_at of %d key(s): %s", len(batch), e)

    async def idle(self) -> None:
        """Wait until every noted use is written (or has failed)."""
        while self._writer is not None and not self._writer.done():
            await asyncio.shield(self._writer)

    async def close(self) -> None:
        await self.idle()
