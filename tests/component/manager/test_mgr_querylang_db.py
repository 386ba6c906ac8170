"""The filter / order language on the real tables, SQLite and PostgreSQL: whatever the
expression, the database never raises — a bad one is a QueryError before any SQL runs
(NUL characters, int32 overflow, a LIKE pattern ending in a backslash, dates past the
calendar's ends were database errors, so 5xx, before)."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accelshare.manager.bootstrap import bootstrap
from accelshare.manager.config import ManagerConfig
from accelshare.manager.db import Database
from accelshare.manager.list_specs import AGENTS, SESSIONS
from accelshare.manager.models import Agent, Session
from accelshare.manager.querylang import ListSpec, Op, QueryError
from accelshare.manager.querylang.compile_sql import apply_filter_and_order
from accelshare.manager.schema import upgrade_schema

from .test_mgr_models import add_agent, add_session


@pytest.fixture
async def db(database: Database, manager_config: ManagerConfig) -> Database:
    """Bootstrapped, with a session and an agent (so expressions are evaluated on rows)."""
    await upgrade_schema(database)
    await bootstrap(database, manager_config)
    await add_agent(database)
    await add_session(database, name="s\\1%_x", status_info="why", agent_id="i-node01")
    await add_session(database, name="s2")
    return database


async def run(db: Database, model: Any, spec: ListSpec, filter: str, order: str | None) -> None:
    """Compile and execute, or a QueryError; nothing else."""
    try:
        stmt = apply_filter_and_order(sa.select(model).limit(5), filter, order, spec)
    except QueryError:
        return
    async with db.begin() as session:
        list((await session.execute(stmt)).scalars())


NASTY = [
    'name == "a\x00b"',
    'name == "\ud800"',
    "priority > 3000000000",
    "priority == -2147483649",
    "cluster_size in [1, 99999999999999999999]",
    'name like "abc\\"',
    'name like "abc\\\\"',
    'name ilike "%\\"',
    'created_at < "0001-01-01T00:00:00+01:00"',
    'created_at > "9999-12-31T23:59:59-01:00"',
    'created_at > "9999-12-31"',
    'id == "00000000-0000-0000-0000-000000000000"',
    'cluster_mode == "multi-node"',
    'status in ["RESTARTING"] | type == "INFERENCE"',
    "priority == 1e999",
    'user_email ilike "%" & group_name != "x" & full_name contains "_"',
    "agent is null & terminated_at isnot null",
]


@pytest.mark.parametrize("filter", NASTY)
async def test_nasty_session_filters_never_reach_the_database_as_errors(
    db: Database, filter: str
) -> None:
    await run(db, Session, SESSIONS, filter, "-cluster_mode, +user_email, -terminated_at")


def rendered(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(rendered(v) for v in value) + "]"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return str(value)


scalars = st.one_of(
    st.text(max_size=6),
    st.integers(-(2**40), 2**40),
    st.decimals(allow_nan=False, allow_infinity=False, places=3),
    st.booleans(),
    st.none(),
    st.sampled_from(["RUNNING", "alive", "2025-01-31", "00000000-0000-0000-0000-000000000001"]),
)


def comparisons(spec: ListSpec) -> st.SearchStrategy[str]:
    return st.builds(
        lambda f, op, v: f"{f} {op.value} {rendered(v)}",
        st.sampled_from(sorted(spec.fields)),
        st.sampled_from(list(Op)),
        st.one_of(scalars, st.lists(scalars, max_size=3)),
    )


def filters(spec: ListSpec) -> st.SearchStrategy[str]:
    return st.recursive(
        comparisons(spec),
        lambda inner: st.one_of(
            st.builds(lambda e: f"!({e})", inner),
            st.builds(lambda a, o, b: f"({a}) {o} ({b})", inner, st.sampled_from("&|"), inner),
        ),
        max_leaves=4,
    )


def orders(spec: ListSpec) -> st.SearchStrategy[str]:
    return st.lists(
        st.builds(
            lambda s, f: s + f,
            st.sampled_from(["", "+", "-"]),
            st.sampled_from(sorted(spec.fields)),
        ),
        max_size=3,
    ).map(", ".join)


FUZZ = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@FUZZ
@given(filter=st.one_of(filters(SESSIONS), st.text(max_size=30)), order=orders(SESSIONS))
async def test_random_session_filters_run_or_are_refused(
    db: Database, filter: str, order: str
) -> None:
    await run(db, Session, SESSIONS, filter, order)


@FUZZ
@given(filter=filters(AGENTS), order=orders(AGENTS))
async def test_random_agent_filters_run_or_are_refused(
    db: Database, filter: str, order: str
) -> None:
    await run(db, Agent, AGENTS, filter, order)
