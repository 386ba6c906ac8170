"""Statement overhead benchmark: what SQLAlchemy costs per statement on the manager's
SQLite connection, built per call or prebuilt, through an ORM session or a Core connection.

The manager's hot paths (docs/architecture.md, "Hot paths run prebuilt statements") run
module-level statements with bind parameters; this prints why: the µs per execution of a
one-column primary-key ``SELECT`` on an empty sessions table (so the figures are the
library's overhead, not SQLite's work), and of a whole one-statement transaction.

Run: ``.venv/bin/python bench/stmt_bench.py [--calls 2000]``.  Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from accelshare.manager.db import Database
from accelshare.manager.models import Session
from accelshare.manager.schema import upgrade_schema

PREBUILT = sa.select(Session.status).where(Session.id == sa.bindparam("sid"))


async def per_call_us(fn: Callable[[], Awaitable[Any]], calls: int) -> float:
    for _ in range(min(200, calls)):  # warm: compiled-statement cache, first pages
        await fn()
    start = time.perf_counter()
    for _ in range(calls):
        await fn()
    return (time.perf_counter() - start) / calls * 1e6


async def main(calls: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        db = Database.from_url(f"sqlite+aiosqlite:///{Path(tmp) / 'bench.db'}")
        await upgrade_schema(db)
        sid = uuid.uuid4()
        rows: list[tuple[str, float]] = []
        async with db.begin() as session, db.connect() as conn:
            for where, run in (("ORM session", session.execute), ("Core connection", conn.execute)):
                built = await per_call_us(
                    lambda run=run: run(sa.select(Session.status).where(Session.id == sid)),
                    calls,
                )
                prebuilt = await per_call_us(
                    lambda run=run: run(PREBUILT, {"sid": sid}),
                    calls,
                )
                rows.append((f"SELECT built per call, {where}", built))
                rows.append((f"SELECT prebuilt, {where}", prebuilt))

        async def orm_transaction() -> None:
            async with db.begin() as session:
                await session.execute(PREBUILT, {"sid": sid})

        async def core_transaction() -> None:
            async with db.connect() as conn:
                await conn.execute(PREBUILT, {"sid": sid})

        rows.append(
            (
                "transaction of one prebuilt SELECT, db.begin()",
                await per_call_us(orm_transaction, calls),
            )
        )
        rows.append(
            (
                "transaction of one prebuilt SELECT, db.connect()",
                await per_call_us(core_transaction, calls),
            )
        )
        await db.dispose()
    width = max(len(name) for name, _ in rows)
    print(f"SQLAlchemy {sa.__version__}, SQLite, {calls} calls each")
    for name, us in rows:
        print(f"{name:<{width}}  {us:6.0f} us")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    asyncio.run(main(parser.parse_args().calls))
