"""Password hashing with the standard library's scrypt (no extra dependency).

Stored form (self-describing, so parameters can be raised later)::

    scrypt$<n>$<r>$<p>$<salt, base64>$<hash, base64>

Verification is constant-time; a malformed stored value verifies as False.
Hashing costs ~16 MiB and tens of milliseconds by design: call it off the event loop
(``asyncio.to_thread``) in request handlers.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import string
from dataclasses import dataclass

__all__ = ["ScryptParams", "generate_password", "hash_password", "verify_password"]

_PREFIX = "scrypt"
_SALT_BYTES = 16
_KEY_BYTES = 32


@dataclass(frozen=True, slots=True)
class ScryptParams:
    n: int = 2**14
    r: int = 8
    p: int = 1

    @property
    def maxmem(self) -> int:
        return 128 * self.n * self.r * self.p + 1024 * 1024


DEFAULT_PARAMS = ScryptParams()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def hash_password(password: str, params: ScryptParams = DEFAULT_PARAMS) -> str:
    salt = secrets.token_bytes(_SALT_BYTES)
    key = hashlib.scrypt(
        password.encode(),
        salt=salt,
        n=params.n,
        r=params.r,
        p=params.p,
        maxmem=params.maxmem,
        dklen=_KEY_BYTES,
    )
    return f"{_PREFIX}${params.n}${params.r}${params.p}${_b64(salt)}${_b64(key)}"


def verify_password(password: str, stored: str) -> bool:
    try:
        prefix, n, r, p, salt_b64, key_b64 = stored.split("$")
        if prefix != _PREFIX:
            return False
        params = ScryptParams(int(n), int(r), int(p))
        salt = base64.b64decode(salt_b64, validate=True)
        expected = base64.b64decode(key_b64, validate=True)
        key = hashlib.scrypt(
            password.encode(),
            salt=salt,
            n=params.n,
            r=params.r,
            p=params.p,
            maxmem=params.maxmem,
            dklen=len(expected),
        )
    except (ValueError, TypeError):
        return False
    return hmac.compare_digest(key, expected)


def generate_password(length: int = 24) -> str:
    """A random password of letters and digits (shell-safe in an env file)."""
    alphabet = string.ascii_letters + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(length))
