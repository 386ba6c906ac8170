"""Authentication through the real FastAPI app (httpx ASGITransport, in-memory store)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from accelshare.api.auth import AdminIdentity, SuperadminIdentity
from accelshare.api.signing import API_VERSION, compute_signature, sign_request
from accelshare.manager.clock import FrozenClock
from accelshare.manager.credentials import Credential
from accelshare.manager.enums import UserRole, UserStatus

from .conftest import HMACAuth, MemoryCredentialStore


@pytest.fixture
def user(store: MemoryCredentialStore) -> Credential:
    return store.add("alice@example.com")


def assert_problem(
    response: httpx.Response, status: int, reason: str | None = None
) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    body: dict[str, Any] = response.json()
    assert body["status"] == status
    assert body["type"].startswith("/problems/")
    assert body["title"]
    assert body["detail"]
    if reason is not None:
        assert body["reason"] == reason
    return body


async def test_signed_request_is_accepted(
    client: httpx.AsyncClient, user: Credential, clock: FrozenClock
) -> None:
    response = await client.get("/whoami", auth=HMACAuth(user, clock))
    assert response.status_code == 200, response.text
    assert response.json() == {
        "user_id": str(user.user_id),
        "email": "alice@example.com",
        "role": "user",
        "domain": "default",
        "access_key": user.access_key,
        "is_admin": False,
        "resource_policy": "default",
        "auth_method": "keypair",
    }


async def test_query_string_and_encoded_path_are_signed_as_sent(
    client: httpx.AsyncClient, user: Credential, clock: FrozenClock
) -> None:
    response = await client.get(
        "/whoami", params={"q": "a b/c", "x": "ü"}, auth=HMACAuth(user, clock)
    )
    assert response.status_code == 200, response.text


async def test_no_credentials(client: httpx.AsyncClient) -> None:
    response = await client.get("/whoami")
    assert_problem(response, 401, "missing-credentials")
    assert response.headers["www-authenticate"].startswith("BackendAI")


async def test_unknown_key(client: httpx.AsyncClient, user: Credential, clock: FrozenClock) -> None:
    stranger = Credential(**{**_fields(user), "access_key": "AKIAUNKNOWNKEY000000"})
    response = await client.get("/whoami", auth=HMACAuth(stranger, clock))
    assert_problem(response, 401, "unknown-access-key")


async def test_wrong_signature(
    client: httpx.AsyncClient, user: Credential, clock: FrozenClock
) -> None:
    auth = HMACAuth(user, clock, secret_key="x" * 40)
    body = assert_problem(await client.get("/whoami", auth=auth), 401, "signature-mismatch")
    assert "signature" in body["detail"]


async def test_inactive_key(
    client: httpx.AsyncClient, store: MemoryCredentialStore, user: Credential, clock: FrozenClock
) -> None:
    store.update(user.access_key, is_key_active=False)
    response = await client.get("/whoami", auth=HMACAuth(user, clock))
    assert_problem(response, 401, "inactive-access-key")


async def test_inactive_key_with_a_wrong_secret_learns_nothing(
    client: httpx.AsyncClient, store: MemoryCredentialStore, user: Credential, clock: FrozenClock
) -> None:
    store.update(user.access_key, is_key_active=False)
    auth = HMACAuth(user, clock, secret_key="y" * 40)
    assert_problem(await client.get("/whoami", auth=auth), 401, "signature-mismatch")


async def test_inactive_user(
    client: httpx.AsyncClient, store: MemoryCredentialStore, clock: FrozenClock
) -> None:
    cred = store.add("gone@example.com", user_status=UserStatus.INACTIVE)
    assert_problem(await client.get("/whoami", auth=HMACAuth(cred, clock)), 401, "inactive-user")


@pytest.mark.parametrize(
    ("offset", "reason"),
    [
        pytest.param(timedelta(minutes=-16), "date-expired", id="16-min-old"),
        pytest.param(timedelta(hours=-24), "date-expired", id="a-day-old"),
        pytest.param(timedelta(minutes=16), "date-in-future", id="16-min-ahead"),
        pytest.param(timedelta(minutes=-15), None, id="15-min-old-ok"),
        pytest.param(timedelta(minutes=15), None, id="15-min-ahead-ok"),
        pytest.param(timedelta(minutes=-14, seconds=-59), None, id="just-inside"),
    ],
)
async def test_date_window(
    client: httpx.AsyncClient,
    user: Credential,
    clock: FrozenClock,
    offset: timedelta,
    reason: str | None,
) -> None:
    client_clock = FrozenClock(clock() + offset)
    response = await client.get("/whoami", auth=HMACAuth(user, client_clock))
    if reason is None:
        assert response.status_code == 200, response.text
    else:
        body = assert_problem(response, 401, reason)
        assert "clock" in body["detail"]


def _signed(user: Credential, clock: FrozenClock, path: str, **kw: Any) -> dict[str, str]:
    return sign_request(
        access_key=user.access_key,
        secret_key=user.secret_key,
        method=kw.pop("method", "GET"),
        path_query=path,
        host=kw.pop("host", "testserver"),
        now=clock(),
        **kw,
    )


@pytest.mark.parametrize(
    ("signed_path", "sent_path", "host"),
    [
        pytest.param("/whoami", "/whoami?admin=1", "testserver", id="query-added"),
        pytest.param("/whoami?x=1", "/whoami?x=2", "testserver", id="query-changed"),
        pytest.param("/auth/role", "/whoami", "testserver", id="path-changed"),
        pytest.param("/whoami", "/whoami", "127.0.0.1:8081", id="host-changed"),
    ],
)
async def test_tampered_request(
    client: httpx.AsyncClient,
    user: Credential,
    clock: FrozenClock,
    signed_path: str,
    sent_path: str,
    host: str,
) -> None:
    headers = _signed(user, clock, signed_path, host=host)
    assert_problem(await client.get(sent_path, headers=headers), 401, "signature-mismatch")


async def test_tampered_date_header(
    client: httpx.AsyncClient, user: Credential, clock: FrozenClock
) -> None:
    headers = _signed(user, clock, "/whoami")
    headers["Date"] = (clock() + timedelta(seconds=1)).isoformat()
    assert_problem(await client.get("/whoami", headers=headers), 401, "signature-mismatch")


async def test_x_backendai_date_is_accepted_without_date(
    client: httpx.AsyncClient, user: Credential, clock: FrozenClock
) -> None:
    headers = _signed(user, clock, "/whoami")
    headers["X-BackendAI-Date"] = headers.pop("Date")
    assert (await client.get("/whoami", headers=headers)).status_code == 200


@pytest.mark.parametrize(
    ("signed", "sent"),
    [
        pytest.param("application/json", "application/json; charset=utf-8", id="bare-signed"),
        pytest.param(
            "application/json; charset=utf-8", "application/json; charset=utf-8", id="full-signed"
        ),
        pytest.param("text/plain", "text/plain", id="backendai-client-get"),
        pytest.param("APPLICATION/JSON", "application/json", id="case"),
    ],
)
async def test_content_type_forms(
    client: httpx.AsyncClient, user: Credential, clock: FrozenClock, signed: str, sent: str
) -> None:
    headers = _signed(user, clock, "/whoami", content_type=signed)
    headers["Content-Type"] = sent
    assert (await client.get("/whoami", headers=headers)).status_code == 200


async def test_missing_content_type_is_signed_as_octet_stream(
    client: httpx.AsyncClient, user: Credential, clock: FrozenClock
) -> None:
    headers = _signed(user, clock, "/whoami", content_type="application/octet-stream")
    del headers["Content-Type"]
    assert (await client.get("/whoami", headers=headers)).status_code == 200


async def test_legacy_sorna_version_header(
    client: httpx.AsyncClient, user: Credential, clock: FrozenClock
) -> None:
    date = clock().isoformat()
    signature = compute_signature(
        secret_key=user.secret_key,
        method="GET",
        path_query="/whoami",
        date_header=date,
        host="testserver",
        content_type="application/json",
        api_version=API_VERSION,
        version_header="x-sorna-version",
    )
    headers = {
        "Date": date,
        "Content-Type": "application/json",
        "X-Sorna-Version": API_VERSION,
        "Authorization": f"Sorna signMethod=HMAC-SHA256, credential={user.access_key}:{signature}",
    }
    assert (await client.get("/whoami", headers=headers)).status_code == 200


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        pytest.param(
            lambda h: h.update(Authorization="BackendAI nonsense"), "malformed-header", id="header"
        ),
        pytest.param(
            lambda h: h.update(Authorization=h["Authorization"].replace("SHA256", "MD5")),
            "unsupported-sign-method",
            id="md5",
        ),
        pytest.param(lambda h: h.pop("Date"), "missing-date", id="no-date"),
        pytest.param(lambda h: h.update(Date="tomorrow"), "malformed-date", id="bad-date"),
        pytest.param(lambda h: h.pop("X-BackendAI-Version"), "missing-version", id="no-version"),
    ],
)
async def test_malformed_requests(
    client: httpx.AsyncClient, user: Credential, clock: FrozenClock, mutate: Any, reason: str
) -> None:
    headers = _signed(user, clock, "/whoami")
    mutate(headers)
    assert_problem(await client.get("/whoami", headers=headers), 401, reason)


@pytest.mark.parametrize(
    ("header", "version"),
    [
        ("X-BackendAI-Version", "v4.20190315"),
        ("X-BackendAI-Version", "v99.20991231"),
        ("X-BackendAI-Version", "anything"),
        ("X-BackendAI-Version", ""),
        ("X-Sorna-Version", "v4.20190315"),
    ],
)
async def test_an_unsupported_version_is_refused_listing_the_supported_ones(
    client: httpx.AsyncClient, user: Credential, clock: FrozenClock, header: str, version: str
) -> None:
    """Even correctly signed: the version is checked against the ones spoken."""
    kw: dict[str, Any] = {"api_version": version}
    headers = _signed(user, clock, "/whoami", **kw)
    if header != "X-BackendAI-Version":
        date = headers["Date"]
        signature = compute_signature(
            secret_key=user.secret_key,
            method="GET",
            path_query="/whoami",
            date_header=date,
            host="testserver",
            content_type="application/json",
            api_version=version,
            version_header=header.lower(),
        )
        headers = {
            "Date": date,
            "Content-Type": "application/json",
            header: version,
            "Authorization": f"BackendAI signMethod=HMAC-SHA256, credential={user.access_key}:"
            f"{signature}",
        }
    response = await client.get("/whoami", headers=headers)
    assert response.status_code == 400, response.text
    problem = response.json()
    assert problem["reason"] == "unsupported-version"
    assert problem["field"] == header.lower()
    assert problem["received"] == version
    assert problem["supported"] == [API_VERSION] == ["v8.20240915"]
    assert problem["detail"].endswith(f"this manager speaks {API_VERSION}")
    headers = _signed(user, clock, "/whoami")
    assert (await client.get("/whoami", headers=headers)).status_code == 200


# -- roles -------------------------------------------------------------------------------


@pytest.fixture
def role_app(app: FastAPI) -> FastAPI:
    @app.get("/test/admin")
    async def admin_only(identity: AdminIdentity) -> dict[str, str]:
        return {"role": identity.role.value}

    @app.get("/test/superadmin")
    async def superadmin_only(identity: SuperadminIdentity) -> dict[str, str]:
        return {"role": identity.role.value}

    return app


@pytest.mark.parametrize(
    ("role", "path", "status"),
    [
        pytest.param(UserRole.USER, "/test/admin", 403, id="user-admin"),
        pytest.param(UserRole.USER, "/test/superadmin", 403, id="user-superadmin"),
        pytest.param(UserRole.ADMIN, "/test/admin", 200, id="admin-admin"),
        pytest.param(UserRole.ADMIN, "/test/superadmin", 403, id="admin-superadmin"),
        pytest.param(UserRole.SUPERADMIN, "/test/admin", 200, id="superadmin-admin"),
        pytest.param(UserRole.SUPERADMIN, "/test/superadmin", 200, id="superadmin-superadmin"),
    ],
)
async def test_role_required(
    role_app: FastAPI,
    client: httpx.AsyncClient,
    store: MemoryCredentialStore,
    clock: FrozenClock,
    role: UserRole,
    path: str,
    status: int,
) -> None:
    cred = store.add(f"{role.value}@example.com", role)
    response = await client.get(path, auth=HMACAuth(cred, clock))
    if status == 200:
        assert response.json() == {"role": role.value}
    else:
        body = assert_problem(response, 403, "insufficient-role")
        assert body["required_role"] in {"admin", "superadmin"}
        assert role.value in body["detail"]


async def test_role_endpoint_unauthenticated_is_401_not_403(
    role_app: FastAPI, client: httpx.AsyncClient
) -> None:
    assert_problem(await client.get("/test/superadmin"), 401, "missing-credentials")


async def test_auth_role_compat_shape(
    client: httpx.AsyncClient, store: MemoryCredentialStore, clock: FrozenClock
) -> None:
    cred = store.add("root@example.com", UserRole.SUPERADMIN)
    response = await client.get("/auth/role", auth=HMACAuth(cred, clock))
    assert response.json() == {
        "global_role": "superadmin",
        "domain_role": "admin",
        "group_role": None,
    }


def _fields(cred: Credential) -> dict[str, Any]:
    return {name: getattr(cred, name) for name in Credential.__slots__}


def test_can_access_follows_the_roles(store: MemoryCredentialStore) -> None:
    from accelshare.api.auth import AuthMethod, Identity

    def identity(role: UserRole, domain: str = "default") -> Identity:
        cred = store.add(f"{role.value}-{domain}@example.com", role)
        return Identity(
            user_id=cred.user_id,
            email=cred.email,
            role=role,
            domain_name=domain,
            access_key=cred.access_key,
            is_admin_key=cred.is_admin_key,
            resource_policy="default",
            method=AuthMethod.KEYPAIR,
        )

    user, other = identity(UserRole.USER), identity(UserRole.USER, "other")
    admin, root = identity(UserRole.ADMIN), identity(UserRole.SUPERADMIN, "other")
    mine = {"owner_user_id": user.user_id, "owner_domain": "default"}
    theirs = {"owner_user_id": other.user_id, "owner_domain": "other"}
    assert user.can_access(**mine)
    assert not user.can_access(**theirs)
    assert not other.can_access(**mine)
    assert admin.can_access(**mine)
    assert not admin.can_access(**theirs)
    assert root.can_access(**mine)
    assert root.can_access(**theirs)
