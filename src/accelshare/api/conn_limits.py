"""Per-user limits on the manager's long-lived connections: event streams
(``/events/*``), web terminals and app WebSockets (the app proxy).

Each kind has a limit per user (counted by user id, so a user's several keypairs and its
login cookie share one count), and all of them together a limit for the whole manager.
Beyond a limit the connection is refused with 429 problem+json ``too-many-connections``
naming the limit (``limit``), its value (``limit_value``), how many the caller (or, for
``max-total``, the manager) holds (``held``) and the kind; ``Retry-After`` comes with
``max-total`` only (other users' connections come and go), not with a per-user limit (the
user has to close one of its own).  A WebSocket gets the 429 as its handshake's answer.

A slot is taken before the connection is answered and given back when it ends however it
ends (closed by the client, a network error, the server stopping, a cancelled task):
:meth:`Lease.release` is idempotent and runs from ``finally`` blocks.  Settings:
``[api.connections]`` in manager.toml (docs/configuration.md).
"""

from __future__ import annotations

import enum
from collections import Counter
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from .problems import TooManyRequests

__all__ = [
    "ConnectionKind",
    "ConnectionLimits",
    "ConnectionSettings",
    "Lease",
    "TooManyConnections",
]


class ConnectionKind(enum.StrEnum):
    EVENT_STREAM = "event-stream"
    TERMINAL = "terminal"
    APP_WEBSOCKET = "app-websocket"


@dataclass(frozen=True, slots=True)
class ConnectionSettings:
    max_event_streams_per_user: int = 32
    max_terminals_per_user: int = 16
    max_app_websockets_per_user: int = 64
    max_total: int = 2048
    retry_after_s: int = 5  # Retry-After of a max-total refusal

    def per_user(self, kind: ConnectionKind) -> tuple[str, int]:
        """The per-user limit of ``kind``: its manager.toml key and value."""
        match kind:
            case ConnectionKind.EVENT_STREAM:
                return "max-event-streams-per-user", self.max_event_streams_per_user
            case ConnectionKind.TERMINAL:
                return "max-terminals-per-user", self.max_terminals_per_user
            case ConnectionKind.APP_WEBSOCKET:
                return "max-app-websockets-per-user", self.max_app_websockets_per_user


class TooManyConnections(TooManyRequests):
    slug = "too-many-connections"
    title = "Too many connections"

    def __init__(self, detail: str, *, retry_after_s: int | None, **extra: Any) -> None:
        # TooManyRequests always sends Retry-After; a per-user refusal has none.
        super(TooManyRequests, self).__init__(detail, **extra)
        if retry_after_s is not None:
            self.extra["retry_after_s"] = retry_after_s
            self.headers["Retry-After"] = str(retry_after_s)


class Lease:
    """One held connection slot; :meth:`release` (or leaving ``with``) gives it back once."""

    __slots__ = ("_limits", "kind", "user_id")

    def __init__(self, limits: ConnectionLimits, kind: ConnectionKind, user_id: str) -> None:
        self._limits: ConnectionLimits | None = limits
        self.kind = kind
        self.user_id = user_id

    @property
    def released(self) -> bool:
        return self._limits is None

    def release(self) -> None:
        limits, self._limits = self._limits, None
        if limits is not None:
            limits._release(self.kind, self.user_id)

    def __enter__(self) -> Lease:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


class ConnectionLimits:
    """The counts of open long-lived connections (one manager process; the event loop's
    thread only, so no lock)."""

    def __init__(self, settings: ConnectionSettings | None = None) -> None:
        self.settings = settings or ConnectionSettings()
        self._held: Counter[tuple[ConnectionKind, str]] = Counter()
        self.total = 0

    def held(self, kind: ConnectionKind, user_id: str) -> int:
        return self._held[(kind, user_id)]

    def acquire(self, kind: ConnectionKind, user_id: str) -> Lease:
        """A slot for a new connection of ``kind`` by ``user_id``, or
        :class:`TooManyConnections`."""
        name, value = self.settings.per_user(kind)
        held = self._held[(kind, user_id)]
        if held >= value:
            raise TooManyConnections(
                f"Too many open {kind}s: this user holds {held}, the limit {name} is {value};"
                f" close one first",
                retry_after_s=None,
                kind=kind.value,
                limit=name,
                limit_value=value,
                held=held,
            )
        if self.total >= self.settings.max_total:
            retry = self.settings.retry_after_s
            raise TooManyConnections(
                f"Too many open long-lived connections on this manager: {self.total} held, the"
                f" limit max-total is {self.settings.max_total}; try again in {retry} s",
                retry_after_s=retry,
                kind=kind.value,
                limit="max-total",
                limit_value=self.settings.max_total,
                held=self.total,
            )
        self._held[(kind, user_id)] += 1
        self.total += 1
        return Lease(self, kind, user_id)

    def _release(self, kind: ConnectionKind, user_id: str) -> None:
        key = (kind, user_id)
        self._held[key] -= 1
        if self._held[key] <= 0:
            del self._held[key]
        self.total -= 1

    def snapshot(self) -> dict[str, dict[str, int]]:
        """kind -> user id -> open connections (only non-zero counts)."""
        out: dict[str, dict[str, int]] = {}
        for (kind, user_id), count in self._held.items():
            out.setdefault(kind.value, {})[user_id] = count
        return out
