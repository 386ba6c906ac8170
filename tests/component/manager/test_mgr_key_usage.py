"""``keypairs.last_used_at``: written off the request path, at most once per key per
interval, shown as GraphQL ``last_used``; a failing write never fails a request."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa

from accelshare.manager.key_usage import KeyUsageRecorder
from accelshare.manager.models import Keypair

from .cluster import Cluster
from .test_mgr_admin_gql import make_user, ok

LAST_USED = "query ($a: String) { keypair(access_key: $a) { access_key last_used } }"


async def last_used(cluster: Cluster, access_key: str) -> datetime | None:
    async with cluster.manager.db.connect() as conn:
        value: datetime | None = (
            await conn.execute(
                sa.select(Keypair.last_used_at).where(Keypair.access_key == access_key)
            )
        ).scalar_one()
    return value


async def test_a_signed_request_records_last_used(cluster: Cluster) -> None:
    alice, key = await make_user(cluster, "alice@example.com")
    await cluster.manager.key_usage.idle()
    assert await last_used(cluster, key) is None  # made, never used
    before = datetime.now(UTC)
    async with alice:
        response = await alice.get("/whoami")
        assert response.status_code == 200
    await cluster.manager.key_usage.idle()
    used = await last_used(cluster, key)
    assert used is not None
    assert before - timedelta(seconds=1) <= used <= datetime.now(UTC) + timedelta(seconds=1)

    data = await ok(cluster.admin, LAST_USED, a=key)
    assert data["keypair"]["access_key"] == key
    shown = datetime.fromisoformat(data["keypair"]["last_used"])
    assert abs((shown - used).total_seconds()) < 1


async def test_one_write_per_key_per_interval(cluster: Cluster) -> None:
    now = [1000.0]
    times = iter(datetime(2026, 1, 1, 12, m, tzinfo=UTC) for m in range(10))
    recorder = KeyUsageRecorder(
        cluster.manager.db, interval_s=60.0, clock=lambda: next(times), monotonic=lambda: now[0]
    )
    _, key = await make_user(cluster, "bob@example.com")
    _, other = await make_user(cluster, "carol@example.com")

    recorder.note(key)  # clock: 12:00
    for _ in range(100):
        recorder.note(key)
        now[0] += 0.5  # 50 s in all: still inside the interval
    recorder.note(other)  # another key is not throttled by the first: 12:01
    await recorder.idle()
    assert recorder.writes == 2
    assert await last_used(cluster, key) == datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
    assert await last_used(cluster, other) == datetime(2026, 1, 1, 12, 1, tzinfo=UTC)

    now[0] += 10.1  # 60.1 s after the first note
    recorder.note(key)  # 12:02
    await recorder.idle()
    assert recorder.writes == 3
    assert await last_used(cluster, key) == datetime(2026, 1, 1, 12, 2, tzinfo=UTC)


class _BrokenDatabase:
    def connect(self, **_: Any) -> Any:
        raise ConnectionError("the database is gone")


async def test_a_failing_write_never_fails_the_request(cluster: Cluster) -> None:
    broken = KeyUsageRecorder(_BrokenDatabase(), interval_s=60.0)  # type: ignore[arg-type]
    cluster.app.state.authenticator.on_used = broken.note
    alice, key = await make_user(cluster, "dave@example.com")  # the admin's key: one failure
    await broken.idle()
    assert broken.failures == 1
    async with alice:
        assert (await alice.get("/whoami")).status_code == 200
        await broken.idle()
        assert broken.failures == 2
        # the failed key is forgotten by the throttle: the next request tries again
        assert (await alice.get("/whoami")).status_code == 200
        await broken.idle()
        assert broken.failures == 3

        def explode(_key: str) -> None:
            raise RuntimeError("a bug in the recorder")

        cluster.app.state.authenticator.on_used = explode
        response = await alice.get("/whoami")
        assert response.status_code == 200
        assert response.json()["access_key"] == key
