"""Email/password login, the signed session cookie and its CSRF token."""

from __future__ import annotations

from datetime import timedelta

import httpx
import pytest

from accelshare.api.cookies import (
    CookieError,
    SessionCookie,
    decode_session_cookie,
    encode_session_cookie,
)
from accelshare.api.signing import sign_request
from accelshare.manager.clock import FrozenClock
from accelshare.manager.enums import UserRole, UserStatus

from .conftest import COOKIE_SECRET, T0, MemoryCredentialStore
from .test_api_auth import assert_problem


async def _login(
    client: httpx.AsyncClient, email: str = "bob@example.com", password: str = "correct horse"
) -> httpx.Response:
    return await client.post("/auth/login", json={"email": email, "password": password})


@pytest.fixture
def bob(store: MemoryCredentialStore) -> str:
    return store.add("bob@example.com", UserRole.ADMIN).access_key


async def test_login_sets_an_httponly_cookie(client: httpx.AsyncClient, bob: str) -> None:
    response = await _login(client)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["email"] == "bob@example.com"
    assert body["role"] == "admin"
    assert body["access_key"] == bob
    assert body["csrf_token"]
    set_cookie = response.headers["set-cookie"].lower()
    assert "accelshare_session=" in set_cookie
    assert "httponly" in set_cookie
    assert "samesite=lax" in set_cookie
    whoami = await client.get("/whoami")
    assert whoami.status_code == 200, whoami.text
    assert whoami.json()["auth_method"] == "cookie"
    assert whoami.json()["access_key"] == bob


async def test_username_alias_is_accepted(client: httpx.AsyncClient, bob: str) -> None:
    response = await client.post(
        "/auth/login", json={"username": "bob@example.com", "password": "correct horse"}
    )
    assert response.status_code == 200


@pytest.mark.parametrize(
    ("email", "password"),
    [
        pytest.param("bob@example.com", "wrong", id="wrong-password"),
        pytest.param("nobody@example.com", "correct horse", id="unknown-email"),
    ],
)
async def test_bad_credentials_look_the_same(
    client: httpx.AsyncClient, bob: str, email: str, password: str
) -> None:
    body = assert_problem(await _login(client, email, password), 401, "bad-credentials")
    assert body["detail"] == "Wrong email or password"
    assert "set-cookie" not in (await _login(client, email, password)).headers


async def test_inactive_user_cannot_log_in(
    client: httpx.AsyncClient, store: MemoryCredentialStore
) -> None:
    store.add("old@example.com", user_status=UserStatus.INACTIVE)
    assert_problem(await _login(client, "old@example.com"), 401, "inactive-user")


async def test_cookie_expires(client: httpx.AsyncClient, bob: str, clock: FrozenClock) -> None:
    await _login(client)
    clock.advance(timedelta(hours=12, seconds=1))
    assert_problem(await client.get("/whoami"), 401, "session-expired")


async def test_deactivated_key_ends_the_cookie_session(
    client: httpx.AsyncClient, store: MemoryCredentialStore, bob: str
) -> None:
    await _login(client)
    store.update(bob, is_key_active=False)
    assert_problem(await client.get("/whoami"), 401, "inactive-access-key")


async def test_tampered_cookie(client: httpx.AsyncClient, bob: str) -> None:
    await _login(client)
    value = client.cookies["accelshare_session"]
    client.cookies.set("accelshare_session", "x" + value)
    assert_problem(await client.get("/whoami"), 401, "invalid-session-cookie")


async def test_unsafe_method_needs_the_csrf_token(client: httpx.AsyncClient, bob: str) -> None:
    token = (await _login(client)).json()["csrf_token"]
    body = assert_problem(await client.post("/auth/logout"), 403)
    assert body["reason"] == "csrf-token-mismatch"
    response = await client.post("/auth/logout", headers={"X-CSRF-Token": token})
    assert response.status_code == 200
    assert response.json() == {"email": "bob@example.com", "logged_out": True}
    assert "accelshare_session" not in client.cookies
    assert_problem(await client.get("/whoami"), 401, "missing-credentials")


async def test_the_csrf_token_is_read_again_with_the_cookie(
    client: httpx.AsyncClient, store: MemoryCredentialStore, bob: str
) -> None:
    """A new console tab (no sessionStorage) keeps the login: GET /auth/csrf answers the
    cookie's token, which then passes the CSRF check; without the cookie it is a 401,
    signed with a keypair a 400 (no cookie, no token), after a logout a 401."""
    assert_problem(await client.get("/auth/csrf"), 401, "missing-credentials")
    token = (await _login(client)).json()["csrf_token"]
    again = await client.get("/auth/csrf")
    assert again.status_code == 200, again.text
    assert again.json()["csrf_token"] == token
    assert again.json()["email"] == "bob@example.com"
    assert again.headers["cache-control"] == "no-store"
    kept = client.cookies["accelshare_session"]
    client.cookies.clear()
    cred = store.credentials[bob]
    headers = sign_request(
        access_key=cred.access_key,
        secret_key=cred.secret_key,
        method="GET",
        path_query="/auth/csrf",
        host="testserver",
        now=T0,
    )
    assert_problem(await client.get("/auth/csrf", headers=headers), 403, "no-cookie")
    client.cookies.set("accelshare_session", kept)
    out = await client.post("/auth/logout", headers={"X-CSRF-Token": again.json()["csrf_token"]})
    assert out.status_code == 200, out.text
    client.cookies.set("accelshare_session", kept)
    assert_problem(await client.get("/auth/csrf"), 401, "session-ended")


def test_cookie_codec_round_trip_and_tampering() -> None:
    cookie = SessionCookie.issue(
        user_id="u", access_key="AKIA0000000000000000", now=T0, max_age=timedelta(hours=1)
    )
    value = encode_session_cookie(cookie, COOKIE_SECRET)
    assert decode_session_cookie(value, COOKIE_SECRET, T0) == cookie
    for bad in (value + "x", "x" + value, value.replace(".", ""), "", "a.b"):
        with pytest.raises(CookieError, match="cookie"):
            decode_session_cookie(bad, COOKIE_SECRET, T0)
    with pytest.raises(CookieError, match="cookie"):
        decode_session_cookie(value, b"another-secret-another-secret-00", T0)
    with pytest.raises(CookieError) as info:
        decode_session_cookie(value, COOKIE_SECRET, T0 + timedelta(hours=1))
    assert info.value.reason == "session-expired"


async def test_logout_ends_the_cookie_server_side(client: httpx.AsyncClient, bob: str) -> None:
    """A copy of the cookie kept from before the logout no longer works."""
    token = (await _login(client)).json()["csrf_token"]
    kept = client.cookies["accelshare_session"]
    response = await client.post("/auth/logout", headers={"X-CSRF-Token": token})
    assert response.status_code == 200, response.text
    client.cookies.set("accelshare_session", kept)
    body = assert_problem(await client.get("/whoami"), 401, "session-ended")
    assert "log in again" in body["detail"]
    client.cookies.clear()
    assert (await _login(client)).status_code == 200  # a new login works
    assert (await client.get("/whoami")).status_code == 200


async def test_a_cookie_of_an_ended_generation_is_refused(
    client: httpx.AsyncClient, store: MemoryCredentialStore, bob: str
) -> None:
    await _login(client)
    await store.end_logins(store.credentials[bob].user_id)
    assert_problem(await client.get("/whoami"), 401, "session-ended")


async def test_logout_signed_with_a_keypair_ends_no_console_login(
    client: httpx.AsyncClient, store: MemoryCredentialStore, bob: str
) -> None:
    await _login(client)
    kept = client.cookies["accelshare_session"]
    cred = store.credentials[bob]
    headers = sign_request(
        access_key=cred.access_key,
        secret_key=cred.secret_key,
        method="POST",
        path_query="/auth/logout",
        host="testserver",
        now=T0,
    )
    signed = await client.post("/auth/logout", headers=headers)
    assert signed.status_code == 200, signed.text
    client.cookies.set("accelshare_session", kept)
    assert (await client.get("/whoami")).json()["auth_method"] == "cookie"
    assert store.credentials[bob].login_generation == 0


async def test_repeated_failures_get_429_with_retry_after(
    client: httpx.AsyncClient, bob: str
) -> None:
    for _ in range(5):  # max-failures-per-account-address
        assert_problem(await _login(client, password="wrong"), 401, "bad-credentials")
    body = assert_problem(await _login(client), 429, "too-many-failures")  # even the right one
    assert body["limit"] == "max-failures-per-account-address"
    assert body["limit_value"] == 5
    response = await _login(client)
    assert 1 <= int(response.headers["Retry-After"]) <= 300
    assert "set-cookie" not in response.headers
