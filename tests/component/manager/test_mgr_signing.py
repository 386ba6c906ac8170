"""The HMAC golden vector (issue 6) sent to a running manager, byte for byte.

``tests/unit/api/test_api_signing.py`` checks that the algorithm computes the vector;
this checks that the server accepts the request the vector describes, headers written
out literally (not computed by our own signing code), with the server's injected clock
at the vector's date and the vector's keypair in the database, and that one changed
hex digit is refused.

The vector signs ``GET /session``, which has no route (sessions are created with POST),
and a request without a route is answered 405 before any authentication runs.  So the
test mounts a probe at ``GET /session`` that needs the same ``CurrentIdentity`` as
every authenticated route and answers who signed.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from accelshare.api.auth import CurrentIdentity
from accelshare.manager.clock import FrozenClock
from accelshare.manager.models import Keypair, User

from .cluster import Cluster, running_cluster

ACCESS_KEY = "AKIAIOSFODNN7EXAMPLE"
SECRET_KEY = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
GOLDEN = "feda21ce3ca66bdd86fe04c8f6558258021bc7986c90376a7dee743eafacff36"
VECTOR_DATE = "2024-01-02T03:04:05+00:00"


def vector_headers(signature: str) -> dict[str, str]:
    return {
        "Date": VECTOR_DATE,
        "Content-Type": "application/json",
        "X-BackendAI-Version": "v8.20240915",
        "Authorization": f"BackendAI signMethod=HMAC-SHA256, credential={ACCESS_KEY}:{signature}",
    }


@pytest.fixture
async def vector_cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    clock = FrozenClock(datetime.fromisoformat(VECTOR_DATE))
    url = f"sqlite+aiosqlite:///{tmp_path / 'manager.db'}"
    async with running_cluster(url, tmp_path / "state", clock=clock, background=False) as cluster:
        created = await cluster.admin.post(
            "/admin/users", json={"email": "vector@example.com", "password": "long enough password"}
        )
        assert created.status_code == 201, created.text
        async with cluster.manager.db.begin(write=True) as db:
            user_id = (
                await db.execute(sa.select(User.id).where(User.email == "vector@example.com"))
            ).scalar_one()
            db.add(
                Keypair(
                    access_key=ACCESS_KEY,
                    secret_key=SECRET_KEY,
                    user_id=user_id,
                    resource_policy="default",
                )
            )

        async def probe(identity: CurrentIdentity) -> dict[str, Any]:
            return identity.to_json()

        cluster.app.add_api_route("/session", probe, methods=["GET"])
        yield cluster


async def test_the_golden_vector_request_is_accepted(vector_cluster: Cluster) -> None:
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=vector_cluster.app), base_url="http://127.0.0.1:8081"
    ) as raw:
        accepted = await raw.get("/session", headers=vector_headers(GOLDEN))
        assert accepted.request.headers["host"] == "127.0.0.1:8081"  # as the vector signs it
        assert accepted.status_code == 200, accepted.text
        assert accepted.json()["access_key"] == ACCESS_KEY
        assert accepted.json()["email"] == "vector@example.com"
        assert uuid.UUID(accepted.json()["user_id"])

        one_digit_off = GOLDEN[:-1] + ("7" if GOLDEN[-1] != "7" else "8")
        refused = await raw.get("/session", headers=vector_headers(one_digit_off))
        assert refused.status_code == 401, refused.text
        assert refused.headers["content-type"] == "application/problem+json"
        assert refused.json()["reason"] == "signature-mismatch"

        first_digit_off = ("0" if GOLDEN[0] != "0" else "1") + GOLDEN[1:]
        refused = await raw.get("/session", headers=vector_headers(first_digit_off))
        assert (refused.status_code, refused.json()["reason"]) == (401, "signature-mismatch")
