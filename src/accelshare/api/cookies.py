"""The web console's login cookie: a signed, expiring, stateless token.

Format: ``<payload>.<mac>`` where ``payload`` is base64url JSON and ``mac`` is
base64url HMAC-SHA256 over ``"accelshare-session-v1." + payload`` with the manager's
cookie secret (``<data-dir>/cookie-secret`` unless configured).  The cookie only says
*who* logged in, until when, and under which login generation of the user; every
request re-reads the user and keypair, so deactivating either takes effect at once, and
a cookie of an older generation is refused: logout, a password or status change and a
keypair deactivated bump the generation (``users.login_generation``), which ends every
console login of that user issued before.

Each cookie carries a CSRF token: cookie-authenticated requests with an unsafe method
(POST, PUT, PATCH, DELETE) must repeat it in the ``X-CSRF-Token`` header (the login
response returns it to the console).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import secrets
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta

__all__ = ["CookieError", "SessionCookie", "decode_session_cookie", "encode_session_cookie"]

_CONTEXT = b"accelshare-session-v1."


class CookieError(ValueError):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class SessionCookie:
    user_id: str
    access_key: str
    issued_at: int  # unix seconds
    expires_at: int
    csrf_token: str
    generation: int = 0  # the user's login generation when issued

    @classmethod
    def issue(
        cls,
        *,
        user_id: str,
        access_key: str,
        now: datetime,
        max_age: timedelta,
        generation: int = 0,
    ) -> SessionCookie:
        issued = int(now.timestamp())
        return cls(
            user_id=user_id,
            access_key=access_key,
            issued_at=issued,
            expires_at=issued + int(max_age.total_seconds()),
            csrf_token=secrets.token_urlsafe(24),
            generation=generation,
        )

    @property
    def expires(self) -> datetime:
        return datetime.fromtimestamp(self.expires_at, UTC)


def _b64encode(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _b64decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _mac(secret: bytes, payload: str) -> str:
    return _b64encode(hmac.new(secret, _CONTEXT + payload.encode("ascii"), hashlib.sha256).digest())


def encode_session_cookie(cookie: SessionCookie, secret: bytes) -> str:
    payload = _b64encode(json.dumps(asdict(cookie), separators=(",", ":")).encode())
    return f"{payload}.{_mac(secret, payload)}"


def decode_session_cookie(value: str, secret: bytes, now: datetime) -> SessionCookie:
    """Verify the MAC and the expiry; raise :class:`CookieError` otherwise."""
    payload, dot, mac = value.partition(".")
    if not dot or not payload.isascii() or not mac.isascii():
        raise CookieError("invalid-session-cookie", "Malformed session cookie; log in again")
    if not hmac.compare_digest(_mac(secret, payload).encode(), mac.encode()):
        raise CookieError("invalid-session-cookie", "Invalid session cookie; log in again")
    try:
        cookie = SessionCookie(**json.loads(_b64decode(payload)))
    except (binascii.Error, ValueError, TypeError):
        raise CookieError("invalid-session-cookie", "Unreadable session cookie") from None
    if now.timestamp() >= cookie.expires_at:
        raise CookieError("session-expired", "The login session has expired; log in again")
    return cookie
