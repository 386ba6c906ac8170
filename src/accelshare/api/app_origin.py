"""App pages on an origin of their own (``[apps]`` in manager.toml; Backend.AI's WSProxy
serves apps on ports of its own for the same reason).

An app page is JavaScript the session's user (or anything the session runs) wrote.  On
the console's origin it could call the console API with the user's login cookie
(``fetch("/sessions")``, a terminal WebSocket...).  With ``[apps]`` set, the manager
serves app pages only on the *apps origin* (a second listener, ``listen-addr``, and/or a
host name of their own, ``origin``):

* the apps origin serves ``/session/{id}/apps/{name}/...`` (HTTP and WebSocket) and
  :data:`AUTH_PATH`, nothing else (the API, the console and the terminal answer 404
  there), with strict headers (:data:`SECURITY_HEADERS`);
* the console's login cookie is not accepted there; access is a cookie of the apps
  origin (:data:`APP_COOKIE`, HttpOnly, ``Path=/session/{id}/``) holding a token this
  manager signed for one session and one keypair (``cookie-max-age``);
* a browser gets it by a hand-off: a navigation on the console's origin to
  ``/session/{id}/apps/{name}/...`` with the login cookie is answered ``303`` to
  ``<apps origin>/_apps/auth?token=...``: a token for that session, valid
  ``token-ttl`` seconds and once (on every manager replica sharing the database: the
  used ones are recorded in ``used_app_tokens``, :mod:`accelshare.manager.app_tokens`),
  which the apps origin exchanges for its cookie before
  a ``303`` to the app's page.  Anything else with the login cookie on the console's app
  routes (``fetch``, other methods, WebSockets) is refused: 403 / 4403;
* signed requests (the CLI, API clients) keep using the app routes on the API origin.

So an app page's script runs on an origin where the user's login cookie means nothing,
and the console's origin answers it as any other site: the browser sends the cookie
(same site) but the page cannot read the answers (no CORS), cannot pass the CSRF check
(``X-CSRF-Token``), and a terminal WebSocket from it is refused (its ``Origin`` is not
the console's).  All sessions' apps share the apps origin: give each user's apps a
trusted-enough neighbourhood, or an origin per app with a reverse proxy (docs).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import secrets
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urlsplit

__all__ = [
    "APP_COOKIE",
    "AUTH_PATH",
    "SECURITY_HEADERS",
    "AppOrigin",
    "AppTokenError",
    "AppsOriginMiddleware",
    "HandOff",
    "is_apps_request",
]

APP_COOKIE = "accelshare_app"
AUTH_PATH = "/_apps/auth"
_APP_PATH = re.compile(r"^/session/[^/]+/apps/[^/]+(/.*)?$")
# Added to every answer of the apps origin unless the app set its own.
SECURITY_HEADERS: dict[str, str] = {
    "x-content-type-options": "nosniff",
    "x-frame-options": "SAMEORIGIN",
    "referrer-policy": "same-origin",
    "cross-origin-opener-policy": "same-origin",
    "cross-origin-resource-policy": "same-origin",
}
_STATE_KEY = "accelshare_apps_origin"

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class AppTokenError(ValueError):
    """A token or cookie that is malformed, forged, expired, reused or for another
    session."""


class UsedTokens(Protocol):
    """The record of used hand-off tokens that several manager replicas share."""

    async def claim(self, nonce: str, expires_at: float) -> bool:
        """Record ``nonce`` (valid until ``expires_at``, epoch seconds) as used;
        False when it already was."""
        ...


@dataclass(frozen=True, slots=True)
class HandOff:
    session_id: str
    access_key: str
    user_id: str
    path: str  # where the apps origin sends the browser (under /session/{id}/apps/)
    # the login cookie's generation when handed off from one (None: a signed request);
    # the app cookie then ends with that console login (logout, password change...)
    login_generation: int | None = None


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass(slots=True)
class AppOrigin:
    """The apps origin's settings and its tokens.

    ``origin``: the configured public origin (``[apps] origin``, else
    ``http://<listen-addr>``), where the hand-off sends browsers; None only where no
    hand-off happens (a listener matched by ``listen_port`` alone).  Never derived from
    a request's ``Host`` header.  ``key``: the HMAC key of the tokens (derived from the login
    cookie's secret, so replicas sharing it accept each other's tokens)."""

    key: bytes
    origin: str | None = None
    listen_port: int | None = None
    token_ttl_s: float = 30.0
    cookie_max_age_s: int = 8 * 3600
    secure_cookie: bool = False
    clock: Callable[[], float] = time.time
    #: Where the used hand-off tokens are recorded for all replicas (the manager's
    #: database: :class:`accelshare.manager.app_tokens.DbUsedTokens`); None: this
    #: process only.
    used_tokens: UsedTokens | None = None
    _used: dict[str, float] = field(default_factory=dict)  # hand-off nonce -> expiry

    @classmethod
    def from_secret(cls, cookie_secret: bytes, **kwargs: Any) -> AppOrigin:
        key = hmac.new(cookie_secret, b"accelshare apps origin v1", hashlib.sha256).digest()
        return cls(key=key, **kwargs)

    # -- where ---------------------------------------------------------------------------
    def matches(self, scope: Scope) -> bool:
        """Whether a request came to the apps origin (its listener or its host name)."""
        server = scope.get("server")
        if self.listen_port is not None and server and server[1] == self.listen_port:
            return True
        if self.origin is None:
            return False
        host = ""
        for name, value in scope.get("headers") or ():
            if name == b"host":
                host = value.decode("latin-1").lower()
                break
        wanted = urlsplit(self.origin)
        default = ":443" if wanted.scheme == "https" else ":80"
        return host.removesuffix(default) == wanted.netloc.removesuffix(default)

    # -- tokens --------------------------------------------------------------------------
    def _sign(self, payload: dict[str, Any]) -> str:
        body = _b64(json.dumps(payload, separators=(",", ":"), sort_keys=True).encode())
        mac = hmac.new(self.key, body.encode(), hashlib.sha256).digest()
        return f"{body}.{_b64(mac)}"

    def _verify(self, token: str, kind: str) -> dict[str, Any]:
        body, dot, mac = token.partition(".")
        if not dot or len(token) > 4096:
            raise AppTokenError("malformed token")
        expected = hmac.new(self.key, body.encode(), hashlib.sha256).digest()
        try:
            given = _unb64(mac)
            payload = json.loads(_unb64(body))
        except (ValueError, UnicodeDecodeError):
            raise AppTokenError("malformed token") from None
        if not hmac.compare_digest(expected, given):
            raise AppTokenError("bad signature")
        if not isinstance(payload, dict) or payload.get("k") != kind:
            raise AppTokenError("not a token of this kind")
        exp = payload.get("exp")
        if not isinstance(exp, int | float) or exp < self.clock():
            raise AppTokenError("expired")
        for key in ("sid", "ak", "uid"):
            if not isinstance(payload.get(key), str):
                raise AppTokenError("malformed token")
        return payload

    def hand_off(self, handoff: HandOff) -> str:
        """A single-use token for ``handoff``, valid ``token_ttl_s``."""
        return self._sign(
            {
                "k": "h",
                "sid": handoff.session_id,
                "ak": handoff.access_key,
                "uid": handoff.user_id,
                "g": handoff.login_generation,
                "p": handoff.path,
                "exp": self.clock() + self.token_ttl_s,
                "n": secrets.token_urlsafe(16),
            }
        )

    async def redeem(self, token: str) -> HandOff:
        """The hand-off of ``token``, once (a second use raises), on every replica
        sharing :attr:`used_tokens`."""
        payload = self._verify(token, "h")
        path, nonce = payload.get("p"), payload.get("n")
        prefix = f"/session/{payload['sid']}/apps/"
        if not isinstance(path, str) or not path.startswith(prefix) or not isinstance(nonce, str):
            raise AppTokenError("malformed token")
        now = self.clock()
        for old in [n for n, exp in self._used.items() if exp < now]:
            del self._used[old]
        if nonce in self._used:
            raise AppTokenError("already used")
        self._used[nonce] = float(payload["exp"])
        if self.used_tokens is not None and not await self.used_tokens.claim(
            nonce, float(payload["exp"])
        ):
            raise AppTokenError("already used")
        return HandOff(payload["sid"], payload["ak"], payload["uid"], path, _generation(payload))

    def cookie_value(self, handoff: HandOff) -> str:
        return self._sign(
            {
                "k": "c",
                "sid": handoff.session_id,
                "ak": handoff.access_key,
                "uid": handoff.user_id,
                "g": handoff.login_generation,
                "exp": self.clock() + self.cookie_max_age_s,
            }
        )

    def read_cookie(self, value: str, session_id: str) -> tuple[str, str, int | None]:
        """``(access_key, user_id, login generation)`` of an app cookie for ``session_id``."""
        payload = self._verify(value, "c")
        if payload["sid"].lower() != session_id.lower():
            raise AppTokenError("for another session")
        return payload["ak"], payload["uid"], _generation(payload)


def _generation(payload: dict[str, Any]) -> int | None:
    generation = payload.get("g")
    if generation is not None and (isinstance(generation, bool) or not isinstance(generation, int)):
        raise AppTokenError("malformed token")
    return generation


def is_apps_request(scope: Scope) -> bool:
    """Set by :class:`AppsOriginMiddleware` on requests to the apps origin."""
    state = scope.get("state") or {}
    return bool(state.get(_STATE_KEY))


class AppsOriginMiddleware:
    """On the apps origin: app routes and :data:`AUTH_PATH` only, strict headers."""

    def __init__(self, app: ASGIApp, apps: AppOrigin) -> None:
        self.app = app
        self.apps = apps

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or not self.apps.matches(scope):
            await self.app(scope, receive, send)
            return
        scope.setdefault("state", {})[_STATE_KEY] = True
        path = scope.get("path", "")
        allowed = _APP_PATH.match(path) is not None or (
            path == AUTH_PATH and scope["type"] == "http"
        )
        if not allowed:
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 4404, "reason": "not here"})
                return
            body = b"Not found: this origin serves app pages only\n"
            await send(
                {
                    "type": "http.response.start",
                    "status": 404,
                    "headers": [
                        (b"content-type", b"text/plain; charset=utf-8"),
                        (b"content-length", str(len(body)).encode()),
                        *((k.encode(), v.encode()) for k, v in SECURITY_HEADERS.items()),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return
        if scope["type"] == "websocket":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers") or [])
                present = {bytes(k).lower() for k, _ in headers}
                for name, value in SECURITY_HEADERS.items():
                    if name.encode() not in present:
                        headers.append((name.encode(), value.encode()))
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, send_with_headers)
