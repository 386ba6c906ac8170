"""The manager's endpoints for agents, fuzzed: ``/internal/agents/heartbeat`` and
``/internal/agents/events`` (docs/reliability.md).

An agent is trusted with the cluster secret, not with its input: a buggy or hostile
agent must get a clear 400 naming the field, never a 5xx, and a refused call must leave
nothing behind.  Hypothesis mutates a real heartbeat (from a hollow agent holding a
running kernel) and a real event batch one place at a time (replace, delete, add a key)
with wrong types, empty/blank/long/NUL strings, NaN, infinities, negative and huge
amounts, unknown slot names, big lists; then checks:

* never a 5xx (in-process, so a server error raises here with its traceback);
* a refusal is ``application/problem+json`` whose ``field`` is the mutated path, an
  enclosing one or one inside it (NUL: the detail names the path);
* after a refusal the registry is unchanged: agent rows, known slot types, applied
  event ids, sessions and kernels, byte for byte.

Regressions (both databases, PostgreSQL marked ``integration``): the nameless agent,
over-long ids and NUL (500s on PostgreSQL), non-numeric and huge capacities (500s on
both), out-of-range exit codes.  Short run: 60 examples per endpoint; full run: 600.
"""

from __future__ import annotations

import asyncio
import copy
import json
import math
import re
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accelshare.protocol import CLUSTER_SECRET_HEADER
from accelshare_testkit.hollow_agent import HollowAgent
from component.manager.cluster import SECRET, Cluster, running_cluster
from component.manager.conftest import temporary_pg_database

from .conftest import scaled

PROBLEM = "application/problem+json"
HEADERS = {CLUSTER_SECRET_HEADER: SECRET}
Path_ = tuple[str | int, ...]


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.integration)])
async def cluster(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Cluster]:
    if request.param == "sqlite":
        url = f"sqlite+aiosqlite:///{tmp_path / 'manager.db'}"
        async with running_cluster(url, tmp_path / "state", background=False) as running:
            yield running
        return
    async with (
        temporary_pg_database() as url,
        running_cluster(url, tmp_path / "state", background=False) as running,
    ):
        yield running


@pytest.fixture
async def sqlite_only(tmp_path: Path) -> AsyncIterator[Cluster]:
    url = f"sqlite+aiosqlite:///{tmp_path / 'manager.db'}"
    async with running_cluster(url, tmp_path / "state", background=False) as running:
        yield running


# -- what a refused call must leave untouched ------------------------------------------------


async def registry_state(cluster: Cluster) -> dict[str, Any]:
    """Every table an agent's call can write, and the known slot types."""
    state: dict[str, Any] = {}
    async with cluster.manager.db.begin() as db:
        for table, order in (
            ("agents", "id"),
            ("kernel_events", "event_id"),
            ("sessions", "id"),
            ("kernels", "id"),
        ):
            rows = (await db.execute(sa.text(f"SELECT * FROM {table} ORDER BY {order}"))).all()
            state[table] = [tuple(str(v) for v in row) for row in rows]
    state["slots"] = dict(await cluster.manager.known_slots.load())
    return state


def _diff(before: dict[str, Any], after: dict[str, Any]) -> list[Any]:
    return [
        (table, sorted(set(before[table]) ^ set(after[table])))
        for table in before
        if before[table] != after[table]
    ]


# -- mutations -----------------------------------------------------------------------------

WEIRD_STRINGS = ["", " ", "\x00", "a\x00b", "x" * 300, "NaN", "-1", "1e400", "Infinity",
                 "../../etc", "weird slot!", "\u202e", "0x10", "1_000"]  # fmt: skip
WEIRD_VALUES: st.SearchStrategy[Any] = st.one_of(
    st.none(),
    st.booleans(),
    st.sampled_from([0, -1, 2**31, -(2**31) - 1, 2**63, 2**70, 10**30]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([math.nan, math.inf, -math.inf]),
    st.sampled_from(WEIRD_STRINGS),
    st.text(max_size=80),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.sampled_from(["", "cpu", "x y", "\x00", "mem"]), st.integers(), max_size=2),
    # big lists (bounded by the 1 MiB body limit anyway)
    st.builds(lambda n: ["x"] * n, st.integers(1000, 20_000)),
)


def paths_of(body: Any, prefix: Path_ = ()) -> list[Path_]:
    """Every place in the body, parents before children."""
    found: list[Path_] = [prefix] if prefix else []
    if isinstance(body, dict):
        for key, value in body.items():
            found += paths_of(value, (*prefix, key))
    elif isinstance(body, list):
        for index, value in enumerate(body):
            found += paths_of(value, (*prefix, index))
    return found


def apply(body: Any, path: Path_, action: str, value: Any) -> Any:
    """A copy of ``body`` with ``value`` put at ``path`` (``delete``: removed; ``add``:
    a new key next to it, under the same parent, when the parent is an object)."""
    mutated = copy.deepcopy(body)
    parent: Any = mutated
    for part in path[:-1]:
        parent = parent[part]
    last = path[-1]
    if action == "delete" and isinstance(parent, dict):
        del parent[last]
    elif action == "add" and isinstance(parent, dict):
        parent[value if isinstance(value, str) else json.dumps(value)] = parent[last]
    else:
        parent[last] = value
    return mutated


def dotted(path: Path_) -> str:
    return ".".join(str(p) for p in path)


def reported_place(problem: dict[str, Any]) -> str:
    """Where the refusal says the problem is: ``field``, or for what is checked over the
    whole body (NUL, NaN) the place its detail names (``slots.cpu: expected ...``)."""
    field = str(problem.get("field", ""))
    assert field, problem
    if field == "body":
        named = re.search(r"field 'body': (.+?): expected", problem["detail"], re.DOTALL)
        if named:
            return named.group(1)
    return field


def related(field: str, path: str) -> bool:
    """The refusal names the mutated place, a place enclosing it, or one inside it."""
    field = field.removesuffix(".[key]")
    return field == path or path.startswith(field + ".") or field.startswith(path + ".")


async def check_call(
    cluster: Cluster, endpoint: str, body: Any, path: Path_, action: str
) -> tuple[int, str]:
    before = await registry_state(cluster)
    content = json.dumps(body, allow_nan=True)
    response = await cluster.internal.post(
        f"/internal/agents/{endpoint}",
        content=content,
        headers={**HEADERS, "Content-Type": "application/json"},
    )
    where = dotted(path)
    assert response.status_code < 500, (where, action, response.text[:500])
    if response.status_code >= 400:
        assert response.status_code in (400, 413), (where, response.text[:300])
        assert response.headers["content-type"] == PROBLEM
        problem = response.json()
        reported = reported_place(problem)
        if action == "add":  # the new key (or its value) sits under the same parent
            parent = dotted(path[:-1])
            assert not parent or related(reported, parent), (where, action, problem["detail"])
        else:
            assert related(reported, where), (where, action, problem["detail"][:300])
        after = await registry_state(cluster)
        assert after == before, (where, action, _diff(before, after))
    return response.status_code, where


def run_fuzz(
    loop: asyncio.AbstractEventLoop,
    check: Callable[[Any], Coroutine[Any, Any, Any]],
    strategy: st.SearchStrategy[Any],
    examples: int,
) -> None:
    """Run Hypothesis in a worker thread, each example on the test's event ``loop``."""

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def fuzz(example: Any) -> None:
        asyncio.run_coroutine_threadsafe(check(example), loop).result(timeout=60)

    return fuzz()  # type: ignore[no-any-return]


async def _running_session(cluster: Cluster, agent_id: str) -> tuple[HollowAgent, str]:
    """A hollow agent holding one running kernel; the agent and the session id."""
    agent = await cluster.add_agent(agent_id)
    response = await cluster.create({"cpu": 1, "mem": "1g"}, enqueueOnly=True)
    assert response.status_code == 201, response.text
    session_id = str(response.json()["sessionId"])
    await cluster.manager.scheduler.run_once()
    await cluster.wait_status(session_id, "RUNNING")
    # the bind's own writes may land after RUNNING: let them finish before snapshots
    await cluster.manager.binder.drain(30)
    await agent.settle()
    return agent, session_id


async def _running_agent(cluster: Cluster) -> dict[str, Any]:
    """The heartbeat (JSON) of a hollow agent holding one running kernel."""
    agent, _ = await _running_session(cluster, "i-fuzz")
    body: dict[str, Any] = json.loads(agent.heartbeat_message().model_dump_json())
    assert body["kernels"], body
    return body


def mutation(body: Any) -> st.SearchStrategy[tuple[Path_, str, Any]]:
    return st.tuples(
        st.sampled_from(paths_of(body)),
        st.sampled_from(["replace", "replace", "delete", "add"]),
        WEIRD_VALUES,
    )


# -- the fuzz tests ------------------------------------------------------------------------


async def test_heartbeat_fuzz_never_5xx_names_the_field_writes_nothing(cluster: Cluster) -> None:
    base = await _running_agent(cluster)
    outcomes: dict[int, int] = {}

    async def check(example: tuple[Path_, str, Any]) -> None:
        path, action, value = example
        body = apply(base, path, action, value)
        status, _ = await check_call(cluster, "heartbeat", body, path, action)
        outcomes[status] = outcomes.get(status, 0) + 1

    await asyncio.to_thread(
        run_fuzz, asyncio.get_running_loop(), check, mutation(base), scaled(60, 600)
    )
    # the generator reached both sides: refusals and acceptable variations
    assert outcomes.get(400, 0) > 0, outcomes
    assert outcomes.get(200, 0) > 0, outcomes
    print(f"heartbeat fuzz: {outcomes}")


async def test_events_fuzz_never_5xx_names_the_field_applies_nothing(cluster: Cluster) -> None:
    """A batch of two events: a good one (a new id each time) and the mutated one.  A
    refused batch must not apply the good one either (its id never recorded)."""
    await _running_agent(cluster)
    good = {
        "event_id": "good",
        "kernel_id": str(uuid.uuid4()),
        "session_id": str(uuid.uuid4()),
        "event": "exited",
        "exit_code": 0,
        "reason": "",
        "at": "2026-11-25T00:00:00Z",
    }
    base = {"agent_id": "i-fuzz", "events": [good, {**good, "event_id": "second"}]}
    outcomes: dict[int, int] = {}

    async def check(example: tuple[Path_, str, Any]) -> None:
        path, action, value = example
        body = apply(base, path, action, value)
        if isinstance(body.get("events"), list) and body["events"]:
            first = body["events"][0]
            if isinstance(first, dict) and first.get("event_id") == "good":
                first["event_id"] = f"good-{uuid.uuid4()}"
        if isinstance(body.get("events"), list) and len(body["events"]) > 1:
            second = body["events"][1]
            if isinstance(second, dict) and second.get("event_id") == "second":
                second["event_id"] = f"second-{uuid.uuid4()}"
        status, _ = await check_call(cluster, "events", body, path, action)
        outcomes[status] = outcomes.get(status, 0) + 1

    await asyncio.to_thread(
        run_fuzz, asyncio.get_running_loop(), check, mutation(base), scaled(60, 600)
    )
    assert outcomes.get(400, 0) > 0, outcomes
    assert outcomes.get(204, 0) > 0, outcomes
    print(f"events fuzz: {outcomes}")


async def test_bad_json_and_wrong_top_level_types_are_400(sqlite_only: Cluster) -> None:
    before = await registry_state(sqlite_only)
    for endpoint in ("heartbeat", "events"):
        for content in (b"{bad", b"", b"[]", b"null", b'"x"', b"1e999", b"\xff\xfe"):
            response = await sqlite_only.internal.post(
                f"/internal/agents/{endpoint}",
                content=content,
                headers={**HEADERS, "Content-Type": "application/json"},
            )
            assert response.status_code == 400, (endpoint, content, response.text)
            assert response.headers["content-type"] == PROBLEM
            assert response.json()["field"], response.json()
    assert await registry_state(sqlite_only) == before


# -- regressions (both databases) -----------------------------------------------------------


def _heartbeat(**changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "agent_id": "i-reg",
        "rpc_url": "http://i-reg.hollow",
        "slots": {
            "cpu": {"type": "count", "capacity": "4"},
            "mem": {"type": "bytes", "capacity": "8589934592"},
        },
        "alloc_maps": {},
    }
    body.update(changes)
    return {k: v for k, v in body.items() if v is not ...}


# (a change to a good heartbeat, the field the 400 must name)
BAD_HEARTBEATS: list[tuple[dict[str, Any], str]] = [
    # the nameless agent: accepted (200) before, an agent row with an empty id that
    # the scheduler then placed sessions on ("scheduled on agent ")
    ({"agent_id": ""}, "agent_id"),
    ({"agent_id": "   "}, "agent_id"),
    ({"agent_id": ...}, "agent_id"),
    ({"agent_id": None}, "agent_id"),
    # PostgreSQL: 500 (the column holds 64 characters; NUL cannot be stored)
    ({"agent_id": "x" * 65}, "agent_id"),
    ({"agent_id": "a\x00b"}, "agent_id"),
    ({"region": "r" * 65}, "region"),
    ({"version": "v\x00"}, "version"),
    # PostgreSQL: 500 (jsonb has no NaN nor Infinity)
    ({"slot_metadata": {"cpu": {"x": math.nan}}}, "slot_metadata.cpu.x"),
    ({"slot_metadata": {"cpu": {"x": -math.inf}}}, "slot_metadata.cpu.x"),
    ({"rpc_url": ""}, "rpc_url"),
    ({"rpc_url": "ftp://x"}, "rpc_url"),
    # both databases: 500 (Decimal raised InvalidOperation, or failed when written)
    ({"slots": {"cpu": {"type": "count", "capacity": "abc"}}}, "slots.cpu.capacity"),
    ({"slots": {"cpu": {"type": "count", "capacity": "1e400"}}}, "slots.cpu.capacity"),
    # accepted before: capacities no amount can be
    ({"slots": {"cpu": {"type": "count", "capacity": "-4"}}}, "slots.cpu.capacity"),
    ({"slots": {"cpu": {"type": "count", "capacity": "Infinity"}}}, "slots.cpu.capacity"),
    ({"slots": {"cpu": {"type": "count", "capacity": "NaN"}}}, "slots.cpu.capacity"),
    # accepted before and added to the cluster's known slot types for good
    ({"slots": {"weird slot!": {"type": "count", "capacity": "1"}}}, "slots.weird slot!"),
]
# (a change to the second, otherwise good event of a batch, the field the 400 must name)
BAD_EVENTS: list[tuple[dict[str, Any], str]] = [
    ({"exit_code": 2**70}, "events.1.exit_code"),
    ({"exit_code": 2**31}, "events.1.exit_code"),
    ({"event_id": ""}, "events.1.event_id"),
    ({"event_id": "e" * 129}, "events.1.event_id"),
    ({"kernel_id": "k" * 65}, "events.1.kernel_id"),
    ({"reason": "a\x00"}, "events.1.reason"),
    ({"exit_code": math.nan}, "events.1.exit_code"),
    ({"event": "exploded"}, "events.1.event"),
    ({"at": "yesterday"}, "events.1.at"),
]


async def test_bad_heartbeats_are_400s_naming_the_field_and_write_nothing(
    cluster: Cluster,
) -> None:
    """Each case in turn against one manager (a refusal leaves nothing, so the cases do
    not interfere; a well-formed heartbeat of the same agent is accepted after each)."""
    for changes, field in BAD_HEARTBEATS:
        case = repr(changes)[:80]
        before = await registry_state(cluster)
        response = await cluster.internal.post(
            "/internal/agents/heartbeat",
            content=json.dumps(_heartbeat(**changes)),  # allows NaN, as Python's json does
            headers={**HEADERS, "Content-Type": "application/json"},
        )
        assert response.status_code == 400, (case, response.text)
        assert response.headers["content-type"] == PROBLEM, case
        problem = response.json()
        assert reported_place(problem).removesuffix(".[key]") == field, (case, problem)
        assert await registry_state(cluster) == before, case
        ok = await cluster.internal.post(
            "/internal/agents/heartbeat", json=_heartbeat(), headers=HEADERS
        )
        assert ok.status_code == 200, (case, ok.text)


async def test_a_bad_event_refuses_the_whole_batch(cluster: Cluster) -> None:
    """The first event of each batch is good and real (the running kernel exited): the
    batch is refused whole, so the session stays RUNNING and no event id is recorded."""
    agent, session_id = await _running_session(cluster, "i-node01")
    kernel_id = next(iter(agent.kernels))
    good = {
        "event_id": str(uuid.uuid4()),
        "kernel_id": kernel_id,
        "session_id": session_id,
        "event": "exited",
        "exit_code": 0,
        "at": "2026-11-25T00:00:00Z",
    }
    for event, field in BAD_EVENTS:
        case = repr(event)[:80]
        before = await registry_state(cluster)
        bad = {**good, "event_id": str(uuid.uuid4()), **event}
        response = await cluster.internal.post(
            "/internal/agents/events",
            content=json.dumps({"agent_id": "i-node01", "events": [good, bad]}),
            headers={**HEADERS, "Content-Type": "application/json"},
        )
        assert response.status_code == 400, (case, response.text)
        assert reported_place(response.json()) == field, (case, response.json())
        assert await registry_state(cluster) == before, case
        assert (await cluster.session(session_id))["status"] == "RUNNING", case
    # the good event alone is applied: the session ends
    response = await cluster.internal.post(
        "/internal/agents/events", json={"agent_id": "i-node01", "events": [good]}, headers=HEADERS
    )
    assert response.status_code == 204, response.text
    assert (await cluster.session(session_id))["status"] == "TERMINATED"


def test_the_mutation_helpers_find_every_place() -> None:
    body = {"a": {"b": [1, {"c": 2}]}, "d": 3}
    assert [dotted(p) for p in paths_of(body)] == ["a", "a.b", "a.b.0", "a.b.1", "a.b.1.c", "d"]
    assert apply(body, ("a", "b", 1, "c"), "replace", math.inf) == {
        "a": {"b": [1, {"c": math.inf}]},
        "d": 3,
    }
    assert apply(body, ("d",), "delete", None) == {"a": {"b": [1, {"c": 2}]}}
    assert related("slots.cpu", "slots.cpu.capacity")
    assert related("slots.cpu.capacity", "slots")
    assert not related("region", "slots.cpu")
