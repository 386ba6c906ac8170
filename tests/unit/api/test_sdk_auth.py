"""The SDK's KeypairAuth is accepted by the real authenticator."""

from __future__ import annotations

import httpx
from fastapi import FastAPI

from accelshare.client.auth import KeypairAuth
from accelshare.manager.clock import FrozenClock

from .conftest import MemoryCredentialStore


async def test_sdk_signature_accepted(
    app: FastAPI, store: MemoryCredentialStore, clock: FrozenClock
) -> None:
    cred = store.add("user@example.com")
    auth = KeypairAuth(cred.access_key, cred.secret_key, clock=clock)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(
        transport=transport, base_url="http://127.0.0.1:8081", auth=auth
    ) as c:
        ok = await c.get("/whoami", params={"q": "a b"})
        assert ok.status_code == 200, ok.text
        assert ok.json()["access_key"] == cred.access_key


async def test_sdk_wrong_secret_refused(
    app: FastAPI, store: MemoryCredentialStore, clock: FrozenClock
) -> None:
    cred = store.add("user@example.com")
    auth = KeypairAuth(cred.access_key, "x" * 40, clock=clock)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(
        transport=transport, base_url="http://127.0.0.1:8081", auth=auth
    ) as c:
        resp = await c.get("/whoami")
    assert resp.status_code == 401
    assert resp.headers["content-type"].startswith("application/problem+json")
