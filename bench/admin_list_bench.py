"""Admin list benchmark: the server time of one page of ``user_list`` / ``keypair_list``
(Backend.AI's admin GraphQL, ``AdminViews.users`` / ``AdminViews.keypairs``) over
10,000 users with a keypair each, in two domains, on SQLite (and PostgreSQL with
``--pg URL``, a database of its own that is emptied first).

Each figure is the median of ``--repeat`` calls of one page (``--limit`` rows) at the
first, a middle and the last offset, as a superadmin (every row) and a domain admin
(half of them): the count query, the page and the page's groups and live-session
counts.  The target (issue 30) is < 100 ms a page.

Run: ``.venv/bin/python bench/admin_list_bench.py [--rows 10000] [--limit 20]
[--pg postgresql+asyncpg://...]``.  Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import sqlalchemy as sa

from accelshare.common import ResourceSlot
from accelshare.manager.db import Database
from accelshare.manager.enums import UserRole, UserStatus
from accelshare.manager.models import (
    Domain,
    Group,
    GroupMember,
    Keypair,
    KeypairResourcePolicy,
    User,
)
from accelshare.manager.schema import upgrade_schema
from accelshare.manager.services.admin_views import AdminViews
from accelshare.manager.slots import KnownSlots

DOMAINS = ("bench-a", "bench-b")


@dataclass(frozen=True)
class Caller:
    user_id: uuid.UUID
    domain_name: str
    role: UserRole

    @property
    def is_superadmin(self) -> bool:
        return self.role is UserRole.SUPERADMIN


async def seed(db: Database, rows: int) -> None:
    now = datetime.now(UTC)
    async with db.begin(write=True) as session:
        if await session.get(KeypairResourcePolicy, "bench") is None:
            session.add(KeypairResourcePolicy(name="bench", total_resource_slots=ResourceSlot()))
        groups = {}
        for name in DOMAINS:
            session.add(Domain(name=name, total_resource_slots=ResourceSlot()))
            groups[name] = uuid.uuid4()
            session.add(
                Group(
                    id=groups[name],
                    name="team",
                    domain_name=name,
                    total_resource_slots=ResourceSlot(),
                )
            )
        await session.flush()
        users, keypairs, members = [], [], []
        for i in range(rows):
            uid = uuid.uuid4()
            domain = DOMAINS[i % 2]
            users.append(
                {
                    "id": uid,
                    "email": f"user{i:05d}@bench.example",
                    "username": None,
                    "full_name": f"User {i}",
                    "password_hash": "x",
                    "role": UserRole.USER,
                    "status": UserStatus.ACTIVE,
                    "domain_name": domain,
                    "total_resource_slots": ResourceSlot(),
                    "created_at": now + timedelta(milliseconds=i),
                    "modified_at": now,
                    "login_generation": 0,
                }
            )
            keypairs.append(
                {
                    "access_key": f"AKIB{i:016d}",
                    "secret_key": "s" * 40,
                    "user_id": uid,
                    "resource_policy": "bench",
                    "is_active": True,
                    "is_admin": False,
                    "created_at": now + timedelta(milliseconds=i),
                }
            )
            members.append({"group_id": groups[domain], "user_id": uid})
        for table, values in ((User, users), (Keypair, keypairs), (GroupMember, members)):
            for start in range(0, len(values), 2000):
                await session.execute(sa.insert(table), values[start : start + 2000])


async def median_ms(fn: Callable[[], Awaitable[Any]], repeat: int) -> float:
    await fn()  # warm
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        await fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


async def run(url: str, label: str, rows: int, limit: int, repeat: int) -> None:
    db = Database.from_url(url)
    try:
        await upgrade_schema(db)
        await seed(db, rows)
        views = AdminViews(db=db, known_slots=cast(KnownSlots, None))  # lists use no slots
        callers = {
            "superadmin": Caller(uuid.uuid4(), DOMAINS[0], UserRole.SUPERADMIN),
            "domain admin": Caller(uuid.uuid4(), DOMAINS[0], UserRole.ADMIN),
        }
        print(f"\n{label}: {rows} users and keypairs, pages of {limit}, median of {repeat}")
        print(f"{'list':<14}{'caller':<14}{'offset':>8}{'ms':>10}{'total':>8}")
        for caller_name, caller in callers.items():
            visible = (await views.users(caller, limit=1)).total
            for offset in (0, visible // 2, max(0, visible - limit)):
                for name, call in (
                    ("user_list", views.users),
                    ("keypair_list", views.keypairs),
                ):

                    async def page(
                        call: Any = call, caller: Any = caller, offset: int = offset
                    ) -> Any:
                        return await call(caller, limit=limit, offset=offset)

                    ms = await median_ms(page, repeat)
                    total = (await page()).total
                    print(f"{name:<14}{caller_name:<14}{offset:>8}{ms:>10.1f}{total:>8}")
    finally:
        await db.dispose()


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        sqlite = f"sqlite+aiosqlite:///{Path(tmp) / 'bench.db'}"
        await run(sqlite, "SQLite", args.rows, args.limit, args.repeat)
    if args.pg:
        await run(args.pg, "PostgreSQL", args.rows, args.limit, args.repeat)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--limit", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument(
        "--pg", help="a PostgreSQL URL (postgresql+asyncpg://...) of an empty database"
    )
    asyncio.run(main(parser.parse_args()))
