"""Short-lived transfer tokens: what a client shows the client-facing API.

A token is ``v1.<payload>.<signature>``: the payload is the JSON of :class:`TokenClaims`
(base64url), the signature HMAC-SHA256 over ``v1.<payload>`` with a key derived from
the proxy's secret.  It names the operation, volume, folder, path, the upload's size
and session, and expires (``exp``, POSIX seconds).  A token that is malformed, badly
signed, expired or for another operation is refused (``bad-token``).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import time
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from accelshare.protocol.storage import StorageErrorType

from .errors import StorageError

__all__ = ["TokenClaims", "TokenSigner"]

_VERSION = "v1"


class TokenClaims(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    op: Literal["upload", "download"]
    volume: str
    folder_id: str
    path: str
    exp: float
    size: int | None = None  # upload
    session: str | None = None  # upload
    archive: bool = False  # download


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class TokenSigner:
    def __init__(self, secret: str) -> None:
        self._key = hmac.new(
            secret.encode("utf-8"), b"accelshare-storage-token-v1", hashlib.sha256
        ).digest()

    def _sign(self, signed: str) -> str:
        return _b64(hmac.new(self._key, signed.encode("ascii"), hashlib.sha256).digest())

    def issue(self, claims: TokenClaims) -> str:
        payload = _b64(json.dumps(claims.model_dump(), separators=(",", ":")).encode("utf-8"))
        signed = f"{_VERSION}.{payload}"
        return f"{signed}.{self._sign(signed)}"

    def verify(self, token: str | None, *, op: str, now: float | None = None) -> TokenClaims:
        if not token:
            raise _refuse("a token issued by this storage proxy, received nothing")
        parts = token.split(".")
        if len(parts) != 3 or parts[0] != _VERSION:
            raise _refuse("a token of the form 'v1.PAYLOAD.SIGNATURE', received another form")
        signed = f"{parts[0]}.{parts[1]}"
        if not hmac.compare_digest(self._sign(signed), parts[2]):
            raise _refuse("a token signed by this storage proxy, received a bad signature")
        try:
            claims = TokenClaims.model_validate(json.loads(_unb64(parts[1])))
        except (ValueError, binascii.Error, ValidationError):
            raise _refuse("a well-formed token payload, received an unreadable one") from None
        if claims.op != op:
            raise _refuse(f"a token for {op!r}, received one for {claims.op!r}")
        current = time.time() if now is None else now
        if claims.exp < current:
            raise _refuse(
                f"an unexpired token, received one that expired {current - claims.exp:.0f} s ago"
            )
        return claims


def _refuse(what: str) -> StorageError:
    return StorageError(StorageErrorType.BAD_TOKEN, f"token: expected {what}")
