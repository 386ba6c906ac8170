"""Backend.AI-compatible request signing (spec 07), shared by the server and the SDK.

Pure: standard library only, no I/O, no clock (the caller passes the date).

A request is signed over this string (``\\n`` between the lines)::

    GET                                   the method, upper case
    /session?x=1                          path and query, as sent on the wire
    2024-01-02T03:04:05+00:00             the Date header, verbatim
    host:127.0.0.1:8081                   the Host header (host[:port])
    content-type:application/json         the content type, lower case
    x-backendai-version:v8.20240915       the API version header
    e3b0c442...b855                       hex digest of an EMPTY body

with the key chain ``k1 = HMAC(secret, date as YYYYMMDD)``, ``k2 = HMAC(k1, host)``,
``signature = hex(HMAC(k2, string to sign))``; SHA-256 unless the header says
otherwise.  The header is
``Authorization: BackendAI signMethod=HMAC-SHA256, credential=<access key>:<signature>``.

Compatibility notes (from Backend.AI's client ``auth.py``/``request.py`` and its
manager's ``api/auth.py``):

* the client writes ``Date: datetime.now(tzutc()).isoformat()`` and signs that text;
  the server signs the *raw* header text and takes YYYYMMDD from the parsed date in
  its own offset (not converted to UTC);
* the server falls back to ``X-BackendAI-Date`` (and the legacy ``X-Sorna-Date``)
  when ``Date`` is absent, and to ``X-Sorna-Version`` (signed as
  ``x-sorna-version:``) when ``X-BackendAI-Version`` is absent;
* the auth type may be ``BackendAI`` or the legacy ``Sorna``;
* the body is never hashed (API versions since v4.20181215 sign an empty body).

Worked example (the golden vector of issue 6)::

    >>> compute_signature(
    ...     secret_key="wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    ...     method="GET", path_query="/session", date_header="2024-01-02T03:04:05+00:00",
    ...     host="127.0.0.1:8081", content_type="application/json", api_version="v8.20240915",
    ... )
    'feda21ce3ca66bdd86fe04c8f6558258021bc7986c90376a7dee743eafacff36'
"""

from __future__ import annotations

import hashlib
import hmac
import re
from dataclasses import dataclass
from datetime import UTC, datetime

__all__ = [
    "API_VERSION",
    "AUTH_TYPES",
    "SUPPORTED_API_VERSIONS",
    "SUPPORTED_HASH_TYPES",
    "AuthorizationParams",
    "SigningError",
    "build_authorization",
    "compute_signature",
    "format_date",
    "parse_authorization",
    "parse_date",
    "sign_request",
    "signatures_match",
    "string_to_sign",
]

API_VERSION = "v8.20240915"
"""The API version accelshare speaks (the one Backend.AI's 25.x client sends)."""

SUPPORTED_API_VERSIONS: tuple[str, ...] = (API_VERSION,)
"""The ``X-BackendAI-Version`` values a signed request may carry (anything else: 400
listing these).  Backend.AI's client negotiates the lower of its version and the one
``GET /`` announces, so its 25.x releases send :data:`API_VERSION`."""

AUTH_TYPES = ("BackendAI", "Sorna")
SUPPORTED_HASH_TYPES = frozenset({"sha256", "sha384", "sha512"})
DEFAULT_HASH_TYPE = "sha256"

_HEX = re.compile(r"^[0-9a-fA-F]+$")


class SigningError(ValueError):
    """A malformed Authorization header, sign method or date; ``reason`` is a short code."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class AuthorizationParams:
    """The parsed ``Authorization`` header."""

    auth_type: str  # "BackendAI" (or the legacy "Sorna")
    hash_type: str  # "sha256"
    access_key: str
    signature: str  # hex

    @property
    def sign_method(self) -> str:
        return f"HMAC-{self.hash_type.upper()}"


def _hash_type_of(sign_method: str) -> str:
    """``"HMAC-SHA256"`` -> ``"sha256"``; anything else raises :class:`SigningError`."""
    mac, _, hash_type = sign_method.strip().partition("-")
    hash_type = hash_type.lower()
    if mac.lower() != "hmac" or hash_type not in SUPPORTED_HASH_TYPES:
        supported = ", ".join(f"HMAC-{h.upper()}" for h in sorted(SUPPORTED_HASH_TYPES))
        raise SigningError(
            "unsupported-sign-method",
            f"Unsupported signMethod {sign_method!r}: expected one of {supported}",
        )
    return hash_type


def parse_authorization(header: str) -> AuthorizationParams:
    """Parse ``BackendAI signMethod=HMAC-SHA256, credential=<ak>:<hex sig>``."""
    auth_type, sep, rest = header.strip().partition(" ")
    if not sep or auth_type not in AUTH_TYPES:
        raise SigningError(
            "malformed-header",
            "Malformed Authorization header: expected "
            "'BackendAI signMethod=HMAC-SHA256, credential=<access key>:<signature>'",
        )
    params: dict[str, str] = {}
    for piece in rest.split(","):
        key, eq, value = piece.partition("=")
        if not eq:
            raise SigningError("malformed-header", f"Malformed Authorization parameter {piece!r}")
        params[key.strip()] = value.strip()
    if "signMethod" not in params or "credential" not in params:
        raise SigningError(
            "malformed-header", "The Authorization header needs both signMethod and credential"
        )
    access_key, colon, signature = params["credential"].partition(":")
    if not colon or not access_key or not signature or not _HEX.match(signature):
        raise SigningError(
            "malformed-header",
            "Malformed credential: expected '<access key>:<hex signature>'",
        )
    hash_type = _hash_type_of(params["signMethod"])
    return AuthorizationParams(auth_type, hash_type, access_key, signature.lower())


def format_date(moment: datetime) -> str:
    """The Date header value the client sends: ISO 8601 with the offset."""
    if moment.tzinfo is None:
        raise ValueError("the request date must be timezone-aware")
    return moment.isoformat()


def _parse_rfc1123(text: str) -> datetime:
    """``Tue, 02 Jan 2024 03:04:05 GMT`` (the HTTP date format); always UTC."""
    return datetime.strptime(text, "%a, %d %b %Y %H:%M:%S GMT").replace(tzinfo=UTC)


def parse_date(raw: str) -> datetime:
    """Parse a Date header: ISO 8601 (``2024-01-02T03:04:05+00:00``, ``...Z``) or RFC 1123.

    A date without an offset is taken as UTC (as Backend.AI does).
    """
    text = raw.strip()
    moment: datetime | None = None
    for parse in (datetime.fromisoformat, _parse_rfc1123):
        try:
            moment = parse(text)
            break
        except ValueError:
            continue
    if moment is None:
        raise SigningError(
            "malformed-date",
            f"Malformed Date header {raw!r}: expected ISO 8601 with a timezone, "
            "e.g. 2024-01-02T03:04:05+00:00",
        )
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def string_to_sign(
    *,
    method: str,
    path_query: str,
    date_header: str,
    host: str,
    content_type: str,
    api_version: str,
    hash_type: str = DEFAULT_HASH_TYPE,
    version_header: str = "x-backendai-version",
) -> str:
    """The exact text that is signed (see the module docstring)."""
    body_hash = hashlib.new(hash_type, b"").hexdigest()
    return "\n".join(
        [
            method.upper(),
            path_query,
            date_header,
            f"host:{host}",
            f"content-type:{content_type.lower()}",
            f"{version_header}:{api_version}",
            body_hash,
        ]
    )


def compute_signature(
    *,
    secret_key: str,
    method: str,
    path_query: str,
    date_header: str,
    host: str,
    content_type: str,
    api_version: str,
    hash_type: str = DEFAULT_HASH_TYPE,
    version_header: str = "x-backendai-version",
    date: datetime | None = None,
) -> str:
    """Hex signature of one request.  ``date`` defaults to ``parse_date(date_header)``."""
    if hash_type not in SUPPORTED_HASH_TYPES:
        raise SigningError("unsupported-sign-method", f"Unsupported hash type {hash_type!r}")
    day = (date if date is not None else parse_date(date_header)).strftime("%Y%m%d")
    k1 = hmac.new(secret_key.encode(), day.encode(), hash_type).digest()
    k2 = hmac.new(k1, host.encode(), hash_type).digest()
    text = string_to_sign(
        method=method,
        path_query=path_query,
        date_header=date_header,
        host=host,
        content_type=content_type,
        api_version=api_version,
        hash_type=hash_type,
        version_header=version_header,
    )
    return hmac.new(k2, text.encode(), hash_type).hexdigest()


def signatures_match(expected: str, received: str) -> bool:
    """Constant-time comparison of two hex signatures (case-insensitive)."""
    return hmac.compare_digest(expected.lower().encode(), received.lower().encode())


def build_authorization(access_key: str, signature: str, hash_type: str = DEFAULT_HASH_TYPE) -> str:
    return f"BackendAI signMethod=HMAC-{hash_type.upper()}, credential={access_key}:{signature}"


def sign_request(
    *,
    access_key: str,
    secret_key: str,
    method: str,
    path_query: str,
    host: str,
    now: datetime,
    content_type: str = "application/json",
    api_version: str = API_VERSION,
    hash_type: str = DEFAULT_HASH_TYPE,
) -> dict[str, str]:
    """The headers a client adds to a request: Date, Content-Type, version, Authorization.

    ``path_query`` and ``host`` must be what goes on the wire: the percent-encoded path
    with its query string, and the Host header (``host`` or ``host:port``, the port only
    when the URL names one).  Example for an httpx request ``req``::

        headers = sign_request(access_key=ak, secret_key=sk, method=req.method,
                               path_query=req.url.raw_path.decode(), host=req.headers["host"],
                               now=datetime.now(UTC))
    """
    date_header = format_date(now)
    signature = compute_signature(
        secret_key=secret_key,
        method=method,
        path_query=path_query,
        date_header=date_header,
        host=host,
        content_type=content_type,
        api_version=api_version,
        hash_type=hash_type,
        date=now,
    )
    return {
        "Date": date_header,
        "Content-Type": content_type,
        "X-BackendAI-Version": api_version,
        "Authorization": build_authorization(access_key, signature, hash_type),
    }
