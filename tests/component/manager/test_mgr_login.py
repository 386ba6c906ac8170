"""Console logins through the real API and database (SQLite and PostgreSQL): a cookie
dies at logout, password change and deactivation, and stays dead after reactivation."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest

from .cluster import Cluster

PASSWORD = "long enough password"


def browser(cluster: Cluster, address: str = "10.0.0.1") -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=cluster.app, client=(address, 40000)),
        base_url="http://127.0.0.1:8081",
    )


async def login(client: httpx.AsyncClient, email: str, password: str = PASSWORD) -> httpx.Response:
    return await client.post("/auth/login", json={"email": email, "password": password})


async def _logout(cluster: Cluster, client: httpx.AsyncClient, email: str, token: str) -> None:
    response = await client.post("/auth/logout", headers={"X-CSRF-Token": token})
    assert response.status_code == 200, response.text


async def _password(cluster: Cluster, client: httpx.AsyncClient, email: str, token: str) -> None:
    response = await cluster.admin.patch(f"/admin/users/{email}", json={"password": "a new one!"})
    assert response.status_code == 200, response.text


async def _own_password(
    cluster: Cluster, client: httpx.AsyncClient, email: str, token: str
) -> None:
    """The user changes its own password with the cookie (an admin in the console)."""
    response = await client.patch(
        f"/admin/users/{email}", json={"password": "a new one!"}, headers={"X-CSRF-Token": token}
    )
    assert response.status_code == 200, response.text


async def _user_status(cluster: Cluster, client: httpx.AsyncClient, email: str, token: str) -> None:
    response = await cluster.admin.patch(f"/admin/users/{email}", json={"status": "inactive"})
    assert response.status_code == 200, response.text
    response = await cluster.admin.patch(f"/admin/users/{email}", json={"status": "active"})
    assert response.status_code == 200, response.text


async def _keypair(cluster: Cluster, client: httpx.AsyncClient, email: str, token: str) -> None:
    listed = await cluster.admin.get("/admin/keypairs", params={"user_email": email})
    (key,) = [k["access_key"] for k in listed.json()["items"]]
    for active in (False, True):
        response = await cluster.admin.patch(f"/admin/keypairs/{key}", json={"is_active": active})
        assert response.status_code == 200, response.text


Ending = Callable[[Cluster, httpx.AsyncClient, str, str], Awaitable[None]]


@pytest.mark.parametrize(
    "end",
    [
        pytest.param(_logout, id="logout"),
        pytest.param(_password, id="password-changed-by-an-admin"),
        pytest.param(_own_password, id="own-password-changed"),
        pytest.param(_user_status, id="user-deactivated-then-reactivated"),
        pytest.param(_keypair, id="keypair-deactivated-then-reactivated"),
    ],
)
async def test_a_console_cookie_dies_at_once(cluster: Cluster, end: Ending) -> None:
    email = "console@example.com"
    created = await cluster.admin.post(
        "/admin/users", json={"email": email, "password": PASSWORD, "role": "admin"}
    )
    assert created.status_code == 201, created.text
    async with browser(cluster) as first, browser(cluster, "10.0.0.2") as second:
        token = (await login(first, email)).json()["csrf_token"]
        assert (await login(second, email)).status_code == 200  # another browser
        kept = first.cookies["accelshare_session"]
        assert (await first.get("/whoami")).status_code == 200
        await end(cluster, first, email, token)
        first.cookies.clear()
        first.cookies.set("accelshare_session", kept)  # a copy kept from before
        for client in (first, second):
            refused = await client.get("/whoami")
            assert refused.status_code == 401, refused.text
            body: dict[str, Any] = refused.json()
            assert body["reason"] == "session-ended", body
        first.cookies.clear()
        password = PASSWORD if end in (_logout, _user_status, _keypair) else "a new one!"
        again = await login(first, email, password)
        assert again.status_code == 200, again.text
        assert (await first.get("/whoami")).status_code == 200


async def test_a_deleted_user_s_cookie_is_refused(cluster: Cluster) -> None:
    email = "gone@example.com"
    created = await cluster.admin.post("/admin/users", json={"email": email, "password": PASSWORD})
    assert created.status_code == 201, created.text
    async with browser(cluster) as client:
        assert (await login(client, email)).status_code == 200
        deleted = await cluster.admin.delete(f"/admin/users/{email}")
        assert deleted.status_code == 200, deleted.text
        refused = await client.get("/whoami")
        assert refused.status_code == 401, refused.text
