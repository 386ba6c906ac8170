"""Several OS processes sharing one store (a manager and agents on one host, or hosts
sharing an etcd): locks exclude each other and no write or event is lost."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from accelshare.config import ConfigStore, WatchEvent

from .conftest import Harness

pytestmark = pytest.mark.integration

WORKER = Path(__file__).with_name("_worker.py")


def _spawn(harness: Harness, *args: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, **harness.env()}
    return subprocess.Popen([sys.executable, str(WORKER), *args], env=env, stderr=subprocess.PIPE)


def _wait(processes: list[subprocess.Popen[bytes]]) -> None:
    for process in processes:
        _, stderr = process.communicate(timeout=60)
        assert process.returncode == 0, stderr.decode()


async def test_the_lock_is_exclusive_between_two_processes(
    harness: Harness, tmp_path: Path
) -> None:
    log, go, rounds = tmp_path / "lock.log", tmp_path / "go", 5
    processes = [
        _spawn(harness, "lock", "exclusive", str(log), str(rounds), str(go)) for _ in range(2)
    ]
    async with asyncio.timeout(60):
        while len(list(tmp_path.glob("go.ready.*"))) < 2:
            for p in processes:
                if p.poll() is not None:
                    _, stderr = p.communicate()
                    pytest.fail(f"a worker died (exit {p.returncode}):\n{stderr.decode()}")
            await asyncio.sleep(0.02)
    go.touch()
    await asyncio.to_thread(_wait, processes)

    words = log.read_text().split()
    entries = list(zip(words[0::2], words[1::2], strict=True))  # ("enter"|"exit", pid)
    assert len(entries) == 2 * 2 * rounds
    for (enter, pid_in), (leave, pid_out) in zip(entries[0::2], entries[1::2], strict=True):
        # Never two holders at once: each "enter" is followed by the same process's "exit".
        assert (enter, leave, pid_in) == ("enter", "exit", pid_out)
    assert len({pid for _, pid in entries}) == 2


async def test_concurrent_writers_in_separate_processes_lose_nothing(
    harness: Harness, store: ConfigStore
) -> None:
    writers, count = 3, 15
    events: list[WatchEvent] = []
    ready = asyncio.Event()

    async def follow() -> None:
        async for event in store.watch_prefix("w", ready=ready):
            events.append(event)
            if len(events) == writers * count:
                return

    task = asyncio.create_task(follow())
    await asyncio.wait_for(ready.wait(), 10)
    processes = [_spawn(harness, "write", f"w/{n}", str(count)) for n in range(writers)]
    await asyncio.to_thread(_wait, processes)
    await asyncio.wait_for(task, 20)

    tree = await store.get_prefix("w")
    assert sorted(tree) == [str(n) for n in range(writers)]
    assert all(len(subtree) == count for subtree in tree.values())
    assert len({(e.key, e.revision) for e in events}) == writers * count
    assert [e.revision for e in events] == sorted(e.revision for e in events)


async def test_processes_creating_a_fresh_store_at_once_all_succeed(harness: Harness) -> None:
    # Regression: with the embedded store, two processes opening a not-yet-existing
    # file raced on the switch to WAL and one failed with "database is locked".
    for round_ in range(3):
        processes = [_spawn(harness, "write", f"fresh{round_}/{n}", "1") for n in range(4)]
        await asyncio.to_thread(_wait, processes)
        if harness.kind == "embedded":
            for suffix in ("", "-wal", "-shm"):
                Path(f"{harness.db_path}{suffix}").unlink(missing_ok=True)
