"""Request authentication (HMAC keypair signatures or the console's login cookie) and roles.

Routes declare what they need with FastAPI dependencies::

    @router.get("/whoami")
    async def whoami(identity: CurrentIdentity) -> dict[str, str]: ...

    @router.get("/agents")
    async def agents(identity: SuperadminIdentity) -> ...: ...   # 403 for user/admin

    @router.post("/x", dependencies=[Depends(require_role(UserRole.ADMIN))])

A request with an ``Authorization`` header is checked as a Backend.AI signature
(:mod:`accelshare.api.signing`); otherwise the login cookie is used; otherwise 401.
Failures are 401 problems whose ``reason`` is one of :class:`AuthFailure`:

* the Date (``Date``, else ``X-BackendAI-Date``) must lie within ± ``max-clock-skew``
  of the injected clock (``date-expired`` / ``date-in-future``);
* ``unknown-access-key`` when no such key exists; for an existing key the signature is
  checked *before* the key's state, so ``inactive-access-key`` / ``inactive-user`` are
  only told to someone who holds the secret.

Roles are the user's (``user`` < ``admin`` < ``superadmin``); the keypair's Backend.AI
``is_admin`` flag is reported but grants nothing by itself.
"""

from __future__ import annotations

import enum
import hmac
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Annotated, Any

from fastapi import Depends, Request

from accelshare.manager.clock import Clock, utcnow
from accelshare.manager.credentials import Credential, CredentialStore
from accelshare.manager.enums import UserRole, UserStatus

from .cookies import CookieError, decode_session_cookie
from .problems import Forbidden, InvalidAPIParameters, Unauthorized
from .signing import (
    SUPPORTED_API_VERSIONS,
    SigningError,
    compute_signature,
    parse_authorization,
    parse_date,
    signatures_match,
)

__all__ = [
    "AdminIdentity",
    "AuthFailure",
    "AuthMethod",
    "AuthSettings",
    "Authenticator",
    "CurrentIdentity",
    "Identity",
    "SuperadminIdentity",
    "current_identity",
    "require_role",
]

log = logging.getLogger(__name__)

UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
CSRF_HEADER = "X-CSRF-Token"


class AuthFailure(enum.StrEnum):
    """The ``reason`` of a 401 problem."""

    MISSING_CREDENTIALS = "missing-credentials"
    MALFORMED_HEADER = "malformed-header"
    UNSUPPORTED_SIGN_METHOD = "unsupported-sign-method"
    MISSING_DATE = "missing-date"
    MALFORMED_DATE = "malformed-date"
    DATE_EXPIRED = "date-expired"
    DATE_IN_FUTURE = "date-in-future"
    MISSING_VERSION = "missing-version"
    UNKNOWN_ACCESS_KEY = "unknown-access-key"
    SIGNATURE_MISMATCH = "signature-mismatch"
    INACTIVE_ACCESS_KEY = "inactive-access-key"
    INACTIVE_USER = "inactive-user"
    BAD_CREDENTIALS = "bad-credentials"
    INVALID_SESSION_COOKIE = "invalid-session-cookie"
    SESSION_EXPIRED = "session-expired"
    SESSION_ENDED = "session-ended"
    TOO_MANY_FAILURES = "too-many-failures"


class AuthMethod(enum.StrEnum):
    KEYPAIR = "keypair"
    COOKIE = "cookie"
    APP_COOKIE = "app-cookie"  # the apps origin's per-session cookie (api/app_origin.py)


@dataclass(frozen=True, slots=True)
class Identity:
    """Who is calling (attached to ``request.state.identity`` once authenticated)."""

    user_id: uuid.UUID
    email: str
    role: UserRole
    domain_name: str
    access_key: str
    is_admin_key: bool
    resource_policy: str
    method: AuthMethod
    login_generation: int | None = None  # the login cookie's (streams re-check it)

    @property
    def is_superadmin(self) -> bool:
        return self.role is UserRole.SUPERADMIN

    @property
    def is_admin(self) -> bool:
        """Admin of its domain (superadmins included)."""
        return self.role.includes(UserRole.ADMIN)

    def can_access(self, *, owner_user_id: uuid.UUID, owner_domain: str) -> bool:
        """May this caller see or change something owned by that user?

        superadmin: everything; admin: everything in its domain; user: only its own.
        Routes answer 404 (not 403) when this is False, so ids of others do not leak.
        """
        if self.is_superadmin:
            return True
        if self.role is UserRole.ADMIN:
            return owner_domain == self.domain_name
        return owner_user_id == self.user_id

    def to_json(self) -> dict[str, Any]:
        return {
            "user_id": str(self.user_id),
            "email": self.email,
            "role": self.role.value,
            "domain": self.domain_name,
            "access_key": self.access_key,
            "is_admin": self.is_admin_key,
            "resource_policy": self.resource_policy,
            "auth_method": self.method.value,
        }


@dataclass(frozen=True, slots=True)
class AuthSettings:
    cookie_secret: bytes
    max_clock_skew: timedelta = timedelta(minutes=15)
    cookie_name: str = "accelshare_session"
    cookie_max_age: timedelta = timedelta(hours=12)
    cookie_secure: bool = False
    clock: Clock = utcnow


def _fail(reason: AuthFailure, detail: str) -> Unauthorized:
    return Unauthorized(detail, reason=reason.value)


def _path_query(request: Request) -> str:
    """Path and query exactly as sent (the client signs its encoded request target)."""
    raw_path = request.scope.get("raw_path")
    path = raw_path.decode("latin-1") if raw_path else request.url.path
    query = request.scope.get("query_string", b"").decode("latin-1")
    return f"{path}?{query}" if query else path


def _content_type_candidates(header: str | None) -> list[str]:
    """What a client may have signed: Backend.AI's server signs the bare media type
    (aiohttp's ``content_type``, "application/octet-stream" when absent); a client may
    also sign the full header value with parameters."""
    if header is None:
        return ["application/octet-stream", ""]
    full = header.strip().lower()
    bare = full.split(";", 1)[0].strip()
    return [bare] if bare == full else [bare, full]


def _identity(
    cred: Credential, method: AuthMethod, login_generation: int | None = None
) -> Identity:
    return Identity(
        user_id=cred.user_id,
        email=cred.email,
        role=cred.role,
        domain_name=cred.domain_name,
        access_key=cred.access_key,
        is_admin_key=cred.is_admin_key,
        resource_policy=cred.resource_policy,
        method=method,
        login_generation=login_generation,
    )


def _check_active(cred: Credential) -> None:
    if not cred.is_key_active:
        raise _fail(AuthFailure.INACTIVE_ACCESS_KEY, "The access key is deactivated")
    if cred.user_status is not UserStatus.ACTIVE:
        raise _fail(AuthFailure.INACTIVE_USER, f"The user account is {cred.user_status.value}")


class Authenticator:
    """Turns a request into an :class:`Identity` or raises a 401 problem.

    ``on_used``: called with the access key of every request authenticated by a
    signature or the login cookie (the manager records ``keypairs.last_used_at``,
    :class:`~accelshare.manager.key_usage.KeyUsageRecorder`); it must not block, and
    whatever it raises is logged, never the request's failure.
    """

    def __init__(
        self,
        store: CredentialStore,
        settings: AuthSettings,
        *,
        on_used: Callable[[str], None] | None = None,
    ) -> None:
        self.store = store
        self.settings = settings
        self.on_used = on_used

    def _used(self, access_key: str) -> None:
        if self.on_used is None:
            return
        try:
            self.on_used(access_key)
        except Exception:
            log.exception("recording the use of access key %s failed", access_key)

    async def authenticate(self, request: Request) -> Identity:
        header = request.headers.get("authorization")
        if header:
            return await self.authenticate_signature(request, header)
        cookie = request.cookies.get(self.settings.cookie_name)
        if cookie:
            return await self.authenticate_cookie(request, cookie)
        raise _fail(
            AuthFailure.MISSING_CREDENTIALS,
            "Sign the request with an access key (Authorization: BackendAI ...) or log in",
        )

    async def authenticate_signature(self, request: Request, header: str) -> Identity:
        try:
            params = parse_authorization(header)
        except SigningError as e:
            raise _fail(AuthFailure(e.reason), str(e)) from None
        headers = request.headers
        raw_date = headers.get("date") or headers.get("x-backendai-date")
        raw_date = raw_date or headers.get("x-sorna-date")
        if not raw_date:
            raise _fail(
                AuthFailure.MISSING_DATE, "The Date (or X-BackendAI-Date) header is missing"
            )
        try:
            date = parse_date(raw_date)
        except SigningError as e:
            raise _fail(AuthFailure.MALFORMED_DATE, str(e)) from None
        now, skew = self.settings.clock(), self.settings.max_clock_skew
        if date < now - skew:
            raise _fail(
                AuthFailure.DATE_EXPIRED,
                f"The request Date {raw_date} is more than {skew} before the server time "
                f"{now.isoformat()}; check the client's clock",
            )
        if date > now + skew:
            raise _fail(
                AuthFailure.DATE_IN_FUTURE,
                f"The request Date {raw_date} is more than {skew} after the server time "
                f"{now.isoformat()}; check the client's clock",
            )
        version, version_header = headers.get("x-backendai-version"), "x-backendai-version"
        if version is None and headers.get("x-sorna-version") is not None:
            version, version_header = headers["x-sorna-version"], "x-sorna-version"
        if version is None:
            raise _fail(AuthFailure.MISSING_VERSION, "The X-BackendAI-Version header is missing")
        if version not in SUPPORTED_API_VERSIONS:
            spoken = ", ".join(SUPPORTED_API_VERSIONS)
            raise InvalidAPIParameters(
                f"Unsupported API version {version[:64]!r} in {version_header}: this manager"
                f" speaks {spoken}",
                field=version_header,
                expected=f"one of {spoken}",
                received=version,
                reason="unsupported-version",
                supported=list(SUPPORTED_API_VERSIONS),
            )
        cred = await self.store.get_credential(params.access_key)
        if cred is None:
            raise _fail(AuthFailure.UNKNOWN_ACCESS_KEY, "Unknown access key")
        host, path_query = headers.get("host", ""), _path_query(request)
        for content_type in _content_type_candidates(headers.get("content-type")):
            expected = compute_signature(
                secret_key=cred.secret_key,
                method=request.method,
                path_query=path_query,
                date_header=raw_date,
                host=host,
                content_type=content_type,
                api_version=version,
                hash_type=params.hash_type,
                version_header=version_header,
                date=date,
            )
            if signatures_match(expected, params.signature):
                break
        else:
            raise _fail(
                AuthFailure.SIGNATURE_MISMATCH,
                "The signature does not match: sign METHOD, path?query, Date, host, "
                "content-type and version exactly as sent (see docs/manager.md)",
            )
        _check_active(cred)
        self._used(cred.access_key)
        return _identity(cred, AuthMethod.KEYPAIR)

    async def authenticate_cookie(self, request: Request, value: str) -> Identity:
        try:
            cookie = decode_session_cookie(
                value, self.settings.cookie_secret, self.settings.clock()
            )
        except CookieError as e:
            raise _fail(AuthFailure(e.reason), str(e)) from None
        cred = await self.store.get_credential(cookie.access_key)
        if cred is None or str(cred.user_id) != cookie.user_id:
            raise _fail(AuthFailure.INVALID_SESSION_COOKIE, "The login session is no longer valid")
        _check_active(cred)
        if cookie.generation != cred.login_generation:
            raise _fail(
                AuthFailure.SESSION_ENDED,
                "The login session was ended (logout, password change or deactivation); "
                "log in again",
            )
        csrf = request.headers.get(CSRF_HEADER, "")
        if request.method in UNSAFE_METHODS and not hmac.compare_digest(
            csrf.encode(), cookie.csrf_token.encode()
        ):
            raise Forbidden(
                f"A {request.method} request with the login cookie needs the {CSRF_HEADER} "
                "header returned by the login",
                reason="csrf-token-mismatch",
            )
        self._used(cred.access_key)
        return _identity(cred, AuthMethod.COOKIE, cookie.generation)

    async def identity_of(
        self,
        access_key: str,
        user_id: str,
        method: AuthMethod,
        *,
        login_generation: int | None = None,
    ) -> Identity:
        """The identity of a keypair named by a token this manager signed (the apps
        origin's cookie): refused when the key or user is gone or inactive, or when the
        console login it was handed off from has ended (``login_generation``)."""
        cred = await self.store.get_credential(access_key)
        if cred is None or str(cred.user_id) != user_id:
            raise _fail(AuthFailure.INVALID_SESSION_COOKIE, "The app access is no longer valid")
        _check_active(cred)
        if login_generation is not None and login_generation != cred.login_generation:
            raise _fail(
                AuthFailure.SESSION_ENDED,
                "The console login this app was opened from has ended; log in again",
            )
        return _identity(cred, method, login_generation)


async def current_identity(request: Request) -> Identity:
    """Dependency: the authenticated caller (cached on ``request.state``)."""
    cached = getattr(request.state, "identity", None)
    if isinstance(cached, Identity):
        return cached
    authenticator: Authenticator = request.app.state.authenticator
    identity = await authenticator.authenticate(request)
    request.state.identity = identity
    return identity


def require_role(role: UserRole) -> Callable[..., Awaitable[Identity]]:
    """Dependency factory: the caller must hold ``role`` or a higher one (else 403)."""

    async def dependency(
        identity: Annotated[Identity, Depends(current_identity)],
    ) -> Identity:
        if not identity.role.includes(role):
            raise Forbidden(
                f"This needs the {role.value} role; {identity.email} has {identity.role.value}",
                reason="insufficient-role",
                required_role=role.value,
            )
        return identity

    dependency.__name__ = f"require_{role.value}"
    return dependency


CurrentIdentity = Annotated[Identity, Depends(current_identity)]
AdminIdentity = Annotated[Identity, Depends(require_role(UserRole.ADMIN))]
SuperadminIdentity = Annotated[Identity, Depends(require_role(UserRole.SUPERADMIN))]
