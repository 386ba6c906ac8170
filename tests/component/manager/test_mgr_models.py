"""Models on a real database: exact decimals, UTC timestamps, enums, constraints, pragmas."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError, OperationalError

from accelshare.common import ResourceSlot
from accelshare.manager.bootstrap import bootstrap
from accelshare.manager.config import ManagerConfig
from accelshare.manager.db import Database
from accelshare.manager.models import (
    Agent,
    AgentStatus,
    Group,
    Kernel,
    Keypair,
    Session,
    SessionDependency,
    SessionStatusHistory,
    User,
)
from accelshare.manager.schema import upgrade_schema
from accelshare.manager.sqlite_inline import InlineConnection
from accelshare.sched.lifecycle import SessionStatus, check_transition
from accelshare.sched.model import SessionType

T0 = datetime(2024, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
REQUEST = ResourceSlot({"cpu": Decimal("1.5"), "mem": 2 << 30, "cuda.shares": Decimal("0.2")})


@pytest.fixture
async def db(database: Database, manager_config: ManagerConfig) -> Database:
    await upgrade_schema(database)
    await bootstrap(database, manager_config)
    return database


async def add_agent(db: Database, agent_id: str = "i-node01") -> None:
    async with db.begin(write=True) as session:
        session.add(
            Agent(
                id=agent_id,
                status=AgentStatus.ALIVE,
                scaling_group="default",
                address="tcp://127.0.0.1:6001",
                available_slots=ResourceSlot({"cpu": 8, "mem": 16 << 30, "cuda.shares": 2}),
                occupied_slots=ResourceSlot(),
                quanta={"cuda.shares": "0.1"},
                map_views={"cuda.shares": {"gpu0": {"capacity": "1", "allocated": "0"}}},
                first_contact_at=T0,
                last_heartbeat_at=T0,
            )
        )


async def add_session(db: Database, **overrides: object) -> uuid.UUID:
    async with db.begin(write=True) as session:
        user = (await session.execute(sa.select(User))).scalar_one()
        keypair = (await session.execute(sa.select(Keypair))).scalar_one()
        group = (await session.execute(sa.select(Group))).scalar_one()
        fields: dict[str, object] = {
            "name": "s1",
            "access_key": keypair.access_key,
            "user_id": user.id,
            "group_id": group.id,
            "domain_name": "default",
            "image": "python:3.11",
            "scaling_group": "default",
            "requested_slots": REQUEST,
            "created_at": T0,
        }
        row = Session(**{**fields, **overrides})
        session.add(row)
        await session.flush()
        session.add(
            SessionStatusHistory(
                session_id=row.id, to_status=SessionStatus.PENDING, reason="enqueued", changed_at=T0
            )
        )
        return row.id


async def test_resource_slots_are_stored_as_decimal_strings(db: Database) -> None:
    session_id = await add_session(db)
    async with db.connect() as conn:
        raw = (await conn.execute(sa.text("SELECT requested_slots FROM sessions"))).scalar_one()
    stored = raw if isinstance(raw, dict) else json.loads(raw)
    assert stored == {"cpu": "1.5", "mem": "2147483648", "cuda.shares": "0.2"}
    assert all(isinstance(v, str) for v in stored.values())
    async with db.begin() as session:
        row = await session.get(Session, session_id)
    assert row is not None
    assert row.requested_slots == REQUEST
    assert row.requested_slots["cuda.shares"] == Decimal("0.2")
    assert row.occupied_slots == ResourceSlot()


async def test_timestamps_come_back_aware_utc_with_microseconds(db: Database) -> None:
    starts = datetime(2024, 1, 2, 12, 0, tzinfo=timezone(timedelta(hours=9)))
    session_id = await add_session(db, starts_at=starts, session_type=SessionType.BATCH)
    async with db.begin() as session:
        row = await session.get(Session, session_id)
    assert row is not None
    assert row.created_at == T0
    assert row.created_at.tzinfo is UTC
    assert row.starts_at == starts
    assert row.session_type is SessionType.BATCH
    assert row.status is SessionStatus.PENDING
    assert row.priority == 10


async def test_enums_are_stored_as_values(db: Database) -> None:
    await add_session(db)
    async with db.connect() as conn:
        status, kind = (
            await conn.execute(sa.text("SELECT status, session_type FROM sessions"))
        ).one()
        role = (await conn.execute(sa.text("SELECT role FROM users"))).scalar_one()
    assert (status, kind, role) == ("PENDING", "interactive", "superadmin")


async def test_priority_is_bounded(db: Database) -> None:
    with pytest.raises(IntegrityError):
        await add_session(db, priority=101)


async def test_foreign_keys_are_enforced(db: Database) -> None:
    with pytest.raises(IntegrityError):
        await add_session(db, scaling_group="no-such-group")


async def test_lifecycle_with_history_kernels_and_dependencies(db: Database) -> None:
    await add_agent(db)
    first = await add_session(db)
    second = await add_session(db)
    async with db.begin(write=True) as session:
        row = await session.get(Session, first)
        assert row is not None
        new = check_transition(row.status, SessionStatus.SCHEDULED)
        session.add(
            SessionStatusHistory(
                session_id=row.id, from_status=row.status, to_status=new, changed_at=T0
            )
        )
        row.status, row.agent_id, row.scheduled_at = new, "i-node01", T0
        row.occupied_slots = REQUEST
        session.add(
            Kernel(
                session_id=row.id,
                agent_id="i-node01",
                image=row.image,
                requested_slots=REQUEST,
                occupied_slots=REQUEST,
                allocation={"cuda.shares": {"gpu0": "0.2"}},
                status=new,
            )
        )
        session.add(SessionDependency(session_id=second, depends_on=first))
    async with db.begin() as session:
        history = (
            await session.execute(
                sa.select(SessionStatusHistory.from_status, SessionStatusHistory.to_status)
                .where(SessionStatusHistory.session_id == first)
                .order_by(SessionStatusHistory.id)
            )
        ).all()
        kernel = (await session.execute(sa.select(Kernel))).scalar_one()
    assert [tuple(h) for h in history] == [
        (None, SessionStatus.PENDING),
        (SessionStatus.PENDING, SessionStatus.SCHEDULED),
    ]
    assert kernel.allocation == {"cuda.shares": {"gpu0": "0.2"}}
    async with db.begin(write=True) as session:
        await session.execute(sa.delete(Session).where(Session.id == second))
        await session.execute(sa.delete(Session).where(Session.id == first))
    async with db.begin() as session:
        leftover = await session.execute(sa.select(sa.func.count()).select_from(Kernel))
        assert leftover.scalar_one() == 0  # ON DELETE CASCADE works (SQLite: foreign_keys=ON)


async def test_agent_reservation_compare_and_set(db: Database) -> None:
    """The pattern the scheduler uses: only one of two writers with the same revision wins."""
    await add_agent(db)

    async def reserve(expected_revision: int, amount: str) -> int:
        async with db.begin(write=True) as session:
            result = await session.execute(
                sa.update(Agent)
                .where(Agent.id == "i-node01", Agent.occupancy_revision == expected_revision)
                .values(
                    occupied_slots=ResourceSlot({"cuda.shares": amount}),
                    occupancy_revision=Agent.occupancy_revision + 1,
                )
                .execution_options(synchronize_session=False)
            )
            return int(result.rowcount)  # type: ignore[attr-defined]

    assert await reserve(0, "0.2") == 1
    assert await reserve(0, "1.2") == 0  # stale revision: refused
    async with db.begin() as session:
        agent = await session.get(Agent, "i-node01")
    assert agent is not None
    assert agent.occupancy_revision == 1
    assert agent.remaining_slots["cuda.shares"] == Decimal("1.8")


async def test_sqlite_pragmas(db: Database) -> None:
    if db.dialect != "sqlite":
        pytest.skip("SQLite only")
    async with db.connect() as conn:
        mode = (await conn.execute(sa.text("PRAGMA journal_mode"))).scalar_one()
        fks = (await conn.execute(sa.text("PRAGMA foreign_keys"))).scalar_one()
        timeout = (await conn.execute(sa.text("PRAGMA busy_timeout"))).scalar_one()
        driver = (await conn.get_raw_connection()).driver_connection
    # the connection's own timeout is 0: a busy statement is retried in its worker thread
    # with [db] busy-timeout (10 s), never waited for on the loop (test_mgr_sqlite_inline)
    assert (mode, fks, timeout) == ("wal", 1, 0)
    assert isinstance(driver, InlineConnection)
    assert driver.busy_timeout_ms == 10000


async def test_write_transactions_serialise_on_sqlite(db: Database) -> None:
    """Read-modify-write transactions on SQLite wait for each other (BEGIN IMMEDIATE)
    instead of failing with 'database is locked' or losing an update."""
    if db.dialect != "sqlite":
        pytest.skip("SQLite only (PostgreSQL uses row locks / compare-and-set)")
    await add_agent(db)

    async def bump() -> None:
        async with db.begin(write=True) as session:
            agent = await session.get(Agent, "i-node01")
            assert agent is not None
            await asyncio.sleep(0)  # let the other writer try meanwhile
            agent.occupancy_revision += 1

    await asyncio.gather(*(bump() for _ in range(5)))
    async with db.begin() as session:
        agent = await session.get(Agent, "i-node01")
    assert agent is not None
    assert agent.occupancy_revision == 5


async def nested_write(db: Database) -> None:
    async with db.connect(write=True) as inner:  # a bug: a writer inside a writer
        await inner.execute(sa.text("INSERT INTO t VALUES (10)"))


async def test_sqlite_writers_queue_in_order_and_a_stuck_one_times_out(tmp_path: Path) -> None:
    """The in-process writer lock hands the write lock over in arrival order; a writer
    that cannot get it within the busy timeout goes on and meets SQLite's own busy
    handling (an error here), never a deadlock."""
    db = Database.from_url(f"sqlite+aiosqlite:///{tmp_path / 'w.db'}", busy_timeout_s=0.3)
    try:
        async with db.connect(write=True) as conn:
            await conn.execute(sa.text("CREATE TABLE t (n INTEGER)"))
        order: list[int] = []

        async def write(n: int) -> None:
            async with db.connect(write=True) as conn:
                await conn.execute(sa.text("INSERT INTO t VALUES (:n)"), {"n": n})
                await asyncio.sleep(0.01)
                order.append(n)

        await asyncio.gather(*(write(n) for n in range(5)))
        assert order == [0, 1, 2, 3, 4]
        async with db.connect(write=True) as outer:
            await outer.execute(sa.text("INSERT INTO t VALUES (9)"))
            with pytest.raises(OperationalError, match="locked"):
                await nested_write(db)
    finally:
        await db.dispose()
