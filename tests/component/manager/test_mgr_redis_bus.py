"""The Redis bus with the real manager and agent processes: live stats come from Redis,
kernel events are consumed from its stream, and a Redis restart in the middle costs
nothing but a reported gap (sessions keep running and resuming over HTTP meanwhile)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from accelshare_testkit.redis_server import RedisProcess, find_redis_binary
from accelshare_testkit.waiting import until

from .test_mgr_real_agent import real_cluster

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        find_redis_binary() is None, reason="no redis-server (apt-get install redis-server)"
    ),
]


def metric(text: str, name: str, labels: str = "") -> float:
    match = re.search(rf"^{re.escape(name)}{re.escape(labels)} (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


async def test_stats_and_events_through_redis_survive_a_redis_restart(
    db_url: str, tmp_path: Path
) -> None:
    redis = RedisProcess(tmp_path / "redis")
    redis.start()
    extra = (
        f'[redis]\naddr = "{redis.addr}"\nnamespace = "comp"\n'
        "stats-interval-s = 0.2\nstats-ttl-s = 5\ntimeout-s = 0.5\n"
    )
    try:
        async with real_cluster(db_url, tmp_path, extra_toml=extra) as client:

            async def stats() -> dict[str, Any] | None:
                reply = await client.get("/agents/i-node01/stats")
                return reply.json() if reply.status_code == 200 else None

            first = await until(stats, "stats on Redis")
            assert first["source"] == "redis"
            names = {m["name"] for m in first["metrics"]}
            assert {"cuda_util", "cuda_mem", "cuda_power", "cuda_temperature"} <= names
            assert first["missed"] == 0

            # a batch session starts and exits: both events also travel through the stream
            created = await client.post(
                "/session",
                json={
                    "image": "python",
                    "name": "batch-1",
                    "type": "batch",
                    "startupCommand": "python -c 'print(42)'",
                    "config": {"resources": {"cpu": 1, "mem": "256m", "cuda.shares": "0.5"}},
                },
            )
            assert created.status_code == 201, created.text

            async def terminated() -> bool:
                return (await client.get("/session/batch-1")).json()["status"] == "TERMINATED"

            await until(terminated, "the batch session to end")

            async def both_events_read() -> float:
                text = (await client.get("/metrics")).text
                return metric(text, "accelshare_bus_events_received_total") >= 2 and 1.0

            await until(both_events_read, "the manager to read both events from Redis")
            text = (await client.get("/metrics")).text
            applied = sum(
                metric(text, "accelshare_event_delivery_seconds_count", f'{{path="{p}"}}')
                for p in ("http", "redis")
            )
            assert applied >= 2  # each event applied once, whichever path came first

            # Redis goes away: no crash, sessions still start (events over HTTP)
            redis.stop()

            async def stats_unavailable() -> str | None:
                reply = await client.get("/agents/i-node01/stats")
                return reply.json()["detail"] if reply.status_code == 503 else None

            detail = await until(stats_unavailable, "a 503 while Redis is down")
            assert f"Redis at {redis.addr}" in detail
            agent_log = tmp_path / "agent.log"

            async def agent_missed_a_tick() -> bool:
                return "stats not published, the agent keeps trying" in agent_log.read_text()

            await until(agent_missed_a_tick, "the agent to miss a stats tick")
            during = await client.post(
                "/session",
                json={
                    "image": "python",
                    "name": "during-outage",
                    "maxWaitSeconds": 30,
                    "config": {"resources": {"cpu": 1, "mem": "256m", "cuda.shares": "0.5"}},
                },
            )
            assert during.status_code == 201, during.text
            assert during.json()["status"] == "RUNNING"

            # Redis is back: stats resume and say how much was missed
            redis.start()

            async def gap_reported() -> dict[str, Any] | None:
                report = await stats()
                return report if report is not None and report["missed"] > 0 else None

            after = await until(gap_reported, "stats with the gap reported")
            assert after["gapS"] > 0
            assert after["seq"] > first["seq"] + after["missed"]
            ok = await client.get("/health")
            assert ok.status_code == 200
    finally:
        redis.stop()


async def test_a_bad_redis_table_stops_the_manager_with_a_clear_error(tmp_path: Path) -> None:
    import subprocess
    import sys

    (tmp_path / "manager.toml").write_text(
        f'[manager]\ndata-dir = "{tmp_path / "state"}"\n[redis]\naddr = "nowhere:notaport"\n'
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "accelshare.client.cli",
            "server",
            "manager",
            "--config",
            str(tmp_path / "manager.toml"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0
    assert "[redis] addr" in done.stderr
    assert "nowhere:notaport" in done.stderr
    assert not (tmp_path / "state" / "manager.db").exists()  # nothing opened
