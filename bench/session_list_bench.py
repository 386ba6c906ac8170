"""Session list benchmark: server time of a filtered, ordered page of
``compute_session_list`` (``backend.ai ps --filter ... --order ...``) over N sessions.

It fills a fresh database with ``--rows`` sessions (default 10,000: names ``s-00000``...,
a spread of statuses, owners and creation times), then times the manager's own
``SessionService.list_sessions`` — the call behind the GraphQL field — for each case in
:data:`CASES` (filter, order), a 20-row page each, as a superadmin (no visibility
predicate) and as a domain admin.  Figures are the median and the 95th percentile in ms
over ``--repeat`` runs, after a warm-up.  The issue's target is a page in < 100 ms.

Run: ``.venv/bin/python bench/session_list_bench.py [--rows 10000] [--repeat 30]
[--pg postgresql://postgres@127.0.0.1:5432/postgres]`` — with ``--pg``, a temporary
database on that server is benchmarked too (and dropped).  Prints figures; asserts
nothing.  ``bench/admin_list_bench.py`` times ``user_list`` / ``keypair_list``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from accelshare.common import ResourceSlot
from accelshare.manager.bootstrap import bootstrap
from accelshare.manager.clock import utcnow
from accelshare.manager.config import ManagerConfig
from accelshare.manager.db import Database
from accelshare.manager.enums import UserRole
from accelshare.manager.hub import ChangeHub
from accelshare.manager.models import Group, Keypair, Session, User
from accelshare.manager.schema import upgrade_schema
from accelshare.manager.services.sessions import SessionService
from accelshare.sched.lifecycle import SessionStatus

CASES: list[tuple[str, str | None, str | None]] = [
    ("no filter, default order", None, None),
    ("status == RUNNING, -created_at", 'status == "RUNNING"', "-created_at"),
    ("name ilike %123%", 'name ilike "%123%"', None),
    ("status & name like, +name", 'status in ["PENDING", "RUNNING"] & name like "s-01%"', "+name"),
    ("user_email (subquery), -name", 'user_email == "{email}"', "-name"),  # the sessions' owner
    ("created_at range", 'created_at >= "2025-01-03" & created_at < "2025-01-05"', "-created_at"),
]
STATUSES = [
    SessionStatus.RUNNING,
    SessionStatus.PENDING,
    SessionStatus.TERMINATED,
    SessionStatus.RUNNING,
    SessionStatus.CANCELLED,
]
T0 = datetime(2025, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Caller:
    user_id: uuid.UUID
    email: str
    role: UserRole
    domain_name: str
    access_key: str


async def fill(db: Database, rows: int) -> Caller:
    async with db.begin(write=True) as session:
        user = (await session.execute(sa.select(User))).scalars().first()
        keypair = (await session.execute(sa.select(Keypair))).scalars().first()
        group = (await session.execute(sa.select(Group))).scalars().first()
        assert user is not None
        assert keypair is not None
        assert group is not None
        base = {
            "access_key": keypair.access_key,
            "user_id": user.id,
            "group_id": group.id,
            "domain_name": user.domain_name,
            "image": "python:3.11",
            "scaling_group": "default",
            "requested_slots": ResourceSlot({"cpu": 1, "mem": 1 << 30}),
        }
        for start in range(0, rows, 1000):
            await session.execute(
                sa.insert(Session),
                [
                    {
                        **base,
                        "id": uuid.uuid4(),
                        "name": f"s-{i:05d}",
                        "status": STATUSES[i % len(STATUSES)],
                        "created_at": T0 + timedelta(minutes=i),
                        "status_changed_at": T0 + timedelta(minutes=i),
                    }
                    for i in range(start, min(rows, start + 1000))
                ],
            )
        return Caller(user.id, user.email, user.role, user.domain_name, keypair.access_key)


def service(db: Database) -> SessionService:
    async def no_pass(_after: int, _timeout: float, _sid: str) -> bool:
        return True

    return SessionService(
        db=db,
        client=None,  # type: ignore[arg-type]  # listing never calls an agent
        hub=ChangeHub(),
        clock=utcnow,
        trigger=lambda: None,
        passes=lambda: 0,
        wait_for_pass=no_pass,
        known_slots=None,  # type: ignore[arg-type]  # only creates read it
    )


async def time_ms(fn: Any, repeat: int) -> tuple[float, float]:
    for _ in range(3):
        await fn()
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        await fn()
        samples.append((time.perf_counter() - start) * 1000)
    samples.sort()
    return statistics.median(samples), samples[max(0, int(len(samples) * 0.95) - 1)]


async def run(url: str, label: str, rows: int, repeat: int, data_dir: Path) -> None:
    db = Database.from_url(url)
    try:
        await upgrade_schema(db)
        config = ManagerConfig.model_validate(
            {"manager": {"data-dir": str(data_dir)}, "db": {"url": url}}
        )
        await bootstrap(db, config)
        started = time.perf_counter()
        superadmin = await fill(db, rows)
        print(f"{label}: filled {rows} sessions in {time.perf_counter() - started:.1f} s")
        admin = Caller(uuid.uuid4(), "a@example.com", UserRole.ADMIN, superadmin.domain_name, "")
        sessions = service(db)
        every = list(SessionStatus)
        for who, caller in (("superadmin", superadmin), ("domain admin", admin)):
            for name, template, order in CASES:
                filter_ = template.format(email=superadmin.email) if template else None

                async def page(
                    caller: Caller = caller, f: str | None = filter_, o: str | None = order
                ) -> Any:
                    return await sessions.list_sessions(
                        caller, statuses=every, limit=20, offset=0, filter=f, order=o
                    )

                answer = await page()
                median, p95 = await time_ms(page, repeat)
                print(
                    f"  {who:12} {name:34} total={answer['total']:6}"
                    f"  median {median:7.2f} ms  p95 {p95:7.2f} ms"
                )
    finally:
        await db.dispose()


async def main(rows: int, repeat: int, pg: str | None) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        await run(
            f"sqlite+aiosqlite:///{Path(tmp) / 'bench.db'}", "SQLite", rows, repeat, Path(tmp) / "a"
        )
        if pg:
            import asyncpg  # type: ignore[import-untyped]
            from sqlalchemy.engine import make_url

            name = f"accelshare_bench_{uuid.uuid4().hex[:8]}"
            admin = await asyncpg.connect(pg)
            try:
                await admin.execute(f'CREATE DATABASE "{name}"')
                url = make_url(pg).set(drivername="postgresql+asyncpg", database=name)
                await run(
                    url.render_as_string(hide_password=False),
                    "PostgreSQL",
                    rows,
                    repeat,
                    Path(tmp) / "b",
                )
            finally:
                await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                await admin.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--pg", default=None, help="a PostgreSQL admin URL (trust auth)")
    args = parser.parse_args()
    asyncio.run(main(args.rows, args.repeat, args.pg))
