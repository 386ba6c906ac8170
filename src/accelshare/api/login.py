"""Email/password login for the web console: sets the signed session cookie.

``POST /auth/login`` ``{"email": "...", "password": "..."}`` (``username`` is accepted
for ``email``, as Backend.AI's ``authorize`` does) -> 200 with the user, its role,
the access key the session acts with and the CSRF token; the cookie is HttpOnly and
SameSite=Lax (Secure when ``[api] session-cookie-secure``).  ``POST /auth/logout``
clears it.  ``GET /auth/csrf`` answers the login cookie's CSRF token again (a console tab
opened from another, which did not inherit its ``sessionStorage``, keeps the login); a
same-origin read only: the API answers no CORS, so another site's page cannot read it.

Unknown email and wrong password give the same 401 (``bad-credentials``) after the
same amount of hashing work, so the endpoint does not reveal which emails exist.
Failures are throttled per account and client address (:mod:`.login_throttle`): 429
``too-many-failures`` with ``Retry-After``.  Logout (with the cookie) ends every console
login of the user server-side, not only this browser's cookie.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import Any

from fastapi import APIRouter, Request, Response
from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator

from accelshare.common.text_input import check_text
from accelshare.manager.credentials import LoginRecord
from accelshare.manager.enums import UserStatus
from accelshare.manager.passwords import hash_password, verify_password

from .auth import Authenticator, AuthFailure, AuthMethod, CurrentIdentity
from .cookies import SessionCookie, decode_session_cookie, encode_session_cookie
from .login_throttle import LoginThrottle
from .problems import Forbidden, TooManyRequests, Unauthorized

__all__ = ["LoginRequest", "router"]

router = APIRouter(prefix="/auth", tags=["auth"])
log = logging.getLogger(__name__)


class LoginRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    email: str = Field(
        min_length=1, max_length=128, validation_alias=AliasChoices("email", "username")
    )
    password: str = Field(min_length=1, max_length=1024)

    @field_validator("email")
    @classmethod
    def _one_line(cls, value: str) -> str:
        return check_text(value, field="email")


@functools.cache
def _dummy_hash() -> str:
    return hash_password("accelshare-dummy-password")


async def _check_password(record: LoginRecord | None, password: str) -> LoginRecord:
    stored = record.password_hash if record is not None else _dummy_hash()
    ok = await asyncio.to_thread(verify_password, password, stored)
    if record is None or not ok:
        raise Unauthorized("Wrong email or password", reason=AuthFailure.BAD_CREDENTIALS.value)
    return record


def _throttle(request: Request) -> LoginThrottle:
    throttle: LoginThrottle = request.app.state.login_throttle
    return throttle


@router.post("/login")
async def login(body: LoginRequest, request: Request, response: Response) -> dict[str, Any]:
    authenticator: Authenticator = request.app.state.authenticator
    settings = authenticator.settings
    throttle = _throttle(request)
    address = request.client.host if request.client else "unknown"
    refusal = throttle.check(body.email, address)
    if refusal is not None:
        log.warning(
            "login: throttled %r from %s (%s = %d in %gs)",
            body.email,
            address,
            refusal.limit,
            refusal.value,
            throttle.settings.window_s,
        )
        raise TooManyRequests(
            f"Too many failed logins for {refusal.scope} ({refusal.limit} = {refusal.value} "
            f"in {throttle.settings.window_s:g} s); try again in {refusal.retry_after_s} s",
            retry_after_s=refusal.retry_after_s,
            reason=AuthFailure.TOO_MANY_FAILURES.value,
            limit=refusal.limit,
            limit_value=refusal.value,
            window_s=throttle.settings.window_s,
        )
    if not _dummy_hash.cache_info().currsize:
        await asyncio.to_thread(_dummy_hash)
    try:
        record = await _check_password(
            await authenticator.store.get_login(body.email), body.password
        )
    except Unauthorized:
        throttle.failed(body.email, address)
        raise
    throttle.succeeded(body.email, address)
    if record.status is not UserStatus.ACTIVE:
        raise Unauthorized(
            f"The user account is {record.status.value}", reason=AuthFailure.INACTIVE_USER.value
        )
    if record.access_key is None:
        raise Unauthorized(
            "The user has no active access key; ask an administrator to issue one",
            reason=AuthFailure.INACTIVE_ACCESS_KEY.value,
        )
    cookie = SessionCookie.issue(
        user_id=str(record.user_id),
        access_key=record.access_key,
        now=settings.clock(),
        max_age=settings.cookie_max_age,
        generation=record.login_generation,
    )
    response.set_cookie(
        settings.cookie_name,
        encode_session_cookie(cookie, settings.cookie_secret),
        max_age=int(settings.cookie_max_age.total_seconds()),
        httponly=True,
        secure=settings.cookie_secure,
        samesite="lax",
        path="/",
    )
    return {
        "email": record.email,
        "role": record.role.value,
        "domain": record.domain_name,
        "access_key": record.access_key,
        "csrf_token": cookie.csrf_token,
        "expires_at": cookie.expires.isoformat(),
    }


@router.post("/logout")
async def logout(identity: CurrentIdentity, request: Request, response: Response) -> dict[str, Any]:
    """Clear the cookie; with the cookie, also end the user's console logins server-side
    (a copy of the cookie no longer works).  Signed with a keypair, nothing is ended."""
    authenticator: Authenticator = request.app.state.authenticator
    if identity.method is AuthMethod.COOKIE:
        await authenticator.store.end_logins(identity.user_id)
    response.delete_cookie(authenticator.settings.cookie_name, path="/")
    return {"email": identity.email, "logged_out": True}


@router.get("/csrf")
async def csrf_token(
    identity: CurrentIdentity, request: Request, response: Response
) -> dict[str, Any]:
    """The CSRF token of the caller's login cookie (a new console tab's way to keep the
    login without the password)."""
    authenticator: Authenticator = request.app.state.authenticator
    settings = authenticator.settings
    value = request.cookies.get(settings.cookie_name)
    if identity.method is not AuthMethod.COOKIE or not value:
        raise Forbidden("Only a console login (the cookie) has a CSRF token", reason="no-cookie")
    cookie = decode_session_cookie(value, settings.cookie_secret, settings.clock())
    response.headers["Cache-Control"] = "no-store"
    return {
        "email": identity.email,
        "csrf_token": cookie.csrf_token,
        "expires_at": cookie.expires.isoformat(),
    }
