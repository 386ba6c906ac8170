"""Count a process's SQL statements and its CPU time (``e2e_bench.py --sql-stats``).

Put this directory on ``PYTHONPATH`` with ``ACCELSHARE_SQL_STATS=DIR``: every Python
process started so (the dev cluster's manager and agents) counts the statements its
SQLAlchemy engines execute, keyed by verb and table (``INSERT session_status_history``,
``BEGIN IMMEDIATE``), and rewrites ``DIR/<pid>.json`` every 0.25 s with the cumulative
counts, its CPU seconds (``time.process_time``) and its ``argv``.  The bench diffs two
snapshots around a phase.  With ``ACCELSHARE_PROFILE=DIR`` (``e2e_bench.py --profile``)
it also cProfiles the process's main thread between SIGUSR1 and SIGUSR2.  Nothing here
runs unless a variable is set.
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
import time
from collections import Counter
from typing import Any

_DIR = os.environ.get("ACCELSHARE_SQL_STATS")
_PROFILE_DIR = os.environ.get("ACCELSHARE_PROFILE")
_TABLE = re.compile(r"\b(?:FROM|INTO|UPDATE)\s+\"?(\w+)", re.IGNORECASE)


def _key(statement: str) -> str:
    text = statement.lstrip()
    verb = text.split(None, 1)[0].upper() if text else "?"
    if verb == "BEGIN":
        return text.split("\n", 1)[0].strip().upper()
    match = _TABLE.search(text)
    return f"{verb} {match.group(1) if match else ''}".strip()


def _caller() -> str:
    """The innermost accelshare function on the stack, but the database helpers."""
    frames: list[Any] = [sys._getframe(2)]
    try:  # SQLAlchemy's asyncio layer runs the statement in a greenlet: the awaiting
        import greenlet  # code is the parent greenlet's (suspended) stack

        parent = greenlet.getcurrent().parent
        if parent is not None and parent.gr_frame is not None:
            frames.append(parent.gr_frame)
    except ImportError:
        pass
    for innermost in frames:
        frame = innermost
        while frame is not None:
            filename = frame.f_code.co_filename
            if "/accelshare/" in filename and not filename.endswith(
                ("/db.py", "/sitecustomize.py")
            ):
                module = filename.rsplit("/", 1)[-1].removesuffix(".py")
                return f"{module}.{frame.f_code.co_name}"
            frame = frame.f_back
    return "?"


def _install(directory: str) -> None:
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    counts: Counter[str] = Counter()
    lock = threading.Lock()
    callers = os.environ.get("ACCELSHARE_SQL_STATS_CALLERS") == "1"

    @event.listens_for(Engine, "before_cursor_execute")
    def _count(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        key = _key(statement)
        if callers:
            key = f"{key} <- {_caller()}"
        with lock:
            counts[key] += 1

    @event.listens_for(Engine, "commit")
    def _commit(_conn: Any) -> None:
        with lock:
            counts["COMMIT"] += 1

    path = os.path.join(directory, f"{os.getpid()}.json")

    def _dump() -> None:
        while True:
            with lock:
                snapshot = dict(counts)
            data = {"argv": sys.argv, "cpu_s": time.process_time(), "counts": snapshot}
            tmp = path + ".tmp"
            with open(tmp, "w") as out:
                json.dump(data, out)
            os.replace(tmp, path)
            time.sleep(0.25)

    threading.Thread(target=_dump, name="sql-stats", daemon=True).start()


if _DIR:
    _install(_DIR)


def _install_profiler(directory: str) -> None:
    """cProfile of this process's main thread (the event loop) between SIGUSR1 (start)
    and SIGUSR2 (stop, write ``DIR/<pid>.prof`` and ``DIR/<pid>.argv``)."""
    import cProfile
    import signal

    profiler = cProfile.Profile()

    def _start(_signum: int, _frame: Any) -> None:
        profiler.enable()

    def _stop(_signum: int, _frame: Any) -> None:
        profiler.disable()
        profiler.dump_stats(os.path.join(directory, f"{os.getpid()}.prof"))
        with open(os.path.join(directory, f"{os.getpid()}.argv"), "w") as out:
            json.dump(sys.argv, out)

    signal.signal(signal.SIGUSR1, _start)
    signal.signal(signal.SIGUSR2, _stop)


if _PROFILE_DIR:
    _install_profiler(_PROFILE_DIR)
